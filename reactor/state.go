package reactor

import (
	"time"
)

// runState is what a run persists (msgpack, short keys). A composed child in
// progress is embedded in its parent's state, so one fenced write saves a
// whole run tree.
type runState struct {
	ID      string              `msgpack:"id"`
	Reactor string              `msgpack:"r"`
	Status  Status              `msgpack:"s"`
	Inputs  map[string]Raw      `msgpack:"in"`
	Steps   map[string]*stepRec `msgpack:"st"`
	// Ledger is the undo stack, oldest first.
	Ledger []*LedgerEntry `msgpack:"l,omitempty"`
	// Seq numbers ledger entries.
	Seq int `msgpack:"q,omitempty"`
	// Constructs holds the state of construct steps in progress, by step.
	Constructs map[string]Raw `msgpack:"cs,omitempty"`
	// Children holds composed child runs in progress, by compose step.
	Children map[string]*runState `msgpack:"ch,omitempty"`
	// Rollback is set while rolling back.
	Rollback *RollbackRecord `msgpack:"rb,omitempty"`
	// Undone records what each rollback did to each step, in order.
	Undone []StepRollback `msgpack:"u,omitempty"`

	// Intent is the plain step this frame runs next, saved by the checkpoint
	// before its Run is called (the previous step's checkpoint carries it),
	// with the attempt it is on. A state read back with an intent may have
	// had that step's Run called by a process that died before recording
	// its result: a forward resume runs it again, and a rollback compensates
	// it (or reports it) instead of forgetting it.
	Intent *intentRec `msgpack:"it,omitempty"`

	// Wake is the id of the last wake-up task enqueued for the run, saved
	// before the enqueue, so the sweeper can tell whether it is still queued.
	Wake string `msgpack:"w,omitempty"`

	// Queue is the asynq queue of the run's wake-ups ("" for the
	// Enqueuer's own), chosen with WithQueue when the run was created.
	Queue string `msgpack:"qu,omitempty"`
	// Deadline is the run's deadline in Unix milliseconds (0: none).
	Deadline int64 `msgpack:"dl,omitempty"`
	// Trace is the run's trace id (RunInfo.TraceID).
	Trace string `msgpack:"tr,omitempty"`
	// Elem is where an element run belongs (nil for any other run).
	Elem *elementRec `msgpack:"el,omitempty"`
	// RetryOf is the run this one retries (Engine.Retry); RetriedBy lists
	// the retries of this run, oldest first, each recorded before it is
	// created (retry_run.go).
	RetryOf   string   `msgpack:"rof,omitempty"`
	RetriedBy []string `msgpack:"rby,omitempty"`

	Value     Raw      `msgpack:"v,omitempty"`
	Failure   *Failure `msgpack:"f,omitempty"`
	Reason    string   `msgpack:"why,omitempty"`
	CreatedAt int64    `msgpack:"c"`
	UpdatedAt int64    `msgpack:"t"`
}

type stepState string

const (
	stepDone    stepState = "done"
	stepSkipped stepState = "skipped"
)

// intentRec is a step about to run or running, and its attempt (1-based).
// Attempts that returned an error are counted durably: a crash never sends a
// step back to attempt 1, so Retry.MaxAttempts bounds its failures.
type intentRec struct {
	Step    string `msgpack:"s"`
	Attempt int    `msgpack:"a,omitempty"`
	// Interrupted counts the executions that found this intent on record
	// and so may have been cut short inside the step (a dead process, an
	// ended delivery): past maxInterruptions the step fails instead of
	// killing its workers for ever.
	Interrupted int `msgpack:"x,omitempty"`
	// Scheduled marks an intent saved with a scheduled retry wake-up: the
	// process left on purpose, nothing was cut short.
	Scheduled bool `msgpack:"sch,omitempty"`
}

type stepRec struct {
	State    stepState `msgpack:"s"`
	Value    Raw       `msgpack:"v,omitempty"`
	Attempts int       `msgpack:"a,omitempty"`
}

// LedgerEntry is one completed, undoable step on a run's undo stack.
type LedgerEntry struct {
	// Ordinal orders entries within a run (1, 2, ...).
	Ordinal int `msgpack:"o"`
	// Step is the step's name.
	Step string `msgpack:"step"`
	// Args is a snapshot of the arguments the step saw.
	Args Raw `msgpack:"args,omitempty"`
	// Result is the step's result.
	Result Raw `msgpack:"res,omitempty"`
	// Status is the entry's rollback status (pending until undone).
	Status RollbackStatus `msgpack:"status"`
	// Children are a composed child's entries, folded into the compose
	// step's entry, oldest first.
	Children []*LedgerEntry `msgpack:"ch,omitempty"`
	// Interrupted marks a step whose Run was called but whose result was
	// never recorded (its process died, or the run was cut short mid-step):
	// its effect may or may not have happened, so the rollback calls its
	// Compensate, which must tolerate both.
	Interrupted bool `msgpack:"int,omitempty"`
}

// RollbackTrigger says what started a rollback.
type RollbackTrigger string

// Rollback triggers.
const (
	// TriggerFailure: a step failed.
	TriggerFailure RollbackTrigger = "failure"
	// TriggerUndo: Undo or Cancel was called.
	TriggerUndo RollbackTrigger = "undo"
	// TriggerStep: a composed child rolls back inside the parent's step.
	TriggerStep RollbackTrigger = "step"
)

// RollbackRecord is saved with status rolling_back before the first
// compensation side effect, so a crash mid-rollback resumes the rollback
// instead of retrying the failed step.
type RollbackRecord struct {
	Trigger RollbackTrigger `msgpack:"trigger"`
	// Step is the failing step ("" for an undo).
	Step string `msgpack:"step,omitempty"`
	// Compensated is true once the failing step's compensate was called.
	Compensated bool `msgpack:"compensated"`
	// Failure is the Failure the run will end with, captured when the
	// rollback started; rollback failures are added as they happen.
	Failure *Failure `msgpack:"failure,omitempty"`
	// CompensationError is the failing step's compensate error, if any.
	CompensationError string `msgpack:"compensation_error,omitempty"`
}

// StepRollback is what a rollback did for one step: the per-step rollback
// status report.
type StepRollback struct {
	Step    string              `msgpack:"step"`
	Ordinal int                 `msgpack:"o,omitempty"`
	Kind    RollbackFailureKind `msgpack:"kind"`
	Status  RollbackStatus      `msgpack:"status"`
	Reason  string              `msgpack:"reason,omitempty"`
	Message string              `msgpack:"message,omitempty"`
	At      int64               `msgpack:"at"`
}

// Run is a stored run, as Get returns it.
type Run struct {
	ID      string
	Reactor string
	Status  Status
	// Version is the number of fenced writes the run has had.
	Version int64
	Inputs  map[string]Raw
	// Completed lists completed steps in completion order of the definition.
	Completed []string
	// Skipped lists skipped steps.
	Skipped []string
	// Ledger is the undo stack, oldest first.
	Ledger []*LedgerEntry
	// Rollback is set while the run is rolling back.
	Rollback *RollbackRecord
	// Rollbacks is the per-step rollback report, in the order it happened.
	Rollbacks []StepRollback
	Value     Raw
	Failure   *Failure
	Reason    string
	// Wake is the id of the last wake-up task enqueued for the run.
	Wake string
	// Queue is the asynq queue of the run's wake-ups (WithQueue); "" for
	// the Enqueuer's own.
	Queue string
	// Deadline is the run's deadline (WithDeadline, WithTimeout); zero when
	// it has none.
	Deadline time.Time
	// TraceID is the run's trace id (see RunInfo.TraceID).
	TraceID string
	// Element is set for a map element run (Engine.Element).
	Element *ElementInfo
	// RetryOf is the id of the run this run retries (Engine.Retry); "" for
	// a run started otherwise.
	RetryOf string
	// RetriedBy lists the ids of the runs that retry this one, oldest
	// first.
	RetriedBy []string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Result returns the run's result as a Result.
func (r *Run) Result() *Result {
	return &Result{RunID: r.ID, Reactor: r.Reactor, Status: r.Status, Value: r.Value, Failure: r.Failure, Reason: r.Reason}
}

func (st *runState) result() *Result {
	return &Result{RunID: st.ID, Reactor: st.Reactor, Status: st.Status, Value: st.Value, Failure: st.Failure, Reason: st.Reason}
}

func (st *runState) view(d *Definition, version int64) *Run {
	r := &Run{ID: st.ID, Reactor: st.Reactor, Status: st.Status, Version: version, Inputs: st.Inputs,
		Ledger: st.Ledger, Rollback: st.Rollback, Rollbacks: st.Undone, Value: st.Value,
		Failure: st.Failure, Reason: st.Reason, Wake: st.Wake, Queue: st.Queue, TraceID: st.Trace,
		RetryOf: st.RetryOf, RetriedBy: st.RetriedBy,
		CreatedAt: time.UnixMilli(st.CreatedAt), UpdatedAt: time.UnixMilli(st.UpdatedAt)}
	if st.Deadline != 0 {
		r.Deadline = time.UnixMilli(st.Deadline)
	}
	if el := st.Elem; el != nil {
		r.Element = &ElementInfo{Owner: el.Owner, Step: el.Step, Index: el.Index}
	}
	names := make([]string, 0, len(st.Steps))
	if d != nil {
		for _, s := range d.order {
			names = append(names, s.name)
		}
	} else {
		for n := range st.Steps {
			names = append(names, n)
		}
	}
	for _, n := range names {
		rec, ok := st.Steps[n]
		if !ok {
			continue
		}
		if rec.State == stepSkipped {
			r.Skipped = append(r.Skipped, n)
		} else {
			r.Completed = append(r.Completed, n)
		}
	}
	return r
}

func newState(id string, d *Definition, inputs map[string]Raw, now time.Time) *runState {
	return &runState{ID: id, Reactor: d.name, Status: StatusRunning, Inputs: inputs,
		Steps: map[string]*stepRec{}, CreatedAt: now.UnixMilli(), UpdatedAt: now.UnixMilli()}
}
