package worker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// An enqueued run is executed by the worker; Wait returns its final result.
func TestEnqueuedRunCompletesInWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	type in struct {
		Name string `json:"name"`
	}
	def := reactor.MustDefine("greet",
		reactor.Input[string]("name", reactor.Required()),
		reactor.Step("hello", reactor.StepConfig[in, string]{
			Args: reactor.Bindings{"name": reactor.FromInput("name")},
			Run:  func(_ context.Context, in in) (string, error) { return "hello " + in.Name, nil },
		}),
		reactor.Returns(reactor.FromStep("hello")),
	)
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, map[string]any{"name": "ada"})
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	require.Equal(t, reactor.StatusPending, res.Status)

	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.Equal(t, reactor.OutcomeSuccess, final.Outcome())
	v, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	require.Equal(t, "hello ada", v)
	require.Equal(t, []string{"hello"}, f.events.steps("worker", reactor.EventStepCompleted))
	require.Empty(t, f.events.steps("api", reactor.EventStepStarted), "the enqueuing engine runs nothing")
}

// A failing run ends failed with its Failure, rolled back by the worker.
func TestFailingRunRollsBackInWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("checkout",
		step(tr, "reserve", nil),
		step(tr, "charge", nil, "reserve"),
		step(tr, "ship", errors.New("carrier down"), "charge"),
	)
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.NotNil(t, final.Failure)
	require.Equal(t, "ship", final.Failure.Step)
	require.Equal(t, "carrier down", final.Failure.Message)
	require.Equal(t, []string{"run:reserve", "run:charge", "run:ship", "undo:charge", "undo:reserve"}, tr.all())
	require.Equal(t, []string{"charge", "reserve"}, f.events.steps("worker", reactor.EventStepUndone))
	require.Empty(t, f.events.steps("api", reactor.EventStepUndone))

	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.Ledger, "every undoable step was undone")
}

// Enqueuing the same run id twice queues one task and runs the steps once;
// enqueuing it after it finished returns the stored result.
func TestEnqueueSameRunIDRunsOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	var runs atomic.Int32
	def := counted("once", &runs)
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	const id = "order-1"

	first, err := api.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	second, err := api.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, id, first.RunID)
	require.Equal(t, id, second.RunID)
	require.Equal(t, reactor.StatusPending, second.Status)
	qi, err := f.inspector.GetQueueInfo(f.queue)
	require.NoError(t, err)
	require.Equal(t, 1, qi.Pending, "the second Enqueue is the same wake-up")

	f.startWorker(wk)
	final, err := api.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	f.awaitTaskGone(startTask(id))

	third, err := api.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, third.Status)
	require.Equal(t, final.Value, third.Value)
	qi, err = f.inspector.GetQueueInfo(f.queue)
	require.NoError(t, err)
	require.Zero(t, qi.Size, "a finished run is not enqueued again")
	require.Equal(t, int32(1), runs.Load())
}

// A payload no retry can fix is archived with the reason, never retried, and
// the worker carries on with other tasks.
func TestMalformedPayloadIsArchived(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	wk := f.engine("worker")
	f.startWorker(wk)
	encode := func(p payload.RunPayload) []byte {
		b, err := payload.EncodeRun(p)
		require.NoError(t, err)
		return b
	}
	cases := []struct {
		id      string
		payload []byte
		reason  string
	}{
		{"garbage", []byte{0xc1, 0xff, 0x00}, "malformed payload"},
		{"empty", nil, "malformed payload"},
		{"empty-run-id", encode(payload.RunPayload{Reactor: "x"}), "run id: id is empty"},
		{"braced-run-id", encode(payload.RunPayload{RunID: "a{b}", Reactor: "x"}), "brace"},
		{"no-reactor", encode(payload.RunPayload{RunID: "r1"}), "no reactor name"},
	}
	ac := asynq.NewClientFromRedisClient(f.rdb) // shares f.rdb: nothing to close
	for _, c := range cases {
		_, err := ac.Enqueue(asynq.NewTask(worker.TypeRun, c.payload),
			asynq.Queue(f.queue), asynq.TaskID(c.id), asynq.MaxRetry(worker.DefaultMaxRetry))
		require.NoError(t, err)
	}
	for _, c := range cases {
		info := f.awaitTaskState(c.id, asynq.TaskStateArchived)
		require.Contains(t, info.LastErr, "malformed payload", c.id)
		require.Contains(t, info.LastErr, c.reason, c.id)
		require.Zero(t, info.Retried, "%s was archived at once, not after retries", c.id)
	}

	var runs atomic.Int32
	def := counted("after_garbage", &runs)
	ctx := ctxTimeout(t)
	res, err := wk.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	final, err := wk.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)

	qi, err := f.inspector.GetQueueInfo(f.queue)
	require.NoError(t, err)
	require.Equal(t, len(cases), qi.Archived)
	require.Zero(t, qi.Retry)
}

// A run of a reactor the worker does not know (yet) is retried, not
// archived: a rolling deploy may not have the definition everywhere.
func TestUnknownReactorIsRetriedUntilRegistered(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker") // only api knows "late"
	var runs atomic.Int32
	def := counted("late", &runs)
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	task := startTask(res.RunID)
	info := f.awaitTaskState(task, asynq.TaskStateRetry)
	require.Contains(t, info.LastErr, `unknown reactor "late"`)
	require.Equal(t, 1, info.Retried, "an unknown reactor is a real failure")
	require.Zero(t, runs.Load())
	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, run.Status, "the run is untouched")

	// The deploy catches up; asynq's next attempt is seconds away, so run
	// the task now.
	require.NoError(t, wk.Register(def))
	require.NoError(t, f.inspector.RunTask(f.queue, task))
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.Equal(t, int32(1), runs.Load())
}

// A task whose run is locked by another process snoozes: it is redelivered
// without spending asynq's retry budget, and runs once the lock is free.
func TestLockedRunSnoozesWithoutSpendingRetries(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	var runs atomic.Int32
	def := counted("contended", &runs)
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	const id = "snooze-1"
	lockKey := f.prefix + ":{run:" + id + "}:lock"

	_, err := api.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	// Another process holds the run before any worker sees the task.
	require.NoError(t, f.rdb.Set(ctx, lockKey, "another-process", time.Minute).Err())
	f.startWorker(wk, func(c *worker.Config) { c.Snooze = 20 * time.Millisecond })

	info := f.awaitTaskState(startTask(id), asynq.TaskStateRetry)
	require.Contains(t, info.LastErr, "locked by another process; snoozing")
	require.Zero(t, info.Retried, "a snooze is not a failure")
	require.Equal(t, worker.DefaultMaxRetry, info.MaxRetry)
	require.Zero(t, runs.Load())

	// The other process dies: its lock expires shortly.
	require.NoError(t, f.rdb.PExpire(ctx, lockKey, 200*time.Millisecond).Err())
	final, err := api.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.Equal(t, int32(1), runs.Load())

	f.awaitTaskGone(startTask(id))
	qi, err := f.inspector.GetQueueInfo(f.queue)
	require.NoError(t, err)
	require.Zero(t, qi.FailedTotal, "no snooze counted as a failure")
	require.Equal(t, 1, qi.ProcessedTotal, "only the final delivery counts as processed")
}

// Hand-off points: an in-process run executes up to its hand-off point and
// a worker runs the rest.
func TestHandOffPoints(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	caller, wk := f.engine("caller"), f.engine("worker")
	var mu sync.Mutex
	ran := map[string]int{}
	mark := func(name string, h reactor.HandOff, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After:   after,
			HandOff: h,
			Run: func(context.Context, reactor.Args) (string, error) {
				mu.Lock()
				ran[name]++
				mu.Unlock()
				return name, nil
			},
		})
	}
	after := reactor.MustDefine("handoff_after",
		mark("a", reactor.HandOffAfter),
		mark("b", reactor.NoHandOff, "a"),
		mark("c", reactor.HandOffBefore, "b"),
		reactor.Returns(reactor.FromStep("c")),
	)
	before := reactor.MustDefine("handoff_before",
		mark("x", reactor.NoHandOff),
		mark("y", reactor.HandOffBefore, "x"),
	)
	require.NoError(t, wk.Register(after, before))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := caller.Run(ctx, after, nil, reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	final, err := caller.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	v, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	require.Equal(t, "c", v)

	res, err = caller.Run(ctx, before, nil, reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	final, err = caller.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)

	require.Equal(t, []string{"a", "x"}, f.events.steps("caller", reactor.EventStepCompleted))
	require.Equal(t, []string{"b", "c", "y"}, f.events.steps("worker", reactor.EventStepCompleted))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1, "x": 1, "y": 1}, ran)
}

// A worker whose run lock is taken over mid-step stops: the step's context
// is cancelled by the heartbeat, nothing more is written, no later step runs,
// and the task is not retried (the new owner carries the run on).
func TestLostLockStopsWorkerRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	lost := make(chan struct{})
	var once sync.Once
	api := f.engine("api")
	wk := f.engine("worker", func(c *reactor.Config) {
		// A heartbeat every 333ms notices the takeover; one up to 667ms
		// late (a process starved by a parallel run) keeps the lock till then.
		c.LockExpiry = time.Second
		c.Hooks = append(c.Hooks, reactor.HookFunc(func(_ context.Context, ev reactor.Event) {
			if ev.Kind == reactor.EventRunLockLost {
				once.Do(func() { close(lost) })
			}
		}))
	})
	const id = "lost-1"
	lockKey := f.prefix + ":{run:" + id + "}:lock"
	tr := &trail{}
	var (
		takeover struct {
			version int64
			err     error
			cause   error
		}
		takeoverDone = make(chan struct{})
	)
	def := reactor.MustDefine("lost",
		step(tr, "a", nil),
		reactor.Step("b", reactor.StepConfig[reactor.Args, int]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ reactor.Args) (int, error) {
				defer close(takeoverDone)
				tr.add("run:b")
				run, err := wk.Get(context.Background(), id)
				if err != nil {
					takeover.err = err
					return 0, err
				}
				takeover.version = run.Version
				// Another process takes the run over.
				takeover.err = f.rdb.Set(context.Background(), lockKey, "usurper", time.Minute).Err()
				<-ctx.Done() // the heartbeat notices and cancels the step
				takeover.cause = context.Cause(ctx)
				return 0, errors.New("step saw its context end")
			},
		}),
		step(tr, "c", nil, "b"),
	)
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	_, err := api.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	select {
	case <-lost:
	case <-ctx.Done():
		t.Fatal("the worker never noticed it lost the lock")
	}
	<-takeoverDone
	require.NoError(t, takeover.err)
	require.ErrorIs(t, takeover.cause, lock.ErrLost)
	// The handler snoozes: while the new owner holds the run, a redelivery
	// only waits; it is not a failure and spends no retry.
	info := f.awaitTaskState(startTask(id), asynq.TaskStateRetry)
	require.Zero(t, info.Retried)
	require.Contains(t, info.LastErr, "snoozing")

	require.Equal(t, []string{"run:a", "run:b"}, tr.all(), "no undo, no later step")
	run, err := api.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, takeover.version, run.Version, "nothing was written after the takeover")
	require.Equal(t, reactor.StatusRunning, run.Status)
	require.Equal(t, []string{"a"}, run.Completed)
	require.Equal(t, "usurper", f.rdb.Get(ctx, lockKey).Val(), "the new owner's lock is untouched")
}

// Enqueue refuses an id taken by a run of another reactor, as Run does,
// rather than waking that run under the wrong name.
func TestEnqueueRefusesAnIDTakenByAnotherReactor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.engine("api")
	var runsA, runsB atomic.Int32
	defA, defB := counted("a", &runsA), counted("b", &runsB)
	ctx := ctxTimeout(t)
	const id = "shared-id"

	_, err := api.Enqueue(ctx, defA, nil, reactor.WithRunID(id)) // pending, no worker
	require.NoError(t, err)
	_, err = api.Enqueue(ctx, defB, nil, reactor.WithRunID(id))
	require.ErrorContains(t, err, `taken by a run of "a"`)
	_, err = api.Run(ctx, defB, nil, reactor.WithRunID(id))
	require.ErrorContains(t, err, `taken by a run of "a"`)

	f.startWorker(api)
	final, err := api.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.Equal(t, "a", final.Reactor)
	_, err = api.Enqueue(ctx, defB, nil, reactor.WithRunID(id))
	require.ErrorContains(t, err, `taken by a run of "a"`)
	require.Equal(t, int32(1), runsA.Load())
	require.Zero(t, runsB.Load())
}

// Client.Enqueue of a wake-up already queued is the same cause: nil, and
// one task. A delay schedules the task.
func TestClientEnqueueDeduplicatesAndDelays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := ctxTimeout(t)
	w := reactor.Wake{ID: "resume:r1:start", RunID: "r1", Reactor: "x", Delay: time.Hour}
	require.NoError(t, f.client.Enqueue(ctx, w))
	require.NoError(t, f.client.Enqueue(ctx, w))
	info := f.awaitTaskState(w.ID, asynq.TaskStateScheduled)
	require.Equal(t, worker.TypeRun, info.Type)
	require.Equal(t, f.queue, f.client.Queue())
	p, err := payload.DecodeRun(info.Payload)
	require.NoError(t, err)
	require.Equal(t, payload.RunPayload{RunID: "r1", Reactor: "x"}, p)
	qi, err := f.inspector.GetQueueInfo(f.queue)
	require.NoError(t, err)
	require.Equal(t, 1, qi.Size)
	require.NoError(t, f.client.Close())
}

func TestStopIsIdempotentAndStopBeforeStartIsFine(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.engine("worker")
	ctx := ctxTimeout(t)

	never := f.newWorker(e)
	require.NoError(t, never.Stop(ctx), "Stop before Start")
	require.NoError(t, never.Stop(ctx))
	require.ErrorContains(t, never.Start(ctx), "stopped", "a stopped worker cannot start: nothing would stop it")

	w := f.newWorker(e)
	require.NoError(t, w.Start(ctx))
	require.ErrorContains(t, w.Start(ctx), "already started")
	require.NoError(t, w.Stop(ctx))
	require.NoError(t, w.Stop(ctx))
	require.Error(t, w.Start(ctx))
}

// Snoozes are not failures and wait their base to twice their base.
func TestSnoozeIsNotAFailure(t *testing.T) {
	t.Parallel()
	s := &worker.SnoozeError{RunID: "r1", Base: 40 * time.Millisecond}
	require.False(t, worker.IsFailure(s))
	require.False(t, worker.IsFailure(errors.Join(errors.New("ctx"), s)))
	require.False(t, worker.IsFailure(nil))
	require.True(t, worker.IsFailure(errors.New("redis down")))
	task := asynq.NewTask(worker.TypeRun, nil)
	for range 50 {
		d := worker.RetryDelay(3, s, task)
		require.GreaterOrEqual(t, d, s.Base)
		require.LessOrEqual(t, d, 2*s.Base)
	}
	// Other errors back off exponentially from 1 s, jittered by up to a
	// half, capped at 5 minutes.
	for n, base := range map[int]time.Duration{0: time.Second, 3: 8 * time.Second, 20: 5 * time.Minute} {
		d := worker.RetryDelay(n, errors.New("boom"), task)
		require.GreaterOrEqual(t, d, base, "retry %d", n)
		require.LessOrEqual(t, d, base+base/2, "retry %d", n)
	}
}
