package reactor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/store"
)

// RollbackOutcome is a rollback's summary: one of three, never "partial".
type RollbackOutcome string

// Rollback outcomes.
const (
	// RollbackReverted: every entry that needed compensation was
	// compensated. Entries with no compensation registered may be among
	// them: their effects are kept and listed (RollbackSummary.Kept).
	RollbackReverted RollbackOutcome = "reverted"
	// RollbackNothingToDo: no entry needed compensation (none completed,
	// or none that completed has an Undo).
	RollbackNothingToDo RollbackOutcome = "nothing_to_do"
	// RollbackNeedsHuman: at least one entry's compensation failed (or,
	// with guarded undo, conflicts or is blocked): a person must look.
	RollbackNeedsHuman RollbackOutcome = "needs_human"
)

// RollbackEntry is one entry of a rollback report: a step the rollback
// compensated, tried to, kept or has still to reach.
type RollbackEntry struct {
	// Order is the entry's place in the rollback, from 1, in the order it
	// was (or will be) reached: newest step first.
	Order int `json:"order"`
	// Step is the step's path ("book/reserve" inside a composed child).
	Step string `json:"step"`
	// Ordinal is the ledger ordinal of the step within its run or child (0
	// for steps not on the ledger: the failing step, steps without Undo).
	Ordinal int `json:"ordinal,omitempty"`
	// Status is the entry's rollback status.
	Status RollbackStatus `json:"status"`
	// Action is what reverses the step: undo, compensate, or none.
	Action CompensatingAction `json:"action"`
	// Attempts counts the calls of its Undo or Compensate (0 for none).
	Attempts int `json:"attempts"`
	// StartedAt and FinishedAt bound its compensation (zero when nothing
	// was called or it has not finished).
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Reason is a failure's stable code and Message its text.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
}

// RollbackSummary is what a rollback's entries add up to (SummarizeRollback).
type RollbackSummary struct {
	// Outcome is reverted, nothing_to_do or needs_human. It is final only
	// when Settled: entries still pending or compensating are not counted
	// in it.
	Outcome RollbackOutcome `json:"outcome"`
	// Settled is false while some entry is pending or compensating.
	Settled bool `json:"settled"`
	// Total is the number of entries.
	Total int `json:"total"`
	// Compensated, Outstanding and Failed count entries reverted, not yet
	// settled, and needing a person.
	Compensated int `json:"compensated"`
	Outstanding int `json:"outstanding"`
	Failed      int `json:"failed"`
	// Kept lists the steps whose effects were kept because nothing can
	// reverse them (no_compensation_registered), in rollback order.
	Kept []string `json:"kept,omitempty"`
	// OutOfWindow lists the steps whose effects were kept because their
	// undo window had closed (out_of_window), in rollback order: "roll
	// back everything" never quietly means less than it says.
	OutOfWindow []string `json:"out_of_window,omitempty"`
	// NeedsHuman lists the steps a person must look at, in rollback order.
	NeedsHuman []string `json:"needs_human,omitempty"`
}

// SummarizeRollback derives a rollback's summary from its entries alone (a
// pure function; the order of entries only orders Kept and NeedsHuman):
// needs_human when any entry needs a person (compensation_failed);
// otherwise reverted when some entry was compensated; otherwise
// nothing_to_do. An entry with no compensation registered is an
// irreversible effect its step's author declared (a sent e-mail has no
// undo): it does not make the rollback needs_human, since no person can do
// what the author could not, but it is listed in Kept, never hidden. An
// entry out of its undo window is kept by the definition's own policy and
// listed in OutOfWindow, likewise. An unknown status counts as needing a
// person.
func SummarizeRollback(entries []RollbackEntry) RollbackSummary {
	s := RollbackSummary{Total: len(entries)}
	for _, e := range entries {
		switch e.Status.class() {
		case classOutstanding:
			s.Outstanding++
		case classReverted:
			s.Compensated++
		case classKept:
			s.Kept = append(s.Kept, e.Step)
		case classOutOfWindow:
			s.OutOfWindow = append(s.OutOfWindow, e.Step)
		default:
			s.Failed++
			s.NeedsHuman = append(s.NeedsHuman, e.Step)
		}
	}
	s.Settled = s.Outstanding == 0
	switch {
	case s.Failed > 0:
		s.Outcome = RollbackNeedsHuman
	case s.Compensated > 0:
		s.Outcome = RollbackReverted
	default:
		s.Outcome = RollbackNothingToDo
	}
	return s
}

// RollbackReport is the per-entry account of a run's latest rollback
// (Engine.RollbackStatus).
type RollbackReport struct {
	// RunID is the run.
	RunID string `json:"run_id"`
	// RollbackID names the rollback: "<run id>:rb:<generation>".
	RollbackID string `json:"rollback_id"`
	// Generation is the rollback's generation (1 for a run's first).
	Generation int `json:"generation"`
	// Status is the run's status (rolling_back while it is under way).
	Status Status `json:"status"`
	// Trigger is what started the rollback, while it is under way ("" once
	// it finished: the run's status then says failed or cancelled).
	Trigger RollbackTrigger `json:"trigger,omitempty"`
	// Summary adds the entries up.
	Summary RollbackSummary `json:"summary"`
	// Entries are the rollback's entries in order: those it reached, then,
	// while it is under way, those still on the undo stack (newest first).
	Entries []RollbackEntry `json:"entries"`
}

// ErrNoRollback is returned by RollbackStatus for a run that never rolled
// back (it is running, or finished keeping what it did).
var ErrNoRollback = errors.New("reactor: the run has not rolled back")

// RollbackStatus reports run id's latest rollback, entry by entry, with its
// summary. id may be a root run's or a map element run's ("<mapID>.<i>").
// It reads the stored run only (no definitions needed), so any process can
// call it, a dashboard included. A run that never rolled back returns
// ErrNoRollback; an unknown one ErrNotFound.
func (e *Engine) RollbackStatus(ctx context.Context, id string) (*RollbackReport, error) {
	st, _, err := e.load(ctx, id)
	if errors.Is(err, ErrNotFound) {
		snap, lerr := e.store.Load(ctx, e.store.ElemTarget(id))
		switch {
		case errors.Is(lerr, store.ErrNotFound):
			return nil, err // neither a run nor an element
		case lerr != nil:
			return nil, lerr
		}
		st, err = decodeState(snap.Data)
	}
	if err != nil {
		return nil, err
	}
	return rollbackReport(st)
}

func rollbackReport(st *runState) (*RollbackReport, error) {
	gen := st.RbGen
	if st.Rollback != nil {
		gen = st.Rollback.generation()
	}
	if gen == 0 && len(st.Undone) > 0 {
		gen = 1 // stored before generations were kept
	}
	if gen == 0 {
		return nil, fmt.Errorf("%w (run %s is %s)", ErrNoRollback, st.ID, st.Status)
	}
	r := &RollbackReport{RunID: st.ID, RollbackID: st.ID + ":rb:" + strconv.Itoa(gen), Generation: gen, Status: st.Status,
		Entries: []RollbackEntry{}}
	if st.Rollback != nil {
		r.Trigger = st.Rollback.Trigger
	}
	// Every entry once, as its newest generation left it: a re-triggered
	// rollback (RetryRollback) retries only what the earlier ones could
	// not undo, so the report of generation g is generation 1's entries
	// with the retried ones replaced, in the order they were first undone.
	at := map[string]int{}
	var reached func(st *runState)
	reached = func(st *runState) {
		for _, u := range st.Undone {
			if max(u.Generation, 1) > gen {
				continue
			}
			k := u.Step + "#" + strconv.Itoa(u.Ordinal)
			if i, ok := at[k]; ok {
				r.Entries[i] = reportEntry(u)
				continue
			}
			at[k] = len(r.Entries)
			r.Entries = append(r.Entries, reportEntry(u))
		}
		// A composed child rolling back on its own keeps its records
		// until it settles.
		for _, n := range sortedKeys(st.Children) {
			reached(st.Children[n])
		}
	}
	reached(st)
	if st.Status == StatusRollingBack {
		var stack func(es []*LedgerEntry, prefix string)
		stack = func(es []*LedgerEntry, prefix string) {
			for i := len(es) - 1; i >= 0; i-- {
				le := es[i]
				if len(le.Children) > 0 {
					stack(le.Children, prefix+le.Step+"/")
					continue
				}
				if st.Rollback != nil && st.Rollback.Trigger == TriggerTargeted && !le.Target {
					continue // left applied by UndoSteps
				}
				a := ActionUndo
				if le.Interrupted {
					a = ActionCompensate
				}
				r.Entries = append(r.Entries, RollbackEntry{Step: prefix + le.Step, Ordinal: le.Ordinal, Status: le.Status, Action: a})
			}
		}
		stack(st.Ledger, "")
	}
	for i := range r.Entries {
		r.Entries[i].Order = i + 1
	}
	r.Summary = SummarizeRollback(r.Entries)
	return r, nil
}

// generationEntries are the report entries of st's rollback generation gen
// that were reached (its children's included).
func (x *execution) generationEntries(st *runState, gen int) []RollbackEntry {
	var out []RollbackEntry
	for _, u := range st.Undone {
		if max(u.Generation, 1) == gen {
			out = append(out, reportEntry(u))
		}
	}
	return out
}

func reportEntry(u StepRollback) RollbackEntry {
	ms := func(v int64) time.Time {
		if v == 0 {
			return time.Time{}
		}
		return time.UnixMilli(v)
	}
	e := RollbackEntry{Step: u.Step, Ordinal: u.Ordinal, Status: u.Status, Action: actionOf(u.Kind, u.Status),
		Attempts: u.Attempt, StartedAt: ms(u.StartedAt), FinishedAt: ms(u.At), Reason: u.Reason, Message: u.Message}
	if e.Action == ActionNone {
		e.FinishedAt = time.Time{}
	}
	return e
}

// actionOf is the compensating action of a rollback record.
func actionOf(k RollbackFailureKind, s RollbackStatus) CompensatingAction {
	switch {
	case s == RollbackNoCompensation, s == RollbackOutOfWindow:
		return ActionNone
	case k == KindCompensate:
		return ActionCompensate
	}
	return ActionUndo
}
