package engine

import (
	"context"
	"time"
)

// SetSleep replaces the engine's backoff wait, so tests can record delays
// instead of waiting them out.
func SetSleep(e *Engine, f func(ctx context.Context, d time.Duration) error) { e.sleep = f }

// SetServerClockSkew shifts the engine's readings of the Redis server's
// clock by d, standing in for a node whose clock is behind (or ahead).
func SetServerClockSkew(e *Engine, d time.Duration) { e.clockSkew.Store(d.Milliseconds()) }

// StoreCancelRequest stores a cancel request for run id as Cancel does when
// it finds the run's lock held.
func StoreCancelRequest(e *Engine, id string) error {
	return e.store.RequestCancel(context.Background(), e.store.RunTarget(id))
}
