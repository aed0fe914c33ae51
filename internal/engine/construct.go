package engine

import (
	"context"
	"errors"
	"fmt"
)

// Construct is a step kind with a protocol of its own, declared with
// ConstructStep. Package mapstep implements map steps with it; reactor knows
// nothing of maps.
//
// A construct may hand its work to workers: Run returns Dispatch() after
// saving what it decided (SaveState) and enqueueing the work. The run is then
// saved and released, and the caller gets a dispatched Result. When the owner
// run is resumed, Run is called again with the saved state and must adopt the
// outcome idempotently: return the result, or Dispatch() again without
// dispatching anything.
type Construct interface {
	// Run executes the step forward and returns its encoded result. A
	// *Failure or a Permanent error fails the step; any other error is
	// infrastructure trouble: the run stops at its last checkpoint, to be
	// retried, and is not rolled back for it.
	Run(ctx context.Context, c *ConstructContext) (Raw, error)
	// Undo rolls back the completed step (State holds what Run saved). A
	// *RollbackFailures, *Failure or Permanent error is recorded as the
	// step's rollback failure; any other error stops the rollback at its
	// checkpoint, to be resumed, with the entry still on the stack.
	Undo(ctx context.Context, c *ConstructContext) error
	// Compensate cleans up after the step's own failure; errors are
	// classified as for Undo.
	Compensate(ctx context.Context, c *ConstructContext, cause error) error
}

// ConstructContext is what a Construct sees of the run executing it.
type ConstructContext struct {
	// Engine is the engine executing the run.
	Engine *Engine
	// OwnerID and OwnerReactor name the top-level run (the root of a
	// composed tree): all resumes go to it.
	OwnerID, OwnerReactor string
	// OwnerDefinition is the fingerprint of the definition the owner run
	// started with (Definition.Fingerprint): what a worker must have to
	// take the construct's work.
	OwnerDefinition string
	// RunID is the id of the run whose step this is (the owner, or a run
	// nested in it).
	RunID string
	// Step is the step's path in the owner ("book/items").
	Step string
	// Args are the step's resolved arguments (encoded map).
	Args Raw
	// Nested is true when the run is itself an element of a construct
	// (a map inside a map element runs inline).
	Nested bool
	// TraceID is the run's trace id (RunInfo.TraceID), for the construct
	// to hand to the element runs it starts.
	TraceID string
	// Sensitive is true when the run is a sensitive run (Run.Sensitive):
	// the element runs the construct starts, whose inputs come from it,
	// are to be sensitive too (mapstep hands it on).
	Sensitive bool

	state Raw
	gen   int // the rollback generation (RollbackGeneration)
	// queue is the owner run's queue (its wake-ups go there; "" for the
	// Enqueuer's own).
	queue string
	// windowAt is the server time (ms) at which the run's rollback judges
	// undo windows (UndoWindowAt).
	windowAt int64
	save     func(ctx context.Context, state Raw) error
	// cancel asks whether a cancel was requested (control.go); nil outside Run.
	cancel func(ctx context.Context) (bool, error)
	// hold records what the construct's parts hold (Hold).
	hold func(Held)
}

// Hold reports what the construct's parts (a map's element runs) still
// hold after their rollbacks, over every rollback generation: the run keeps
// it with the step (saved with its next write). While any part waits for a
// person the run waits too (it never expires and Engine.NeedsHuman lists
// it), and while any effect is held Engine.Retry refuses the run. A
// construct calls it when its parts may have rolled back: at the end of its
// own rollback, and when its Run completes or fails with parts that rolled
// themselves back. A zero Held clears it.
func (c *ConstructContext) Hold(h Held) {
	if c.hold != nil {
		c.hold(h)
	}
}

// hold records h as what the parts of construct step path hold.
func (x *execution) hold(path string, h Held) {
	if h.IsZero() {
		delete(x.st.Held, path)
		return
	}
	if x.st.Held == nil {
		x.st.Held = map[string]Held{}
	}
	x.st.Held[path] = h
}

// State returns what the construct saved for this step (nil at first).
func (c *ConstructContext) State() Raw { return c.state }

// SaveState stores state with the run and saves the run (fenced) before
// returning: decide, save, then act.
func (c *ConstructContext) SaveState(ctx context.Context, state Raw) error {
	if c.save == nil {
		return errors.New("reactor: SaveState is only available in Run")
	}
	c.state = state
	return c.save(ctx, state)
}

// RollbackHandedOff is the control signal a Construct's Undo or Compensate
// returns when it handed its rollback to workers (a fan-out map rolls back
// through one job per element). It is not a failure: the executor keeps the
// construct's entry on the undo stack, saves the run (rolling_back, with its
// rollback record) while it still holds the lock, then calls AfterSave, and
// releases the run. When the owner is resumed, the rollback carries on and
// calls the construct again, which adopts the settled outcome.
type RollbackHandedOff struct {
	// AfterSave runs after the owner's save, still under its lock: the
	// construct's half of the two-flag handshake (mark the hand-off, and
	// resume the owner if the work already settled).
	AfterSave func(ctx context.Context) error
}

func (*RollbackHandedOff) Error() string { return "reactor: rollback handed off to workers" }

// RollbackFailures is what a Construct's Undo or Compensate returns to
// report the rollback failures of its parts (a map's elements): each is
// recorded on the run's Failure as it is, with the same cap as any other.
type RollbackFailures struct {
	Failures []RollbackFailure
	// Omitted counts failures beyond those listed.
	Omitted int
	// OutOfWindow lists the parts' steps ("each[3]/reserve") that were
	// kept because their undo windows had closed. They are not failures:
	// a RollbackFailures with no Failures and no Omitted reports only
	// these, and the construct's undo counts as done.
	OutOfWindow []string
}

func (e *RollbackFailures) Error() string {
	n := len(e.Failures) + e.Omitted
	if len(e.Failures) == 0 {
		return fmt.Sprintf("reactor: %d rollback failure(s)", n)
	}
	return fmt.Sprintf("reactor: %d rollback failure(s), first: %s of %q: %s", n, e.Failures[0].Kind, e.Failures[0].Step, e.Failures[0].Message)
}

// dispatchSignal unwinds an execution whose construct handed work off.
type dispatchSignal struct{}

func (dispatchSignal) Error() string { return "reactor: step dispatched to workers" }

var errDispatch error = dispatchSignal{}

// Dispatch is what a Construct's Run returns after handing its work to
// workers. It is a control signal, not a failure.
func Dispatch() error { return errDispatch }

func isDispatch(err error) bool { return errors.Is(err, errDispatch) }

// ConstructConfig describes a construct step.
type ConstructConfig struct {
	// Args binds the construct's arguments.
	Args Bindings
	// After lists steps that must complete first.
	After []string
}

// ConstructStep declares a step run by a Construct.
func ConstructStep(name string, c Construct, cfg ConstructConfig) Part {
	return partFunc(func(d *Definition) error {
		if c == nil {
			return &DefinitionError{Reactor: d.name, Step: name, Reason: "nil construct"}
		}
		if v, ok := c.(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				return &DefinitionError{Reactor: d.name, Step: name, Reason: err.Error()}
			}
		}
		return d.addStep(&stepDef{name: name, kind: kindConstruct, args: cfg.Args, after: cfg.After, construct: c})
	})
}

func (x *execution) constructContext(f *frame, s *stepDef, args Raw) *ConstructContext {
	return &ConstructContext{
		Engine: x.e, OwnerID: x.st.ID, OwnerReactor: x.st.Reactor, OwnerDefinition: x.st.Def, RunID: f.st.ID,
		Step: f.path + s.name, Args: args, Nested: x.element, TraceID: x.st.Trace, Sensitive: f.st.Sensitive || x.st.Sensitive,
		state: f.st.Constructs[s.name], gen: x.rollbackGen(), windowAt: rollbackWindowAt(f),
		hold: func(h Held) { x.hold(f.path+s.name, h) }, queue: x.st.Queue,
	}
}

// rollbackWindowAt is the time f's rollback judges undo windows at (0 when
// it is not rolling back, or judged none).
func rollbackWindowAt(f *frame) int64 {
	if f.st.Rollback == nil {
		return 0
	}
	return f.st.Rollback.WindowAt
}

// runConstruct runs a construct step forward.
func (x *execution) runConstruct(ctx context.Context, f *frame, s *stepDef, args Raw) (stepOutcome, error) {
	path := f.path + s.name
	cc := x.constructContext(f, s, args)
	cc.save = func(ctx context.Context, state Raw) error {
		if f.st.Constructs == nil {
			f.st.Constructs = map[string]Raw{}
		}
		f.st.Constructs[s.name] = state
		return x.checkpoint(ctx)
	}
	cc.cancel = x.cancelRequested
	x.emit(ctx, Event{Kind: EventStepStarted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1})
	var val Raw
	err := x.call(ctx, Call{Kind: CallRun, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1}, 0, func(cctx context.Context) error {
		var rerr error
		val, rerr = s.construct.Run(cctx, cc)
		return rerr
	})
	if ierr := interrupted(ctx); ierr != nil {
		return stepOutcome{}, ierr
	}
	if isDispatch(err) {
		return stepOutcome{}, errDispatch
	}
	if errors.Is(err, ErrCancelRequested) {
		// Stopped between its parts for a cancel: its saved state goes on
		// the undo stack (startRollback), so what it did is undone.
		return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
	}
	if err != nil && x.pastDeadline(0) {
		// Its parts (an inline map's elements) were cut short by the run's
		// deadline, which their contexts carried: a failure of the run,
		// not trouble to retry.
		err = x.deadlineError(path, err)
	}
	var halt *haltError
	switch {
	case err == nil:
		f.st.Steps[s.name] = &stepRec{State: stepDone, Value: val, Attempts: 1}
		f.st.Seq++
		// The entry's snapshot is the construct's state, never its
		// arguments: a map's entry carries its map id, not its source.
		f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: s.name, Args: cc.state, Status: RollbackPending,
			At: x.stamp(ctx, f.def)})
		delete(f.st.Constructs, s.name)
		x.emit(ctx, Event{Kind: EventStepCompleted, RunID: x.st.ID, Reactor: f.def.name, Step: path})
		return stepOutcome{kind: outOK}, nil
	case errors.As(err, &halt):
		return stepOutcome{kind: outHalt, reason: halt.reason}, nil
	}
	var fl *Failure
	if !errors.As(err, &fl) && !IsPermanent(err) {
		// Not the construct's verdict but trouble reaching it (Redis, a
		// held element lock): the run stays at its checkpoint and is
		// retried, never rolled back for it.
		return stepOutcome{}, fmt.Errorf("reactor: step %q: %w", path, err)
	}
	x.emit(ctx, Event{Kind: EventStepFailed, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1, Err: err})
	return stepOutcome{kind: outFail, failure: asFailure(path, err), err: err}, nil
}

// asFailure keeps a *Failure a construct returns (an element's failure) as
// it is, and wraps anything else.
func asFailure(path string, err error) *Failure {
	var fl *Failure
	if errors.As(err, &fl) {
		c := fl.clone()
		if c.Step == "" {
			c.Step = path
		}
		return c
	}
	return newFailure(path, err)
}

// ConstructAt returns the construct of the step at path ("items", or
// "book/items" inside a composed child), so that a worker can reach a
// construct's configuration from its owner's definition.
func (d *Definition) constructAt(path string) (Construct, bool) {
	s := d.stepAt(path)
	if s == nil || s.construct == nil {
		return nil, false
	}
	return s.construct, true
}
