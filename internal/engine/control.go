package engine

import (
	"context"
	"errors"
	"fmt"
)

// Op names an operation on a stored run that the run's status can refuse:
// the Op of a StatusError, and what Check checks.
type Op string

// Operations on stored runs.
const (
	// OpUndo is Engine.Undo.
	OpUndo Op = "undo"
	// OpCancel is Engine.Cancel.
	OpCancel Op = "cancel"
	// OpRetry is Engine.Retry.
	OpRetry Op = "retry"
	// OpRollback is Engine.RetryRollback: re-trigger the rollback of a
	// failed or cancelled run that left entries applied.
	OpRollback Op = "rollback"
)

// Check tells whether op may be applied to stored run id now, by the same
// rules, and with the same errors, as the operation itself: nil when it
// may; an error wrapping ErrNotFound for an unknown run; a *StatusError
// with the operation's reason when the run's status refuses it. It reads
// the run and needs no definitions, so a process that holds none (a
// dashboard) can validate a request before handing it to workers (see
// worker.Controller). It also returns the run as it read it (nil when it
// found none). The run may change before the operation is applied: the
// operation checks again.
func (e *Engine) Check(ctx context.Context, id string, op Op) (*Run, error) {
	st, version, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	d := e.viewDef(st)
	run := st.view(d, version)
	switch op {
	case OpUndo:
		err = undoable(st)
	case OpCancel:
		err = cancelable(st)
	case OpRetry:
		_, _, err = e.retryPlan(ctx, st)
	case OpRollback:
		err = retriable(st)
	case OpUndoSteps:
		err = stepsUndoable(st)
	default:
		err = fmt.Errorf("reactor: Check: unknown operation %q (want %s, %s, %s, %s or %s)", op, OpUndo, OpCancel, OpRetry, OpRollback, OpUndoSteps)
	}
	return run, err
}

// Allowed is Check of every operation (OpUndo, OpCancel, OpRetry,
// OpRollback, OpUndoSteps) from one read of stored run id: for each, nil
// when it may be applied now, else the error Check would return (a
// *StatusError with the reason). A page offers the operations
// whose entry is nil and shows the others' reasons. The error is Check's
// for a run it cannot read (one wrapping ErrNotFound for an unknown run).
func (e *Engine) Allowed(ctx context.Context, id string) (*Run, map[Op]error, error) {
	st, version, err := e.load(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	d := e.viewDef(st)
	_, _, retry := e.retryPlan(ctx, st)
	if se := (*StatusError)(nil); retry != nil && !errors.As(retry, &se) && !errors.Is(retry, ErrNotFound) {
		return nil, nil, retry // a failed read, not a refusal
	}
	out := map[Op]error{OpUndo: undoable(st), OpCancel: cancelable(st), OpRetry: retry, OpRollback: retriable(st),
		OpUndoSteps: stepsUndoable(st)}
	return st.view(d, version), out, nil
}

// ErrCancelRequested is the control signal a Construct's Run returns when
// it stopped between its parts because ConstructContext.CancelRequested
// reported a cancel request. It is not a failure: the run rolls back what
// it completed, the construct included (its Undo is called with the state
// it saved), and ends cancelled.
var ErrCancelRequested = errors.New("reactor: cancel requested; the run stops and rolls back")

// CancelRequested reports whether someone asked to cancel the run
// (Engine.Cancel while this process executes it). The engine honours a
// request at every checkpoint of its own; a construct that runs long in
// this process without one (an inline map, between its elements) asks
// here and, when it is true, returns ErrCancelRequested from Run. A request
// seen once is remembered; until then each call reads Redis once, so a
// construct with many small parts asks now and then, not between every two.
// Outside Run it returns false.
func (c *ConstructContext) CancelRequested(ctx context.Context) (bool, error) {
	if c.cancel == nil {
		return false, nil
	}
	return c.cancel(ctx)
}

// cancelRequested reports a cancel request of the execution's run: one seen
// by a fenced write, or one stored since.
func (x *execution) cancelRequested(ctx context.Context) (bool, error) {
	if x.cancel {
		return true, nil
	}
	ok, err := x.e.store.CancelRequested(ctx, x.target)
	if err != nil {
		return false, fmt.Errorf("reactor: read the cancel request of run %s: %w", x.st.ID, err)
	}
	x.cancel = ok
	return ok, nil
}
