package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/store"
)

// RollbackOutcome is a rollback's summary, from a closed set; never
// "partial": each outcome says what is still in place and who must act.
type RollbackOutcome string

// Rollback outcomes.
const (
	// RollbackInProgress: the rollback is under way; some entry is still
	// pending or compensating, and nothing is final yet.
	RollbackInProgress RollbackOutcome = "in_progress"
	// RollbackReverted: every entry that needed compensation was
	// compensated (or a person put it back: manually_reverted). Entries
	// with no compensation registered may be among them: their effects are
	// kept and listed (RollbackSummary.Kept). No effect that could be
	// undone is in place.
	RollbackReverted RollbackOutcome = "reverted"
	// RollbackKeptInPlace: settled, and nobody has to act, but effects
	// that could have been undone stay in place by decision: a person left
	// them applied (RollbackSummary.LeftApplied), or their undo windows had
	// closed (RollbackSummary.OutOfWindow). A Retry of the run is refused.
	RollbackKeptInPlace RollbackOutcome = "kept_in_place"
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
	// ID names the entry for Engine.Resolve: "<step path>#<ordinal>".
	ID string `json:"id"`
	// Resource is what the step changed, if it names it.
	Resource string `json:"resource,omitempty"`
	// Label, Expected, Observed and RestoreTo describe a guarded undo: the
	// effect's label, its after fingerprint, what the probe read, and its
	// before fingerprint.
	Label     string `json:"label,omitempty"`
	Expected  string `json:"expected,omitempty"`
	Observed  string `json:"observed,omitempty"`
	RestoreTo string `json:"restore_to,omitempty"`
	// ExpectedValue, ObservedValue and RestoreToValue are those states as
	// a person reads them (fingerprint.Format: indented, one map entry or
	// list element a line); "" when not known. For a sensitive run they
	// are there too: RollbackReport.Redacted hides them.
	ExpectedValue  string `json:"expected_value,omitempty"`
	ObservedValue  string `json:"observed_value,omitempty"`
	RestoreToValue string `json:"restore_to_value,omitempty"`
	// BlockedBy is the id of the newer entry that blocked this one.
	BlockedBy string `json:"blocked_by,omitempty"`
}

// RollbackSummary is what a rollback's entries add up to (SummarizeRollback).
type RollbackSummary struct {
	// Outcome is in_progress until Settled, then reverted,
	// kept_in_place, nothing_to_do or needs_human.
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
	// LeftApplied lists the steps whose effects a person decided to keep
	// (a resolved conflict left_applied, and the entries under it), in
	// rollback order.
	LeftApplied []string `json:"left_applied,omitempty"`
	// NeedsHuman lists the steps a person must look at, in rollback order.
	NeedsHuman []string `json:"needs_human,omitempty"`
}

// RollbackOutcomes lists every rollback outcome.
func RollbackOutcomes() []RollbackOutcome {
	return []RollbackOutcome{RollbackInProgress, RollbackReverted, RollbackKeptInPlace, RollbackNothingToDo, RollbackNeedsHuman}
}

// SummarizeRollback derives a rollback's summary from its entries alone (a
// pure function; the order of entries only orders the lists): in_progress
// while any entry is pending or compensating; else needs_human when any
// entry needs a person (compensation_failed, needs_human, blocked); else
// kept_in_place when an effect that could be undone stays in place by
// decision (left_applied, out_of_window); else reverted when some entry was
// compensated or manually reverted; otherwise nothing_to_do. So it never
// says reverted while an undoable effect is in place. An entry with no
// compensation registered is an irreversible effect its step's author
// declared (a sent e-mail has no undo): it does not change the outcome,
// since no person can do what the author could not, but it is listed in
// Kept, never hidden. An unknown status counts as needing a person.
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
		case classLeftApplied:
			s.LeftApplied = append(s.LeftApplied, e.Step)
		default:
			s.Failed++
			s.NeedsHuman = append(s.NeedsHuman, e.Step)
		}
	}
	s.Settled = s.Outstanding == 0
	switch {
	case !s.Settled:
		s.Outcome = RollbackInProgress
	case s.Failed > 0:
		s.Outcome = RollbackNeedsHuman
	case len(s.LeftApplied)+len(s.OutOfWindow) > 0:
		s.Outcome = RollbackKeptInPlace
	case s.Compensated > 0:
		s.Outcome = RollbackReverted
	default:
		s.Outcome = RollbackNothingToDo
	}
	return s
}

// RollbackReport is the per-entry account of a run's latest rollback
// (Engine.RollbackReport).
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
	// ActionRequired lists what a person must act on: the entries whose
	// guarded undo conflicted and that no one resolved yet, with the
	// fingerprints and why (FormatActionRequired turns it into text).
	ActionRequired []ActionItem `json:"action_required"`
	// ElementsHeld counts what the run's map elements still hold, over
	// every rollback generation: it can exceed what ActionRequired lists
	// (a run keeps its first MaxRollbackFailures failures); NeedsHuman lists
	// every element run that waits.
	ElementsHeld Held `json:"elements_held,omitzero"`
	// Sensitive is the run's Run.Sensitive (see Sensitive). The report
	// still carries the states' values (the caller of RollbackReport is
	// trusted code); whatever shows the report to people who may not read
	// them should show Redacted instead.
	Sensitive bool `json:"sensitive,omitempty"`
	// ValuesRedacted: the states' values were replaced with RedactedValue
	// (Redacted).
	ValuesRedacted bool `json:"values_redacted,omitempty"`
}

// ActionItem is an entry a person must resolve (Engine.Resolve).
type ActionItem struct {
	// ID is the entry's id, for Resolve.
	ID string `json:"id"`
	// Run is the run to call Resolve on: the report's own run, or the map
	// element run whose entry conflicted (an owner's report lists its
	// elements' conflicts; their fingerprints are on the element's report).
	Run      string `json:"run"`
	Step     string `json:"step"`
	Resource string `json:"resource"`
	Label    string `json:"label,omitempty"`
	// Expected is the fingerprint of the state the step left, Observed
	// what the rollback read instead, RestoreTo the state before the step.
	Expected  string `json:"expected"`
	Observed  string `json:"observed"`
	RestoreTo string `json:"restore_to"`
	// ExpectedValue, ObservedValue and RestoreToValue are those states as
	// a person reads them (fingerprint.Format), what "restore to" means in
	// practice; "" when not known (a conflict recorded before values were
	// kept, a state too large to keep, a map element's conflict listed on
	// its owner).
	ExpectedValue  string `json:"expected_value,omitempty"`
	ObservedValue  string `json:"observed_value,omitempty"`
	RestoreToValue string `json:"restore_to_value,omitempty"`
	// Why the rollback stopped.
	Why string `json:"why"`
	// Blocked lists the ids of the older entries on the resource waiting
	// for this one.
	Blocked []string `json:"blocked,omitempty"`
}

// FormatActionRequired renders what a person must act on in a report as
// plain text, for a page or a ticket ("" when nothing is required).
func FormatActionRequired(r *RollbackReport) string {
	if r == nil {
		return ""
	}
	elements := 0
	for _, a := range r.ActionRequired {
		if a.Run != "" && a.Run != r.RunID {
			elements++
		}
	}
	unlisted := r.ElementsHeld.Waiting - elements
	if len(r.ActionRequired) == 0 && unlisted <= 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s: rollback %s needs a person (%d entr%s).\n", r.RunID, r.RollbackID, len(r.ActionRequired)+max(unlisted, 0),
		map[bool]string{true: "y", false: "ies"}[len(r.ActionRequired)+max(unlisted, 0) == 1])
	for _, a := range r.ActionRequired {
		if a.Run != "" && a.Run != r.RunID {
			fmt.Fprintf(&b, "\n- %s of map element run %s (step %s)\n  why:        %s\n  resolve it on that run (its report has the fingerprints and values)\n",
				a.ID, a.Run, a.Step, a.Why)
			continue
		}
		fmt.Fprintf(&b, "\n- %s (step %s) on %s", a.ID, a.Step, a.Resource)
		if a.Label != "" {
			fmt.Fprintf(&b, ": %s", a.Label)
		}
		fmt.Fprintf(&b, "\n  why:        %s\n", a.Why)
		writeState(&b, "expected:  ", a.Expected, " (the state the step left)", a.ExpectedValue)
		writeState(&b, "observed:  ", a.Observed, "", a.ObservedValue)
		writeState(&b, "restore to:", a.RestoreTo, " (the state before the step)", a.RestoreToValue)
		if len(a.Blocked) > 0 {
			fmt.Fprintf(&b, "  blocked:    %s\n", strings.Join(a.Blocked, ", "))
		}
		b.WriteString("  resolve:    manually_reverted (you put it back to the before state) or left_applied (it stays), with a note\n")
	}
	if unlisted > 0 {
		fmt.Fprintf(&b, "\n- %d more conflict(s) of map element runs, past what the run's failure lists: "+
			"Engine.NeedsHuman (the dashboard's \"Needs a person\") lists every element run that waits\n", unlisted)
	}
	return b.String()
}

// ErrNoRollback is returned by RollbackReport for a run that never rolled
// back (it is running, or finished keeping what it did).
var ErrNoRollback = errors.New("reactor: the run has not rolled back")

// RollbackReport reports run id's latest rollback, entry by entry, with its
// summary. id may be a root run's or a map element run's ("<mapID>.<i>").
// It reads the stored run only (no definitions needed), so any process can
// call it, a dashboard included. A run that never rolled back returns
// ErrNoRollback; an unknown one ErrNotFound.
func (e *Engine) RollbackReport(ctx context.Context, id string) (*RollbackReport, error) {
	st, _, err := e.load(ctx, id)
	if errors.Is(err, ErrNotFound) {
		target, lerr := e.storedElemTarget(ctx, id)
		var snap store.Snapshot
		if lerr == nil {
			snap, lerr = e.store.Load(ctx, target)
		}
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
		Entries: []RollbackEntry{}, ActionRequired: []ActionItem{}, Sensitive: st.Sensitive}
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
				re := RollbackEntry{Step: prefix + le.Step, Ordinal: le.Ordinal, Status: le.Status, Action: a,
					ID: entryID(prefix+le.Step, le.Ordinal), Resource: le.Resource}
				if le.Effect != nil {
					re.Label, re.Expected, re.RestoreTo = le.Effect.Label, le.Effect.AfterFP, le.Effect.BeforeFP
					re.ExpectedValue, re.RestoreToValue = shownValue(le.Effect.AfterEnc), shownValue(le.Effect.BeforeEnc)
				}
				r.Entries = append(r.Entries, re)
			}
		}
		stack(st.Ledger, "")
	}
	for i := range r.Entries {
		r.Entries[i].Order = i + 1
		// The book says where each entry stands now: a later generation
		// (or a person) may have settled what an earlier one reported.
		if b := st.entry(r.Entries[i].ID); b != nil && b.State != RollbackPending && b.State != RollbackCompensating {
			r.Entries[i].Status = b.State
			r.Entries[i].Attempts = max(r.Entries[i].Attempts, b.Attempts)
		}
	}
	r.Summary = SummarizeRollback(r.Entries)
	for _, h := range st.Held {
		r.ElementsHeld.Waiting += h.Waiting
		r.ElementsHeld.LeftApplied += h.LeftApplied
		r.ElementsHeld.Failed += h.Failed
	}
	switch {
	case st.Status == StatusRollingBack:
		r.Summary.Settled, r.Summary.Outcome = false, RollbackInProgress
	case r.Summary.Outcome == RollbackNeedsHuman:
	case r.ElementsHeld.Waiting+r.ElementsHeld.Failed > 0:
		// A map's elements wait for a person or failed to undo, though
		// the run's own entries settled.
		r.Summary.Outcome = RollbackNeedsHuman
	case r.ElementsHeld.LeftApplied > 0:
		r.Summary.Outcome = RollbackKeptInPlace
	}
	for _, c := range st.conflicts() {
		if !c.waiting() {
			continue
		}
		h := c.Conflict
		a := ActionItem{ID: h.ID, Run: st.ID, Step: h.Step, Resource: h.Resource, Label: h.Label, Expected: h.Expected, Observed: h.Observed,
			RestoreTo: h.RestoreTo, Why: h.Why,
			ExpectedValue: shownValue(h.ExpectedEnc), ObservedValue: shownValue(h.ObservedEnc), RestoreToValue: shownValue(h.RestoreToEnc)}
		for _, e := range r.Entries {
			if e.BlockedBy == h.ID && e.Status == RollbackBlocked {
				a.Blocked = append(a.Blocked, e.ID)
			}
		}
		r.ActionRequired = append(r.ActionRequired, a)
	}
	// The conflicts of its map elements, as the map reported them: each
	// names the element run and entry to resolve.
	if fl := st.Failure; fl != nil {
		for _, rf := range fl.RollbackFailures {
			if rf.Reason == ReasonConflict && rf.Run != "" && rf.Run != st.ID {
				r.ActionRequired = append(r.ActionRequired, ActionItem{ID: rf.Entry, Run: rf.Run, Step: rf.Step, Why: rf.Message})
			}
		}
	}
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
		Attempts: u.Attempt, StartedAt: ms(u.StartedAt), FinishedAt: ms(u.At), Reason: u.Reason, Message: u.Message,
		ID: entryID(u.Step, u.Ordinal), Resource: u.Resource, Label: u.Label, Expected: u.Expected, Observed: u.Observed,
		RestoreTo: u.RestoreTo, BlockedBy: u.BlockedBy,
		ExpectedValue: shownValue(u.ExpectedEnc), ObservedValue: shownValue(u.ObservedEnc), RestoreToValue: shownValue(u.RestoreToEnc)}
	if e.Action == ActionNone {
		e.FinishedAt = time.Time{}
	}
	return e
}

// actionOf is the compensating action of a rollback record.
func actionOf(k CompensatingAction, s RollbackStatus) CompensatingAction {
	switch {
	case s == RollbackNoCompensation, s == RollbackOutOfWindow:
		return ActionNone
	case k == ActionCompensate:
		return ActionCompensate
	}
	return ActionUndo
}
