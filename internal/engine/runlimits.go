package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Run limits: a definition may declare limits its runs take as a whole
// (RunLimits): a run takes them before it executes anything and holds them
// until it ends, across every execution in between (a pause at an
// interrupt, a fan-out map's wait, a wait for a step's limit, a retry's
// backoff), and its rollback takes them again (an Undo of a finished run
// waits for them like a new run). A run's holder is one of its own, the
// same for every execution ("<run>|(run)|<created>.run"), so an execution
// takes back what the run holds. While an execution runs, the slot has a
// lease it renews, as a step's slot does; when the execution leaves the
// run unfinished, the slot is parked (store/lua/slot.lua): held with no
// lease, for as long as the run is live, until its terminal write is
// followed by the release. A process that dies mid-execution leaves a
// leased slot, reclaimed when the lease ends; the run, once recovered,
// takes it again (and waits if another run got it meanwhile).

// runPath is the "step" a run's own limits are held by.
const runPath = "(run)"

// RunLimits declares limits each run of the definition takes as a whole:
// from before its first step to its end, across pauses and waits, and
// again for its rollback. Key computes the key from the run's inputs.
// Concurrency (a Lock is RunLimits(Lock(name, key))), Ordered (runs for a
// key execute one after another in the order they were created: enqueue
// order) and Rates (at most N runs start per window) apply; Fair, OnFull
// and OncePer are for step limits. A definition with run limits cannot be
// composed into another (the parent's run would hold them), and none of
// its steps may declare a limit of the same name (it would wait for its
// own run).
func RunLimits(limits ...Limit) Part {
	return partFunc(func(d *Definition) error {
		for _, l := range limits {
			if err := l.validate(); err != nil {
				return &DefinitionError{Reactor: d.name, Reason: "run limits: " + err.Error()}
			}
			var bad string
			switch {
			case l.Fair:
				bad = "Fair"
			case l.OnFull != WaitForSlot:
				bad = "OnFull"
			case l.OncePer > 0:
				bad = "OncePer"
			}
			if bad != "" {
				return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("run limit %q: %s is for step limits (StepConfig.Limits); a run limit takes Concurrency, Ordered and Rates", l.Name, bad)}
			}
			for _, o := range d.runLimits {
				if o.Name == l.Name {
					return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("run limit %q declared twice", l.Name)}
				}
			}
			d.runLimits = append(d.runLimits, l)
		}
		return nil
	})
}

// RunLimits returns the limits d's runs take as a whole (RunLimits).
func (d *Definition) RunLimits() []Limit { return d.runLimits }

// validateRunLimits refuses a step limit that shares a run limit's name.
func (d *Definition) validateRunLimits() error {
	if len(d.runLimits) == 0 {
		return nil
	}
	for _, sl := range d.StepLimits() {
		for _, l := range sl.Limits {
			for _, r := range d.runLimits {
				if r.Name == l.Name {
					return &DefinitionError{Reactor: d.name, Step: sl.Step,
						Reason: fmt.Sprintf("declares limit %q, which the run holds already (RunLimits): it would wait for its own run", l.Name)}
				}
			}
		}
	}
	return nil
}

// withRunLimits runs fn (an execution) holding the run's own limits, if
// its definition declares any: taken first (a full one returns its
// *LimitError after the in-process wait, the run untouched), then parked
// or released as fn leaves the run.
func (x *execution) withRunLimits(ctx context.Context, fn func(context.Context) (*Result, error)) (*Result, error) {
	if x.def == nil || len(x.def.runLimits) == 0 {
		return fn(ctx)
	}
	if x.undoing && !x.st.RunAdmitted {
		// Cancelled before it ever ran under its limits (waiting for them,
		// or still queued): nothing it did needs them to be undone.
		return fn(ctx)
	}
	h, err := x.takeRunLimits(ctx)
	if _, full := errors.AsType[*LimitError](err); full && !x.st.RunAdmitted {
		if cancelled, _ := x.cancelRequested(ctx); cancelled {
			// Cancelled while it waits for its limits, before it ever ran
			// under them: it rolls back (nothing to undo) without them,
			// before any step runs (x.cancel is set).
			return fn(ctx)
		}
	}
	if err != nil {
		_ = x.lease.Release(context.WithoutCancel(ctx))
		if le, ok := errors.AsType[*LimitError](err); ok {
			return nil, le
		}
		return nil, err
	}
	res, err := fn(ctx)
	h.leave(ctx, x, err)
	return res, err
}

// takeRunLimits takes the run's own limits for this execution.
func (x *execution) takeRunLimits(ctx context.Context) (*limitHolds, error) {
	wants, err := limitWants(x.def.runLimits, Args(x.st.Inputs))
	if err != nil {
		return nil, fmt.Errorf("reactor: run %s: run limits: %w", x.st.ID, err)
	}
	c := limitCall{reactor: x.def.name, path: runPath, rates: !x.st.RunAdmitted,
		fixed: strconv.FormatInt(x.st.CreatedAt, 36) + ".run"}
	h, err := x.waitLimits(ctx, c, wants)
	if err == nil {
		x.st.RunAdmitted = true // saved with the execution's first write
	}
	return h, err
}

// leave ends this execution's hold of the run's limits: released when the
// run ended (its terminal write is done), parked when it waits (paused,
// parked on a map, at a checkpoint), left alone when another process took
// the run (its execution holds the same holder).
func (h *limitHolds) leave(ctx context.Context, x *execution, err error) {
	if h == nil {
		return
	}
	close(h.stop)
	h.done.Wait()
	bg := context.WithoutCancel(ctx)
	switch {
	case errors.Is(err, ErrLockLost):
	case err == nil && x.st.Status.Terminal():
		for _, s := range h.slots {
			if s.release(bg, h.st) == nil {
				h.waits.wake(s.key)
			}
		}
	default:
		for _, s := range h.slots {
			if ok, perr := h.st.ParkSlot(bg, s.key, s.holder); perr == nil && !ok {
				x.e.log.Warn("a run's own limit slot was lost before the run parked it (its lease ended first); the run takes it again when it resumes",
					"event", "reactor.limit.lost", "run", x.st.ID, "limit_key", s.key)
			}
		}
	}
}

// placeOrdered takes run st's place in the queue of each Ordered run limit
// of def, at enqueue: scored by its creation time, as its first execution
// would. A place not renewed within the limit's lease (the run waits that
// long in asynq's queue before a worker picks it up) lapses, as a dead
// waiter's does, so a key is never blocked by a run that does not come.
func (e *Engine) placeOrdered(ctx context.Context, def *Definition, st *runState) error {
	if !slices.ContainsFunc(def.runLimits, func(l Limit) bool { return l.Ordered }) {
		return nil
	}
	wants, err := limitWants(def.runLimits, Args(st.Inputs))
	if err != nil {
		return fmt.Errorf("reactor: run %s: run limits: %w", st.ID, err)
	}
	for _, w := range wants {
		if !w.l.Ordered {
			continue
		}
		if err := e.store.PlaceOrdered(ctx, e.store.Keys().Slots(w.l.Name, w.key), st.ID+"|"+runPath, st.CreatedAt, w.l.lease()); err != nil {
			return err
		}
	}
	return nil
}
