package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/runctx"
	"github.com/goreactor/goreactor/internal/store"
)

// Re-triggering a rollback. A rollback goes on past an entry whose undo (or
// compensate) fails, so a failed or cancelled run can end with entries still
// applied. The rollback keeps those entries on the run (rollbackRetry), and
// RetryRollback undoes them again, and only them, in a new rollback
// generation: what was compensated is never undone twice. A construct sees
// the generation (ConstructContext.RollbackGeneration): a fan-out map starts
// a rollback generation of its own over the elements that failed, with fresh
// keys and task ids.

// Errors of Engine.RetryRollback (the Err of its *StatusError).
var (
	// ErrNoRollbackToRetry: the run is not failed or cancelled, so it has
	// no finished rollback to retry.
	ErrNoRollbackToRetry = errors.New("reactor: only a failed or cancelled run has a finished rollback to retry " +
		"(undo a completed, halted or aborted run; wait for a live one to finish)")
	// ErrNothingToRetry: the run's rollback left no entry whose undo failed
	// or was blocked: everything was compensated (or had nothing to
	// compensate), or what stays applied waits for a person or stays by
	// decision. The refusal's message says which.
	ErrNothingToRetry = errors.New("reactor: the run's rollback left no failed entry to retry")
	// ErrRollbackRetried: the generation named with FromGeneration is no
	// longer the run's latest: its failures were retried already (the same
	// request delivered twice, or another request).
	ErrRollbackRetried = errors.New("reactor: that rollback generation was already retried; read the run again and retry its latest generation if it still has failures")
)

// rollbackRetry is what a run keeps of its rollbacks for a re-trigger.
type rollbackRetry struct {
	// Gen is the generation of the run's latest rollback (0 means 1: the
	// first rollback, never re-triggered).
	Gen int `msgpack:"g,omitempty"`
	// Entries are the entries the latest rollback could not undo, in the
	// order they failed (newest first).
	Entries []*retryEntry `msgpack:"e,omitempty"`
}

// retryEntry is one entry a rollback could not undo.
type retryEntry struct {
	// Path is where the entry's step is: "" for the run's own steps,
	// "book/" for the steps of composed child book.
	Path string `msgpack:"p,omitempty"`
	// Entry is the ledger entry, as it was when its undo failed.
	Entry *LedgerEntry `msgpack:"e"`
	// Compensate marks the failing step's own Compensate (not an Undo);
	// Entry.Args holds its arguments.
	Compensate bool `msgpack:"c,omitempty"`
}

// rollbackGen is the generation of st's latest (or current) rollback.
func (st *runState) rollbackGen() int {
	if st.Retry == nil || st.Retry.Gen < 1 {
		return 1
	}
	return st.Retry.Gen
}

func (x *execution) rollbackGen() int { return x.st.rollbackGen() }

// RollbackGeneration is the generation of the rollback the construct undoes
// in: 1 for a run's rollback, 2 and up for each RetryRollback of it. A
// construct whose parts keep rollback state of their own (a fan-out map's
// outcomes and task ids) starts fresh state for a new generation, over the
// parts the previous generation could not undo.
func (c *ConstructContext) RollbackGeneration() int { return max(c.gen, 1) }

// keepFailed records entry e, whose undo at path failed, for a re-trigger.
// It is called as the failure is recorded, before the entry leaves the
// stack, so the checkpoint that pops it saves it here.
func (x *execution) keepFailed(path string, e *LedgerEntry) {
	if x.targeted() {
		return // a failed target stays on the stack itself
	}
	c := *e
	c.Children = nil
	x.keep(&retryEntry{Path: strings.TrimSuffix(path, e.Step), Entry: &c})
}

// keepFailedCompensate records the failing step's compensate (frame f,
// arguments args) that failed. A construct's Compensate is retried as its
// Undo over the state it kept (a map rolls back alike either way).
func (x *execution) keepFailedCompensate(f *frame, s *stepDef, args Raw) {
	if s.kind == kindConstruct {
		x.keep(&retryEntry{Path: f.path, Entry: &LedgerEntry{Step: s.name, Args: f.st.Constructs[s.name]}})
		return
	}
	x.keep(&retryEntry{Path: f.path, Entry: &LedgerEntry{Step: s.name, Args: args}, Compensate: true})
}

func (x *execution) keep(r *retryEntry) {
	if x.st.Retry == nil {
		x.st.Retry = &rollbackRetry{}
	}
	r.Entry.Status = RollbackFailed
	x.st.Retry.Entries = append(x.st.Retry.Entries, r)
}

// RollbackOption adjusts a RetryRollback.
type RollbackOption func(*rollbackOptions)

type rollbackOptions struct{ gen int }

// FromGeneration makes RetryRollback retry only if gen (a Run's
// RollbackGeneration as the caller read it) is still the run's latest
// rollback generation, and refuse with ErrRollbackRetried otherwise. A
// request made once then runs once, however often it is delivered:
// worker.Controller's rollback requests use it.
func FromGeneration(gen int) RollbackOption { return func(o *rollbackOptions) { o.gen = gen } }

// RetryRollback re-triggers the rollback of a failed or cancelled run whose
// rollback left entries applied (their undo or compensate failed; see
// Failure.RollbackFailures): it undoes those entries again, and only them,
// newest first, in a new rollback generation (Run.RollbackGeneration goes
// up by one). Entries that were compensated are never undone again. A
// fan-out map among them starts a rollback generation of its own over the
// elements that failed (their outcome failed, element_in_flight or
// context_unavailable), with fresh keys and task ids, through the same
// distributed protocol; the earlier generation's outcomes stay readable. An
// inline map retries its failed elements in this process.
//
// The run ends as it ended before (failed or cancelled), with a Failure
// whose RollbackFailures are this retry's only: none when everything is
// now undone. Entries that fail again can be retried again.
//
// It is idempotent: the run's lock serializes calls, and once the retry has
// run, the same call finds nothing to retry (ErrNothingToRetry) or, with
// FromGeneration, a newer generation (ErrRollbackRetried). Refusals are
// *StatusError (Op "rollback"): ErrNoRollbackToRetry for a run that is not
// failed or cancelled, ErrRollbackInProgress while it rolls back,
// ErrNothingToRetry when nothing is left applied. It waits up to
// Config.UndoLockWait for the run's lock and returns ErrRunLocked if it
// stays held. A run whose map hands its rollback to workers returns the
// rolling_back Result; Wait for its end.
func (e *Engine) RetryRollback(ctx context.Context, id string, opts ...RollbackOption) (*Result, error) {
	var o rollbackOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.Acquire(ctx, target.Lock, e.cfg.UndoLockWait)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (run %s; waited %s)", ErrRunLocked, id, e.cfg.UndoLockWait)
	}
	if err != nil {
		return nil, err
	}
	st, version, err := e.load(ctx, id)
	if err == nil {
		err = retriable(st)
	}
	if (err == nil || errors.Is(err, ErrNothingToRetry)) && o.gen > 0 && o.gen != st.rollbackGen() {
		err = &StatusError{RunID: id, Status: st.Status, Op: string(OpRollback), Err: ErrRollbackRetried}
	}
	var def *Definition
	if err == nil {
		def, err = e.lookupRun(st)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	x := &execution{e: e, def: def, st: st, target: target, lease: lease, version: version, indexed: st.Status, revive: true}
	return x.traceRun(ctx, func(ctx context.Context) (*Result, error) {
		runCtx := x.lease.Keep(ctx)
		defer x.lease.Stop()
		_, err := x.retryRollback(runCtx, st.rollbackGen()+1)
		x.lease.Stop()
		return x.conclude(ctx, err)
	})
}

// retriable is RetryRollback's status rule (Check shares it).
func retriable(st *runState) error {
	se := func(s Status, err error) error {
		return &StatusError{RunID: st.ID, Status: s, Op: string(OpRollback), Err: err}
	}
	switch {
	case treeRollingBack(st):
		return se(StatusRollingBack, ErrRollbackInProgress)
	case st.Status != StatusFailed && st.Status != StatusCancelled:
		return se(st.Status, ErrNoRollbackToRetry)
	case len(st.retryable()) == 0:
		if st.waitsForPerson() {
			return se(st.Status, fmt.Errorf("%w: what it left applied waits for a person (resolve the conflicts first; "+
				"a conflict is never attempted again)", ErrNothingToRetry))
		}
		if st.effectsInPlace() > 0 {
			return se(st.Status, fmt.Errorf("%w: what it left applied stays by decision (left applied, or past its undo window)", ErrNothingToRetry))
		}
		return se(st.Status, fmt.Errorf("%w; nothing is still applied", ErrNothingToRetry))
	}
	return nil
}

// retryable are the entries of the retry list a new generation undoes
// again: those whose record in the book says their undo failed or was
// blocked. An entry that waits for a person (a map whose elements' only
// failures are conflicts) stays on the list for when a resolution makes
// it retryable again; one left applied leaves it.
func (st *runState) retryable() []*retryEntry {
	if st.Retry == nil {
		return nil
	}
	var out []*retryEntry
	for _, r := range st.Retry.Entries {
		if b := st.entry(r.id()); b == nil || b.State == RollbackFailed || b.State == RollbackBlocked {
			out = append(out, r)
		}
	}
	return out
}

// id is the id of the entry's record in the book.
func (r *retryEntry) id() string { return entryID(r.Path+r.Entry.Step, r.Entry.Ordinal) }

// retryRollback starts rollback generation gen of the finished run over the
// entries the previous one could not undo: they go back on the undo stack
// (the steps of composed children inside their compose entry, so they are
// undone in their parent's turn, in the order they were), the failing
// step's failed compensate becomes the rollback's step again, and the
// decision is saved (rolling_back) before the first undo. Then it is an
// ordinary rollback, resumable as any other.
func (x *execution) retryRollback(ctx context.Context, gen int) (*frameResult, error) {
	st := x.st
	entries := st.retryable()
	st.Retry.Entries = slices.DeleteFunc(st.Retry.Entries, func(r *retryEntry) bool { return slices.Contains(entries, r) })
	st.Retry.Gen = gen
	failure := st.Failure.clone()
	if failure == nil {
		failure = newCancelFailure("rolled back")
	}
	prior := failure.RollbackFailures
	failure.RollbackFailures, failure.RollbackFailuresOmitted = nil, 0
	// What still waits for a person stays on the failure: the new
	// generation does not retry a conflict, and must not forget it.
	rb0 := &RollbackRecord{Failure: failure}
	for _, r := range st.conflicts() {
		if r.waiting() {
			h := r.Conflict
			cerr := &ConflictError{Step: h.Step, Resource: h.Resource, Expected: h.Expected, Observed: h.Observed, RestoreTo: h.RestoreTo, Why: h.Why}
			x.addRollbackFailure(rb0, RollbackFailure{Step: h.Step, Kind: ActionUndo, Reason: ReasonConflict, Message: cerr.Error(),
				Run: st.ID, Entry: r.ID})
		}
	}
	// So do its map elements' conflicts, and what a person left applied
	// in them (a map the generation retries reports them again, once).
	for _, rf := range prior {
		if rf.Reason == ReasonLeftApplied || (rf.Reason == ReasonConflict && rf.Run != "" && rf.Run != st.ID) {
			x.addRollbackFailure(rb0, rf)
		}
	}
	// The retried entries were inside their undo windows when the rollback
	// they failed in started: that verdict stands (the rollback finishes).
	rb := &RollbackRecord{Trigger: TriggerFailure, Compensated: true, Failure: failure, Generation: gen, WindowAt: st.RbWindowAt}
	if st.Status == StatusCancelled {
		rb.Trigger = TriggerUndo
	}
	st.RbGen = gen
	for i := len(entries) - 1; i >= 0; i-- { // oldest first
		r := entries[i]
		if r.Compensate && r.Path == "" && rb.Trigger == TriggerFailure {
			rb.Step, rb.Compensated = r.Entry.Step, false
			continue
		}
		e := *r.Entry
		e.Status = RollbackPending
		// A composed child's failing step: its Compensate is called as for
		// a step cut short (the child's own failure is not on record).
		e.Interrupted = e.Interrupted || r.Compensate
		st.Ledger = pushAt(st.Ledger, strings.Split(strings.TrimSuffix(r.Path, "/"), "/"), &e)
	}
	st.Status = StatusRollingBack
	st.Rollback = rb
	started := auditRec{kind: AuditRollbackStarted, trigger: rb.Trigger, generation: gen}
	if rb.Step != "" {
		started.step = rb.Step
	}
	x.audit(started)
	if err := x.checkpoint(ctx); err != nil {
		return nil, err
	}
	x.emit(ctx, Event{Kind: EventRollbackStarted, RunID: st.ID, Reactor: st.Reactor, Err: failure.errOrNil()})
	return x.rollback(ctx, &frame{def: x.def, st: st, root: true}, nil)
}

// pushAt puts e on top of ledger, inside the compose entries named by path
// (none for [""]): the newest entry of a compose path is reused while it is
// on top, so entries of one child stay together.
func pushAt(ledger []*LedgerEntry, path []string, e *LedgerEntry) []*LedgerEntry {
	if len(path) == 0 || path[0] == "" {
		return append(ledger, e)
	}
	if n := len(ledger); n > 0 && ledger[n-1].Step == path[0] && len(ledger[n-1].Children) > 0 {
		top := ledger[n-1]
		top.Children = pushAt(top.Children, path[1:], e)
		return ledger
	}
	return append(ledger, &LedgerEntry{Step: path[0], Status: RollbackPending, Children: pushAt(nil, path[1:], e)})
}

// retryElementRollback brings construct element run id to rollback
// generation gen (a map's re-triggered rollback): an element whose latest
// rollback is older than gen and left failed entries retries them; one
// never rolled back is undone; one rolling back resumes; anything else
// returns its stored result. It waits up to wait for the element's lock
// and returns ErrRunLocked if it stays held.
func (e *Engine) retryElementRollback(ctx context.Context, id string, gen int, wait time.Duration) (*Result, error) {
	x, res, err := e.openElement(ctx, id, wait)
	if x == nil || err != nil {
		return res, err
	}
	st := x.st
	switch {
	case st.Status == StatusRollingBack:
		return x.execute(ctx, EventRunResumed)
	case st.Status == StatusFailed || st.Status == StatusCancelled:
		if st.rollbackGen() >= gen || retriable(st) != nil {
			_ = x.lease.Release(context.WithoutCancel(ctx))
			return st.result(), nil
		}
		return x.traceRun(ctx, func(ctx context.Context) (*Result, error) {
			runCtx := x.lease.Keep(ctx)
			defer x.lease.Stop()
			_, err := x.retryRollback(runCtx, gen)
			x.lease.Stop()
			return x.conclude(ctx, err)
		})
	}
	return x.undo(ctx, "undone with its map")
}

// openElement takes element run id's lock (waiting up to wait) and loads it
// for an execution, as undoElement does.
func (e *Engine) openElement(ctx context.Context, id string, wait time.Duration) (*execution, *Result, error) {
	if err := validateRunID(id); err != nil {
		return nil, nil, err
	}
	x, err := e.lockAndLoad(ctx, e.elemTarget(ctx, id), "element "+id, wait)
	if err != nil {
		return nil, nil, err
	}
	if x.def, err = e.lookupRun(x.st); err != nil {
		_ = x.lease.Release(context.WithoutCancel(ctx))
		return nil, nil, err
	}
	adoptElement(ctx, x.st)
	x.element, x.inWorker, x.windowNow = true, true, elementWindowAt(ctx)
	return x, nil, nil
}

// lockAndLoad takes target's lock (waiting up to wait) and loads its state
// for an execution; what names the run in errors ("element <id>"). The
// execution has no definition yet. On error nothing is held.
func (e *Engine) lockAndLoad(ctx context.Context, target store.Target, what string, wait time.Duration) (*execution, error) {
	if el, ok := runctx.ElementFrom(ctx); ok && el.Load != nil && wait <= 0 {
		return e.lockAndLoadElement(ctx, target, what, el) // a map's rollback job: element_run.go
	}
	lease, err := e.locks.Acquire(ctx, target.Lock, wait)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (%s; waited %s)", ErrRunLocked, what, wait)
	}
	if err != nil {
		return nil, err
	}
	snap, err := e.store.Load(ctx, target)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %s", ErrNotFound, what)
	}
	var st *runState
	if err == nil {
		st, err = decodeState(snap.Data)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return &execution{e: e, st: st, target: target, lease: lease, version: snap.Version, indexed: st.Status}, nil
}
