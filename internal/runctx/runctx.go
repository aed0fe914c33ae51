// Package runctx carries what a construct tells the engine about an element
// run it executes, through the context, so that reactor's public API needs
// no parameter that only mapstep would ever pass.
package runctx

import (
	"context"
	"time"

	"github.com/goreactor/goreactor/internal/store"
)

// Element is where an element run belongs: the top-level run that owns its
// map, the map step's path in that run, the element's index, and the
// owner's trace id (the element run inherits it).
type Element struct {
	Owner string
	Step  string
	Index int
	Trace string
	// WindowAt is the Redis server time (Unix ms) at which the owner's
	// rollback judges undo windows (0: none): an element's rollback judges
	// its own entries' windows at that time, not when its job runs.
	WindowAt int64
	// Sensitive: the owner is a sensitive run, so the element run is one
	// too (its inputs come from the owner).
	Sensitive bool
	// Legacy: the element run's keys are in the layout of maps started
	// before element runs moved into their map's slot
	// (store.LegacyElemTarget).
	Legacy bool
	// Create, when set, replaces the element run's lock and create: it
	// takes the lock (token, for lockTTL) and the map checks its own keys
	// in the same script (the element's keys share its map's slot). It has
	// store.Store.CreateNew's contract (store.ErrLockNotHeld: someone else
	// holds the lock), and may refuse with an error of the map's own (the
	// map failed, or no longer takes the element), which the engine returns
	// as it is, after releasing the lock.
	Create func(ctx context.Context, t store.Target, token string, lockTTL time.Duration, data []byte) (store.Snapshot, bool, error)
	// Load, when set, replaces the element run's lock and load for its
	// undo (a map rollback job, which tries the lock once): it takes the
	// lock (token, for lockTTL) and the map checks its rollback in the same
	// script. It has store.Store.Load's contract (store.ErrLockNotHeld:
	// someone else holds the lock), and may refuse with an error of the
	// map's own, returned as it is after the lock is released.
	Load func(ctx context.Context, t store.Target, token string, lockTTL time.Duration) (store.Snapshot, error)
	// Finish, when set, is the element run's terminal write, with
	// store.Store.Write's contract: the map records the element's outcome in
	// the same script. res is the run's *reactor.Result as the write stores
	// it.
	Finish func(ctx context.Context, t store.Target, token string, version int64, data []byte, o store.WriteOptions, res any) (store.WriteResult, error)
}

type elementKey struct{}

// WithElement returns ctx telling ExecuteElement and UndoElement where the
// element run belongs.
func WithElement(ctx context.Context, e Element) context.Context {
	return context.WithValue(ctx, elementKey{}, e)
}

// ElementFrom returns what WithElement put in ctx.
func ElementFrom(ctx context.Context) (Element, bool) {
	e, ok := ctx.Value(elementKey{}).(Element)
	return e, ok
}
