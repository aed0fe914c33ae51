package store

import (
	"context"
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
