package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/store"
)

// Resolution is what a person did about an entry whose guarded undo
// conflicted (Engine.Resolve).
type Resolution string

// Resolutions.
const (
	// ResolvedManuallyReverted: the person put the resource back to the
	// entry's before state. The older entries it blocked are unblocked: a
	// re-triggered rollback (RetryRollback) undoes them, since the
	// resource is now at the state the next one down compares against.
	ResolvedManuallyReverted Resolution = "manually_reverted"
	// ResolvedLeftApplied: the person decided the resource stays as it
	// is. The older entries it blocked stay applied for good (undoing one
	// would write over what the person kept); they are reported
	// left_applied.
	ResolvedLeftApplied Resolution = "left_applied"
)

// humanRec is an entry whose guarded undo conflicted.
type humanRec struct {
	// ID is the entry's id (entryID: "<step path>#<ordinal>").
	ID       string `msgpack:"id"`
	Step     string `msgpack:"s"`
	Ordinal  int    `msgpack:"o"`
	Resource string `msgpack:"r"`
	Label    string `msgpack:"l,omitempty"`
	// Expected, Observed and RestoreTo are the fingerprints of the
	// conflict: after, what was read, before.
	Expected   string `msgpack:"ex"`
	Observed   string `msgpack:"ob"`
	RestoreTo  string `msgpack:"to"`
	Why        string `msgpack:"why,omitempty"`
	Generation int    `msgpack:"g"`
	At         int64  `msgpack:"at"`
	// ExpectedEnc, ObservedEnc and RestoreToEnc are the encodings
	// (fingerprint.Encode) of the three states, for a person to read; nil
	// when not known (a conflict recorded before they were kept, a state
	// too large to keep).
	ExpectedEnc  []byte `msgpack:"exv,omitempty"`
	ObservedEnc  []byte `msgpack:"obv,omitempty"`
	RestoreToEnc []byte `msgpack:"tov,omitempty"`
	// Resolution, Note and ResolvedAt are set by Resolve.
	Resolution Resolution `msgpack:"res,omitempty"`
	Note       string     `msgpack:"n,omitempty"`
	ResolvedAt int64      `msgpack:"ra,omitempty"`
}

// Errors of Resolve.
var (
	// ErrEmptyNote: a resolution must say what the person did.
	ErrEmptyNote = errors.New("reactor: a resolution needs a note saying what was done (a ledger row that only says someone clicked is not evidence)")
	// ErrNoSuchConflict: the run has no conflicted entry with that id.
	ErrNoSuchConflict = errors.New("reactor: the run has no entry with that id waiting for a person")
	// ErrAlreadyResolved: the entry was resolved already.
	ErrAlreadyResolved = errors.New("reactor: the entry was already resolved")
	// ErrUnknownResolution: the kind is neither ResolvedManuallyReverted
	// nor ResolvedLeftApplied.
	ErrUnknownResolution = errors.New("reactor: unknown resolution")
)

// Resolve records what a person did about entry entry of run id, whose
// guarded undo conflicted (it is needs_human; RollbackReport.ActionRequired
// lists such entries with their ids). kind is ResolvedManuallyReverted or
// ResolvedLeftApplied, and note must say what was done: it is kept on the
// run and audited (as its sha256). id may be a root run's or a map element
// run's ("<mapID>.<i>"). The call needs no definitions.
//
// After manually_reverted, a RetryRollback of the run undoes the entries
// the conflict blocked; after left_applied they are kept for good. A run
// with an entry no person resolved never expires; once the last is
// resolved, the run's retention applies again.
func (e *Engine) Resolve(ctx context.Context, id, entry string, kind Resolution, note string) error {
	if err := validateRunID(id); err != nil {
		return err
	}
	if kind != ResolvedManuallyReverted && kind != ResolvedLeftApplied {
		return fmt.Errorf("%w %q: want %q or %q", ErrUnknownResolution, kind, ResolvedManuallyReverted, ResolvedLeftApplied)
	}
	if strings.TrimSpace(note) == "" {
		return ErrEmptyNote
	}
	x, err := e.openForResolve(ctx, id)
	if err != nil {
		return err
	}
	bg := context.WithoutCancel(ctx)
	st := x.st
	if treeRollingBack(st) {
		_ = x.lease.Release(bg)
		return &StatusError{RunID: id, Status: StatusRollingBack, Op: string(OpResolve), Err: ErrRollbackInProgress}
	}
	r := st.entry(entry)
	if r == nil || r.Conflict == nil {
		_ = x.lease.Release(bg)
		var open []string
		for _, c := range st.conflicts() {
			if c.waiting() {
				open = append(open, c.ID)
			}
		}
		return fmt.Errorf("%w: %q (run %s; waiting: %s)", ErrNoSuchConflict, entry, id, strings.Join(open, ", "))
	}
	h := r.Conflict
	if h.Resolution != "" {
		_ = x.lease.Release(bg)
		// A repeat settles the owner's record if the first call could not.
		if err := e.settleOwner(ctx, st, x.settledPaths(h), h.Resolution); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s was resolved %s", ErrAlreadyResolved, entry, h.Resolution)
	}
	h.Resolution, h.Note, h.ResolvedAt = kind, note, e.now().UnixMilli()
	gen := max(st.RbGen, 1)
	status := RollbackStatus(kind)
	r.State, r.Gen, r.Reason, r.BlockedBy = status, gen, "", ""
	rec := StepRollback{Step: h.Step, Ordinal: h.Ordinal, Kind: ActionUndo, Status: status, At: h.ResolvedAt, Generation: gen,
		Resource: h.Resource, Label: h.Label, Expected: h.Expected, Observed: h.Observed, RestoreTo: h.RestoreTo, Message: note,
		ExpectedEnc: h.ExpectedEnc, ObservedEnc: h.ObservedEnc, RestoreToEnc: h.RestoreToEnc}
	st.Undone = append(st.Undone, rec)
	x.audit(auditRec{kind: AuditResolved, step: h.Step, ordinal: h.Ordinal, status: status, generation: gen,
		reason: string(kind), message: note, resource: h.Resource})
	if kind == ResolvedLeftApplied {
		// Every older entry on the resource that is blocked stays applied
		// for good under what the person kept: undoing one would write
		// over it. They leave the retry list.
		for _, o := range st.Book {
			if o == r || o.Resource != h.Resource || o.State != RollbackBlocked || !newer(r.Key, o.Key) {
				continue
			}
			o.State, o.Gen, o.Reason, o.BlockedBy = RollbackLeftApplied, gen, "", h.ID
			st.Undone = append(st.Undone, StepRollback{Step: o.Step, Ordinal: o.Ordinal, Kind: ActionUndo, Status: RollbackLeftApplied,
				At: h.ResolvedAt, Generation: gen, Resource: h.Resource, BlockedBy: h.ID,
				Message: fmt.Sprintf("kept: entry %s, newer on resource %q, was left applied by a person", h.ID, h.Resource)})
			x.audit(auditRec{kind: AuditBlocked, step: o.Step, ordinal: o.Ordinal, status: RollbackLeftApplied, generation: gen,
				resource: h.Resource, blockedBy: h.ID})
		}
		if st.Retry != nil {
			st.Retry.Entries = slices.DeleteFunc(st.Retry.Entries, func(re *retryEntry) bool {
				o := st.entry(entryID(re.Path+re.Entry.Step, re.Entry.Ordinal))
				return o != nil && o.State == RollbackLeftApplied
			})
		}
	}
	// What a person resolved is no longer a rollback failure of the run:
	// a map whose rollback is re-triggered reads this run's result.
	settled := x.settledPaths(h)
	if fl := st.Failure; fl != nil {
		fl.RollbackFailures = slices.DeleteFunc(fl.RollbackFailures, func(rf RollbackFailure) bool {
			return settled[rf.Step] == rf.Reason
		})
	}
	e.log.Info("a conflicted undo was resolved by a person", "event", "reactor.undo.resolved", "run", id, "entry", entry,
		"resolution", string(kind))
	terminal := st.Status.Terminal()
	x.recheckWaiting = true
	err = x.save(bg, terminal)
	if !terminal || err != nil {
		_ = x.lease.Release(bg)
	}
	if err != nil {
		return err
	}
	if err := e.settleOwner(ctx, st, settled, kind); err != nil {
		// The element is resolved; its owner still lists the conflict
		// (and keeps its tree): a repeat Resolve, from the owner's report,
		// settles it.
		e.log.Warn("a map element's conflict was resolved but its owner run was not updated; resolve the entry again to update it",
			"event", "reactor.undo.owner_unsettled", "run", id, "owner", st.Elem.Owner, "entry", entry, "error", err)
	}
	return nil
}

// settledPaths are the step paths whose rollback failures the resolution
// of h settled (h's own, and with left_applied the entries it blocked, as
// recorded on the run).
func (x *execution) settledPaths(h *humanRec) map[string]string {
	out := map[string]string{h.Step: ReasonConflict}
	if h.Resolution == ResolvedLeftApplied {
		for _, o := range x.st.Book {
			if o.State == RollbackLeftApplied && o.BlockedBy == h.ID {
				out[o.Step] = ReasonBlocked
			}
		}
	}
	return out
}

// settleOwner carries a map element's resolution to its owner run: what
// the element holds now goes into the map's count of what its elements hold
// (store.SetHeld, in the map's keys, over every generation), the owner keeps
// the map's new totals (runState.Held), from which its retention, its place
// in NeedsHuman and Retry's refusal follow, and the rollback failures the
// resolution settled leave the owner's failure (they read
// "<map step>[<index>]/<step>" there). elem is the element's state; a root
// run has no owner: nothing to do.
func (e *Engine) settleOwner(ctx context.Context, elem *runState, settled map[string]string, kind Resolution) error {
	el := elem.Elem
	if el == nil || el.Owner == "" {
		return nil
	}
	mapID := strings.TrimSuffix(elem.ID, "."+strconv.Itoa(el.Index))
	h := elem.held()
	totals, err := e.store.SetHeld(ctx, mapID, el.Index, store.Held{Waiting: h.Waiting, LeftApplied: h.LeftApplied, Failed: h.Failed})
	if err != nil {
		return fmt.Errorf("%w (the element is resolved: call Resolve again to update its owner %s)", err, el.Owner)
	}
	target := e.store.RunTarget(el.Owner)
	lease, err := e.locks.Acquire(ctx, target.Lock, e.cfg.UndoLockWait)
	if errors.Is(err, lock.ErrHeld) {
		return fmt.Errorf("%w (owner %s of the resolved element; the element is resolved: call Resolve again to update the owner)",
			ErrRunLocked, el.Owner)
	}
	if err != nil {
		return err
	}
	bg := context.WithoutCancel(ctx)
	st, version, err := e.load(ctx, el.Owner)
	if err != nil {
		_ = lease.Release(bg)
		if errors.Is(err, ErrNotFound) {
			return nil // the owner is gone: nothing to settle
		}
		return err
	}
	x := &execution{e: e, st: st, target: target, lease: lease, version: version, indexed: st.Status, recheckWaiting: true}
	before := st.Held[el.Step]
	x.hold(el.Step, Held{Waiting: totals.Waiting, LeftApplied: totals.LeftApplied, Failed: totals.Failed})
	changed := before != st.Held[el.Step]
	prefix := fmt.Sprintf("%s[%d]/", el.Step, el.Index)
	if fl := st.Failure; fl != nil && !treeRollingBack(st) {
		// What the owner's failure says of the element follows: a
		// conflict put back leaves it, one left applied says so.
		fl.RollbackFailures = slices.DeleteFunc(fl.RollbackFailures, func(rf RollbackFailure) bool {
			step, ok := strings.CutPrefix(rf.Step, prefix)
			drop := ok && settled[step] == rf.Reason
			changed = changed || drop
			return drop && kind == ResolvedManuallyReverted
		})
		if kind == ResolvedLeftApplied {
			for i, rf := range fl.RollbackFailures {
				if step, ok := strings.CutPrefix(rf.Step, prefix); ok && settled[step] == rf.Reason {
					fl.RollbackFailures[i].Reason = ReasonLeftApplied
					fl.RollbackFailures[i].Message = "left applied by a person: " + rf.Message
				}
			}
		}
	}
	if st.Failure != nil && !treeRollingBack(st) {
		// The map's own entry stands as its elements do now.
		var left []RollbackFailure
		for _, rf := range st.Failure.RollbackFailures {
			if strings.HasPrefix(rf.Step, el.Step+"[") {
				left = append(left, rf)
			}
		}
		var parts error
		if len(left) > 0 {
			parts = &RollbackFailures{Failures: left}
		}
		for _, r := range st.Book {
			switch r.State {
			case RollbackFailed, RollbackNeedsPerson, RollbackLeftApplied, RollbackCompensated:
			default:
				continue
			}
			if r.Step != el.Step {
				continue
			}
			if s := x.partsState(el.Step, parts); s != r.State {
				r.State, changed = s, true
			}
		}
	}
	if !changed {
		// The element's resolve write took its expiry off: it goes with
		// its owner's tree again, on what is left of the owner's retention.
		defer func() { _ = lease.Release(bg) }()
		ttl, err := e.store.Client().PTTL(ctx, target.State).Result()
		if err != nil || ttl <= 0 {
			return err
		}
		return e.store.RetainTree(ctx, el.Owner, ttl)
	}
	x.def = e.viewDef(st)
	err = x.save(bg, st.Status.Terminal())
	if !st.Status.Terminal() || err != nil {
		_ = lease.Release(bg)
	}
	return err
}

// ReasonLeftApplied is the reason an owner's rollback failure takes when a
// person resolved its map element's conflict left_applied: the effect is in
// place by decision, so nobody waits for it, and the owner is not retried.
const ReasonLeftApplied = "reactor.left_applied"

// OpResolve is Engine.Resolve (the Op of its StatusError).
const OpResolve Op = "resolve"

// openForResolve locks and loads run id (a root run, else a map element
// run) for a change that needs no definition.
func (e *Engine) openForResolve(ctx context.Context, id string) (*execution, error) {
	target, what, element := e.store.RunTarget(id), "run "+id, false
	if n, err := e.store.Client().Exists(ctx, target.State).Result(); err != nil {
		return nil, err
	} else if n == 0 {
		what, element = "element "+id, true
		if target, err = e.storedElemTarget(ctx, id); err != nil {
			return nil, err
		}
	}
	x, err := e.lockAndLoad(ctx, target, what, e.cfg.UndoLockWait)
	if err != nil {
		return nil, err
	}
	x.def = e.viewDef(x.st)
	x.element, x.inWorker = element, true
	return x, nil
}

// NeedsHuman lists up to limit runs (root or map element runs) that wait
// for a person, newest first: a conflicted undo of their own that no person
// has resolved, or, for an owner, map elements with one (however many its
// failure lists). It is what an operator's queue of work holds;
// RollbackReport of each says what to do.
func (e *Engine) NeedsHuman(ctx context.Context, limit int) ([]string, error) {
	if limit <= 0 {
		limit = 100
	}
	ids, err := e.store.NeedsHuman(ctx, limit)
	if err != nil {
		return nil, err
	}
	// An entry whose run settled, but whose removal was lost, waits for
	// the sweeper's trim; it is not shown meanwhile.
	waiting, err := e.waitingForPerson(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := ids[:0]
	for i, id := range ids {
		if waiting[i] {
			out = append(out, id)
		}
	}
	return out, nil
}
