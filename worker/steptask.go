package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/reactor"
)

// TypeStep is the asynq task type of a step that runs as its own task
// (reactor.StepConfig.Task): one attempt of its Run, or its undo or
// compensation for a rollback.
const TypeStep = "goreactor:step"

// stepTaskGrace is what a step task's asynq timeout allows beyond the
// step's own Timeout: the record's reads and writes around the call.
const stepTaskGrace = time.Minute

// stepPayload is a step task's payload.
type stepPayload struct {
	T  engine.StepTask `msgpack:"t"`
	TP string          `msgpack:"tp,omitempty"`
}

// stepSender is engine.StepSender under a name that keeps the embedded
// field unexported.
type stepSender = engine.StepSender

// stepTasks is the Client's step-task side (engine.StepTaskEnqueuer), which
// the engine reaches through the embedded StepSender; it is not part of
// the Client's API.
type stepTasks struct{ c *Client }

func (s stepTasks) EnqueueStepTask(ctx context.Context, t engine.StepTask) error {
	return s.c.enqueueStepTask(ctx, t)
}

func (c *Client) enqueueStepTask(ctx context.Context, t engine.StepTask) error {
	body, err := codec.Marshal(stepPayload{T: t, TP: traceparent(ctx)})
	if err != nil {
		return err
	}
	queue := c.queue
	if t.Queue != "" {
		queue = t.Queue
	}
	timeout := DefaultTaskTimeout
	if t.Timeout > 0 {
		timeout = t.Timeout + stepTaskGrace
	}
	opts := []asynq.Option{asynq.TaskID(t.TaskID()), asynq.Queue(queue), asynq.MaxRetry(DefaultMaxRetry), asynq.Timeout(timeout)}
	if t.Delay > 0 {
		opts = append(opts, asynq.ProcessAt(notBefore(time.Now().Add(t.Delay))))
	}
	_, err = c.c.EnqueueContext(ctx, asynq.NewTask(TypeStep, body), opts...)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil // the same attempt (or undo), queued or running
	}
	if err != nil {
		return fmt.Errorf("worker: enqueue %s: %w", t.TaskID(), err)
	}
	return nil
}

func (w *Worker) handleStep(ctx context.Context, t *asynq.Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: panic handling %s: %v\n%s", t.Type(), r, debug.Stack())
		}
	}()
	var p stepPayload
	if err := codec.Unmarshal(t.Payload(), &p); err != nil || p.T.Owner == "" || p.T.Token == "" || p.T.Step == "" {
		if err == nil {
			err = errors.New("worker: step task names no run, token or step")
		}
		w.log.Error("archiving undecodable task", "event", "worker.task.malformed", "type", t.Type(), "error", err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	ctx, span := w.startTask(ctx, "reactor.step.task", p.TP, attribute.String("reactor.run.id", p.T.Owner),
		attribute.String("reactor.step", p.T.Step), attribute.Int("reactor.attempt", p.T.Attempt), attribute.Bool("reactor.undo", p.T.Undo))
	defer func() { endTask(span, err) }()
	err = engine.ExecuteStepTask(w.engine, ctx, p.T)
	switch {
	case err == nil:
		return nil
	case engine.IsStepTaskBusy(err):
		return &SnoozeError{RunID: p.T.Owner, Base: w.cfg.Snooze}
	case errors.Is(err, reactor.ErrDefinitionMismatch):
		return w.refuse(ctx, "step", p.T.TaskID(), err)
	case errors.Is(err, reactor.ErrUnknownReactor):
		w.unknownReactor(ctx, p.T.Reactor, "step", p.T.Owner)
	}
	return err
}

func newStepSender(t stepTasks) *stepSender { return engine.NewStepSender(t) }
