package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// AuditRecord is one entry of an audit stream: its stream id (the server's
// time in ms, then a sequence number) and its fields.
type AuditRecord struct {
	ID     string
	Fields map[string]string
}

// ReadAudit returns every entry of audit stream key, oldest first (at most
// AuditCap, the stream's own bound). A missing stream has none.
func (s *Store) ReadAudit(ctx context.Context, key string) ([]AuditRecord, error) {
	msgs, err := s.rdb.XRange(ctx, key, "-", "+").Result()
	if err != nil && err != redis.Nil {
		return nil, fmt.Errorf("store: read audit %s: %w", key, err)
	}
	out := make([]AuditRecord, 0, len(msgs))
	for _, m := range msgs {
		f := make(map[string]string, len(m.Values))
		for k, v := range m.Values {
			f[k] = fmt.Sprint(v)
		}
		out = append(out, AuditRecord{ID: m.ID, Fields: f})
	}
	return out, nil
}

//go:embed lua/note.lua
var noteSrc string

var noteScript = redis.NewScript(noteSrc)

// ErrNoRun reports a note for a run that has no state: nothing was
// appended.
var ErrNoRun = errors.New("store: the run has no state")

// Note appends an entry no state change carries (an operator's request) to
// t's audit stream, with the fields given as field/value pairs; the stream
// keeps the run's time to live (note.lua). It returns ErrNoRun when t has
// no state.
func (s *Store) Note(ctx context.Context, t Target, fields ...string) error {
	args := make([]any, 0, 1+len(fields))
	args = append(args, t.AuditCapOrDefault())
	for _, f := range fields {
		args = append(args, f)
	}
	err := rideOut(ctx, func() error {
		return noteScript.Run(ctx, s.rdb, []string{t.Audit, t.State}, args...).Err()
	})
	if errors.Is(err, redis.Nil) {
		return ErrNoRun
	}
	if err != nil {
		return fmt.Errorf("store: note in the audit: %w", err)
	}
	return nil
}
