package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// EventKind names an event; it is also the log line's event attribute.
type EventKind string

// Events emitted by the executor.
const (
	EventRunStarted   EventKind = "reactor.run.started"
	EventRunResumed   EventKind = "reactor.run.resumed"
	EventRunCompleted EventKind = "reactor.run.completed"
	EventRunFailed    EventKind = "reactor.run.failed"
	EventRunHalted    EventKind = "reactor.run.halted"
	EventRunCancelled EventKind = "reactor.run.cancelled"
	EventRunAborted   EventKind = "reactor.run.aborted"
	EventRunLockLost  EventKind = "reactor.run.lock_lost"
	// EventReplicaAcksShort reports a write that fewer replicas than
	// Config.ReplicaAcks acknowledged in time (Err says how many). It names
	// no run: the wait covers every write its pipeline carried. Logged at
	// Debug; the engine logs a Warn summing them at most every 10 s.
	EventReplicaAcksShort EventKind = "reactor.replica_acks.short"
	EventRollbackStarted  EventKind = "reactor.rollback.started"
	// EventStepsUndone: UndoSteps finished undoing named steps of a
	// finished run, which is back in the status it had.
	EventStepsUndone EventKind = "reactor.run.steps_undone"
	// EventRollbackHandedOff: a construct handed its rollback to workers.
	EventRollbackHandedOff EventKind = "reactor.rollback.handed_off"
	EventStepStarted       EventKind = "reactor.step.started"
	EventStepCompleted     EventKind = "reactor.step.completed"
	EventStepSkipped       EventKind = "reactor.step.skipped"
	EventStepRetrying      EventKind = "reactor.step.retrying"
	EventStepFailed        EventKind = "reactor.step.failed"
	EventStepUndone        EventKind = "reactor.step.undo"
	EventStepUndoFailed    EventKind = "reactor.step.undo_failed"
	EventStepCompensated   EventKind = "reactor.step.compensate"
	EventCompensateFail    EventKind = "reactor.step.compensate_failed"
	// EventMapBatchClaimed: a fan-out map claimed its next batch of
	// elements (RunID and Reactor are the owner's, Step the map step).
	EventMapBatchClaimed EventKind = "reactor.map.batch_claimed"
	// EventMapRollbackBatchClaimed: a fan-out map's rollback claimed its
	// next batch of element rollback jobs.
	EventMapRollbackBatchClaimed EventKind = "reactor.map.rollback.batch_claimed"
	// EventLimitWaited: a step's attempt found a limit full (Err is the
	// *LimitError, Delay its RetryAfter); it waits a little, then the run
	// waits at its checkpoint.
	EventLimitWaited EventKind = "reactor.limit.waited"
	// EventLimitRefused: an attempt gave up waiting in-process for a full
	// limit (Err is the *LimitError): the run waits at its checkpoint and
	// its worker snoozes the task.
	EventLimitRefused EventKind = "reactor.limit.refused"
	// EventLimitTaken: a step's attempt took its limits and runs.
	EventLimitTaken EventKind = "reactor.limit.taken"
	// EventLimitCancelled: a full limit's OnFull cancelled a run: RunID's
	// own (CancelNewest) or the oldest holder's (CancelOldest; Err names
	// the run that asked). Err wraps the *LimitError.
	EventLimitCancelled EventKind = "reactor.limit.cancelled"
	// EventRunPaused: the run saved itself paused at an interrupt step
	// (Step) and left its worker.
	EventRunPaused EventKind = "reactor.run.paused"
	// EventPayloadReceived: Continue recorded a payload for the interrupt
	// at Step (emitted by the engine that recorded it).
	EventPayloadReceived EventKind = "reactor.interrupt.payload_received"
	// EventPayloadRefused: the run refused a recorded payload (Err says
	// why) and stays paused.
	EventPayloadRefused EventKind = "reactor.interrupt.payload_refused"
	// EventRunContinued: the interrupt at Step took its payloads and the
	// run goes on; Duration is how long it was paused.
	EventRunContinued EventKind = "reactor.run.continued"
	// EventInterruptTimedOut: the interrupt at Step timed out short of
	// payloads (the step fails, or takes its Default).
	EventInterruptTimedOut EventKind = "reactor.interrupt.timed_out"
)

// Event describes something that happened to a run or a step.
type Event struct {
	Kind    EventKind
	RunID   string
	Reactor string
	// Step is the step's path ("" for run events).
	Step    string
	Attempt int
	// Status is the run's status; on EventRunStarted and EventRunResumed,
	// the status the execution began from (StatusPending on the first
	// execution of an enqueued run).
	Status Status
	Err    error
	// Duration is how long the user function took: a step's final attempt
	// (EventStepCompleted, EventStepFailed), an undo or a compensate
	// (EventStepUndone, EventStepUndoFailed, EventStepCompensated,
	// EventCompensateFail). Zero when not timed.
	Duration time.Duration
	// Delay is the wait before the next attempt (EventStepRetrying).
	Delay time.Duration
	// Element is true for the events of a construct's element run (a map
	// element, run id "<mapID>.<i>", executed by ExecuteElement or undone
	// by UndoElement). They are logged at Debug whatever happened: the map
	// reports its elements' failures and rollback failures on the owner
	// run, once, where an operator looks.
	Element bool
	// TraceID is the run's trace id (RunInfo.TraceID): the OpenTelemetry
	// trace its spans are in when tracing is on. It is logged as trace_id.
	TraceID string
}

// Hook receives every event. Hooks run synchronously on the executing
// goroutine: keep them fast and never block.
type Hook interface {
	OnEvent(ctx context.Context, e Event)
}

// HookFunc adapts a function to Hook.
type HookFunc func(ctx context.Context, e Event)

// OnEvent calls f.
func (f HookFunc) OnEvent(ctx context.Context, e Event) { f(ctx, e) }

// CallKind says which user function a Middleware wraps.
type CallKind string

// Kinds of call.
const (
	CallRun        CallKind = "run"
	CallUndo       CallKind = "undo"
	CallCompensate CallKind = "compensate"
)

// Call describes one invocation of a step's function.
type Call struct {
	Kind    CallKind
	RunID   string
	Reactor string
	Step    string
	Attempt int
}

// Middleware wraps every call of a step's Run, Undo and Compensate (for
// tracing, metrics, or context values). It must call next once and return
// its error.
type Middleware func(ctx context.Context, c Call, next func(context.Context) error) error

// emit is how an execution emits: its events carry whether it is an
// element run.
func (x *execution) emit(ctx context.Context, ev Event) {
	ev.Element = ev.Element || x.element
	if ev.TraceID == "" {
		ev.TraceID = x.st.Trace
	}
	x.e.emit(ctx, ev)
}

// eventLevel is an event's log level. Error is kept for a step's Run, Undo
// or Compensate that panicked: a bug in the step, logged with its stack
// (see panicOf). Warn is for what an operator must act on: an undo or
// compensate that failed (something stays applied), a run that ended with
// rollback failures, a lost run lock. A failing step or a failed run that
// rolled back cleanly is the system working (Info for runs, Info for a
// step's failure and retries, Debug for other step events). An element
// run's events are all Debug, its panics included: its map reports the
// failures on the owner.
func eventLevel(ev Event) slog.Level {
	if ev.Element || ev.Kind == EventReplicaAcksShort {
		return slog.LevelDebug
	}
	if panicOf(ev) != nil {
		return slog.LevelError
	}
	switch ev.Kind {
	case EventStepUndoFailed, EventCompensateFail, EventRunLockLost:
		return slog.LevelWarn
	case EventRunFailed, EventRunCancelled:
		var f *Failure
		if errors.As(ev.Err, &f) && len(f.RollbackFailures)+f.RollbackFailuresOmitted > 0 {
			return slog.LevelWarn
		}
	case EventStepFailed, EventStepRetrying:
		return slog.LevelInfo
	}
	if ev.Step != "" {
		return slog.LevelDebug // a step, or a composed child's run event
	}
	return slog.LevelInfo
}

// panicOf is the panic of a step's call that an event reports: its Run
// failing or retrying, its Undo or Compensate failing. Only these events
// carry a panic's stack, so each panic is logged with it once: the run's
// failure that follows repeats the message alone.
func panicOf(ev Event) *PanicError {
	switch ev.Kind {
	case EventStepFailed, EventStepRetrying, EventStepUndoFailed, EventCompensateFail:
	default:
		return nil
	}
	var p *PanicError
	if errors.As(ev.Err, &p) {
		return p
	}
	return nil
}

func (e *Engine) emit(ctx context.Context, ev Event) {
	// Checked before anything is built: a step's events are Debug, and a
	// logger at Info (the usual one) must cost them nothing.
	if level := eventLevel(ev); e.log.Enabled(ctx, level) {
		e.log.LogAttrs(ctx, level, string(ev.Kind), eventAttrs(ev)...)
	}
	for _, h := range e.cfg.Hooks {
		e.callHook(ctx, h, ev)
	}
}

// eventAttrs are the attributes of ev's log line.
func eventAttrs(ev Event) []slog.Attr {
	attrs := make([]slog.Attr, 0, 11) // every attribute below
	attrs = append(attrs, slog.String("event", string(ev.Kind)), slog.String("run", ev.RunID), slog.String("reactor", ev.Reactor))
	if ev.Step != "" {
		attrs = append(attrs, slog.String("step", ev.Step))
	}
	if ev.Attempt > 0 {
		attrs = append(attrs, slog.Int("attempt", ev.Attempt))
	}
	if ev.Status != "" {
		attrs = append(attrs, slog.String("status", string(ev.Status)))
	}
	if ev.Duration > 0 {
		// As text ("1.25s"): slog's JSON handler writes a Duration as
		// nanoseconds, which nobody reads at a glance.
		attrs = append(attrs, slog.String("duration", ev.Duration.String()))
	}
	if ev.Delay > 0 {
		attrs = append(attrs, slog.String("delay", ev.Delay.String()))
	}
	if ev.Err != nil {
		attrs = append(attrs, slog.String("error", ev.Err.Error()))
	}
	if p := panicOf(ev); p != nil {
		attrs = append(attrs, slog.String("stack", p.Stack))
	}
	if ev.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", ev.TraceID))
	}
	return attrs
}

// callHook isolates the run from a panicking hook: the panic is logged, the
// run goes on.
func (e *Engine) callHook(ctx context.Context, h Hook, ev Event) {
	defer func() {
		if r := recover(); r != nil {
			e.log.Error("hook panicked", "event", "reactor.hook.panic", "hook_event", string(ev.Kind), "run", ev.RunID, "panic", fmt.Sprint(r))
		}
	}()
	h.OnEvent(ctx, ev)
}
