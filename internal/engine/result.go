package engine

import (
	"fmt"
	"strings"

	"github.com/goreactor/goreactor/internal/codec"
)

// CompensatingAction is which of a step's two reversing functions a
// rollback calls for it, or called when it failed: the Action of a
// RollbackEntry and an AuditEntry, the Kind of a RollbackFailure and a
// StepRollback.
type CompensatingAction string

// Compensating actions.
const (
	// ActionUndo: the step's Undo (a completed step).
	ActionUndo CompensatingAction = "undo"
	// ActionCompensate: the step's Compensate (the failing step, or one cut
	// short).
	ActionCompensate CompensatingAction = "compensate"
	// ActionNone: nothing is registered to reverse the step (reports and
	// audit entries only: a failure is always an undo's or a compensate's).
	ActionNone CompensatingAction = "none"
)

// RollbackFailure is one undo or compensate that failed during a rollback.
// The rollback carried on past it.
type RollbackFailure struct {
	// Step is the step's path: its name, prefixed by the compose steps it
	// ran inside ("book/reserve_seat").
	Step string `msgpack:"step"`
	// Kind is the function that failed: ActionUndo or ActionCompensate.
	Kind CompensatingAction `msgpack:"kind"`
	// Reason is the stable code of the error ("" when it was not registered).
	Reason string `msgpack:"reason"`
	// Message is the error's text.
	Message string `msgpack:"message"`
	// Run and Entry name, for a guarded undo's conflict, the run holding
	// the conflicted entry and the entry's id: what Engine.Resolve takes.
	// Run is a map element run's id when the conflict is an element's.
	Run   string `msgpack:"run,omitempty"`
	Entry string `msgpack:"entry,omitempty"`
}

// Failure is how a run failed: the error, the step it came from, whether a
// retry of the run could help, and every rollback failure along the way.
// A Failure read back from Redis unwraps to the registered error, so
// errors.Is and errors.As work on it.
type Failure struct {
	// Step is the failing step ("" when the failure is not a step's).
	Step string `msgpack:"step"`
	// Code is the error's stable code from the error registry ("" if none).
	Code string `msgpack:"code"`
	// Message is the error's text.
	Message string `msgpack:"message"`
	// Data holds the registered error's fields.
	Data Raw `msgpack:"data,omitempty"`
	// Retryable is false when the step failed with a Permanent error.
	Retryable bool `msgpack:"retryable"`
	// RollbackFailures lists the undos and compensations that failed.
	RollbackFailures []RollbackFailure `msgpack:"rollback_failures,omitempty"`
	// RollbackFailuresOmitted counts rollback failures beyond those kept.
	RollbackFailuresOmitted int `msgpack:"rollback_failures_omitted,omitempty"`

	err error // the live or decoded error, rebuilt lazily
}

func newFailure(step string, err error) *Failure {
	code, data := encodeError(err)
	return &Failure{
		Step:      step,
		Code:      code,
		Message:   err.Error(),
		Data:      data,
		Retryable: !IsPermanent(err),
		err:       err,
	}
}

// Error describes the failure and, when there were any, its rollback failures.
func (f *Failure) Error() string {
	var b strings.Builder
	if f.Step != "" {
		fmt.Fprintf(&b, "reactor: step %q failed: %s", f.Step, f.Message)
	} else {
		fmt.Fprintf(&b, "reactor: %s", f.Message)
	}
	if n := len(f.RollbackFailures) + f.RollbackFailuresOmitted; len(f.RollbackFailures) > 0 {
		fmt.Fprintf(&b, " (and %d rollback failure(s), first: %s of %q: %s)", n,
			f.RollbackFailures[0].Kind, f.RollbackFailures[0].Step, f.RollbackFailures[0].Message)
	}
	return b.String()
}

// Unwrap returns the step's error: the original in the process that ran the
// step, otherwise the error rebuilt from its registered code (nil if the code
// is not registered here).
func (f *Failure) Unwrap() error {
	if f.err == nil {
		f.err = decodeError(f.Code, f.Data)
	}
	return f.err
}

func (f *Failure) clone() *Failure {
	if f == nil {
		return nil
	}
	c := *f
	c.RollbackFailures = append([]RollbackFailure(nil), f.RollbackFailures...)
	return &c
}

// Outcome is the kind of a run's result.
type Outcome string

// Outcomes of a run.
const (
	// OutcomeSuccess: the run completed and returned a value.
	OutcomeSuccess Outcome = "success"
	// OutcomeFailure: the run failed, or was cancelled, and was rolled back.
	OutcomeFailure Outcome = "failure"
	// OutcomeHalt: a step halted the run.
	OutcomeHalt Outcome = "halt"
	// OutcomeDispatched: the run was handed to workers; look it up by RunID.
	OutcomeDispatched Outcome = "dispatched"
	// OutcomePaused: the run waits at an interrupt for a payload
	// (Continue); look it up by RunID.
	OutcomePaused Outcome = "paused"
	// OutcomeAborted: an in-process run stopped because its context ended.
	OutcomeAborted Outcome = "aborted"
)

// Result is what a run returned: its status and value, or its Failure.
type Result struct {
	RunID   string
	Reactor string
	Status  Status
	// Value is the encoded return value (see ValueOf).
	Value Raw
	// Failure is set when Status is failed or cancelled.
	Failure *Failure
	// Reason is the halt reason.
	Reason string
	// OutOfWindow lists the steps the run's latest rollback kept because
	// their undo windows had closed (UndoWindow): the rollback did not undo
	// them, by the definition's own rule.
	OutOfWindow []string
	// Held counts the entries the run's rollbacks (every generation) left
	// in place and that someone must know of: waiting for a person, left
	// applied by one, failed or blocked; its maps' elements included. Zero
	// when nothing is held.
	Held Held
}

// Outcome classifies the result.
func (r *Result) Outcome() Outcome {
	switch r.Status {
	case StatusCompleted:
		return OutcomeSuccess
	case StatusFailed, StatusCancelled:
		return OutcomeFailure
	case StatusHalted:
		return OutcomeHalt
	case StatusAborted:
		return OutcomeAborted
	}
	if r.Status == StatusPaused {
		return OutcomePaused
	}
	return OutcomeDispatched
}

// Err returns the Failure as an error, ErrAborted for an aborted run, or
// nil.
func (r *Result) Err() error {
	if r.Status == StatusAborted {
		return fmt.Errorf("%w (run %s: %s)", ErrAborted, r.RunID, r.Reason)
	}
	if r.Failure == nil {
		return nil
	}
	return r.Failure
}

// ValueOf decodes a result's return value into T.
func ValueOf[T any](r *Result) (T, error) {
	var v T
	if r == nil || len(r.Value) == 0 {
		return v, fmt.Errorf("reactor: result has no value")
	}
	err := codec.Unmarshal(r.Value, &v)
	return v, err
}
