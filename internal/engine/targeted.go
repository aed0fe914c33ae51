package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/goreactor/goreactor/internal/lock"
)

// Targeted compensation: UndoSteps undoes named completed steps of a
// finished run and leaves the rest applied. The named entries are marked on
// the run's own undo stack (LedgerEntry.Target) and undone there, newest
// first, as one rollback generation: the run is rolling_back meanwhile (so
// a crash resumes the same undo, and a fan-out map among the targets hands
// its rollback to workers as usual), then it returns to the status it had.
// An entry whose undo fails, or whose undo window had closed, stays on the
// stack with its status; the others leave it.

// Errors of UndoSteps.
var (
	// ErrUnknownStep: a named step is not a step of the run's definition
	// (or of the composed child its path names).
	ErrUnknownStep = errors.New("reactor: no such step in the run's definition")
	// ErrNoStepsNamed: UndoSteps was called without a step.
	ErrNoStepsNamed = errors.New("reactor: name at least one step to undo")
	// ErrResourceOrder is what a *ResourceOrderError matches with
	// errors.Is.
	ErrResourceOrder = errors.New("reactor: a newer entry on the same resource would stay applied")
)

// Unresolved reasons: why a named step had nothing to undo.
const (
	// ReasonNotCompleted: the step never completed (not reached, skipped,
	// or it failed).
	ReasonNotCompleted = "reactor.not_completed"
	// ReasonAlreadyCompensated: an earlier rollback compensated it.
	ReasonAlreadyCompensated = "reactor.already_compensated"
)

// ResourceOrderError refuses an UndoSteps request, before anything runs,
// that would undo Step while a newer entry on the same Resource stays
// applied: undoing the older change would write over the newer one. Include
// the newer step in the request (or undo it first).
type ResourceOrderError struct {
	RunID string
	// Step and Ordinal are the requested entry.
	Step    string
	Ordinal int
	// Resource is what both entries changed.
	Resource string
	// Newer and NewerOrdinal name the newer entry left out of the request.
	Newer        string
	NewerOrdinal int
}

// Is makes errors.Is(err, ErrResourceOrder) true.
func (e *ResourceOrderError) Is(target error) bool { return target == ErrResourceOrder }

func (e *ResourceOrderError) Error() string {
	return fmt.Sprintf("reactor: run %s: cannot undo step %q (entry %d) without step %q (entry %d): "+
		"it changed resource %q later and is still applied; include %q in the request",
		e.RunID, e.Step, e.Ordinal, e.Newer, e.NewerOrdinal, e.Resource, e.Newer)
}

// StepsUndone is what UndoSteps did.
type StepsUndone struct {
	// Result is the run's result. Its status is the one the run had
	// (completed, halted or aborted) once the undo is done, or
	// rolling_back while a fan-out map's workers undo its elements (Wait
	// for the run, then read RollbackReport).
	Result *Result
	// Rollback reports the run's rollbacks so far, this one included:
	// each named entry with its status (compensated, compensation_failed,
	// out_of_window, no_compensation_registered). Nil when no named step
	// had anything to undo.
	Rollback *RollbackReport
	// Unresolved lists the named steps that had nothing to undo, with
	// why: logged and audited (unresolved), not a fault.
	Unresolved []UnresolvedStep
}

// UnresolvedStep is a step named for undo that had nothing to undo.
type UnresolvedStep struct {
	Step string `json:"step"`
	// Reason is ReasonNotCompleted or ReasonAlreadyCompensated.
	Reason string `json:"reason"`
}

// targetedRec is what the rollback of UndoSteps keeps on its record.
type targetedRec struct {
	// Prior is the status the run returns to.
	Prior Status `msgpack:"p"`
	// Steps are the steps as named.
	Steps []string `msgpack:"s"`
}

// UndoSteps undoes the named completed steps of a finished run (completed,
// halted or aborted) and keeps the rest: the run keeps its status, and its
// other steps stay applied, to be undone later by Undo or another
// UndoSteps. A step is named by its path: "charge", or "book/reserve" for a
// step of composed child book; naming a compose step ("book") or a map step
// names all it did. The named entries are undone newest first, in one new
// rollback generation (RollbackReport reports it; the audit trail records
// it), even when other steps sit between them.
//
// Before anything runs, the request is refused with a *ResourceOrderError
// when it would undo an entry while a newer entry on the same resource
// (StepConfig.Resource) stays applied, and with ErrUnknownStep when a name
// is not a step of the definition. A named step with nothing to undo (it
// never completed, or was compensated already) is listed in Unresolved and
// audited, not an error; one that completed without an Undo is reported
// no_compensation_registered. An entry whose undo fails, or whose undo
// window had closed, stays applied with its status, and can be named again.
//
// Status refusals are *StatusError (Op "undo_steps"), as for Undo. It waits
// up to Config.UndoLockWait for the run's lock (ErrRunLocked).
func (e *Engine) UndoSteps(ctx context.Context, id string, steps []string) (*StepsUndone, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, ErrNoStepsNamed
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.Acquire(ctx, target.Lock, e.cfg.UndoLockWait)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (run %s; waited %s)", ErrRunLocked, id, e.cfg.UndoLockWait)
	}
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	st, version, err := e.load(ctx, id)
	if err == nil {
		err = stepsUndoable(st)
	}
	var def *Definition
	if err == nil {
		def, err = e.lookupRun(st)
	}
	var p *targetPlan
	if err == nil {
		p, err = planTargets(def, st, steps)
	}
	if err != nil {
		_ = lease.Release(bg)
		return nil, err
	}
	x := &execution{e: e, def: def, st: st, target: target, lease: lease, version: version, indexed: st.Status}
	if windowed(def, st.Ledger) && len(p.targets) > 0 {
		// Judged before anything changes: a clock that went backwards
		// refuses the request as it stands.
		if x.windowNow, err = x.windowClock(ctx); err != nil {
			_ = lease.Release(bg)
			return nil, err
		}
	}
	out := &StepsUndone{Unresolved: p.unresolved}
	for _, u := range p.unresolved {
		x.audit(auditRec{kind: AuditUnresolved, step: u.Step, reason: u.Reason})
		e.log.Info("a step named for undo had nothing to undo", "event", "reactor.undo_steps.unresolved",
			"run", id, "step", u.Step, "reason", u.Reason)
	}
	if len(p.targets) == 0 && len(p.kept) == 0 {
		// Nothing to undo: the audit entries alone are stored.
		if err := x.save(bg, true); err != nil {
			_ = lease.Release(bg)
			return nil, err
		}
		out.Result = st.result()
		return out, nil
	}
	x.revive = true
	res, err := x.traceRun(ctx, func(ctx context.Context) (*Result, error) {
		runCtx := x.lease.Keep(ctx)
		defer x.lease.Stop()
		_, err := x.undoTargets(runCtx, p, steps)
		x.lease.Stop()
		return x.conclude(ctx, err)
	})
	if err != nil {
		return nil, err
	}
	out.Result = res
	if out.Rollback, err = rollbackReport(x.st); err != nil {
		return nil, err
	}
	return out, nil
}

// CheckUndoSteps tells whether UndoSteps(ctx, id, steps) would be refused
// before anything runs, by the same rules and errors: the status rule
// (*StatusError), ErrNoStepsNamed, the resource order (*ResourceOrderError)
// and, when this engine holds the run's definition, ErrUnknownStep. It
// needs no definition (a dashboard can ask it); without one, a name that
// matches no entry is not judged here. It returns the run as it read it.
func (e *Engine) CheckUndoSteps(ctx context.Context, id string, steps []string) (*Run, error) {
	if len(steps) == 0 {
		return nil, ErrNoStepsNamed
	}
	st, version, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	d := e.viewDef(st)
	run := st.view(d, version)
	if err := stepsUndoable(st); err != nil {
		return run, err
	}
	_, err = planTargets(d, st, steps)
	return run, err
}

// ErrStoppedMidStep: UndoSteps of a run that stopped with work in
// progress (an aborted run inside a step, a composed child or a map).
var ErrStoppedMidStep = errors.New("reactor: the run stopped with a step, composed child or map in progress; " +
	"what it did there is not on its undo stack yet, so named steps cannot be judged against it: Undo the run whole")

// stepsUndoable is UndoSteps's status rule (Check shares it): Undo's, and
// nothing in progress.
func stepsUndoable(st *runState) error {
	err := undoable(st)
	var se *StatusError
	if errors.As(err, &se) {
		se.Op = string(OpUndoSteps)
		return err
	}
	if len(st.Children) > 0 || len(st.Constructs) > 0 || st.Intent != nil {
		return &StatusError{RunID: st.ID, Status: st.Status, Op: string(OpUndoSteps), Err: ErrStoppedMidStep}
	}
	return nil
}

// targetPlan is what an UndoSteps request resolved to.
type targetPlan struct {
	// targets are the leaf entries to undo.
	targets []*LedgerEntry
	// kept are the named steps that completed without an Undo.
	kept       []string
	unresolved []UnresolvedStep
}

// placedEntry is a leaf entry of an undo stack with its path, in the order
// the entries were made.
type placedEntry struct {
	path string
	e    *LedgerEntry
}

// flattenLedger lists the leaf entries of ledger (the entries of composed
// children in their parent's place), oldest first.
func flattenLedger(ledger []*LedgerEntry, prefix string, out []placedEntry) []placedEntry {
	for _, e := range ledger {
		if len(e.Children) > 0 {
			out = flattenLedger(e.Children, prefix+e.Step+"/", out)
			continue
		}
		out = append(out, placedEntry{path: prefix + e.Step, e: e})
	}
	return out
}

// planTargets resolves the named steps against the run's undo stack and
// refuses a request that would leave a newer entry on a target's resource
// applied.
func planTargets(def *Definition, st *runState, steps []string) (*targetPlan, error) {
	leaves := flattenLedger(st.Ledger, "", nil)
	p := &targetPlan{}
	picked := map[*LedgerEntry]bool{}
	seen := map[string]bool{}
	for _, name := range steps {
		if def == nil {
			// CheckUndoSteps without the definition: only the entries.
			for _, l := range leaves {
				if l.path == name || strings.HasPrefix(l.path, name+"/") {
					picked[l.e] = true
				}
			}
			continue
		}
		s, err := resolveStepPath(def, name)
		if err != nil {
			return nil, err
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		matched := false
		for _, l := range leaves {
			if l.path == name || strings.HasPrefix(l.path, name+"/") {
				matched = true
				picked[l.e] = true
			}
		}
		switch {
		case matched:
		case s.kind == kindPlain && s.undo == nil && s.guard == nil && completedPath(st, name):
			p.kept = append(p.kept, name)
		case slices.ContainsFunc(st.Undone, func(u StepRollback) bool {
			return (u.Step == name || strings.HasPrefix(u.Step, name+"/")) && u.Status == RollbackCompensated
		}):
			p.unresolved = append(p.unresolved, UnresolvedStep{Step: name, Reason: ReasonAlreadyCompensated})
		default:
			p.unresolved = append(p.unresolved, UnresolvedStep{Step: name, Reason: ReasonNotCompleted})
		}
	}
	for i, l := range leaves {
		if !picked[l.e] {
			continue
		}
		p.targets = append(p.targets, l.e)
		if l.e.Resource == "" {
			continue
		}
		for _, n := range leaves[i+1:] {
			if !picked[n.e] && n.e.Resource == l.e.Resource {
				return nil, &ResourceOrderError{RunID: st.ID, Step: l.path, Ordinal: l.e.Ordinal, Resource: l.e.Resource,
					Newer: n.path, NewerOrdinal: n.e.Ordinal}
			}
		}
	}
	return p, nil
}

// resolveStepPath finds the step a path names ("book/reserve": step
// reserve of compose step book's child).
func resolveStepPath(def *Definition, path string) (*stepDef, error) {
	d := def
	parts := strings.Split(path, "/")
	for i, name := range parts {
		s := d.byName[name]
		if s == nil || name == "" {
			return nil, fmt.Errorf("%w: %q (reactor %q has no step %q)", ErrUnknownStep, path, d.name, name)
		}
		if i == len(parts)-1 {
			return s, nil
		}
		if s.kind != kindCompose {
			return nil, fmt.Errorf("%w: %q (step %q of reactor %q is not a compose step, it has no steps inside)", ErrUnknownStep, path, name, d.name)
		}
		d = s.child
	}
	return nil, fmt.Errorf("%w: %q", ErrUnknownStep, path)
}

// completedPath reports whether the step at path completed: its own record,
// or, inside a composed child, its compose step's (a finished child's step
// records are gone; a child that completed ran all its steps).
func completedPath(st *runState, path string) bool {
	top, _, _ := strings.Cut(path, "/")
	rec := st.Steps[top]
	return rec != nil && rec.State == stepDone
}

// undoTargets marks the plan's entries and starts the targeted rollback:
// saved rolling_back before the first undo, like any rollback.
func (x *execution) undoTargets(ctx context.Context, p *targetPlan, steps []string) (*frameResult, error) {
	st := x.st
	gen := 1
	if st.RbGen > 0 {
		gen = st.rollbackGen() + 1
	}
	if st.Retry == nil {
		st.Retry = &rollbackRetry{}
	}
	st.Retry.Gen = gen
	st.RbGen = gen
	resetLedger(st.Ledger)
	for _, e := range p.targets {
		e.Target = true
	}
	prior := st.Status
	st.Status = StatusRollingBack
	st.Rollback = &RollbackRecord{Trigger: TriggerTargeted, Compensated: true, Generation: gen,
		Failure: newCancelFailure("steps undone on request"), Targeted: &targetedRec{Prior: prior, Steps: steps}}
	x.audit(auditRec{kind: AuditRollbackStarted, trigger: TriggerTargeted, generation: gen})
	for _, name := range p.kept {
		u := StepRollback{Step: name, Kind: ActionUndo, Status: RollbackNoCompensation, At: x.e.now().UnixMilli(), Generation: gen}
		x.auditOutcome(u, 0)
		st.Undone = append(st.Undone, u)
	}
	if err := x.checkpoint(ctx); err != nil {
		return nil, err
	}
	x.emit(ctx, Event{Kind: EventRollbackStarted, RunID: st.ID, Reactor: st.Reactor})
	return x.rollback(ctx, &frame{def: x.def, st: st, root: true}, nil)
}

// targeted reports whether the rollback under way is an UndoSteps one.
func (x *execution) targeted() bool {
	return x.st.Rollback != nil && x.st.Rollback.Trigger == TriggerTargeted
}

// rollbackTargets undoes the marked entries of f's stack, newest first,
// saving after each: a compensated one leaves the stack, any other stays
// with its status and loses its mark.
func (x *execution) rollbackTargets(ctx context.Context, f *frame) error {
	for {
		if lock.Lost(ctx) {
			return ErrLockLost
		}
		d, prefix, base, e := newestTarget(f.def, f.st.Ledger, "", f.key)
		if e == nil {
			return nil
		}
		if err := x.undoEntry(ctx, f, d, e, prefix, base); err != nil {
			return err
		}
		e.Target = false
		if e.Status == RollbackCompensated {
			f.st.Ledger = removeEntry(f.st.Ledger, e)
		}
		if err := x.checkpoint(ctx); err != nil {
			return err
		}
	}
}

// newestTarget finds the newest marked leaf entry of ledger (of definition
// d, under key base), with the definition that declares its step, its path
// prefix and the key of the compose entries it is in.
func newestTarget(d *Definition, ledger []*LedgerEntry, prefix string, base []int) (*Definition, string, []int, *LedgerEntry) {
	for i := len(ledger) - 1; i >= 0; i-- {
		e := ledger[i]
		if len(e.Children) > 0 {
			var cd *Definition
			if d != nil {
				cd = d.byName[e.Step].childDef()
			}
			if cd == nil {
				cd = &Definition{name: e.Step, byName: map[string]*stepDef{}}
			}
			if fd, fp, fb, fe := newestTarget(cd, e.Children, prefix+e.Step+"/", append(slices.Clip(base), e.Ordinal)); fe != nil {
				return fd, fp, fb, fe
			}
			continue
		}
		if e.Target {
			return d, prefix, base, e
		}
	}
	return nil, "", nil, nil
}

// removeEntry takes leaf entry e off ledger, and the compose entries it
// leaves empty.
func removeEntry(ledger []*LedgerEntry, e *LedgerEntry) []*LedgerEntry {
	out := ledger[:0]
	for _, c := range ledger {
		if c == e {
			continue
		}
		if len(c.Children) > 0 {
			c.Children = removeEntry(c.Children, e)
			if len(c.Children) == 0 {
				continue
			}
		}
		out = append(out, c)
	}
	return out
}

// finishTargeted ends an UndoSteps rollback: the run returns to the status
// it had, with the entries left applied on its stack.
func (x *execution) finishTargeted(ctx context.Context, f *frame) (*frameResult, error) {
	rb := f.st.Rollback
	f.st.Status = rb.Targeted.Prior
	f.st.Rollback = nil
	x.endingTargeted = true
	x.audit(auditRec{kind: AuditRollbackCompleted, generation: rb.generation(),
		outcome: SummarizeRollback(x.generationEntries(f.st, rb.generation())).Outcome})
	return x.finish(ctx, f, EventStepsUndone)
}

// OpUndoSteps is Engine.UndoSteps (Check applies its status rule).
const OpUndoSteps Op = "undo_steps"
