package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/store"
)

// ErrElementStopped is the Failure of an element run that StopElement
// created finished: its map stopped before the element started, and it
// never ran a step.
var ErrElementStopped = errors.New("reactor: element stopped with its map before it started")

const codeElementStopped = "reactor.element_stopped"

func init() { builtinSentinel(codeElementStopped, ErrElementStopped) }

// StopElement runs fn under the lock of element run id (a construct
// element, "<mapID>.<i>") after making sure the element can never start
// later: an element run that does not exist yet is created finished
// (cancelled, its Failure ErrElementStopped), so a delivery that read its
// map before the map stopped, and only now reaches the element, finds a
// finished run instead of executing it. An element run that exists
// (finished, or cut short by a delivery that died) is left as it is: a
// rollback that takes the element's lock finds it and undoes what it
// completed.
//
// It is used by package mapstep, whose map positions settle "stopped" only
// inside fn: a position must never settle while another delivery of the
// element still executes it, or the map could settle and its rollback judge
// the element before that delivery completes it.
//
// The lock is tried once: when another process holds it, StopElement
// returns ErrRunLocked without calling fn (a worker snoozes the task). The
// lock is kept alive while fn runs (fn's context is cancelled if it is
// lost, and StopElement then returns ErrLockLost) and released after.
// reactorName is the element reactor's name, recorded on a created run so
// that a later execution of the element recognises it as its own.
func (e *Engine) stopElement(ctx context.Context, reactorName, id string, fn func(ctx context.Context) error) error {
	if err := validateRunID(id); err != nil {
		return err
	}
	target := e.elemTarget(ctx, id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		return fmt.Errorf("%w (element %s)", ErrRunLocked, id)
	}
	if err != nil {
		return err
	}
	held := lease.Keep(ctx)
	err = e.sealElement(held, target, lease.Token(), reactorName, id)
	if err == nil {
		err = fn(held)
	}
	lost := lock.Lost(held)
	_ = lease.Release(context.WithoutCancel(ctx))
	if lost {
		return fmt.Errorf("reactor: element %s: %w (%v)", id, ErrLockLost, err)
	}
	return err
}

// sealElement creates element run id finished unless it exists. Like any
// element run it has no expiry of its own: it expires with its owner's run
// tree.
func (e *Engine) sealElement(ctx context.Context, target store.Target, token, reactorName, id string) error {
	now := e.now().UnixMilli()
	st := &runState{ID: id, Reactor: reactorName, Status: StatusCancelled, Steps: map[string]*stepRec{},
		Failure:   &Failure{Code: codeElementStopped, Message: ErrElementStopped.Error(), err: ErrElementStopped},
		CreatedAt: now, UpdatedAt: now}
	data, err := codec.Marshal(st)
	if err != nil {
		return fmt.Errorf("reactor: encode stopped element: %w", err)
	}
	_, _, err = e.store.Create(ctx, target, token, data)
	return err
}

// LockExpiry is how long a lock this engine takes lives without a
// heartbeat (Config.LockExpiry): the longest a crashed holder's lock
// outlives it. Package mapstep derives its rollback's wait for a held
// element lock from it.
func (e *Engine) lockExpiry() time.Duration { return e.cfg.LockExpiry }
