package reactor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/lock"
)

// HoldElement runs fn while this process holds the lock of element run id
// (a construct element, "<mapID>.<i>"), without touching the element run
// itself. It is used by package mapstep, whose map positions settle only
// under their element's lock: a position must never settle while another
// delivery of the element still executes it, or the map could settle and
// its rollback judge the element before that delivery completes it.
//
// The lock is tried once: when another process holds it, HoldElement
// returns ErrRunLocked without calling fn (a worker snoozes the task). The
// lock is kept alive while fn runs (fn's context is cancelled if it is
// lost, and HoldElement then returns ErrLockLost) and released after.
func (e *Engine) HoldElement(ctx context.Context, id string, fn func(ctx context.Context) error) error {
	if err := validateRunID(id); err != nil {
		return err
	}
	target := e.store.ElemTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		return fmt.Errorf("%w (element %s)", ErrRunLocked, id)
	}
	if err != nil {
		return err
	}
	held := lease.Keep(ctx)
	err = fn(held)
	lost := lock.Lost(held)
	_ = lease.Release(context.WithoutCancel(ctx))
	if lost {
		return fmt.Errorf("reactor: element %s: %w (%v)", id, ErrLockLost, err)
	}
	return err
}

// LockExpiry is how long a lock this engine takes lives without a
// heartbeat (Config.LockExpiry): the longest a crashed holder's lock
// outlives it. Package mapstep derives its rollback's wait for a held
// element lock from it.
func (e *Engine) LockExpiry() time.Duration { return e.cfg.LockExpiry }
