package redislog

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"
)

// A go-redis line becomes one JSON record at Warn, its trailing newline
// dropped, marked as go-redis's.
func TestPrintfWritesOneJSONRecord(t *testing.T) {
	var buf bytes.Buffer
	l := Logger{L: slog.New(slog.NewJSONHandler(&buf, nil))}
	l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v\n", 5, "refused")
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q: %v", buf.String(), err)
	}
	if rec["level"] != "WARN" || rec["component"] != "go-redis" ||
		rec["msg"] != "redis: connection pool: failed to dial after 5 attempts: refused" {
		t.Errorf("record %v", rec)
	}
}
