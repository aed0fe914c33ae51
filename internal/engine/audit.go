package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

// The audit trail: every ledger and rollback-status transition of a run is
// appended to the run's audit stream (P:{run:<id>}:audit; a map element run
// has its own, P:{elem:<id>}:audit) by the same fenced write that stores the
// state change, so the stream holds exactly what was stored, in the order it
// was stored. Entries ride on writes the run makes anyway: auditing adds no
// Redis round trip. The stream expires with the run's tree and is capped at
// about 10,000 entries (the oldest go first).

// AuditKind names what an audit entry records.
type AuditKind string

// Audit entry kinds.
const (
	// AuditEligible: a completed step went on the undo stack (a compose
	// step's entry carries its child's entries folded in).
	AuditEligible AuditKind = "eligible"
	// AuditRollbackStarted: a rollback started (Trigger says why; Step is
	// the failing step, if any).
	AuditRollbackStarted AuditKind = "rollback_started"
	// AuditCompensating: an entry's Undo or Compensate was called. It is
	// stored with the call's outcome (or with a construct's hand-off), so it
	// shares that entry's timestamp.
	AuditCompensating AuditKind = "compensating"
	// AuditCompensated: an entry's Undo or Compensate returned successfully.
	AuditCompensated AuditKind = "compensated"
	// AuditNoCompensation: a completed step has no Undo (or the failing
	// step no Compensate): its effect is kept, listed as irreversible, and
	// the rollback goes on.
	AuditNoCompensation AuditKind = "no_compensation"
	// AuditCompensationFailed: an Undo or Compensate returned an error or
	// timed out; Reason is its code, MessageHash the sha256 of its message
	// (the readable message stays on the run).
	AuditCompensationFailed AuditKind = "compensation_failed"
	// AuditResolved: a person resolved an entry that needed one. Written by
	// the guarded-undo resolution, not by the engine itself.
	AuditResolved AuditKind = "resolved"
	// AuditRollbackCompleted: the rollback finished; Outcome is its summary.
	AuditRollbackCompleted AuditKind = "rollback_completed"
	// AuditUnresolved: UndoSteps named a step with nothing to undo (it
	// never completed, or was compensated already; Reason says which):
	// logged, not a fault.
	AuditUnresolved AuditKind = "unresolved"
	// AuditOutOfWindow: a completed step's undo window had closed when
	// the rollback started: its effect is kept, nothing was called.
	AuditOutOfWindow AuditKind = "out_of_window"
	// AuditConflict: a guarded undo found the resource changed by
	// somebody else; nothing was written, and the entry needs a person
	// (status needs_human). Expected, Observed and RestoreTo are the
	// fingerprints.
	AuditConflict AuditKind = "conflict"
	// AuditBlocked: an entry was not attempted because a newer entry on
	// its resource is still applied (BlockedBy), or was kept for good
	// (status left_applied) because a person left that entry applied.
	AuditBlocked AuditKind = "blocked"
	// AuditDiscarded: a step's recorded intent was dropped when the
	// rollback started, because its Run was never called: nothing of it to
	// compensate.
	AuditDiscarded AuditKind = "discarded"
	// AuditOperatorRequest: an operator asked for an action on the run
	// (Request: cancel, undo, undo_steps, retry, rollback, resolve), who
	// (Operator) and why (Note), recorded by Engine.RecordRequest when the
	// request was accepted; TaskID names the control task carrying it out.
	// The action's own effects follow as their own entries.
	AuditOperatorRequest AuditKind = "operator_request"
	// AuditPaused: the run paused at an interrupt step (Attempt: how many
	// payloads it accepts).
	AuditPaused AuditKind = "paused"
	// AuditContinued: a payload was recorded for the interrupt (Attempt:
	// its number; Operator: who sent it, if named; MessageHash: the
	// payload's digest, never the payload).
	AuditContinued AuditKind = "continued"
	// AuditPayloadRefused: the run refused payload Attempt (MessageHash:
	// why).
	AuditPayloadRefused AuditKind = "payload_refused"
	// AuditInterruptTimedOut: the interrupt's timeout passed with Attempt
	// payloads received.
	AuditInterruptTimedOut AuditKind = "interrupt_timed_out"
)

// AuditEntry is one entry of a run's audit stream.
type AuditEntry struct {
	// ID is the entry's stream id ("<ms>-<seq>"), increasing.
	ID string `json:"id"`
	// Kind is what the entry records.
	Kind AuditKind `json:"kind"`
	// Step is the step's path ("book/reserve" inside a composed child);
	// for rollback_started the failing step, if any; for
	// rollback_completed "" (a composed child's rollback: its compose
	// step).
	Step string `json:"step,omitempty"`
	// Ordinal is the ledger entry's ordinal within its run or composed
	// child (0 for entries not on the ledger: the failing step, steps
	// without an Undo).
	Ordinal int `json:"ordinal,omitempty"`
	// Status is the entry's rollback status after the transition.
	Status RollbackStatus `json:"status,omitempty"`
	// Action is the compensating action (compensating, compensated,
	// compensation_failed, no_compensation).
	Action CompensatingAction `json:"action,omitempty"`
	// Attempt is the step's attempt that completed (eligible) or the
	// compensation's attempt (from 1).
	Attempt int `json:"attempt,omitempty"`
	// TraceID is the run's trace id (RunInfo.TraceID: the OpenTelemetry
	// trace id when the run started under a span, else a generated one).
	TraceID string `json:"trace_id"`
	// Generation is the rollback generation (1 for a run's first); 0 on
	// eligible entries, written before any rollback.
	Generation int `json:"generation,omitempty"`
	// Trigger is what started the rollback (rollback_started).
	Trigger RollbackTrigger `json:"trigger,omitempty"`
	// Outcome is the rollback's summary outcome (rollback_completed).
	Outcome RollbackOutcome `json:"outcome,omitempty"`
	// Reason is a failure's stable code (compensation_failed).
	Reason string `json:"reason,omitempty"`
	// MessageHash is "sha256:<hex>" of a failure's message: the audit
	// never holds free text, which may carry personal data; the readable
	// message stays on the run (Run.Rollbacks, Engine.RollbackReport).
	MessageHash string `json:"message_sha256,omitempty"`
	// Resource is the entry's resource, if it names one.
	Resource string `json:"resource,omitempty"`
	// Expected, Observed and RestoreTo are a guarded undo's fingerprints
	// (conflict): the effect's after state, what was read, its before
	// state.
	Expected  string `json:"expected,omitempty"`
	Observed  string `json:"observed,omitempty"`
	RestoreTo string `json:"restore_to,omitempty"`
	// BlockedBy is the entry that blocked this one (blocked).
	BlockedBy string `json:"blocked_by,omitempty"`
	// Request, Operator, Note and TaskID describe an operator's request
	// (operator_request): the action, who asked, the reason they gave in
	// their own words (the one free text the audit holds: written for it),
	// and the control task.
	Request  string `json:"request,omitempty"`
	Operator string `json:"operator,omitempty"`
	Note     string `json:"note,omitempty"`
	TaskID   string `json:"task_id,omitempty"`
	// At is the Redis server's time of the write that stored the entry.
	At time.Time `json:"at"`
}

// ReasonUnregistered is the audit's reason code for a failure whose error
// has no registered code (RegisterError, RegisterSentinel): every
// compensation_failed entry has a code, even when the run's record has none.
const ReasonUnregistered = "reactor.unregistered_error"

// auditRec is an audit entry before it is stored.
type auditRec struct {
	kind       AuditKind
	step       string
	ordinal    int
	status     RollbackStatus
	action     CompensatingAction
	attempt    int
	generation int
	trigger    RollbackTrigger
	outcome    RollbackOutcome
	reason     string
	message    string // hashed when stored
	resource   string
	expected   string
	observed   string
	restoreTo  string
	blockedBy  string
}

// HashMessage returns how the audit stores a free-text message:
// "sha256:<hex>" of its UTF-8 bytes ("" for an empty one). Compare a
// message you hold with an entry's MessageHash through it.
func HashMessage(msg string) string {
	if msg == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(msg))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// fields is r as stream fields (the write script adds ts).
func (r auditRec) fields(trace string) []string {
	f := []string{"k", string(r.kind), "trace", trace}
	add := func(k, v string) {
		if v != "" {
			f = append(f, k, v)
		}
	}
	num := func(k string, v int) {
		if v != 0 {
			f = append(f, k, strconv.Itoa(v))
		}
	}
	add("step", r.step)
	num("o", r.ordinal)
	add("status", string(r.status))
	add("action", string(r.action))
	num("attempt", r.attempt)
	num("gen", r.generation)
	add("trigger", string(r.trigger))
	add("outcome", string(r.outcome))
	add("reason", r.reason)
	add("msg", HashMessage(r.message))
	add("res", r.resource)
	add("exp", r.expected)
	add("obs", r.observed)
	add("to", r.restoreTo)
	add("by", r.blockedBy)
	return f
}

// audit queues r for the execution's next fenced write.
func (x *execution) audit(r auditRec) {
	x.pendingAudit = append(x.pendingAudit, r)
}

// auditCompensating queues the compensating entry of rec's call.
func (x *execution) auditCompensating(rec StepRollback, ordinal int) {
	x.audit(auditRec{kind: AuditCompensating, step: rec.Step, ordinal: ordinal, status: RollbackCompensating,
		action: actionOf(rec.Kind, RollbackCompensating), attempt: rec.Attempt, generation: max(rec.Generation, 1)})
}

// auditOutcome queues the entry of rec's outcome: compensated,
// compensation_failed (reason code, hashed message) or no_compensation.
func (x *execution) auditOutcome(rec StepRollback, ordinal int) {
	r := auditRec{step: rec.Step, ordinal: ordinal, status: rec.Status, action: actionOf(rec.Kind, rec.Status),
		attempt: rec.Attempt, generation: max(rec.Generation, 1), resource: rec.Resource}
	if rec.Expected != "" && rec.Status == RollbackFailed {
		r.expected, r.observed, r.restoreTo = rec.Expected, rec.Observed, rec.RestoreTo
	}
	switch rec.Status {
	case RollbackCompensated:
		r.kind = AuditCompensated
	case RollbackNoCompensation:
		r.kind = AuditNoCompensation
	case RollbackOutOfWindow:
		r.kind = AuditOutOfWindow
	default:
		r.kind = AuditCompensationFailed
		r.reason, r.message = rec.Reason, rec.Message
		if r.reason == "" {
			r.reason = ReasonUnregistered
		}
	}
	x.audit(r)
}

// auditEligible queues an eligible entry for every ledger entry that went
// on the stack of st (or of a composed child in progress) since the last
// one, so each reaches the stream on the write that stores it.
func (x *execution) auditEligible(st *runState, prefix string) {
	if st.Seq > st.AuditSeq {
		first := len(st.Ledger)
		for first > 0 && st.Ledger[first-1].Ordinal > st.AuditSeq {
			first--
		}
		for _, e := range st.Ledger[first:] {
			r := auditRec{kind: AuditEligible, step: prefix + e.Step, ordinal: e.Ordinal, status: e.Status}
			if rec := st.Steps[e.Step]; rec != nil && !e.Interrupted {
				r.attempt = rec.Attempts
			}
			x.audit(r)
		}
		st.AuditSeq = st.Seq
	}
	for _, n := range sortedKeys(st.Children) {
		x.auditEligible(st.Children[n], prefix+n+"/")
	}
}

// auditFields turns the queued entries into stream fields, refusing any
// whose status is outside the closed set.
func (x *execution) auditFields() ([][]string, error) {
	if len(x.pendingAudit) == 0 {
		return nil, nil
	}
	out := make([][]string, len(x.pendingAudit))
	for i, r := range x.pendingAudit {
		if r.status != "" && !r.status.Valid() {
			return nil, &RollbackStatusError{RunID: x.st.ID, Step: r.step, Status: r.status}
		}
		out[i] = r.fields(x.st.Trace)
		if x.element && x.st.Elem != nil {
			// An element's entries go to its map's stream (keys.ElemAudit),
			// shared by the map's elements: each names its element.
			out[i] = append(out[i], "el", strconv.Itoa(x.st.Elem.Index))
		}
	}
	return out, nil
}

// RollbackStatusError is returned when a run would be stored with a rollback
// status outside the closed set (RollbackStatuses): nothing is written.
type RollbackStatusError struct {
	RunID  string
	Step   string
	Status RollbackStatus
}

func (e *RollbackStatusError) Error() string {
	names := make([]string, 0, len(rollbackStatuses))
	for _, s := range RollbackStatuses() {
		names = append(names, string(s))
	}
	return fmt.Sprintf("reactor: run %s: refusing to store rollback status %q of step %q: not one of %s",
		e.RunID, e.Status, e.Step, strings.Join(names, ", "))
}

// checkStatuses reports the first rollback status of st (its ledger, its
// rollback report, its composed children in progress) outside the closed
// set.
func checkStatuses(st *runState, prefix string) error {
	var walk func(es []*LedgerEntry, prefix string) error
	walk = func(es []*LedgerEntry, prefix string) error {
		for _, e := range es {
			if !e.Status.Valid() {
				return &RollbackStatusError{RunID: st.ID, Step: prefix + e.Step, Status: e.Status}
			}
			if err := walk(e.Children, prefix+e.Step+"/"); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(st.Ledger, prefix); err != nil {
		return err
	}
	for _, u := range st.Undone {
		if !u.Status.Valid() {
			return &RollbackStatusError{RunID: st.ID, Step: u.Step, Status: u.Status}
		}
	}
	for _, n := range sortedKeys(st.Children) {
		if err := checkStatuses(st.Children[n], prefix+n+"/"); err != nil {
			return err
		}
	}
	return nil
}

// Audit returns the audit trail of run id, oldest first: every ledger and
// rollback-status transition stored for it (see AuditKind). id may be a root
// run's or a map element run's ("<mapID>.<i>", Run.Element); a run with no
// entries, or unknown, has none. It needs no definitions.
func (e *Engine) Audit(ctx context.Context, id string) ([]AuditEntry, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	k := e.store.Keys()
	recs, err := e.store.ReadAudit(ctx, k.RunAudit(id))
	if _, index, isElem := keys.SplitElementID(id); err == nil && len(recs) == 0 && isElem {
		// An element's entries are in its map's stream, with the map's
		// other elements' (keys.ElemAudit); a map started before that
		// layout kept one stream per element.
		var all []store.AuditRecord
		if all, err = e.store.ReadAudit(ctx, k.ElemAudit(id)); err == nil {
			for _, r := range all {
				if r.Fields["el"] == index {
					delete(r.Fields, "el")
					recs = append(recs, r)
				}
			}
		}
		if err == nil && len(recs) == 0 {
			recs, err = e.store.ReadAudit(ctx, k.LegacyElemAudit(id))
		}
	}
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, 0, len(recs))
	for _, r := range recs {
		out = append(out, auditEntry(r))
	}
	return out, nil
}

func auditEntry(r store.AuditRecord) AuditEntry {
	f := r.Fields
	num := func(k string) int {
		n, _ := strconv.Atoi(f[k])
		return n
	}
	a := AuditEntry{ID: r.ID, Kind: AuditKind(f["k"]), Step: f["step"], Ordinal: num("o"),
		Status: RollbackStatus(f["status"]), Action: CompensatingAction(f["action"]), Attempt: num("attempt"),
		TraceID: f["trace"], Generation: num("gen"), Trigger: RollbackTrigger(f["trigger"]),
		Outcome: RollbackOutcome(f["outcome"]), Reason: f["reason"], MessageHash: f["msg"],
		Resource: f["res"], Expected: f["exp"], Observed: f["obs"], RestoreTo: f["to"], BlockedBy: f["by"],
		Request: f["req"], Operator: f["op"], Note: f["note"], TaskID: f["task"]}
	if ms, err := strconv.ParseInt(f["ts"], 10, 64); err == nil {
		a.At = time.UnixMilli(ms)
	}
	return a
}

// OperatorRequest is an operator's request on a run, as RecordRequest
// keeps it.
type OperatorRequest struct {
	// Action is what was asked: cancel, undo, undo_steps, retry, rollback
	// or resolve. Required.
	Action string
	// Operator is who asked (a name from the dashboard's operators file or
	// its trusted proxy's header); "" for unknown.
	Operator string
	// Reason is why, in the operator's words. Required.
	Reason string
	// TaskID is the control task that carries the request out, if any.
	TaskID string
	// Steps are the steps an undo_steps request names.
	Steps []string
}

// maxRequestReason bounds an OperatorRequest's Reason.
const maxRequestReason = 1000

// RecordRequest appends r to the audit trail of stored run id (an
// operator_request entry), where Audit and the dashboard's audit panel
// show it beside the entries its action writes. It fails for an unknown
// run (ErrNotFound), and for a request without an action or a reason, or a
// reason over 1,000 bytes.
func (e *Engine) RecordRequest(ctx context.Context, id string, r OperatorRequest) error {
	if err := validateRunID(id); err != nil {
		return err
	}
	switch {
	case r.Action == "":
		return errors.New("reactor: RecordRequest: the request names no action")
	case strings.TrimSpace(r.Reason) == "":
		return errors.New("reactor: RecordRequest: a request needs a reason (why the operator asked)")
	case len(r.Reason) > maxRequestReason:
		return fmt.Errorf("reactor: RecordRequest: the reason is %d bytes, over %d", len(r.Reason), maxRequestReason)
	}
	t := e.store.RunTarget(id)
	fields := []string{"k", string(AuditOperatorRequest), "req", r.Action, "note", r.Reason}
	if _, index, isElem := keys.SplitElementID(id); isElem {
		t = e.store.ElemTarget(id)
		fields = append(fields, "el", index)
	}
	if r.Operator != "" {
		fields = append(fields, "op", r.Operator)
	}
	if r.TaskID != "" {
		fields = append(fields, "task", r.TaskID)
	}
	if len(r.Steps) > 0 {
		fields = append(fields, "step", strings.Join(r.Steps, ","))
	}
	err := e.store.Note(ctx, t, fields...)
	if errors.Is(err, store.ErrNoRun) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return err
}
