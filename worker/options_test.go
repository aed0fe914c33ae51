package worker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// A delayed Enqueue stores the run pending at once and schedules its start
// task in asynq for the time asked.
func TestEnqueueWithDelayAndStartAt(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.engine("caller")
	var runs atomic.Int32
	def := counted("delayed", &runs)
	ctx := ctxTimeout(t)

	before := time.Now()
	res, err := e.Enqueue(ctx, def, nil, reactor.WithRunID("delay-1"), reactor.WithDelay(time.Hour))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, res.Status)
	info := f.awaitTaskState(startTask("delay-1"), asynq.TaskStateScheduled)
	require.WithinRange(t, info.NextProcessAt, before.Add(time.Hour-time.Second), time.Now().Add(time.Hour+time.Second))

	at := time.Now().Add(3 * time.Hour).Truncate(time.Second)
	_, err = e.Enqueue(ctx, def, nil, reactor.WithRunID("delay-2"), reactor.WithStartAt(at))
	require.NoError(t, err)
	info = f.awaitTaskState(startTask("delay-2"), asynq.TaskStateScheduled)
	require.WithinDuration(t, at, info.NextProcessAt, time.Second)

	for _, id := range []string{"delay-1", "delay-2"} {
		run, err := e.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusPending, run.Status, "run %s is stored pending at once", id)
	}
	require.Zero(t, runs.Load())
}

// A short delay really holds the start back: a worker runs the step no
// sooner than the delay after the enqueue.
func TestDelayedRunStartsWhenDue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.engine("caller")
	var ranAt atomic.Int64
	def := reactor.MustDefine("due",
		reactor.Step("s", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) {
				ranAt.Store(time.Now().UnixNano())
				return "", nil
			},
		}),
	)
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	ctx := ctxTimeout(t)
	enqueued := time.Now()
	res, err := e.Enqueue(ctx, def, nil, reactor.WithDelay(700*time.Millisecond))
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	require.GreaterOrEqual(t, time.Unix(0, ranAt.Load()).Sub(enqueued), 700*time.Millisecond)
}

// WithQueue puts the start task on the run's queue, and the run's later
// wake-ups (a scheduled retry on a worker, a hand-off of an in-process run)
// follow it there.
func TestWithQueueRoutesTheRunsWakeUps(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	other := redistest.Queue(t)
	taskOn := func(queue, id string) (*asynq.TaskInfo, error) {
		info, err := f.inspector.GetTaskInfo(queue, id)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			return nil, nil
		}
		return info, err
	}
	e := f.engine("caller")
	var mu sync.Mutex
	attempts := 0
	retried := reactor.MustDefine("queued-retry",
		reactor.Step("flaky", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				if attempts++; attempts == 1 {
					return "", errors.New("once")
				}
				return "ok", nil
			},
			// Over a second: a worker schedules the retry as a wake-up.
			Retry: reactor.Retry{MaxAttempts: 2, Backoff: reactor.Exponential(1100*time.Millisecond, 1100*time.Millisecond)},
		}),
	)
	handed := reactor.MustDefine("queued-handoff",
		step(&trail{}, "here", nil),
		reactor.Step("there", reactor.StepConfig[reactor.Args, string]{
			After:   []string{"here"},
			HandOff: reactor.HandOffBefore,
			Run:     func(context.Context, reactor.Args) (string, error) { return "", nil },
		}),
	)
	require.NoError(t, e.Register(retried, handed))
	ctx := ctxTimeout(t)

	res, err := e.Enqueue(ctx, retried, nil, reactor.WithRunID("queued-1"), reactor.WithQueue(other))
	require.NoError(t, err)
	info, err := taskOn(other, startTask("queued-1"))
	require.NoError(t, err)
	require.NotNil(t, info, "the start task is on the run's queue")
	info, err = taskOn(f.queue, startTask("queued-1"))
	require.NoError(t, err)
	require.Nil(t, info, "and not on the client's")

	// An in-process run hands off to its queue; no worker serves it yet.
	hres, err := e.Run(ctx, handed, nil, reactor.WithRunID("queued-2"), reactor.WithQueue(other), reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, hres.Outcome())
	run, err := e.Get(ctx, "queued-2")
	require.NoError(t, err)
	require.Equal(t, other, run.Queue)
	info, err = taskOn(other, run.Wake)
	require.NoError(t, err)
	require.NotNil(t, info, "the hand-off wake-up %s is on the run's queue", run.Wake)
	// Without WithQueue, the run records the client's queue, where its
	// wake-up goes, as an enqueued run does.
	dres, err := e.Run(ctx, handed, nil, reactor.WithRunID("queued-3"), reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, dres.Outcome())
	drun, err := e.Get(ctx, "queued-3")
	require.NoError(t, err)
	require.Equal(t, f.queue, drun.Queue)
	info, err = taskOn(f.queue, drun.Wake)
	require.NoError(t, err)
	require.NotNil(t, info, "the hand-off wake-up %s is on the client's queue", drun.Wake)

	// A worker on the run's queue (and the Client's, which every worker of
	// an engine must serve: Start refuses otherwise): the first attempt
	// fails and schedules its retry on the run's queue.
	f.startWorker(e, func(c *worker.Config) { c.Queues = map[string]int{other: 1, f.queue: 1} })
	retryWake := "resume:queued-1:retry:flaky:2"
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := taskOn(other, retryWake)
		require.NoError(c, err)
		require.NotNil(c, info, "retry wake-up on the run's queue")
	}, 5*time.Second, 5*time.Millisecond)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Failure)
	final, err = e.Wait(ctx, "queued-2")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Failure)
}

// The deadline is stored with an enqueued run: the worker that takes it
// stops the slow step at the deadline, fails the run and undoes what it
// completed.
func TestDeadlineOfAnEnqueuedRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("deadline-worker",
		step(tr, "a", nil),
		reactor.Step("slow", reactor.StepConfig[reactor.Args, string]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				tr.add("run:slow")
				<-ctx.Done()
				return "", ctx.Err()
			},
		}),
	)
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	ctx := ctxTimeout(t)
	res, err := e.Enqueue(ctx, def, nil, reactor.WithTimeout(500*time.Millisecond))
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.ErrorIs(t, final.Failure, reactor.ErrDeadlineExceeded)
	require.Equal(t, []string{"run:a", "run:slow", "undo:a"}, tr.all())
}
