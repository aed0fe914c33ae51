package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/store"
)

// A step declared with StepConfig.Task runs as an asynq task of its own on
// a worker, while its run waits, parked, holding no worker slot. It is a
// construct of the engine's own (kindConstruct), so it rides the protocol
// maps ride: the run saves a dispatch token (SaveState), enqueues the first
// attempt and releases itself (Dispatch); the attempt's task runs the step
// under a lease in the owner's record (store/steptask.go), stores its
// outcome (first writer wins) and wakes the owner, which adopts it. A retry
// is a new task, delayed by the step's Backoff. The undo (or compensation)
// is a task too: the rollback hands it off (RollbackHandedOff), the task
// stops the step (no attempt begins after), waits for an attempt in flight
// to end, undoes what the outcome says was done, records that and wakes
// the owner again. Every wake-up of the owner only makes it read the
// record, so duplicates (a redelivered task, the run sweeper's wake-up of a
// long-parked run) are harmless; the sweeper's wake-up also re-enqueues a
// lost attempt, since the owner enqueues its current attempt again (one
// id per attempt, so a queued one is not doubled) every time it finds no
// outcome.

// An attempt holds its step under a lease as long as a run lock lives
// without a heartbeat (Config.LockExpiry): a worker killed mid-attempt
// leaves the step to a new delivery once it has lapsed (the run sweeper
// wakes the run, which enqueues one). The lease is renewed every
// stepRenew (or a third of it, when shorter), which is also how soon a
// running attempt hears a stop: one Redis command a second per attempt in
// flight.
const stepRenew = time.Second

func (e *Engine) stepRenew() time.Duration { return min(stepRenew, e.lockExpiry()/3) }

// taskStep is the construct of a step declared with StepConfig.Task.
type taskStep struct {
	s     *stepDef // the step as declared (run, undo, compensate, retry, timeouts)
	queue string   // StepConfig.TaskQueue
}

// taskState is what the run saves for a task step: the token of its
// dispatch, or, for a step run inline (in a map element, or by an engine
// with no workers), its arguments and result for the undo.
type taskState struct {
	Token  string `msgpack:"t,omitempty"`
	Inline bool   `msgpack:"i,omitempty"`
	Args   Raw    `msgpack:"a,omitempty"`
	Value  Raw    `msgpack:"v,omitempty"`
	// Done is set when the step completed in place; Skipped when it
	// returned Skip (nothing to undo).
	Done    bool `msgpack:"d,omitempty"`
	Skipped bool `msgpack:"s,omitempty"`
}

// Outcome kinds of a step task.
const (
	taskOK          = "ok"          // Run returned a value
	taskFailed      = "failed"      // Run failed for good (or was stopped mid-attempt)
	taskStopped     = "stopped"     // stopped before an attempt ran
	taskInterrupted = "interrupted" // an attempt's worker died, and no attempt may follow
	taskHalted      = "halted"      // Run returned Halt: the run halts
	taskSkipped     = "skipped"     // Run returned Skip: the step completes with no value
)

// taskOutcome is a step task's settled outcome.
type taskOutcome struct {
	Kind     string   `msgpack:"k"`
	Value    Raw      `msgpack:"v,omitempty"`
	Failure  *Failure `msgpack:"f,omitempty"`
	Attempts int      `msgpack:"n,omitempty"`
	Reason   string   `msgpack:"r,omitempty"` // Halt's or Skip's
}

// taskUndoOutcome is what the undo task of one rollback generation did.
type taskUndoOutcome struct {
	// Action is "undo", "compensate" or "" (nothing to call).
	Action  string `msgpack:"a,omitempty"`
	Code    string `msgpack:"c,omitempty"`
	Message string `msgpack:"m,omitempty"`
}

// StepTaskAttempt is one delivery of an attempt of a step that runs as its
// own task (StepConfig.Task): where it ran and how it ended. An attempt
// whose worker died shows twice, once with no end.
type StepTaskAttempt struct {
	Attempt int `msgpack:"n"`
	// Worker names the process that ran it ("host:pid").
	Worker string `msgpack:"w"`
	// StartedAt and EndedAt are Unix ms (EndedAt 0: it never ended, its
	// worker died).
	StartedAt int64 `msgpack:"s"`
	EndedAt   int64 `msgpack:"e,omitempty"`
	// Error is the attempt's error ("" when it succeeded).
	Error string `msgpack:"err,omitempty"`
}

// Shape goes into the definition's fingerprint.
func (t *taskStep) Shape() string { return fmt.Sprintf("task queue=%q", t.queue) }

// ResultType is the step's Out.
func (t *taskStep) ResultType() reflect.Type { return t.s.outType }

func decodeTaskState(raw Raw) (taskState, error) {
	var st taskState
	if len(raw) == 0 {
		return st, nil
	}
	if err := codec.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("reactor: decode a task step's state: %w", err)
	}
	return st, nil
}

// stepTasks returns the engine's step-task carrier (nil when it has no
// workers to give tasks to).
func (e *Engine) stepTasks() StepTaskEnqueuer {
	q, _ := stepTasksOf(e.cfg.Enqueuer)
	return q
}

// Run dispatches the step's first attempt, or adopts its outcome.
func (t *taskStep) Run(ctx context.Context, c *ConstructContext) (Raw, error) {
	e := c.Engine
	q := e.stepTasks()
	st, err := decodeTaskState(c.State())
	if err != nil {
		return nil, Permanent(err)
	}
	switch {
	case st.Token == "" && (c.Nested || q == nil):
		// A map element is already a task of its own; an engine with no
		// workers runs everything in its process.
		return t.runInline(ctx, c)
	case q == nil:
		// Dispatched by a process with workers: only such a process
		// adopts it (the run stays at its checkpoint).
		return nil, fmt.Errorf("reactor: task step %q was dispatched to workers: %w", c.Step, ErrNoEnqueuer)
	}
	if st.Token == "" {
		st.Token = NewRunID()
		ref := store.StepTask{Owner: c.OwnerID, Token: st.Token}
		if err := e.store.StartStepTask(ctx, ref, c.Step, c.Args); err != nil {
			return nil, err
		}
		raw, err := codec.Marshal(st)
		if err != nil {
			return nil, err
		}
		// Decide, save, then act: a crash before the enqueue leaves a
		// token whose first attempt the next resume enqueues.
		if err := c.SaveState(ctx, raw); err != nil {
			return nil, err
		}
		if err := q.EnqueueStepTask(ctx, t.task(c, st.Token, 1)); err != nil {
			return nil, err
		}
		return nil, Dispatch()
	}
	ref := store.StepTask{Owner: c.OwnerID, Token: st.Token}
	rec, err := e.store.LookStep(ctx, ref)
	if err != nil {
		return nil, err
	}
	if rec.Stopped {
		// A rollback stopped this dispatch (the run failed and is retried
		// now): the step runs afresh.
		if err := c.SaveState(ctx, nil); err != nil {
			return nil, err
		}
		return t.Run(ctx, c)
	}
	if rec.Outcome == nil {
		// Not settled: its current attempt is queued, runs, or was lost.
		// Enqueued again under its id, a no-op while asynq has it; under a
		// fresh id when its worker died holding it (a spent id would wait
		// for asynq's own recovery).
		task := t.task(c, st.Token, max(rec.Next, 1))
		if rec.Lease == "dead" {
			task.Redelivery = rec.Tries
		}
		if err := q.EnqueueStepTask(ctx, task); err != nil {
			return nil, err
		}
		return nil, Dispatch()
	}
	var out taskOutcome
	if err := codec.Unmarshal(rec.Outcome, &out); err != nil {
		return nil, Permanent(fmt.Errorf("reactor: decode the outcome of task step %q: %w", c.Step, err))
	}
	switch out.Kind {
	case taskOK:
		return out.Value, nil
	case taskSkipped:
		// Completed with no value: the steps that read it see the zero
		// value, and its undo task calls nothing.
		return nil, nil
	case taskHalted:
		return nil, Halt(out.Reason)
	case taskFailed:
		if out.Failure != nil {
			return nil, out.Failure
		}
	}
	return nil, Permanent(fmt.Errorf("reactor: task step %q ended %s before it completed", c.Step, out.Kind))
}

// task is the task of attempt n of the step's dispatch tok.
func (t *taskStep) task(c *ConstructContext, tok string, n int) StepTask {
	return StepTask{Owner: c.OwnerID, Reactor: c.OwnerReactor, Def: c.OwnerDefinition, Step: c.Step, Token: tok,
		Queue: t.queue, OwnerQueue: c.queue, Attempt: n, Timeout: t.s.timeout, TraceID: c.TraceID}
}

// runInline runs the step where the run runs, its attempts one after
// another, and keeps its arguments and result for the undo.
func (t *taskStep) runInline(ctx context.Context, c *ConstructContext) (Raw, error) {
	var err error
	for n := 1; ; n++ {
		var val Raw
		err = c.Engine.callStepTask(ctx, c.OwnerID, c.OwnerReactor, c.Step, c.TraceID, CallRun, n, t.s.timeout, func(ctx context.Context) (err error) {
			val, err = t.s.run(ctx, c.Args)
			return err
		})
		var halt *haltError
		var skip *skipError
		skipped := errors.As(err, &skip)
		switch {
		case errors.As(err, &halt):
			return nil, err
		case skipped:
			err, val = nil, nil // completed with no value, never undone
		}
		if err == nil {
			raw, merr := codec.Marshal(taskState{Inline: true, Args: c.Args, Value: val, Done: true, Skipped: skipped})
			if merr != nil {
				return nil, merr
			}
			c.state = raw
			return val, nil
		}
		if IsPermanent(err) || n >= t.s.retry.attempts() || ctx.Err() != nil {
			break
		}
		if serr := c.Engine.sleep(ctx, t.s.retry.delay(n)); serr != nil {
			break
		}
	}
	raw, merr := codec.Marshal(taskState{Inline: true, Args: c.Args})
	if merr != nil {
		return nil, merr
	}
	// Saved: the run keeps a failing construct's state for its Compensate.
	if serr := c.SaveState(context.WithoutCancel(ctx), raw); serr != nil {
		return nil, serr
	}
	return nil, newFailure(c.Step, Permanent(err))
}

// Undo undoes the completed (or, for a cancelled run, dispatched) step
// through a task of its own.
func (t *taskStep) Undo(ctx context.Context, c *ConstructContext) error {
	return t.rollBack(ctx, c, nil)
}

// Compensate cleans up after the step's own failure through a task of its
// own (the task finds the failure in the step's outcome).
func (t *taskStep) Compensate(ctx context.Context, c *ConstructContext, cause error) error {
	return t.rollBack(ctx, c, cause)
}

func (t *taskStep) rollBack(ctx context.Context, c *ConstructContext, cause error) error {
	e := c.Engine
	st, err := decodeTaskState(c.State())
	if err != nil {
		return Permanent(err)
	}
	switch {
	case st.Inline:
		return t.undoInline(ctx, c, st, cause)
	case st.Token == "":
		return nil // never dispatched
	}
	ref := store.StepTask{Owner: c.OwnerID, Token: st.Token}
	if t.s.undo == nil && t.s.compensate == nil {
		// Nothing to call: only make sure no attempt begins from here on.
		_, err := e.store.StopStep(ctx, ref)
		return err
	}
	q := e.stepTasks()
	if q == nil {
		return fmt.Errorf("reactor: the undo of task step %q runs on a worker: %w", c.Step, ErrNoEnqueuer)
	}
	gen := max(c.RollbackGeneration(), 1)
	rec, err := e.store.ReadStep(ctx, ref, gen)
	if err != nil {
		return err
	}
	if rec.Undo != nil {
		var u taskUndoOutcome
		if err := codec.Unmarshal(rec.Undo, &u); err != nil {
			return Permanent(fmt.Errorf("reactor: decode the undo outcome of task step %q: %w", c.Step, err))
		}
		if u.Message != "" {
			return Permanent(&taskUndoError{u: u})
		}
		return nil
	}
	if err := q.EnqueueStepTask(ctx, t.undoTask(c, st.Token, gen, e)); err != nil {
		return err
	}
	// The task wakes the owner when it has recorded its outcome; a wake-up
	// that finds the owner still held waits for it (the worker snoozes).
	return &RollbackHandedOff{}
}

func (t *taskStep) undoTask(c *ConstructContext, tok string, gen int, e *Engine) StepTask {
	task := t.task(c, tok, 0)
	task.Gen, task.Undo, task.Timeout = gen, true, t.undoTimeout(e)
	return task
}

// undoAhead enqueues the undo task of a task step's entry that the
// rollback will reach after the one it hands off now (undoTasksAhead):
// the same task (one id per generation) the entry's turn enqueues, and
// finds done or running then.
func (t *taskStep) undoAhead(ctx context.Context, c *ConstructContext) error {
	q := c.Engine.stepTasks()
	st, err := decodeTaskState(c.State())
	if err != nil || q == nil || st.Inline || st.Token == "" || (t.s.undo == nil && t.s.compensate == nil) {
		return err
	}
	return q.EnqueueStepTask(ctx, t.undoTask(c, st.Token, max(c.RollbackGeneration(), 1), c.Engine))
}

// undoTasksAhead starts at once the undo tasks of the task-step entries on
// top of f's stack that are independent of each other (none consumed
// another's result, directly or through another step), up to
// MaxConcurrency of them: each entry is then handed off and adopted in its
// turn, newest first, as alone, but their undos ran side by side.
func (x *execution) undoTasksAhead(ctx context.Context, f *frame) {
	if f.def.maxConc <= 1 {
		return
	}
	var g []*LedgerEntry
	for i := len(f.st.Ledger) - 1; i >= 0 && len(g) < f.def.maxConc; i-- {
		e := f.st.Ledger[i]
		s := f.def.byName[e.Step]
		if s == nil || !isTaskStep(s) || e.Interrupted || (e.Status != RollbackPending && e.Status != RollbackCompensating) {
			break
		}
		if slices.ContainsFunc(g, func(m *LedgerEntry) bool { return f.def.dependsOn(m.Step, e.Step) }) {
			break // a newer entry of the group consumed it: undone after it
		}
		g = append(g, e)
	}
	for _, e := range g[min(1, len(g)):] { // the top one is handed off in its turn
		path := f.path + e.Step
		cc := &ConstructContext{Engine: x.e, OwnerID: x.st.ID, OwnerReactor: x.st.Reactor, OwnerDefinition: x.st.Def, RunID: f.st.ID,
			Step: path, TraceID: x.st.Trace, state: e.Args, gen: x.rollbackGen(), queue: x.st.Queue}
		if err := f.def.byName[e.Step].construct.(*taskStep).undoAhead(ctx, cc); err != nil {
			// Its turn enqueues it again.
			x.e.log.Debug("a task step's undo not started ahead", "event", "reactor.step_task.undo_ahead", "run", x.st.ID, "step", path, "error", err)
		}
	}
}

// taskUndoError is a step task's failed undo or compensation, read back.
type taskUndoError struct{ u taskUndoOutcome }

func (e *taskUndoError) Error() string { return e.u.Message }

func (t *taskStep) undoTimeout(e *Engine) time.Duration {
	if t.s.undoTO > 0 {
		return t.s.undoTO
	}
	return e.cfg.UndoTimeout
}

func (t *taskStep) undoInline(ctx context.Context, c *ConstructContext, st taskState, cause error) error {
	e := c.Engine
	var err error
	switch {
	case st.Skipped:
	case st.Done && t.s.undo != nil:
		err = e.callStepTask(ctx, c.OwnerID, c.OwnerReactor, c.Step, c.TraceID, CallUndo, 0, t.undoTimeout(e), func(ctx context.Context) error {
			return t.s.undo(ctx, st.Args, st.Value)
		})
	case !st.Done && t.s.compensate != nil:
		if cause == nil {
			cause = errors.New("reactor: the step failed")
		}
		err = e.callStepTask(ctx, c.OwnerID, c.OwnerReactor, c.Step, c.TraceID, CallCompensate, 0, t.undoTimeout(e), func(ctx context.Context) error {
			return t.s.compensate(ctx, st.Args, cause)
		})
	}
	if err != nil {
		return Permanent(err)
	}
	return nil
}

// callStepTask calls a step function outside a run's execution (a step
// task on a worker): through the middleware, with the engine and the
// call's RunInfo in its context, a timeout, and a span.
func (e *Engine) callStepTask(ctx context.Context, owner, reactor, step, trace string, kind CallKind, attempt int, timeout time.Duration,
	fn func(context.Context) error) (err error) {
	c := Call{Kind: kind, RunID: owner, Reactor: reactor, Step: step, Attempt: attempt}
	x := &execution{e: e}
	ctx, span := x.startCall(ctx, c)
	defer func() { endCall(span, err) }()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	ctx = context.WithValue(ctx, engineKey{}, e)
	ctx = context.WithValue(ctx, runInfoKey{}, &RunInfo{RunID: owner, Reactor: reactor, Step: step, Kind: kind, Attempt: attempt, TraceID: trace})
	return e.invoke(ctx, c, fn)
}

// errStepTaskBusy is what a step task returns while another delivery's
// attempt holds the step (a worker snoozes the task).
var errStepTaskBusy = errors.New("reactor: the step task's step is held by another attempt")

// lookupTaskStep finds the task step a step task runs.
func (e *Engine) lookupTaskStep(t StepTask) (*taskStep, error) {
	def, err := e.definitionFor(t.Owner, t.Reactor, t.Def, 0)
	if err != nil {
		return nil, err
	}
	s := def.stepAt(t.Step)
	ts, ok := construct(s).(*taskStep)
	if !ok {
		return nil, fmt.Errorf("reactor: reactor %q has no task step at %q", t.Reactor, t.Step)
	}
	return ts, nil
}

func construct(s *stepDef) Construct {
	if s == nil {
		return nil
	}
	return s.construct
}

// wakeOwner wakes the run a step task belongs to, to adopt what the task
// recorded. cause names the record (one id per cause).
func (e *Engine) wakeOwner(ctx context.Context, t StepTask, cause string) error {
	return e.cfg.Enqueuer.Enqueue(ctx, Wake{ID: wakeID(t.Owner, cause), RunID: t.Owner, Reactor: t.Reactor, Queue: t.OwnerQueue})
}

func workerName() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// runStepTask executes one delivery of a step task's attempt.
func (e *Engine) runStepTask(ctx context.Context, t StepTask) error {
	ts, err := e.lookupTaskStep(t)
	if err != nil {
		return err
	}
	ref := store.StepTask{Owner: t.Owner, Token: t.Token}
	settled := func(ctx context.Context) error { return e.wakeOwner(ctx, t, "task:"+t.Token) }
	holder := NewRunID()
	v, err := e.store.BeginStepAttempt(ctx, ref, t.Attempt, holder, e.lockExpiry())
	if err != nil {
		return err
	}
	switch v.State {
	case store.StepTaskSettled:
		return settled(ctx)
	case store.StepTaskStop:
		if err := e.settleStepTask(ctx, ref, "", taskOutcome{Kind: taskStopped}); err != nil {
			return err
		}
		return settled(ctx)
	case store.StepTaskStale:
		if v.Next > t.Attempt {
			// A delivery of an attempt that already ended: make sure the
			// attempt it left is queued (a crash may have come between).
			n := t
			n.Attempt = v.Next
			if q := e.stepTasks(); q != nil {
				return q.EnqueueStepTask(ctx, n)
			}
		}
		return nil
	case store.StepTaskBusy:
		return fmt.Errorf("%w (for %s more)", errStepTaskBusy, v.Left)
	}
	if v.Dead > maxInterruptions {
		out := taskOutcome{Kind: taskInterrupted, Attempts: v.Tries,
			Failure: newFailure(t.Step, Permanent(fmt.Errorf("reactor: task step %q was cut short %d times (its worker died each time)", t.Step, v.Dead)))}
		out.Failure.Retryable = false
		if err := e.settleStepTask(ctx, ref, holder, out); err != nil {
			return err
		}
		return settled(ctx)
	}
	rec, err := e.store.ReadStep(ctx, ref, 0)
	if err != nil {
		return err
	}
	// Each delivery that begins gets a record of its own (numbered by the
	// deliveries begun, so a killed attempt's stays, with no end), written
	// at its start so that an operator sees where a long one runs.
	started := e.now()
	att := StepTaskAttempt{Attempt: t.Attempt, Worker: workerName(), StartedAt: started.UnixMilli()}
	e.recordStepAttempt(ctx, ref, t, v.Tries, att)

	// The attempt, under the lease: renewed while it runs, and the stop a
	// rollback asks for cancels its context.
	actx, cancel := context.WithCancelCause(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(e.stepRenew())
		defer tick.Stop()
		for {
			select {
			case <-actx.Done():
				return
			case <-tick.C:
			}
			rv, err := e.store.RenewStepLease(actx, ref, holder, e.lockExpiry())
			switch {
			case err != nil:
				continue // the lease has time left; the next tick tries again
			case rv.State == store.StepTaskLost:
				cancel(errors.New("reactor: the step task lost its lease"))
				return
			case rv.Stop:
				cancel(ErrCancelled)
				return
			}
		}
	}()
	var val Raw
	runErr := e.callStepTask(actx, t.Owner, t.Reactor, t.Step, t.TraceID, CallRun, t.Attempt, ts.s.timeout, func(ctx context.Context) (err error) {
		val, err = ts.s.run(ctx, rec.Args)
		return err
	})
	stopped := errors.Is(context.Cause(actx), ErrCancelled)
	cancel(nil)
	<-renewed
	bg := context.WithoutCancel(ctx)
	if runErr != nil && ctx.Err() != nil && !stopped {
		// The delivery ended (its worker shuts down, or asynq's timeout):
		// not the step's verdict. The lease goes back, the attempt stays
		// the current one, and asynq delivers the task again.
		att.EndedAt, att.Error = e.now().UnixMilli(), "the delivery ended: "+ctx.Err().Error()
		e.recordStepAttempt(bg, ref, t, v.Tries, att)
		if _, err := e.store.RetryStep(bg, ref, holder, t.Attempt); err != nil {
			return errors.Join(ctx.Err(), err)
		}
		return ctx.Err()
	}
	att.EndedAt = e.now().UnixMilli()
	if runErr != nil {
		att.Error = runErr.Error()
	}
	e.recordStepAttempt(bg, ref, t, v.Tries, att)
	var halt *haltError
	var skip *skipError
	switch {
	case runErr == nil:
		err = e.settleStepTask(bg, ref, holder, taskOutcome{Kind: taskOK, Value: val, Attempts: t.Attempt})
	case errors.As(runErr, &halt) && !stopped:
		err = e.settleStepTask(bg, ref, holder, taskOutcome{Kind: taskHalted, Reason: halt.reason, Attempts: t.Attempt})
	case errors.As(runErr, &skip) && !stopped:
		err = e.settleStepTask(bg, ref, holder, taskOutcome{Kind: taskSkipped, Reason: skip.reason, Attempts: t.Attempt})
	case IsPermanent(runErr), t.Attempt >= ts.s.retry.attempts(), stopped:
		fl := newFailure(t.Step, runErr)
		if stopped {
			fl = newFailure(t.Step, fmt.Errorf("reactor: stopped by the run's rollback: %w", runErr))
		}
		err = e.settleStepTask(bg, ref, holder, taskOutcome{Kind: taskFailed, Failure: fl, Attempts: t.Attempt})
	default:
		// A retry is a task of its own, after the step's backoff.
		rv, rerr := e.store.RetryStep(bg, ref, holder, t.Attempt+1)
		if rerr != nil {
			return rerr
		}
		if rv.State != store.StepTaskOK {
			return nil // settled or taken meanwhile: whoever did acts
		}
		next := t
		next.Attempt, next.Delay = t.Attempt+1, ts.s.retry.delay(t.Attempt)
		e.log.Debug("step task attempt failed; retrying as a new task", "event", "reactor.step_task.retry",
			"run", t.Owner, "step", t.Step, "attempt", t.Attempt, "delay", next.Delay, "error", runErr)
		return e.stepTasks().EnqueueStepTask(bg, next)
	}
	if err != nil {
		return err
	}
	return settled(bg)
}

// recordStepAttempt writes the record of the n-th delivery begun. It is
// the dashboard's view, not the protocol's: a failed write is only logged.
func (e *Engine) recordStepAttempt(ctx context.Context, ref store.StepTask, t StepTask, n int, att StepTaskAttempt) {
	raw, err := codec.Marshal(att)
	if err == nil {
		err = e.store.RecordStepAttempt(ctx, ref, n, raw)
	}
	if err != nil {
		e.log.Debug("step task attempt not recorded", "event", "reactor.step_task.attempt_record", "run", t.Owner, "step", t.Step, "error", err)
	}
}

// settleStepTask stores the outcome, holder still holding the lease ("":
// none may be live). Losing the lease is logged: the effect of the attempt
// is then judged by whoever settled (a rollback that found its worker gone).
func (e *Engine) settleStepTask(ctx context.Context, ref store.StepTask, holder string, out taskOutcome) error {
	raw, err := codec.Marshal(out)
	if err != nil {
		return err
	}
	v, err := e.store.SettleStep(ctx, ref, holder, raw)
	switch {
	case err != nil:
		return err
	case v.State == store.StepTaskLost:
		e.log.Warn("a step task's attempt ended after losing its lease; its outcome was not recorded and its effect may need a person",
			"event", "reactor.step_task.lease_lost", "run", ref.Owner, "token", ref.Token, "outcome", out.Kind)
	case v.State == store.StepTaskBusy:
		return fmt.Errorf("%w (for %s more)", errStepTaskBusy, v.Left)
	}
	return nil
}

// undoStepTask executes one delivery of a step task's undo: stop the step,
// wait for an attempt in flight, then undo or compensate what its outcome
// says, record that for the rollback generation, and wake the owner.
func (e *Engine) undoStepTask(ctx context.Context, t StepTask) error {
	ts, err := e.lookupTaskStep(t)
	if err != nil {
		return err
	}
	ref := store.StepTask{Owner: t.Owner, Token: t.Token}
	cause := fmt.Sprintf("taskundo:%s:%d", t.Token, t.Gen)
	v, err := e.store.StopStep(ctx, ref)
	if err != nil {
		return err
	}
	switch v.State {
	case store.StepTaskRunning:
		// The attempt hears the stop at its next renewal and ends.
		return fmt.Errorf("%w (for %s more)", errStepTaskBusy, v.Left)
	case store.StepTaskDead:
		err = e.settleStepTask(ctx, ref, "", taskOutcome{Kind: taskInterrupted})
	case store.StepTaskIdle:
		err = e.settleStepTask(ctx, ref, "", taskOutcome{Kind: taskStopped})
	}
	if err != nil {
		return err
	}
	rec, err := e.store.ReadStep(ctx, ref, t.Gen)
	if err != nil {
		return err
	}
	if rec.Undo != nil {
		return e.wakeOwner(ctx, t, cause)
	}
	var out taskOutcome
	if err := codec.Unmarshal(rec.Outcome, &out); err != nil {
		return fmt.Errorf("reactor: decode the outcome of task step %q of run %s: %w", t.Step, t.Owner, err)
	}
	var u taskUndoOutcome
	var uerr error
	undo := func(action string, kind CallKind, fn func(ctx context.Context) error) {
		u.Action = action
		uerr = e.callStepTask(ctx, t.Owner, t.Reactor, t.Step, t.TraceID, kind, 0, ts.undoTimeout(e), fn)
	}
	switch {
	case out.Kind == taskOK && ts.s.undo != nil:
		undo("undo", CallUndo, func(ctx context.Context) error { return ts.s.undo(ctx, rec.Args, out.Value) })
	case out.Kind == taskFailed && ts.s.compensate != nil:
		var cause error = out.Failure
		if u := out.Failure.Unwrap(); u != nil {
			cause = u
		}
		undo("compensate", CallCompensate, func(ctx context.Context) error { return ts.s.compensate(ctx, rec.Args, cause) })
	case out.Kind == taskInterrupted && ts.s.compensate != nil:
		undo("compensate", CallCompensate, func(ctx context.Context) error {
			return ts.s.compensate(ctx, rec.Args, errors.New("reactor: the step's worker died during its attempt"))
		})
	case out.Kind == taskInterrupted && ts.s.undo != nil:
		// The attempt may or may not have had its effect; without a
		// Compensate nobody can tell which, as for a step cut short in a run.
		u.Action, uerr = "undo", fmt.Errorf("reactor: task step %q was interrupted (its worker died) and has no Compensate: its effect is unknown", t.Step)
	}
	if uerr != nil {
		u.Code, u.Message = codeOf(uerr), uerr.Error()
		if u.Message == "" {
			u.Message = "undo failed"
		}
	}
	raw, err := codec.Marshal(u)
	if err != nil {
		return err
	}
	if _, err := e.store.RecordStepUndo(ctx, ref, t.Gen, raw); err != nil {
		return err
	}
	return e.wakeOwner(ctx, t, cause)
}

// StepTasks returns the attempts of run id's steps that run as tasks of
// their own (StepConfig.Task), by step path ("label", "book/label"), each in
// attempt order, for the step's latest dispatch: which worker ran each
// attempt, when, and how it ended. An attempt whose worker died has no end.
// Empty for a run with no such step.
func (e *Engine) StepTasks(ctx context.Context, id string) (map[string][]StepTaskAttempt, error) {
	raws, err := e.store.StepAttempts(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]StepTaskAttempt, len(raws))
	for path, recs := range raws {
		as := make([]StepTaskAttempt, 0, len(recs))
		for _, r := range recs {
			var a StepTaskAttempt
			if codec.Unmarshal(r, &a) == nil {
				as = append(as, a)
			}
		}
		out[path] = as
	}
	return out, nil
}

func isTaskStep(s *stepDef) bool {
	_, ok := s.construct.(*taskStep)
	return ok
}

// depsDone reports whether every step s depends on has completed.
func (f *frame) depsDone(s *stepDef) bool {
	for _, d := range s.deps {
		if _, done := f.st.Steps[d]; !done {
			return false
		}
	}
	return true
}
