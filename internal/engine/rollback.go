package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
)

// startRollback records the decision to roll back and saves it before the
// first compensation side effect, so a crash can never send the failed step
// back to be retried while its predecessors are being undone. Then it rolls
// back.
func (x *execution) startRollback(ctx context.Context, f *frame, trigger RollbackTrigger, step string, failure *Failure, cause error) (*frameResult, error) {
	// A run paused at an interrupt (cancelled, or out of time) stops
	// waiting first: a payload that comes later is told so.
	if err := x.closePause(ctx); err != nil {
		return nil, err
	}
	// Composed children still in progress (a run aborted or crashed inside
	// a child, then undone or cancelled) fold their completed entries onto
	// the stack, so the rollback undoes them first.
	for _, name := range sortedKeys(f.st.Children) {
		foldChild(f.def.byName[name].childDef(), f.st, name, f.st.Children[name])
	}
	// So do constructs still in progress (a map still running forward when
	// the run is cancelled, or an inline map cut short): each goes on top of
	// the stack with its saved state, and its Undo stops and rolls it back.
	// A failing construct keeps its state for its Compensate instead.
	for _, name := range sortedKeys(f.st.Constructs) {
		if trigger == TriggerFailure && name == step {
			continue
		}
		f.st.Seq++
		f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: name, Args: f.st.Constructs[name], Status: RollbackPending})
		delete(f.st.Constructs, name)
	}
	// The first generation, or the next after targeted undos (UndoSteps)
	// of a run now undone as a whole; a re-triggered rollback numbers its
	// own.
	gen := 1
	if f.st.RbGen > 0 {
		gen = f.st.rollbackGen() + 1
		if f.st.Retry == nil {
			f.st.Retry = &rollbackRetry{}
		}
		f.st.Retry.Gen = gen
	}
	// Entries still on the stack are applied, whatever an earlier
	// targeted undo left on them.
	resetLedger(f.st.Ledger)
	// A step whose Run may have been called without its result being
	// recorded is the newest thing the run did: it goes on top.
	if f.notStarted {
		if in := f.st.Intent; in != nil {
			x.audit(auditRec{kind: AuditDiscarded, step: f.path + in.Step, attempt: in.Attempt, generation: gen})
		}
		f.st.Intent = nil
	}
	pushInterrupted(f.def, f.st)
	f.st.Status = StatusRollingBack
	f.st.Rollback = &RollbackRecord{Trigger: trigger, Step: step, Failure: failure, Generation: gen}
	f.st.RbGen = gen
	// Audited after the entries pushed above (save audits them first as
	// eligible): the rollback starts over the whole stack.
	x.auditEligible(f.st, f.path)
	started := auditRec{kind: AuditRollbackStarted, trigger: trigger, generation: gen}
	if step != "" {
		started.step = f.path + step
	}
	x.audit(started)
	// An element undone by its map's rollback saves nothing before its
	// first undo: its map's rollback task carries its forward outcome, so
	// a crash before the first undone entry is saved finds the element as
	// it was and decides the same again (the entry in flight is undone at
	// least once, as any entry in flight is); the rollback's start and its
	// audit entries ride on the first undo's checkpoint. A forward failure
	// (or anything else) saves first: its failed step must never be retried
	// while its predecessors are undone.
	if !(x.element && trigger == TriggerUndo) {
		if err := x.checkpoint(ctx); err != nil {
			return nil, err
		}
	}
	x.emit(ctx, Event{Kind: EventRollbackStarted, RunID: x.st.ID, Reactor: f.def.name, Step: trimPath(f.path), Err: failure.errOrNil()})
	return x.rollback(ctx, f, cause)
}

// undo rolls back a finished root run on request; it ends cancelled.
func (x *execution) undo(ctx context.Context, msg string) (*Result, error) {
	x.undoing = true
	return x.traceRun(ctx, func(ctx context.Context) (*Result, error) { return x.undoTraced(ctx, msg) })
}

func (x *execution) undoTraced(ctx context.Context, msg string) (*Result, error) {
	runCtx := x.lease.Keep(ctx)
	defer x.lease.Stop()
	_, err := x.startRollback(runCtx, &frame{def: x.def, st: x.st, root: true}, TriggerUndo, "", newCancelFailure(msg), nil)
	x.lease.Stop()
	return x.conclude(ctx, err)
}

// rollback compensates the failing step (once) and undoes the ledger newest
// first, saving after every undone entry, then ends the frame failed or
// cancelled. It resumes where a crashed rollback stopped: entries pop only
// after their undo returned and the pop was saved.
func (x *execution) rollback(ctx context.Context, f *frame, cause error) (*frameResult, error) {
	rb := f.st.Rollback
	if rb == nil { // a state saved mid-rollback always has its record
		return nil, fmt.Errorf("reactor: run %s is rolling_back without a rollback record", x.st.ID)
	}
	if rb.Failure == nil {
		rb.Failure = newCancelFailure("rolled back")
	}
	if err := x.judgeWindow(ctx, f, x.windowNow); err != nil {
		return nil, err
	}
	if rb.Trigger == TriggerFailure && !rb.Compensated && rb.Step != "" {
		called, err := x.compensate(ctx, f, rb, cause)
		if err != nil {
			return nil, err
		}
		rb.Compensated = true
		if called {
			if err := x.checkpoint(ctx); err != nil {
				return nil, err
			}
		}
	}
	if rb.Trigger == TriggerTargeted {
		if err := x.rollbackTargets(ctx, f); err != nil {
			return nil, err
		}
		return x.finishTargeted(ctx, f)
	}
	for len(f.st.Ledger) > 0 {
		if lock.Lost(ctx) {
			return nil, ErrLockLost
		}
		e := f.st.Ledger[len(f.st.Ledger)-1]
		if f.undoPre[e.Ordinal] == nil {
			x.undoWave(ctx, f)       // independent entries on top, undone at once
			x.undoTasksAhead(ctx, f) // or, for task steps, their undo tasks started at once
		}
		// Completed steps without an Undo newer than e come first: they
		// are reported kept (no_compensation_registered), in their turn.
		// (A targeted undo reports only the steps it was asked for.)
		x.reportKept(f, e.Step)
		if err := x.undoEntry(ctx, f, f.def, e, f.path, f.key); err != nil {
			f.undoPre = nil
			return nil, err
		}
		f.st.Ledger = f.st.Ledger[:len(f.st.Ledger)-1]
		// The pops of a group undone at once share one checkpoint; the
		// last pop of the root rides on the terminal write.
		batched := len(f.st.Ledger) > 0 && f.undoPre[f.st.Ledger[len(f.st.Ledger)-1].Ordinal] != nil
		if (len(f.st.Ledger) > 0 || !f.root) && !batched {
			if err := x.checkpoint(ctx); err != nil {
				return nil, err
			}
		}
	}
	x.reportKept(f, "")
	f.st.Failure = rb.Failure
	f.st.Rollback = nil
	x.audit(auditRec{kind: AuditRollbackCompleted, step: trimPath(f.path), generation: rb.generation(),
		outcome: SummarizeRollback(x.generationEntries(f.st, rb.generation())).Outcome})
	ev := EventRunFailed
	f.st.Status = StatusFailed
	if rb.Trigger == TriggerUndo {
		f.st.Status, ev = StatusCancelled, EventRunCancelled
	}
	return x.finish(ctx, f, ev)
}

// compensate calls the failing step's Compensate. It reports whether a user
// function ran.
func (x *execution) compensate(ctx context.Context, f *frame, rb *RollbackRecord, cause error) (bool, error) {
	s := f.def.byName[rb.Step]
	path := f.path + rb.Step
	if s == nil || s.kind == kindCompose {
		// A composed child rolled itself back before its failure surfaced.
		return false, nil
	}
	if s.compensate == nil && s.kind != kindConstruct {
		x.settle(f, StepRollback{Step: path, Kind: ActionCompensate, Status: RollbackNoCompensation,
			At: x.e.now().UnixMilli(), Generation: rb.generation()})
		x.audit(auditRec{kind: AuditNoCompensation, step: path, status: RollbackNoCompensation, action: ActionNone, generation: rb.generation()})
		return false, nil
	}
	if cause == nil { // resumed: rebuild the cause from the saved failure
		cause = rb.Failure
		if u := rb.Failure.Unwrap(); u != nil {
			cause = u
		}
	}
	args, err := resolveArgs(f.def, s, f.st)
	began := time.Now()
	startedAt := x.e.now().UnixMilli()
	if err == nil {
		err = x.callUndo(ctx, Call{Kind: CallCompensate, RunID: x.st.ID, Reactor: f.def.name, Step: path}, x.undoTimeout(s), func(cctx context.Context) error {
			if s.kind == kindConstruct {
				return s.construct.Compensate(cctx, x.constructContext(f, s, args), cause)
			}
			return s.compensate(cctx, args, cause)
		})
	}
	if ierr := rollbackInterrupted(ctx); ierr != nil {
		return false, ierr
	}
	if ho := handedOff(err); ho != nil {
		return false, x.handOffRollback(ctx, ho)
	}
	if s.kind == kindConstruct && transient(err) {
		// Trouble reaching the construct's parts (Redis, an enqueue), not
		// their verdict: stop at the checkpoint; the rollback resumes.
		return false, fmt.Errorf("reactor: compensate %q: %w", path, err)
	}
	if s.kind == kindConstruct {
		err = x.keptParts(f, err)
	}
	rec := StepRollback{Step: path, Kind: ActionCompensate, Status: RollbackCompensated, At: x.e.now().UnixMilli(),
		StartedAt: startedAt, Attempt: x.attemptOf(entryID(path, 0)), Generation: rb.generation()}
	x.auditCompensating(rec, 0)
	if s.kind == kindConstruct {
		rec.Status = x.partsState(path, err)
	}
	if err != nil {
		rec.Reason, rec.Message = codeOf(err), err.Error()
		if s.kind != kindConstruct {
			rec.Status = RollbackFailed
		}
		rb.CompensationError = err.Error()
		x.keepFailedCompensate(f, s, args) // retrigger.go
		x.addRollbackFailures(rb, err, RollbackFailure{Step: path, Kind: ActionCompensate, Reason: rec.Reason, Message: rec.Message})
		x.emit(ctx, Event{Kind: EventCompensateFail, RunID: x.st.ID, Reactor: f.def.name, Step: path, Err: err, Duration: time.Since(began)})
	} else {
		x.emit(ctx, Event{Kind: EventStepCompensated, RunID: x.st.ID, Reactor: f.def.name, Step: path, Duration: time.Since(began)})
	}
	x.auditOutcome(rec, 0)
	x.settle(f, rec)
	return true, nil
}

// undoEntry undoes one ledger entry of definition d; base is the key of
// the frame or compose entry it is in (entryRec.Key). A compose entry undoes
// its folded child entries newest first, saving after each.
func (x *execution) undoEntry(ctx context.Context, f *frame, d *Definition, e *LedgerEntry, prefix string, base []int) error {
	s := d.byName[e.Step]
	path := prefix + e.Step
	key := append(slices.Clip(base), e.Ordinal)
	if s != nil && s.kind == kindCompose {
		for len(e.Children) > 0 {
			if lock.Lost(ctx) {
				return ErrLockLost
			}
			c := e.Children[len(e.Children)-1]
			x.reportKeptChild(f, s.child, e, path+"/", c.Step)
			if err := x.undoEntry(ctx, f, s.child, c, path+"/", key); err != nil {
				return err
			}
			e.Children = e.Children[:len(e.Children)-1]
			if len(e.Children) > 0 {
				if err := x.checkpoint(ctx); err != nil {
					return err
				}
			}
		}
		x.reportKeptChild(f, s.child, e, path+"/", "")
		e.Status = RollbackCompensated
		return nil
	}
	// The entry's record in the book, made when a rollback first reaches
	// it (its key from where it is on the stack then; a re-triggered
	// rollback's stack is rebuilt, so the first key stands).
	own := x.st.book(entryID(path, e.Ordinal), path, e.Ordinal, key, e.Resource)
	if e.Interrupted {
		return x.compensateInterrupted(ctx, f, d, s, e, path)
	}
	if e.Status == RollbackOutOfWindow {
		// Judged past its undo window when the rollback started: kept,
		// nothing called.
		rec := StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionUndo, Status: RollbackOutOfWindow, At: x.e.now().UnixMilli(),
			Generation: f.st.Rollback.generation(), Resource: e.Resource}
		x.auditOutcome(rec, e.Ordinal)
		x.settle(f, rec)
		return nil
	}
	if by, leftApplied, blocked := x.blocker(e, own); blocked && e.Status != RollbackCompensating {
		x.recordBlocked(ctx, f, d, e, path, by, leftApplied)
		return nil
	}
	if s != nil && s.guard != nil && e.Effect != nil {
		return x.guardedUndo(ctx, f, d, s, e, path)
	}
	var err error
	began := time.Now()
	startedAt := x.e.now().UnixMilli()
	called := false
	if s == nil || (s.undo == nil && s.kind != kindConstruct) {
		err = fmt.Errorf("reactor: step %q is no longer undoable in definition %q", e.Step, d.name)
	} else {
		// A limited step's undo takes its limits as its attempts do (a
		// lock's holder undoes under the lock): a full one leaves the
		// entry on the stack and the rollback waits at its checkpoint.
		holds, lerr := x.takeLimits(ctx, &frame{def: d, st: f.st, path: prefix}, s, e.Args, true)
		if le, ok := errors.AsType[*LimitError](lerr); ok {
			return &errLimited{le: le}
		}
		if lerr != nil {
			if ierr := rollbackInterrupted(ctx); ierr != nil {
				return ierr
			}
			if !IsPermanent(lerr) {
				return lerr
			}
			// A key that cannot be computed: undone without its limits
			// rather than never.
			x.e.log.Warn("a step's undo ran without its limits: their key could not be computed",
				"event", "reactor.limit.key_failed", "run", x.st.ID, "step", path, "error", lerr)
		}
		defer holds.release(ctx)
		called = true
		if e.Status != RollbackCompensating { // not a construct adopting its hand-off
			x.auditCompensating(StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionUndo,
				Attempt: x.attemptOf(entryID(path, e.Ordinal)), Generation: f.st.Rollback.generation()}, e.Ordinal)
		}
		e.Status = RollbackCompensating
		if u := f.undoPre[e.Ordinal]; u != nil && d == f.def {
			// Called in a group at once (concurrent.go).
			delete(f.undoPre, e.Ordinal)
			err, began, startedAt = u.err, u.began, u.startedAt
		} else {
			err = x.callUndo(ctx, Call{Kind: CallUndo, RunID: x.st.ID, Reactor: d.name, Step: path}, x.undoTimeout(s), func(cctx context.Context) error {
				if s.kind == kindConstruct {
					cc := &ConstructContext{Engine: x.e, OwnerID: x.st.ID, OwnerReactor: x.st.Reactor, OwnerDefinition: x.st.Def, RunID: f.st.ID,
						Step: path, Nested: x.element, TraceID: x.st.Trace, Sensitive: f.st.Sensitive || x.st.Sensitive, state: e.Args, gen: x.rollbackGen(),
						windowAt: rollbackWindowAt(f), hold: func(h Held) { x.hold(path, h) }, queue: x.st.Queue}
					return s.construct.Undo(cctx, cc)
				}
				return s.undo(cctx, e.Args, e.Result)
			})
		}
		// An undo cut short by the caller or a lost lock stays on the stack
		// (pending) for whoever resumes the rollback.
		if ierr := rollbackInterrupted(ctx); ierr != nil {
			e.Status = RollbackPending
			return ierr
		}
		if ho := handedOff(err); ho != nil {
			// The entry stays on the stack until the construct adopts.
			e.Status = RollbackCompensating
			return x.handOffRollback(ctx, ho)
		}
		if s.kind == kindConstruct && transient(err) {
			e.Status = RollbackPending
			return fmt.Errorf("reactor: undo %q: %w", path, err)
		}
		if s.kind == kindConstruct {
			err = x.keptParts(f, err)
		}
	}
	rec := StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionUndo, Status: RollbackCompensated, At: x.e.now().UnixMilli(),
		Generation: f.st.Rollback.generation(), Resource: e.Resource}
	if called {
		rec.StartedAt, rec.Attempt = startedAt, x.attemptOf(entryID(path, e.Ordinal))
	}
	x.recordEntry(ctx, f, d, e, rec, err, "", time.Since(began), EventStepUndone, EventStepUndoFailed)
	return nil
}

// recordEntry records what the undo (or compensate) of ledger entry e did:
// its status, the per-step rollback report, a rollback failure when err is
// set (with reason, or err's code), and the event.
func (x *execution) recordEntry(ctx context.Context, f *frame, d *Definition, e *LedgerEntry, rec StepRollback, err error, reason string,
	took time.Duration, done, failed EventKind) {
	if err != nil {
		if reason == "" {
			reason = codeOf(err)
		}
		e.Status = RollbackFailed
		rec.Status, rec.Reason, rec.Message = RollbackFailed, reason, err.Error()
		if s := d.byName[e.Step]; s != nil && s.kind == kindConstruct {
			// A construct's entry stands as its parts do: waiting for a
			// person when their only failures are conflicts.
			e.Status = x.partsState(rec.Step, err)
			rec.Status = e.Status
		}
		x.keepFailed(rec.Step, e) // retrigger.go
		x.addRollbackFailures(f.st.Rollback, err, RollbackFailure{Step: rec.Step, Kind: rec.Kind, Reason: rec.Reason, Message: rec.Message})
		x.emit(ctx, Event{Kind: failed, RunID: x.st.ID, Reactor: d.name, Step: rec.Step, Err: err, Duration: took})
	} else {
		e.Status = RollbackCompensated
		if s := d.byName[e.Step]; s != nil && s.kind == kindConstruct {
			e.Status = x.partsState(rec.Step, nil) // what its parts still hold
			rec.Status = e.Status
		}
		x.emit(ctx, Event{Kind: done, RunID: x.st.ID, Reactor: d.name, Step: rec.Step, Duration: took})
	}
	x.auditOutcome(rec, e.Ordinal)
	x.settle(f, rec)
}

// reportKept records, as kept (no_compensation_registered), the completed
// plain steps of f without an Undo that completed after step newer (every
// remaining one when newer is ""), newest first, once per rollback
// generation. Steps run one at a time in definition order, so that order is
// their completion order: such steps need no ledger entry on the forward
// path, their step records say all there is. A newer step no longer in the
// definition reports nothing.
func (x *execution) reportKept(f *frame, newer string) {
	order := f.def.order
	from := 0
	if newer != "" {
		from = slices.IndexFunc(order, func(s *stepDef) bool { return s.name == newer })
		if from < 0 {
			return
		}
		from++
	}
	gen := f.st.Rollback.generation()
	for i := len(order) - 1; i >= from; i-- {
		s := order[i]
		rec := f.st.Steps[s.name]
		if s.kind != kindPlain || s.undo != nil || s.guard != nil || rec == nil || rec.State != stepDone {
			continue
		}
		path := f.path + s.name
		if slices.ContainsFunc(f.st.Undone, func(u StepRollback) bool {
			return u.Step == path && u.Status == RollbackNoCompensation && max(u.Generation, 1) == gen
		}) {
			continue
		}
		u := StepRollback{Step: path, Kind: ActionUndo, Status: RollbackNoCompensation, At: x.e.now().UnixMilli(), Generation: gen}
		x.auditOutcome(u, 0)
		f.st.Undone = append(f.st.Undone, u)
	}
}

// reportKeptChild is reportKept for the steps of composed child d folded
// into compose entry e (their records are gone; e.Kept lists them): those
// that completed after child step newer ("" : all that are left), newest
// first, once per rollback generation.
func (x *execution) reportKeptChild(f *frame, d *Definition, e *LedgerEntry, prefix, newer string) {
	if len(e.Kept) == 0 || d == nil {
		return
	}
	pos := func(name string) int {
		return slices.IndexFunc(d.order, func(s *stepDef) bool { return s.name == name })
	}
	from := -1
	if newer != "" {
		if from = pos(newer); from < 0 {
			return
		}
	}
	gen := f.st.Rollback.generation()
	for i := len(e.Kept) - 1; i >= 0; i-- {
		name := e.Kept[i]
		if pos(name) <= from {
			continue
		}
		path := prefix + name
		if slices.ContainsFunc(f.st.Undone, func(u StepRollback) bool {
			return u.Step == path && u.Status == RollbackNoCompensation && max(u.Generation, 1) == gen
		}) {
			continue
		}
		u := StepRollback{Step: path, Kind: ActionUndo, Status: RollbackNoCompensation, At: x.e.now().UnixMilli(), Generation: gen}
		x.auditOutcome(u, 0)
		f.st.Undone = append(f.st.Undone, u)
	}
}

// keptSteps lists the plain steps of definition d that completed in st
// without an Undo, in definition (completion) order.
func keptSteps(d *Definition, st *runState) []string {
	if d == nil {
		return nil
	}
	var out []string
	for _, s := range d.order {
		if rec := st.Steps[s.name]; s.kind == kindPlain && s.undo == nil && s.guard == nil && rec != nil && rec.State == stepDone {
			out = append(out, s.name)
		}
	}
	return out
}

// attemptOf is the attempt number of the next call of entry id's Undo or
// Compensate: one more than the calls its book record counts.
func (x *execution) attemptOf(id string) int {
	if r := x.st.entry(id); r != nil {
		return r.Attempts + 1
	}
	return 1
}

// ErrStepInterrupted is the cause a step's Compensate receives when the
// step's Run was called but its result was never recorded: its process died,
// or the run was cut short mid-step. The effect may or may not have happened,
// so the Compensate must tolerate both (as a null compensation does).
var ErrStepInterrupted = errors.New("reactor: the step was interrupted before its result was recorded; its effect may or may not have happened")

// reasonInterrupted is the rollback failure reason of an interrupted step
// that has an Undo but no Compensate: nothing could undo what it may have
// done.
const reasonInterrupted = "reactor.step_interrupted"

// compensateInterrupted rolls back an interrupted step (see LedgerEntry's
// Interrupted): its Compensate is called with ErrStepInterrupted. Without
// one, a step that has an Undo declared an effect to reverse, and its
// interruption is reported as a rollback failure; a step with neither has
// nothing to reverse.
func (x *execution) compensateInterrupted(ctx context.Context, f *frame, d *Definition, s *stepDef, e *LedgerEntry, path string) error {
	rec := StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionCompensate, Status: RollbackCompensated, At: x.e.now().UnixMilli(),
		Generation: f.st.Rollback.generation()}
	var err error
	began := time.Now()
	switch {
	case s == nil:
		err = fmt.Errorf("reactor: step %q was interrupted and is no longer in definition %q; whatever it did was not undone", e.Step, d.name)
	case s.compensate != nil:
		rec.StartedAt, rec.Attempt = x.e.now().UnixMilli(), x.attemptOf(entryID(path, e.Ordinal))
		x.auditCompensating(rec, e.Ordinal)
		e.Status = RollbackCompensating
		err = x.callUndo(ctx, Call{Kind: CallCompensate, RunID: x.st.ID, Reactor: d.name, Step: path}, x.undoTimeout(s), func(cctx context.Context) error {
			return s.compensate(cctx, e.Args, ErrStepInterrupted)
		})
		rec.At = x.e.now().UnixMilli()
		if ierr := rollbackInterrupted(ctx); ierr != nil {
			e.Status = RollbackPending
			return ierr
		}
	case s.undo != nil || s.guard != nil:
		// It declared an effect to reverse (an Undo, or a guarded effect
		// it may have had without recording it).
		err = &interruptedError{step: path}
	default:
		e.Status, rec.Status = RollbackNoCompensation, RollbackNoCompensation
		x.auditOutcome(rec, e.Ordinal)
		x.settle(f, rec)
		return nil
	}
	reason := ""
	if _, ok := err.(*interruptedError); ok {
		reason = reasonInterrupted
	}
	x.recordEntry(ctx, f, d, e, rec, err, reason, time.Since(began), EventStepCompensated, EventCompensateFail)
	return nil
}

// interruptedError reports an interrupted step that has no Compensate.
type interruptedError struct{ step string }

func (e *interruptedError) Error() string {
	return fmt.Sprintf("reactor: step %q was interrupted before its result was recorded and has no Compensate; "+
		"whatever it did was not undone (give it a Compensate that tolerates an effect that never happened)", e.step)
}

func rollbackInterrupted(ctx context.Context) error {
	if lock.Lost(ctx) {
		return ErrLockLost
	}
	if ctx.Err() != nil {
		return fmt.Errorf("reactor: rollback interrupted; Resume the run (a worker's run sweeper does) to carry on from the last undone step: %w", context.Cause(ctx))
	}
	return nil
}

// callUndo calls an Undo or Compensate bounded by timeout (0: unbounded).
// The call's context ends at the timeout; one that ignores its context and
// does not return within a grace after it is abandoned (left to return on
// its own, its result ignored) and fails with a *TimeoutError, so a hung
// undo is compensation_failed instead of a rollback stuck for ever. An
// abandoned call may still finish its effect later: a retried rollback
// calls it again, as it would after a crash (undos run at least once).
func (x *execution) callUndo(ctx context.Context, c Call, timeout time.Duration, fn func(context.Context) error) error {
	if timeout <= 0 {
		return x.call(ctx, c, 0, fn)
	}
	done := make(chan error, 1)
	go func() { done <- x.call(ctx, c, timeout, fn) }()
	t := time.NewTimer(timeout + undoGrace(timeout))
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		x.e.log.Warn("an undo ignored its context past its timeout and was abandoned; it may still finish later",
			"event", "reactor.step.undo_abandoned", "run", c.RunID, "step", c.Step, "kind", string(c.Kind), "timeout", timeout.String())
		return fmt.Errorf("%w: %s did not return after its context ended: %w",
			&TimeoutError{Step: c.Step, Timeout: timeout.String()}, c.Kind, context.DeadlineExceeded)
	}
}

// undoGrace is how long an Undo may take to return after its timeout ended
// its context before it is abandoned.
func undoGrace(timeout time.Duration) time.Duration {
	return min(max(timeout/10, 50*time.Millisecond), 5*time.Second)
}

func (x *execution) undoTimeout(s *stepDef) time.Duration {
	if s != nil && s.kind == kindConstruct {
		return 0 // a construct bounds its own parts (a map: each element's undos)
	}
	if s != nil && s.undoTO > 0 {
		return s.undoTO
	}
	return x.e.cfg.UndoTimeout
}

// keptParts records, as out_of_window, the parts of construct step path
// that a *RollbackFailures err says were kept past their undo windows, and
// returns err, or nil when that was all it reported.
func (x *execution) keptParts(f *frame, err error) error {
	var many *RollbackFailures
	if !errors.As(err, &many) || len(many.OutOfWindow) == 0 {
		return err
	}
	gen := f.st.Rollback.generation()
	for _, p := range many.OutOfWindow {
		u := StepRollback{Step: p, Kind: ActionUndo, Status: RollbackOutOfWindow, At: x.e.now().UnixMilli(), Generation: gen}
		x.auditOutcome(u, 0)
		x.settle(f, u) // its effect stays in place: the book counts it
	}
	if len(many.Failures)+many.Omitted == 0 {
		return nil
	}
	return err
}

// addRollbackFailures records err: the failures a construct reported one by
// one (RollbackFailures), or else the single failure one.
func (x *execution) addRollbackFailures(rb *RollbackRecord, err error, one RollbackFailure) {
	var many *RollbackFailures
	if !errors.As(err, &many) {
		x.addRollbackFailure(rb, one)
		return
	}
	for _, f := range many.Failures {
		x.addRollbackFailure(rb, f)
	}
	rb.Failure.RollbackFailuresOmitted += many.Omitted
}

// transient reports whether a construct's undo error is infrastructure
// trouble rather than its verdict: a verdict is a *RollbackFailures, a
// *Failure or a Permanent error.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var many *RollbackFailures
	var fl *Failure
	return !errors.As(err, &many) && !errors.As(err, &fl) && !IsPermanent(err)
}

func handedOff(err error) *RollbackHandedOff {
	var ho *RollbackHandedOff
	if errors.As(err, &ho) {
		return ho
	}
	return nil
}

// handOffRollback saves the run while it still holds the lock, then lets the
// construct mark the hand-off, then unwinds the execution with the signal.
func (x *execution) handOffRollback(ctx context.Context, ho *RollbackHandedOff) error {
	if err := x.checkpoint(ctx); err != nil {
		return err
	}
	if ho.AfterSave != nil {
		if err := ho.AfterSave(context.WithoutCancel(ctx)); err != nil {
			return err
		}
	}
	x.emit(ctx, Event{Kind: EventRollbackHandedOff, RunID: x.st.ID, Reactor: x.st.Reactor, Status: x.st.Status})
	return ho
}

// partsState is the rollback status of construct entry path whose undo
// reported err (its parts' failures, nil for none), with what its parts
// hold (runState.Held): compensation_failed while a part failed or was
// blocked (a RetryRollback retries them), else needs_human while a part
// waits for a person, else left_applied when a person left some applied,
// else compensated.
func (x *execution) partsState(path string, err error) RollbackStatus {
	h := x.st.Held[path]
	var many *RollbackFailures
	if err != nil && !errors.As(err, &many) {
		return RollbackFailed
	}
	conflicts := 0
	if many != nil {
		for _, f := range many.Failures {
			switch f.Reason {
			case ReasonConflict:
				conflicts++
			case ReasonLeftApplied:
			default:
				return RollbackFailed
			}
		}
		if many.Omitted > 0 && h.Waiting+h.LeftApplied < conflicts+many.Omitted {
			return RollbackFailed // more omitted than the holds explain
		}
	}
	switch {
	case h.Failed > 0:
		return RollbackFailed
	case h.Waiting > 0 || conflicts > 0:
		return RollbackNeedsPerson
	case h.LeftApplied > 0:
		return RollbackLeftApplied
	}
	return RollbackCompensated
}

// addRollbackFailure keeps the first MaxRollbackFailures and counts the rest,
// so a huge rollback cannot grow the run without bound. The same failure
// twice (a map's failing element, reported by the step's failure and again
// by its rollback) is kept once.
func (x *execution) addRollbackFailure(rb *RollbackRecord, rf RollbackFailure) {
	if slices.ContainsFunc(rb.Failure.RollbackFailures, func(o RollbackFailure) bool {
		return o.Step == rf.Step && o.Kind == rf.Kind && o.Reason == rf.Reason && o.Run == rf.Run && o.Entry == rf.Entry
	}) {
		return
	}
	if len(rb.Failure.RollbackFailures) < x.e.cfg.MaxRollbackFailures {
		rb.Failure.RollbackFailures = append(rb.Failure.RollbackFailures, rf)
	} else {
		rb.Failure.RollbackFailuresOmitted++
	}
}

func codeOf(err error) string {
	var many *RollbackFailures
	if errors.As(err, &many) {
		// A construct's parts failed to undo: the code says what holds it,
		// a conflict first (it waits for a person).
		for _, f := range many.Failures {
			if f.Reason == ReasonConflict {
				return ReasonConflict
			}
		}
		for _, f := range many.Failures {
			if f.Reason != "" {
				return f.Reason
			}
		}
		return ReasonPartsFailed
	}
	code, _ := encodeError(err)
	return code
}

// ReasonPartsFailed is the reason of a construct's entry (a map step)
// whose parts failed to undo for reasons of their own (the owner's
// failure lists them).
const ReasonPartsFailed = "reactor.parts_failed"

// ---- compose

// runCompose runs a child definition inside step s. The child's state is
// embedded in the parent's (so every child checkpoint is a root write) and
// removed once the step settles; a completed child's ledger folds into the
// compose step's entry.
func (x *execution) runCompose(ctx context.Context, f *frame, s *stepDef, args Raw) (stepOutcome, error) {
	path := f.path + s.name
	cst := f.st.Children[s.name]
	fresh := cst == nil
	if cst == nil {
		var given map[string]Raw
		if err := codec.Unmarshal(args, &given); err != nil {
			err = Permanent(err)
			return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
		}
		inputs, err := s.child.checkInputs(given)
		if err != nil {
			err = Permanent(err)
			return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
		}
		cst = newState(x.st.ID+"/"+path, s.child, inputs, x.e.now())
		cst.Sensitive = cst.Sensitive || f.st.Sensitive // its inputs come from a sensitive run
		if f.st.Children == nil {
			f.st.Children = map[string]*runState{}
		}
		f.st.Children[s.name] = cst
	}
	x.emit(ctx, Event{Kind: EventStepStarted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: 1})
	res, err := x.runFrame(ctx, &frame{def: s.child, st: cst, path: path + "/", key: append(slices.Clip(f.key), f.st.Seq+1), notStarted: fresh})
	if err != nil {
		return stepOutcome{}, err
	}
	delete(f.st.Children, s.name)
	switch res.status {
	case StatusCompleted:
		f.st.Steps[s.name] = &stepRec{State: stepDone, Value: res.value, Attempts: 1}
		if kept := keptSteps(s.child, cst); len(cst.Ledger) > 0 || len(kept) > 0 {
			f.st.Seq++
			f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: s.name, Result: res.value, Status: RollbackPending,
				Children: cst.Ledger, Kept: kept})
		}
		x.emit(ctx, Event{Kind: EventStepCompleted, RunID: x.st.ID, Reactor: f.def.name, Step: path})
		return stepOutcome{kind: outOK}, nil
	case StatusHalted:
		// A halted child keeps what it completed, like a halted run: its
		// entries fold in so that undoing the parent undoes them.
		foldChild(s.child, f.st, s.name, cst)
		return stepOutcome{kind: outHalt, reason: res.reason}, nil
	case StatusCancelled:
		f.st.Undone = append(f.st.Undone, cst.Undone...)
		return stepOutcome{kind: outCancel, failure: res.failure.clone()}, nil
	default:
		// The child rolled itself back; its failure, with the child's
		// rollback failures, becomes the parent's.
		fl := res.failure.clone()
		f.st.Undone = append(f.st.Undone, cst.Undone...)
		return stepOutcome{kind: outFail, failure: fl, err: errors.Unwrap(fl)}, nil
	}
}

// foldChild moves child run cst of compose step name into st: its completed
// entries (its own in-progress children first) become one compose entry on
// top of st's ledger, its rollback report joins st's, and it leaves
// st.Children.
func foldChild(d *Definition, st *runState, name string, cst *runState) {
	for _, n := range sortedKeys(cst.Children) {
		var cd *Definition
		if d != nil {
			cd = d.byName[n].childDef()
		}
		foldChild(cd, cst, n, cst.Children[n])
	}
	// A child step cut short is the child's newest entry.
	pushInterrupted(d, cst)
	// The child's constructs in progress (a map still running, or kept for
	// its Compensate) are undone with it, like startRollback's own.
	for _, n := range sortedKeys(cst.Constructs) {
		cst.Seq++
		cst.Ledger = append(cst.Ledger, &LedgerEntry{Ordinal: cst.Seq, Step: n, Args: cst.Constructs[n], Status: RollbackPending})
		delete(cst.Constructs, n)
	}
	if kept := keptSteps(d, cst); len(cst.Ledger) > 0 || len(kept) > 0 {
		st.Seq++
		st.Ledger = append(st.Ledger, &LedgerEntry{Ordinal: st.Seq, Step: name, Status: RollbackPending, Children: cst.Ledger, Kept: kept})
	}
	st.Undone = append(st.Undone, cst.Undone...)
	delete(st.Children, name)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// treeRollingBack reports whether st or a composed child in progress is
// rolling back.
func treeRollingBack(st *runState) bool {
	if st.Status == StatusRollingBack {
		return true
	}
	for _, c := range st.Children {
		if treeRollingBack(c) {
			return true
		}
	}
	return false
}

// childDef is a compose step's child definition (nil for anything else, or
// a step no longer in the definition).
func (s *stepDef) childDef() *Definition {
	if s == nil {
		return nil
	}
	return s.child
}

// pushInterrupted turns st's recorded intent into an interrupted ledger
// entry on top of its stack: the step's Run may have been called by a
// process that died (or was cut short) before recording its result, so the
// rollback must compensate it rather than forget it. Its arguments are
// resolved now; they depend only on what completed before it.
func pushInterrupted(d *Definition, st *runState) {
	// A wave's steps called at once whose outcomes were not recorded
	// (concurrent.go) are cut short the same way, each.
	inflight := st.Inflight
	st.Inflight = nil
	for _, in := range inflight {
		if _, done := st.Steps[in.Step]; done || (st.Intent != nil && st.Intent.Step == in.Step) {
			continue
		}
		pushInterruptedStep(d, st, in)
	}
	in := st.Intent
	if in == nil {
		return
	}
	st.Intent = nil
	pushInterruptedStep(d, st, in)
}

func pushInterruptedStep(d *Definition, st *runState, in *intentRec) {
	st.stopped(in.Step, StopInterrupted)
	e := &LedgerEntry{Step: in.Step, Status: RollbackPending, Interrupted: true}
	if d != nil {
		if s := d.byName[in.Step]; s != nil {
			e.Args, _ = resolveArgs(d, s, st)
		}
	}
	st.Seq++
	e.Ordinal = st.Seq
	st.Ledger = append(st.Ledger, e)
}
