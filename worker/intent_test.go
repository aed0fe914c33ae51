package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/reactor"
)

// deliverKey carries the cancel of a delivery's context into a step, so the
// step can end its delivery while it runs (a worker shutting down, a process
// dying mid-step).
type deliverKey struct{}

func endDelivery(ctx context.Context) {
	if cancel, ok := ctx.Value(deliverKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

// deliver executes the stored run id once, as a worker's delivery does.
func deliver(t *testing.T, e *reactor.Engine, id string) (*reactor.Result, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxTimeout(t))
	defer cancel()
	return engine.Process(e, context.WithValue(ctx, deliverKey{}, context.CancelFunc(cancel)), id)
}

// TestHardeningInterruptedStepIsCompensated: a step whose Run was called but
// whose result was never recorded may have had its effect. When the run then
// rolls back (here it is cancelled before any redelivery), the step's
// Compensate runs with ErrStepInterrupted; a step with an Undo but no
// Compensate is reported as a rollback failure; a step with neither needs
// nothing. The completed step before it is undone after it, newest first.
func TestHardeningInterruptedStepIsCompensated(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name       string
		compensate bool
		undo       bool
		reasons    []string
	}{
		{name: "compensate", compensate: true, undo: true},
		{name: "undo-only", undo: true, reasons: []string{"reactor.step_interrupted"}},
		{name: "neither"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			tr := &trail{}
			var cause atomic.Value
			cut := reactor.StepConfig[reactor.Args, string]{
				After: []string{"a"},
				Run: func(ctx context.Context, _ reactor.Args) (string, error) {
					tr.add("run:cut")
					endDelivery(ctx)
					<-ctx.Done()
					return "", ctx.Err()
				},
			}
			if tc.compensate {
				cut.Compensate = func(_ context.Context, _ reactor.Args, err error) error {
					tr.add("compensate:cut")
					cause.Store(err)
					return nil
				}
			}
			if tc.undo {
				cut.Undo = func(context.Context, reactor.Args, string) error {
					tr.add("undo:cut")
					return nil
				}
			}
			def := reactor.MustDefine("interrupted-"+tc.name, step(tr, "a", nil), reactor.Step("cut", cut), step(tr, "z", nil, "cut"))
			e := f.engine("w")
			_, err := e.Enqueue(ctxTimeout(t), def, nil, reactor.WithRunID("r-"+tc.name))
			require.NoError(t, err)
			_, err = deliver(t, e, "r-"+tc.name)
			require.Error(t, err, "the delivery ended mid-step")

			require.NoError(t, e.Cancel(ctxTimeout(t), "r-"+tc.name))
			run, err := e.Get(ctxTimeout(t), "r-"+tc.name)
			require.NoError(t, err)
			require.Equal(t, reactor.StatusCancelled, run.Status)
			want := []string{"run:a", "run:cut"}
			if tc.compensate {
				want = append(want, "compensate:cut")
				require.ErrorIs(t, cause.Load().(error), reactor.ErrStepInterrupted)
			}
			want = append(want, "undo:a")
			require.Equal(t, want, tr.all(), "the interrupted step is rolled back first, then what completed before it")
			var reasons []string
			for _, rf := range run.Failure.RollbackFailures {
				reasons = append(reasons, rf.Reason)
				require.Equal(t, "cut", rf.Step)
				require.Contains(t, rf.Message, "Compensate")
			}
			require.Equal(t, tc.reasons, reasons)
		})
	}
}

// TestHardeningRetryAttemptsAreDurable: the attempt a step is on survives a
// crash. A step with MaxAttempts 3 fails once, then its delivery dies during
// attempt 2; the redelivery goes on with attempts 2 and 3 (a crash does not
// spend an attempt, a failure does) and the step ends failed, never having
// been given a fresh set of attempts.
func TestHardeningRetryAttemptsAreDurable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var attempts []int
	var calls atomic.Int32
	mw := func(ctx context.Context, c reactor.Call, next func(context.Context) error) error {
		if c.Kind == reactor.CallRun && c.Step == "flaky" {
			attempts = append(attempts, c.Attempt)
		}
		return next(ctx)
	}
	boom := errors.New("boom")
	def := reactor.MustDefine("durable-attempts", reactor.Step("flaky", reactor.StepConfig[reactor.Args, string]{
		Retry: reactor.Retry{MaxAttempts: 3},
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			if calls.Add(1) == 2 {
				endDelivery(ctx) // the worker dies during attempt 2
				<-ctx.Done()
				return "", ctx.Err()
			}
			return "", boom
		},
	}))
	e := f.engine("w", func(c *reactor.Config) { c.Middleware = []reactor.Middleware{mw} })
	_, err := e.Enqueue(ctxTimeout(t), def, nil, reactor.WithRunID("flaky-run"))
	require.NoError(t, err)
	_, err = deliver(t, e, "flaky-run")
	require.Error(t, err)
	res, err := deliver(t, e, "flaky-run")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, boom)
	require.Equal(t, []int{1, 2, 2, 3}, attempts, "attempt 2 was cut short and is run again; attempt 1 is never repeated")
	require.EqualValues(t, 4, calls.Load())
}

// TestHardeningLongBackoffIsAScheduledWakeUp: a worker does not sleep through
// a long retry backoff holding the run's lock and a worker slot: it saves the
// attempt, releases the run and schedules its wake-up.
func TestHardeningLongBackoffIsAScheduledWakeUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var calls atomic.Int32
	def := reactor.MustDefine("long-backoff", reactor.Step("later", reactor.StepConfig[reactor.Args, int32]{
		Retry: reactor.Retry{MaxAttempts: 2, Backoff: reactor.Fixed(2 * time.Second)},
		Run: func(context.Context, reactor.Args) (int32, error) {
			if n := calls.Add(1); n == 1 {
				return 0, errors.New("not yet")
			} else {
				return n, nil
			}
		},
	}), reactor.Returns(reactor.FromStep("later")))
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	_, err := e.Enqueue(ctxTimeout(t), def, nil, reactor.WithRunID("backoff-run"))
	require.NoError(t, err)

	wake := "resume:backoff-run:retry:later:2"
	info := f.awaitTaskState(wake, asynq.TaskStateScheduled)
	require.WithinDuration(t, time.Now().Add(2*time.Second), info.NextProcessAt, 1500*time.Millisecond)
	locked, err := engine.Locked(e, ctxTimeout(t), "backoff-run")
	require.NoError(t, err)
	require.False(t, locked, "the run is released while it waits")
	run, err := e.Get(ctxTimeout(t), "backoff-run")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRunning, run.Status)
	require.Equal(t, wake, run.Wake, "the wake-up is saved before it is enqueued")

	res, err := e.Wait(ctxTimeout(t), "backoff-run")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	v, err := reactor.ValueOf[int32](res)
	require.NoError(t, err)
	require.EqualValues(t, 2, v)
}

// TestHardeningLockOutlivesTheDeliveryContext: when a delivery's context ends
// (shutdown, a lapsed queue lease) while a step that ignores its context runs
// on, the run's lock stays held until the step returns, so a redelivery
// cannot run the same step concurrently elsewhere; and what the step
// returned is recorded.
func TestHardeningLockOutlivesTheDeliveryContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// Long enough that a heartbeat starved by a loaded machine (the suite
	// runs packages in parallel on 2 cores) still extends the lock in time:
	// at 200 ms the run's own lock lapsed under load now and then.
	const expiry = 750 * time.Millisecond
	release := make(chan struct{})
	entered := make(chan struct{})
	var calls atomic.Int32
	def := reactor.MustDefine("stubborn", reactor.Step("slow", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			calls.Add(1)
			endDelivery(ctx)
			close(entered)
			<-release // ignores its context
			return "done", nil
		},
	}), reactor.Returns(reactor.FromStep("slow")))
	e := f.engine("w", func(c *reactor.Config) { c.LockExpiry = expiry })
	_, err := e.Enqueue(ctxTimeout(t), def, nil, reactor.WithRunID("stubborn-run"))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { _, err := deliver(t, e, "stubborn-run"); done <- err }()
	<-entered
	// Several lock expiries pass while the step ignores its cancelled
	// context: a second delivery must find the run locked every time.
	deadline := time.Now().Add(5 * expiry)
	for time.Now().Before(deadline) {
		_, err := engine.Process(e, ctxTimeout(t), "stubborn-run")
		require.ErrorIs(t, err, reactor.ErrRunLocked)
		time.Sleep(expiry / 4)
	}
	close(release)
	require.NoError(t, <-done)
	require.EqualValues(t, 1, calls.Load())
	run, err := e.Get(ctxTimeout(t), "stubborn-run")
	require.NoError(t, err)
	require.True(t, strings.Contains(strings.Join(run.Completed, ","), "slow"), "the step's result is recorded")
}

// TestHardeningCrashLoopIsBounded: a step that kills every delivery running
// it (here each delivery ends inside it) is not redelivered for ever: after
// five cut-short executions the next one fails the step, which rolls back
// like any failure (its Compensate runs, the steps before it are undone).
func TestHardeningCrashLoopIsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tr := &trail{}
	var runs atomic.Int32
	def := reactor.MustDefine("crash-loop", step(tr, "a", nil), reactor.Step("killer", reactor.StepConfig[reactor.Args, string]{
		After: []string{"a"},
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			runs.Add(1)
			endDelivery(ctx)
			<-ctx.Done()
			return "", ctx.Err()
		},
		Compensate: func(_ context.Context, _ reactor.Args, err error) error {
			tr.add("compensate:killer")
			return nil
		},
	}))
	e := f.engine("w")
	_, err := e.Enqueue(ctxTimeout(t), def, nil, reactor.WithRunID("crash-loop"))
	require.NoError(t, err)
	for i := range 6 {
		_, err := deliver(t, e, "crash-loop")
		require.Error(t, err, "delivery %d ends inside the step", i+1)
	}
	res, err := deliver(t, e, "crash-loop")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, reactor.ErrStepInterrupted)
	require.EqualValues(t, 6, runs.Load(), "one first run and five cut-short reruns, then no more")
	require.Equal(t, []string{"run:a", "compensate:killer", "undo:a"}, tr.all())
}
