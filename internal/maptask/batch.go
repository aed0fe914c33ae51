package maptask

import (
	"context"
	"errors"
	"sync"
)

// MaxInFlight bounds the enqueues of one batch sent at once. asynq
// v0.26.0 enqueues one task per call (a script per task) and has no batch
// API, so a batch of B tasks goes out as B calls over the Redis client's
// pool, MaxInFlight at a time: about B/MaxInFlight round trips of latency
// instead of B in a row.
const MaxInFlight = 8

// BatchEnqueuers is implemented by a map-task side that can have several
// enqueues in flight (worker.Client's). Others get their tasks one by one.
type BatchEnqueuers interface {
	EnqueueElements(ctx context.Context, ts []ElementTask) error
	EnqueueRollbacks(ctx context.Context, ts []RollbackTask) error
}

// EnqueueElements enqueues ts through q, concurrently when q supports it.
func EnqueueElements(ctx context.Context, q Enqueuers, ts []ElementTask) error {
	if b, ok := q.(BatchEnqueuers); ok {
		return b.EnqueueElements(ctx, ts)
	}
	for _, t := range ts {
		if err := q.EnqueueElement(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// EnqueueRollbacks enqueues ts through q, concurrently when q supports it.
func EnqueueRollbacks(ctx context.Context, q Enqueuers, ts []RollbackTask) error {
	if b, ok := q.(BatchEnqueuers); ok {
		return b.EnqueueRollbacks(ctx, ts)
	}
	for _, t := range ts {
		if err := q.EnqueueRollback(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// All calls one for every t of ts, at most MaxInFlight at once, and
// returns when all have returned: nil, or their errors joined. A task
// whose enqueue failed is left to the map sweeper, as a lost enqueue is.
func All[T any](ctx context.Context, ts []T, one func(context.Context, T) error) error {
	if len(ts) == 1 {
		return one(ctx, ts[0])
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan T)
	)
	for range min(MaxInFlight, len(ts)) {
		wg.Go(func() {
			for t := range next {
				if err := one(ctx, t); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, t := range ts {
		next <- t
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}
