package reactor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
)

// Wake asks a worker to execute run RunID. ID names the cause of the wake-up
// (a start, a hand-off, a sweep), so that a duplicate of the same cause is
// recognised as already queued.
type Wake struct {
	// ID is the task id: "resume:<run>:<cause>".
	ID      string
	RunID   string
	Reactor string
	// Delay postpones the task.
	Delay time.Duration
	// Retain keeps the completed task visible this long (asynq retention),
	// so a sweeper can tell a wake-up that ran from one that was lost.
	// Zero: the task is forgotten when it completes.
	Retain time.Duration
}

// Enqueuer puts wake-ups on the workers' queue. The worker package's Client
// implements it with asynq. An Enqueue of an ID that is already queued must
// return nil: it is the same cause.
type Enqueuer interface {
	Enqueue(ctx context.Context, w Wake) error
}

// ErrNoEnqueuer: the operation hands work to workers but Config.Enqueuer is
// not set.
var ErrNoEnqueuer = errors.New("reactor: Config.Enqueuer is required to hand runs to workers (see package worker)")

func errIDTaken(id, reactor string) error {
	return fmt.Errorf("reactor: run id %s is taken by a run of %q", id, reactor)
}

func wakeID(runID, cause string) string { return "resume:" + runID + ":" + cause }

// HandOff is where a step hands the rest of an in-process run to workers.
type HandOff uint8

// Hand-off points.
const (
	// NoHandOff: the step runs where the run runs.
	NoHandOff HandOff = iota
	// HandOffBefore: the in-process run saves, hands off, and a worker runs
	// this step and the rest.
	HandOffBefore
	// HandOffAfter: the step runs in-process, then a worker runs the rest.
	HandOffAfter
)

// errHandOff unwinds an execution at a hand-off point (or a retry backoff
// turned into a scheduled wake-up, after delay).
type errHandOff struct {
	step  string
	delay time.Duration
}

func (e *errHandOff) Error() string { return "reactor: handed off at step " + e.step }

// Enqueue stores a run of def as pending and hands it to workers; it returns
// at once with a dispatched Result (see Wait). Starting the same id again is
// idempotent: the stored run's result or status is returned.
func (e *Engine) Enqueue(ctx context.Context, def *Definition, inputs map[string]any, opts ...RunOption) (*Result, error) {
	if e.cfg.Enqueuer == nil {
		return nil, ErrNoEnqueuer
	}
	id, encoded, err := e.prepareRun(def, inputs, opts)
	if err != nil {
		return nil, err
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		// Someone executes it already: it is dispatched, or finished.
		if st, _, lerr := e.load(ctx, id); lerr == nil {
			if st.Reactor != def.name {
				return nil, errIDTaken(id, st.Reactor)
			}
			if err := sameInputs(id, st.Inputs, encoded); err != nil {
				return nil, err
			}
			return st.result(), nil
		}
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	defer func() { _ = lease.Release(bg) }()
	now := e.now()
	st := newState(id, def, encoded, now)
	st.Status = StatusPending
	w := Wake{ID: wakeID(id, "start"), RunID: id, Reactor: def.name}
	st.Wake = w.ID
	data, err := codec.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("reactor: encode run: %w", err)
	}
	if err := e.store.MarkStarted(ctx, id, string(StatusPending), now); err != nil {
		return nil, err
	}
	snap, created, err := e.store.Create(ctx, target, lease.Token(), data)
	if err != nil {
		return nil, err
	}
	if !created {
		existing, err := decodeState(snap.Data)
		if err != nil {
			return nil, err
		}
		// Undo the speculative pending index entry where it is wrong.
		if existing.Status.Terminal() {
			_ = e.store.Unindex(bg, id, string(StatusPending))
		} else if existing.Status != StatusPending {
			_ = e.store.MarkStatus(bg, id, string(StatusPending), string(existing.Status), false, now)
		}
		if existing.Reactor != def.name {
			// As Run does: the id belongs to another reactor's run, which
			// must not be woken under this reactor's name.
			return nil, errIDTaken(id, existing.Reactor)
		}
		if err := sameInputs(id, existing.Inputs, encoded); err != nil {
			return nil, err
		}
		if existing.Status.Terminal() {
			return existing.result(), nil
		}
		st = existing
	}
	// Saved first, then enqueued: a crash in between leaves a pending run
	// that the run sweeper wakes.
	if err := e.cfg.Enqueuer.Enqueue(ctx, w); err != nil {
		return nil, fmt.Errorf("reactor: enqueue run %s (stored; the run sweeper will wake it): %w", id, err)
	}
	return st.result(), nil
}

// Wait blocks until run id reaches a terminal status or ctx ends, and
// returns its result. It polls the stored run with a backoff from 5 ms to
// 250 ms.
func (e *Engine) Wait(ctx context.Context, id string) (*Result, error) {
	delay := 5 * time.Millisecond
	for {
		st, _, err := e.load(ctx, id)
		if err != nil {
			return nil, err
		}
		if st.Status.Terminal() {
			return st.result(), nil
		}
		if err := sleepCtx(ctx, delay); err != nil {
			return nil, fmt.Errorf("reactor: wait for run %s (last seen %s): %w", id, st.Status, err)
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}

// Process executes a stored run as a worker does: hand-off points are passed
// through, and a context that ends (worker shutdown) leaves the run where it
// was for the next delivery instead of aborting it. It returns ErrRunLocked
// when another process holds the run, which a worker answers by snoozing.
func (e *Engine) Process(ctx context.Context, id string) (*Result, error) {
	return e.resume(ctx, id, true)
}
