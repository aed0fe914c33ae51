package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Reason codes of guarded undo and resource blocking (RollbackFailure.Reason,
// the audit's reason).
const (
	// ReasonConflict: the resource was changed by somebody else.
	ReasonConflict = "reactor.conflict"
	// ReasonBlocked: a newer entry on the same resource is still applied.
	ReasonBlocked = "reactor.blocked"
	// ReasonRestoreIneffective: Restore returned without error but the
	// resource still reads at the effect's after state.
	ReasonRestoreIneffective = "reactor.restore_ineffective"
	// ReasonAlreadyReverted: the resource was already at the effect's
	// before state; Restore was not called (a compensated entry).
	ReasonAlreadyReverted = "reactor.already_reverted"
)

// ConflictError describes a guarded undo's conflict.
type ConflictError struct {
	Step, Resource string
	// Expected is the effect's after fingerprint, Observed what the probe
	// read, RestoreTo the before fingerprint.
	Expected, Observed, RestoreTo string
	Why                           string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("reactor: guarded undo of step %q left %q untouched: %s (expected %s, observed %s, restore to %s); "+
		"a person must resolve it (Engine.Resolve)", e.Step, e.Resource, e.Why, e.Expected, e.Observed, e.RestoreTo)
}

// errRestoreIneffective: Restore returned but the resource still reads at
// after.
var errRestoreIneffective = errors.New("reactor: Restore returned without error but the resource still reads as the effect's after state: nothing was restored")

type verdictKind uint8

const (
	verdictReverted verdictKind = iota + 1
	verdictAlready
	verdictConflict
	verdictIneffective
)

type verdict struct {
	kind     verdictKind
	observed string
	// observedEnc is the encoding of what the probe read (nil when it is
	// over maxShownValue), for a person to read beside observed.
	observedEnc []byte
	why         string
}

// guardedOnce is one compare-and-set attempt: probe and fingerprint; at
// after, restore and (unless the store compared atomically) probe again to
// confirm; at before, nothing to do; else a conflict.
func guardedOnce(ctx context.Context, g *Guard, resource string, ef *effectRec) (verdict, error) {
	cur, err := g.probe(ctx, resource)
	if err != nil {
		return verdict{}, fmt.Errorf("probe %q: %w", resource, err)
	}
	fp, enc, err := fingerprintOf(cur)
	if err != nil {
		return verdict{}, fmt.Errorf("probe %q read a value that cannot be fingerprinted: %w", resource, err)
	}
	enc = shownEncoding(enc)
	switch fp {
	case ef.BeforeFP:
		return verdict{kind: verdictAlready, observed: fp, observedEnc: enc}, nil
	case ef.AfterFP:
	default:
		return verdict{kind: verdictConflict, observed: fp, observedEnc: enc,
			why: "the resource is neither at the state the step left nor at the state before it: somebody else changed it"}, nil
	}
	res, err := g.restore(ctx, resource, ef.Before, ef.After)
	if err != nil {
		return verdict{observed: fp, observedEnc: enc}, fmt.Errorf("restore %q: %w", resource, err)
	}
	switch res {
	case RestoreApplied:
		return verdict{kind: verdictReverted, observed: fp, observedEnc: enc}, nil
	case RestorePreconditionFailed:
		// What the store's compare found is unknown: the probe before it
		// read after, which is what observed says.
		return verdict{kind: verdictConflict, observed: fp, observedEnc: enc,
			why: "the store's atomic compare found the resource changed between the read and the write; nothing was written"}, nil
	case RestoreWritten:
	default:
		return verdict{}, fmt.Errorf("restore %q returned an unknown result %q", resource, res)
	}
	back, err := g.probe(ctx, resource)
	if err != nil {
		return verdict{observed: fp, observedEnc: enc}, fmt.Errorf("probe %q after the restore: %w", resource, err)
	}
	fp2, enc2, err := fingerprintOf(back)
	if err != nil {
		return verdict{}, fmt.Errorf("probe %q after the restore read a value that cannot be fingerprinted: %w", resource, err)
	}
	enc2 = shownEncoding(enc2)
	switch fp2 {
	case ef.BeforeFP:
		return verdict{kind: verdictReverted, observed: fp, observedEnc: enc}, nil
	case ef.AfterFP:
		return verdict{kind: verdictIneffective, observed: fp2, observedEnc: enc2}, nil
	}
	return verdict{kind: verdictConflict, observed: fp2, observedEnc: enc2,
		why: "the resource changed between the restore and the read that confirms it: somebody else wrote in between"}, nil
}

// guardedAttempts runs guardedOnce, retrying transient failures as the
// guard's Retry allows. A verdict (a conflict above all) is never retried.
func (x *execution) guardedAttempts(ctx context.Context, g *Guard, resource string, ef *effectRec) (verdict, error) {
	attempts := g.retry.attempts()
	for attempt := 1; ; attempt++ {
		v, err := guardedOnce(ctx, g, resource, ef)
		if err == nil || !IsTransient(err) || attempt >= attempts || ctx.Err() != nil {
			return v, err
		}
		if err := x.e.sleep(ctx, g.retry.delay(attempt)); err != nil {
			return v, err
		}
	}
}

// guardedUndo undoes guarded entry e of step s (path) by compare-and-set.
func (x *execution) guardedUndo(ctx context.Context, f *frame, d *Definition, s *stepDef, e *LedgerEntry, path string) error {
	gen := f.st.Rollback.generation()
	ef := e.Effect
	rec := StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionUndo, Status: RollbackCompensated, Generation: gen,
		Resource: e.Resource, Label: ef.Label, Expected: ef.AfterFP, RestoreTo: ef.BeforeFP,
		ExpectedEnc: ef.AfterEnc, RestoreToEnc: ef.BeforeEnc,
		StartedAt: x.e.now().UnixMilli(), Attempt: x.attemptOf(entryID(path, e.Ordinal))}
	if e.Status != RollbackCompensating {
		x.auditCompensating(rec, e.Ordinal)
	}
	// The attempt is saved before the compare-and-set starts: a crash
	// between its Restore and the next save is then counted (the redo is
	// attempt 2, and reads the resource already at its before state). One
	// write per guarded entry, which talks to an outside system twice
	// anyway.
	e.Status = RollbackCompensating
	own := x.st.book(entryID(path, e.Ordinal), path, e.Ordinal, nil, e.Resource)
	own.State, own.Gen, own.Attempts = RollbackCompensating, gen, rec.Attempt
	if err := x.checkpoint(ctx); err != nil {
		return err
	}
	began := time.Now()
	var v verdict
	err := x.callUndo(ctx, Call{Kind: CallUndo, RunID: x.st.ID, Reactor: d.name, Step: path}, x.undoTimeout(s), func(cctx context.Context) error {
		var err error
		v, err = x.guardedAttempts(cctx, s.guard, e.Resource, ef)
		return err
	})
	if ierr := rollbackInterrupted(ctx); ierr != nil {
		e.Status = RollbackPending
		return ierr
	}
	rec.At, rec.Observed, rec.ObservedEnc = x.e.now().UnixMilli(), v.observed, v.observedEnc
	switch {
	case err != nil:
	case v.kind == verdictIneffective:
		err = errRestoreIneffective
		x.recordEntry(ctx, f, d, e, rec, err, ReasonRestoreIneffective, time.Since(began), EventStepUndone, EventStepUndoFailed)
		return nil
	case v.kind == verdictConflict:
		x.recordConflict(ctx, f, d, e, rec, v, time.Since(began))
		return nil
	case v.kind == verdictAlready:
		rec.Reason, rec.Message = ReasonAlreadyReverted, "the resource was already at its before state; Restore was not called"
	}
	x.recordEntry(ctx, f, d, e, rec, err, "", time.Since(began), EventStepUndone, EventStepUndoFailed)
	return nil
}

// recordConflict records a conflict: the entry needs a person, is never
// attempted again, and blocks the older entries on its resource.
func (x *execution) recordConflict(ctx context.Context, f *frame, d *Definition, e *LedgerEntry, rec StepRollback, v verdict, took time.Duration) {
	cerr := &ConflictError{Step: rec.Step, Resource: e.Resource, Expected: rec.Expected, Observed: v.observed, RestoreTo: rec.RestoreTo, Why: v.why}
	rec.Status, rec.Reason, rec.Message = RollbackNeedsPerson, ReasonConflict, v.why
	e.Status = RollbackNeedsPerson
	id := entryID(rec.Step, e.Ordinal)
	// A second conflict of the same entry (a person resolved it, and a
	// later undo found the resource changed once more) waits again.
	x.settle(f, rec).Conflict = &humanRec{ID: id, Step: rec.Step, Ordinal: e.Ordinal,
		Resource: e.Resource, Label: rec.Label, Expected: rec.Expected, Observed: v.observed, RestoreTo: rec.RestoreTo,
		ExpectedEnc: rec.ExpectedEnc, ObservedEnc: v.observedEnc, RestoreToEnc: rec.RestoreToEnc,
		Why: v.why, Generation: rec.Generation, At: rec.At}
	a := auditRec{kind: AuditConflict, step: rec.Step, ordinal: e.Ordinal, status: RollbackNeedsPerson, action: ActionUndo,
		attempt: rec.Attempt, generation: rec.Generation, reason: ReasonConflict, message: v.why,
		resource: e.Resource, expected: rec.Expected, observed: v.observed, restoreTo: rec.RestoreTo}
	x.audit(a)
	if rb := f.st.Rollback; rb != nil {
		x.addRollbackFailure(rb, RollbackFailure{Step: rec.Step, Kind: ActionUndo, Reason: ReasonConflict, Message: cerr.Error(),
			Run: x.st.ID, Entry: id})
	}
	x.emit(ctx, Event{Kind: EventStepUndoFailed, RunID: x.st.ID, Reactor: d.name, Step: rec.Step, Err: cerr, Duration: took})
}

// blocker finds what blocks entry e (id, of frame f) from being undone:
// a newer entry of the run on the same resource whose effect is still in
// place, whichever rollback generation (or person) left it so: it failed,
// waits for a person, was blocked, was kept out of its undo window, or was
// left applied. An entry whose own conflict waits for a person is blocked
// by itself: it is never attempted again until resolved. It returns the
// blocking entry's id and whether it stays applied by a person's decision
// (left_applied: blocked for good).
func (x *execution) blocker(e *LedgerEntry, own *entryRec) (by string, leftApplied bool, ok bool) {
	if e.Resource == "" {
		return "", false, false
	}
	switch own.State {
	case RollbackNeedsPerson:
		return own.ID, false, true
	case RollbackLeftApplied:
		if own.BlockedBy != "" {
			return own.BlockedBy, true, true
		}
		return own.ID, true, true
	}
	for _, r := range x.st.Book {
		if r != own && r.Resource == e.Resource && r.inPlace() && newer(r.Key, own.Key) {
			return r.ID, r.State == RollbackLeftApplied, true
		}
	}
	return "", false, false
}

// recordBlocked records entry e as blocked by entry by: not attempted,
// zero attempts. It stays applied: kept for a re-triggered rollback (or on
// the stack of an UndoSteps), unless a person left the blocker applied.
func (x *execution) recordBlocked(ctx context.Context, f *frame, d *Definition, e *LedgerEntry, path, by string, leftApplied bool) {
	rec := StepRollback{Step: path, Ordinal: e.Ordinal, Kind: ActionUndo, Status: RollbackBlocked, At: x.e.now().UnixMilli(),
		Generation: f.st.Rollback.generation(), Resource: e.Resource, BlockedBy: by, Reason: ReasonBlocked,
		Message: fmt.Sprintf("not attempted: entry %s, newer on resource %q, is still applied", by, e.Resource)}
	if by == entryID(path, e.Ordinal) {
		rec.Message = "not attempted: its conflict waits for a person (Resolve it first)"
	}
	if e.Effect != nil {
		rec.Label, rec.Expected, rec.RestoreTo = e.Effect.Label, e.Effect.AfterFP, e.Effect.BeforeFP
		rec.ExpectedEnc, rec.RestoreToEnc = e.Effect.AfterEnc, e.Effect.BeforeEnc
	}
	a := auditRec{kind: AuditBlocked, step: path, ordinal: e.Ordinal, status: RollbackBlocked, generation: rec.Generation,
		reason: ReasonBlocked, resource: e.Resource, blockedBy: by}
	if leftApplied {
		// A person decided the newer change stays: this one stays under it.
		rec.Status, rec.Reason = RollbackLeftApplied, ""
		rec.Message = fmt.Sprintf("kept: entry %s, newer on resource %q, was left applied by a person", by, e.Resource)
		if by == entryID(path, e.Ordinal) {
			rec.Message, rec.BlockedBy = "kept: a person left its effect applied", ""
		}
		e.Status = RollbackLeftApplied
		a.status, a.reason = RollbackLeftApplied, ""
		x.audit(a)
		x.settle(f, rec)
		return
	}
	if own := x.st.entry(entryID(path, e.Ordinal)); by == entryID(path, e.Ordinal) && own != nil && own.waiting() {
		// Its own conflict (from an earlier rollback) still waits: it
		// stays needs_human, listed, and is not attempted again.
		rec.Status, rec.Reason, rec.BlockedBy = RollbackNeedsPerson, ReasonConflict, ""
		rec.Message = "not attempted again: its conflict waits for a person (Resolve it first)"
		if c := own.Conflict; c != nil {
			rec.Observed, rec.ObservedEnc = c.Observed, c.ObservedEnc
		}
		e.Status = RollbackNeedsPerson
		if rb := f.st.Rollback; rb != nil {
			x.addRollbackFailure(rb, RollbackFailure{Step: path, Kind: ActionUndo, Reason: ReasonConflict, Message: rec.Message,
				Run: x.st.ID, Entry: own.ID})
		}
		x.settle(f, rec)
		return
	}
	e.Status = RollbackBlocked
	x.audit(a)
	x.keepFailed(path, e)
	if rb := f.st.Rollback; rb != nil {
		x.addRollbackFailure(rb, RollbackFailure{Step: path, Kind: ActionUndo, Reason: ReasonBlocked, Message: rec.Message})
	}
	x.emit(ctx, Event{Kind: EventStepUndoFailed, RunID: x.st.ID, Reactor: d.name, Step: path,
		Err: errors.New("reactor: " + rec.Message)})
	x.settle(f, rec)
}

// settle records what a rollback (or a person) did for one entry: the
// generation's record of it, for the report and the audit, and the entry's
// record in the book, which every later generation reads. It returns the
// book record.
func (x *execution) settle(f *frame, rec StepRollback) *entryRec {
	f.st.Undone = append(f.st.Undone, rec)
	r := x.st.book(entryID(rec.Step, rec.Ordinal), rec.Step, rec.Ordinal, nil, rec.Resource)
	r.State, r.Gen, r.Reason, r.BlockedBy = rec.Status, max(rec.Generation, 1), rec.Reason, rec.BlockedBy
	r.Attempts = max(r.Attempts, rec.Attempt)
	return r
}
