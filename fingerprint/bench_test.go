package fingerprint

import (
	"testing"
	"time"
)

type lineItem struct {
	SKU      string  `json:"sku"`
	Quantity int32   `json:"qty"`
	Price    float64 `json:"price"`
}

type invoice struct {
	ID         string            `json:"id"`
	Customer   string            `json:"customer"`
	Status     string            `json:"status"`
	Currency   string            `json:"currency"`
	TotalCents int64             `json:"total_cents"`
	Paid       bool              `json:"paid"`
	Issued     time.Time         `json:"issued"`
	Due        time.Time         `json:"due,omitempty"`
	Lines      []lineItem        `json:"lines"`
	Labels     map[string]string `json:"labels"`
	Note       string            `json:"note,omitempty"`
}

func BenchmarkOf(b *testing.B) {
	issued := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	record := invoice{
		ID: "inv-2026-000123", Customer: "cus_8f2a", Status: "open", Currency: "EUR",
		TotalCents: 12_345, Issued: issued, Due: issued.AddDate(0, 0, 30),
		Lines: []lineItem{
			{"sku-1", 2, 19.99}, {"sku-2", 1, 5.5}, {"sku-3", 10, 0.25}, {"sku-4", 1, 80},
		},
		Labels: map[string]string{"region": "eu-west", "channel": "web"},
	}
	// The same state as the codec reads it back from Redis.
	lines := make([]any, len(record.Lines))
	for i, l := range record.Lines {
		lines[i] = map[string]any{"sku": l.SKU, "qty": int8(l.Quantity), "price": l.Price}
	}
	readBack := map[string]any{
		"id": record.ID, "customer": record.Customer, "status": record.Status, "currency": record.Currency,
		"total_cents": int16(record.TotalCents), "paid": false, "issued": record.Issued, "due": record.Due,
		"lines": lines, "labels": map[string]any{"region": "eu-west", "channel": "web"},
	}
	want, err := Of(record)
	if err != nil {
		b.Fatal(err)
	}
	if got, _ := Of(readBack); got != want {
		b.Fatalf("the struct and its map differ: %s vs %s", want, got)
	}
	for _, c := range []struct {
		name string
		v    any
	}{{"struct", record}, {"map", readBack}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Of(c.v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
