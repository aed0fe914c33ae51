package store

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// SetWaiting stores run id's definition-wait note (encoded by the caller)
// for ttl: one SET with an expiry, so the note lapses once nobody refuses
// the run any more.
func (s *Store) SetWaiting(ctx context.Context, id string, note []byte, ttl time.Duration) error {
	return s.rdb.Set(ctx, s.keys.RunWaiting(id), note, ttl).Err()
}

// Waiting returns run id's definition-wait note, nil when there is none.
func (s *Store) Waiting(ctx context.Context, id string) ([]byte, error) {
	b, err := s.rdb.Get(ctx, s.keys.RunWaiting(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return b, err
}
