package examples_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func newEngine(t *testing.T, enq reactor.Enqueuer) *reactor.Engine {
	t.Helper()
	e, err := reactor.NewEngine(t.Context(), reactor.Config{
		Client:   redistest.Client(t),
		Prefix:   redistest.Prefix(t),
		Logger:   discard,
		Enqueuer: enq,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := examples.Register(e); err != nil {
		t.Fatal(err)
	}
	return e
}

// ref returns an order or trip id unique to this test run.
func ref(kind string) string { return kind + "-" + reactor.NewRunID()[:8] }

// actions lists the actions the journal recorded for ref.
func actions(ref string) string {
	var out []string
	for _, e := range examples.Effects.Entries(ref) {
		out = append(out, e.Action)
	}
	return strings.Join(out, " ")
}

// rollbacks renders a run's rollback report as "step:kind:status" items.
func rollbacks(run *reactor.Run) string {
	var out []string
	for _, r := range run.Rollbacks {
		out = append(out, fmt.Sprintf("%s:%s:%s", r.Step, r.Kind, r.Status))
	}
	return strings.Join(out, " ")
}

func TestCheckoutCompletes(t *testing.T) {
	e := newEngine(t, nil)
	order := ref("o")
	before := examples.Stock.Available("lamp")
	res, err := e.Run(t.Context(), examples.Checkout, map[string]any{"order": order, "item": "lamp", "qty": 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusCompleted {
		t.Fatalf("status %s, failure %v", res.Status, res.Failure)
	}
	got, err := reactor.ValueOf[examples.Receipt](res)
	if err != nil {
		t.Fatal(err)
	}
	want := examples.Receipt{Order: order, Item: "lamp", Qty: 2, Charged: 9000, Payment: "pay_" + order, Tracking: "TRK-" + order}
	if got != want {
		t.Errorf("receipt %+v, want %+v", got, want)
	}
	if a := actions(order); a != "reserve charge label ship" {
		t.Errorf("effects %q", a)
	}
	if n := examples.Stock.Available("lamp"); n != before-2 {
		t.Errorf("lamp stock %d, want %d", n, before-2)
	}
}

func TestCheckoutRollsBack(t *testing.T) {
	for _, tc := range []struct {
		failAt, effects, rollbacks string
	}{
		{"reserve", "", "reserve:compensate:no_compensation_registered"},
		{"charge", "reserve release",
			"charge:compensate:no_compensation_registered reserve:undo:compensated"},
		{"ship", "reserve charge label void refund release",
			"ship:compensate:compensated charge:undo:compensated reserve:undo:compensated"},
	} {
		t.Run(tc.failAt, func(t *testing.T) {
			e := newEngine(t, nil)
			order := ref("o")
			before := examples.Stock.Available("book")
			res, err := e.Run(t.Context(), examples.Checkout, map[string]any{"order": order, "item": "book", "fail_at": tc.failAt})
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != reactor.StatusFailed || res.Failure.Step != tc.failAt {
				t.Fatalf("status %s, failure %v", res.Status, res.Failure)
			}
			// Read back from Redis: the registered sentinel survives.
			run, err := e.Get(t.Context(), res.RunID)
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(run.Failure, examples.ErrInjected) || run.Failure.Retryable {
				t.Errorf("stored failure %v (retryable %v): want ErrInjected, not retryable", run.Failure, run.Failure.Retryable)
			}
			if got := rollbacks(run); got != tc.rollbacks {
				t.Errorf("rollbacks %q, want %q", got, tc.rollbacks)
			}
			if a := actions(order); a != tc.effects {
				t.Errorf("effects %q, want %q", a, tc.effects)
			}
			if n := examples.Stock.Available("book"); n != before {
				t.Errorf("book stock %d after rollback, want %d", n, before)
			}
		})
	}
}

func TestCheckoutOutOfStock(t *testing.T) {
	e := newEngine(t, nil)
	res, err := e.Run(t.Context(), examples.Checkout, map[string]any{"order": ref("o"), "item": "desk", "qty": 1000})
	if err != nil {
		t.Fatal(err)
	}
	run, err := e.Get(t.Context(), res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	var oos *examples.OutOfStockError
	if !errors.As(run.Failure, &oos) {
		t.Fatalf("stored failure %v: want an *OutOfStockError", run.Failure)
	}
	if oos.Item != "desk" || oos.Requested != 1000 || oos.Available != examples.Stock.Available("desk") {
		t.Errorf("decoded %+v", oos)
	}
}

func TestCheckoutRejectsBadInputs(t *testing.T) {
	e := newEngine(t, nil)
	for _, in := range []map[string]any{
		{"order": "o", "item": "book", "qty": 0},
		{"order": "o", "item": "book", "fail_at": "nowhere"},
		{"item": "book"},
	} {
		var ie *reactor.InputError
		if _, err := e.Run(t.Context(), examples.Checkout, in); !errors.As(err, &ie) {
			t.Errorf("inputs %v: error %v, want an *InputError", in, err)
		}
	}
}

func TestTripUndo(t *testing.T) {
	e := newEngine(t, nil)
	trip := ref("t")
	res, err := e.Run(t.Context(), examples.Trip, map[string]any{"trip": trip, "from": "Lisbon", "to": "Oslo", "nights": 3})
	if err != nil {
		t.Fatal(err)
	}
	got, err := reactor.ValueOf[examples.TripReceipt](res)
	if err != nil {
		t.Fatalf("status %s, failure %v: %v", res.Status, res.Failure, err)
	}
	if got.Itinerary.Total != 18900+3*11000 || got.Payment.Amount != got.Itinerary.Total {
		t.Errorf("receipt %+v", got)
	}
	undone, err := e.Undo(t.Context(), res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if undone.Status != reactor.StatusCancelled {
		t.Fatalf("undo: status %s", undone.Status)
	}
	run, err := e.Get(t.Context(), res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	// The itinerary has no Undo: it is reported kept, in its turn.
	if want := "pay:undo:compensated book/itinerary:undo:no_compensation_registered book/hotel:undo:compensated book/flight:undo:compensated"; rollbacks(run) != want {
		t.Errorf("rollbacks %q, want %q", rollbacks(run), want)
	}
	if a := actions(trip); a != "flight hotel charge refund cancel cancel" {
		t.Errorf("effects %q", a)
	}
}

func TestTripFailsInChild(t *testing.T) {
	e := newEngine(t, nil)
	trip := ref("t")
	res, err := e.Run(t.Context(), examples.Trip, map[string]any{"trip": trip, "from": "Lisbon", "to": "Oslo", "fail_at": "hotel"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusFailed || !errors.Is(res.Failure, examples.ErrInjected) {
		t.Fatalf("status %s, failure %v", res.Status, res.Failure)
	}
	if a := actions(trip); a != "flight cancel" {
		t.Errorf("effects %q", a)
	}
}

// TestCheckoutOnWorker runs a Checkout the way cmd/worker does: enqueued,
// executed by an asynq worker, read back with Wait.
func TestCheckoutOnWorker(t *testing.T) {
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	e := newEngine(t, client)
	w := worker.New(e, rdb, worker.Config{Concurrency: 2, Queues: map[string]int{queue: 1}, Logger: discard})
	if err := w.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Error(err)
		}
	})
	order := ref("o")
	res, err := e.Enqueue(t.Context(), examples.Checkout, map[string]any{"order": order, "item": "book", "fail_at": "ship"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err = e.Wait(ctx, res.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusFailed || res.Failure.Step != "ship" || !errors.Is(res.Failure, examples.ErrInjected) {
		t.Fatalf("status %s, failure %v", res.Status, res.Failure)
	}
	if a := actions(order); a != "reserve charge label void refund release" {
		t.Errorf("effects %q", a)
	}
}
