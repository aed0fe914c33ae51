package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// StepTask is one task of a step declared with StepConfig.Task: an attempt
// of its Run, or (Undo) its undo or compensation for a rollback generation.
// Package worker carries it as an asynq task.
type StepTask struct {
	// Owner, Reactor and Def name the run the step belongs to (the
	// top-level run, its reactor and the fingerprint it started with).
	Owner, Reactor, Def string
	// Step is the step's path in the run ("charge", "book/charge").
	Step string
	// Token names the step's dispatch (a run retried runs it afresh).
	Token string
	// Queue is the step's queue (StepConfig.TaskQueue; "": the Enqueuer's
	// own); OwnerQueue the run's, where its wake-ups go.
	Queue, OwnerQueue string
	// Attempt is the attempt of Run (from 1); 0 for an undo.
	Attempt int
	// Undo is set for the undo task of rollback generation Gen.
	Undo bool
	Gen  int
	// Redelivery, when set, makes a fresh task id for an attempt whose
	// task is spent: its worker died with it active (asynq would recover
	// it only once its own lease lapses).
	Redelivery int
	// Delay postpones the task (a retry's backoff).
	Delay time.Duration
	// Timeout is the step's own bound on the call (0: none).
	Timeout time.Duration
	// TraceID is the run's trace id.
	TraceID string
}

// TaskID is the asynq task id: one per attempt, one per undo generation.
func (t StepTask) TaskID() string {
	if t.Undo {
		return fmt.Sprintf("stepundo:%s:%s:%d", t.Owner, t.Token, t.Gen)
	}
	if t.Redelivery > 0 {
		return fmt.Sprintf("step:%s:%s:%d:r%d", t.Owner, t.Token, t.Attempt, t.Redelivery)
	}
	return fmt.Sprintf("step:%s:%s:%d", t.Owner, t.Token, t.Attempt)
}

// StepTaskEnqueuer puts step tasks on the workers' queues. An id already
// queued must return nil.
type StepTaskEnqueuer interface {
	EnqueueStepTask(ctx context.Context, t StepTask) error
}

// StepSender is how a worker.Client carries its step-task side without an
// exported method: the Client embeds a *StepSender under an unexported
// alias, which promotes the unexported method stepTaskSide, and only this
// package can name it.
type StepSender struct{ q StepTaskEnqueuer }

// NewStepSender returns a StepSender for q.
func NewStepSender(q StepTaskEnqueuer) *StepSender { return &StepSender{q: q} }

func (s *StepSender) stepTaskSide() StepTaskEnqueuer {
	if s == nil {
		return nil
	}
	return s.q
}

// stepTasksOf returns the step-task side of a run Enqueuer.
func stepTasksOf(q Enqueuer) (StepTaskEnqueuer, bool) {
	if q == nil {
		return nil, false
	}
	if t, ok := q.(StepTaskEnqueuer); ok {
		return t, true
	}
	if s, ok := q.(interface{ stepTaskSide() StepTaskEnqueuer }); ok {
		if t := s.stepTaskSide(); t != nil {
			return t, true
		}
	}
	return nil, false
}

// ExecuteStepTask runs one delivery of a step task on a worker. It returns
// an error wrapping errStepTaskBusy while another delivery holds the step
// (the worker snoozes the task), ErrDefinitionMismatch or ErrUnknownReactor
// when this worker lacks the run's definition.
func ExecuteStepTask(e *Engine, ctx context.Context, t StepTask) error {
	if e.cfg.Enqueuer == nil {
		return ErrNoEnqueuer
	}
	if t.Undo {
		return e.undoStepTask(ctx, t)
	}
	return e.runStepTask(ctx, t)
}

// IsStepTaskBusy reports whether err is a step task's wait for another
// delivery.
func IsStepTaskBusy(err error) bool { return errors.Is(err, errStepTaskBusy) }
