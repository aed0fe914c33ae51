package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// approval is the payload of the interrupt below.
type approval struct {
	By string `json:"by"`
}

// approvalFlow is prepare -> approve (an interrupt, with timeout, 0: none,
// and, when deflt is set, a default payload) -> ship.
func approvalFlow(name string, tr *trail, timeout time.Duration, deflt func(reactor.Args) (approval, error)) *reactor.Definition {
	return reactor.MustDefine(name,
		step(tr, "prepare", nil),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			After: []string{"prepare"}, Timeout: timeout, Default: deflt,
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep("approve", "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				tr.add("run:ship")
				by, err := reactor.Arg[string](in, "by")
				return "shipped, approved by " + by, err
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
}

// awaitPaused waits until run id is paused, its worker gone, and returns it.
func (e *env) awaitPaused(ctx context.Context, id string) *reactor.Run {
	e.t.Helper()
	var run *reactor.Run
	require.Eventually(e.t, func() bool {
		r, err := e.engine.Get(ctx, id)
		require.NoError(e.t, err)
		run = r
		return r.Status == reactor.StatusPaused && r.Paused != nil
	}, 10*time.Second, 5*time.Millisecond)
	return run
}

// score is run id's active-index entry, as a time.
func (e *env) score(ctx context.Context, id string) time.Time {
	e.t.Helper()
	s, err := e.rdb.ZScore(ctx, e.activeKey(), id).Result()
	require.NoError(e.t, err)
	return time.UnixMilli(int64(s))
}

// serverNow is the Redis server's time.
func (e *env) serverNow(ctx context.Context) time.Time {
	e.t.Helper()
	now, err := e.rdb.Time(ctx).Result()
	require.NoError(e.t, err)
	return now
}

// live returns the queue's tasks that a worker will (or does) execute.
func (e *env) live() map[string]asynq.TaskState {
	e.t.Helper()
	out := e.queued()
	for id, st := range out {
		if st == asynq.TaskStateArchived {
			delete(out, id)
		}
	}
	return out
}

// failingEnqueuer is a Continue's engine whose wake-up enqueue fails.
type failingEnqueuer struct{}

func (failingEnqueuer) Enqueue(context.Context, reactor.Wake) error {
	return errors.New("enqueue refused (test)")
}

// A paused run whose interrupt waits without a deadline is not lost: a
// pass wakes nothing, whatever the run's age, and moves its entry
// PausedRecheck ahead, so the passes after it do not examine it at all.
// A Continue still takes it to the end, and its status write puts the
// entry back where the sweeper can see the live run.
func TestSweepLeavesAWaitingPausedRunAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *sweeper.RunConfig) { c.StaleAfter = 200 * time.Millisecond })
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	def := approvalFlow("paused_alone", tr, 0, nil)
	require.NoError(t, e.engine.Register(def))
	e.startWorker()
	res, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID("paused-alone"))
	require.NoError(t, err)
	id := res.RunID
	e.awaitPaused(ctx, id)
	require.Eventually(t, func() bool { return len(e.live()) == 0 }, 5*time.Second, 5*time.Millisecond,
		"no task of the run is queued or active while it waits")

	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusPaused, run.Status)
	before := e.serverNow(ctx)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Paused: 1}, rep)
	require.Empty(t, e.live(), "nothing woken")
	// Examined again when the entry is StaleAfter old: PausedRecheck
	// (default 1 h) from the pass.
	want := before.Add(time.Hour - 200*time.Millisecond)
	assert.WithinDuration(t, want, e.score(ctx, id), 2*time.Second)

	// The passes after it do not even look at it.
	time.Sleep(300 * time.Millisecond)
	for range 3 {
		rep, err = e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{}, rep)
	}
	require.Empty(t, e.live())

	c, err := e.engine.Continue(ctx, id, "approve", approval{By: "ann"})
	require.NoError(t, err)
	require.True(t, c.Woken)
	final, err := e.engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	require.Equal(t, []string{"run:prepare", "run:ship"}, tr.all())
}

// A paused run with a deadline is examined at its deadline (plus
// StaleAfter), not before; if its timer wake-up is gone then (its process
// died before enqueueing it, or it was archived), the pass wakes it and
// the resume times the interrupt out: the run fails, or, with a Default,
// takes it and completes.
func TestSweepWakesAPausedRunPastItsDeadlineWithoutItsTimer(t *testing.T) {
	t.Parallel()
	for _, withDefault := range []bool{false, true} {
		t.Run(fmt.Sprintf("default=%v", withDefault), func(t *testing.T) {
			t.Parallel()
			const stale = 200 * time.Millisecond
			e := newEnv(t, func(c *sweeper.RunConfig) { c.StaleAfter = stale })
			ctx := ctxTimeout(t, 20*time.Second)
			tr := &trail{}
			var deflt func(reactor.Args) (approval, error)
			if withDefault {
				deflt = func(reactor.Args) (approval, error) { return approval{By: "auto"}, nil }
			}
			def := approvalFlow("paused_timer", tr, 2*time.Second, deflt)
			require.NoError(t, e.engine.Register(def))
			e.startWorker()
			res, err := e.engine.Enqueue(ctx, def, nil)
			require.NoError(t, err)
			id := res.RunID
			run := e.awaitPaused(ctx, id)
			require.NotEmpty(t, run.Wake, "the pause saved its timer as the run's wake-up")
			require.Contains(t, run.Wake, ":timeout:approve:")
			// The timer is lost (once enqueued: after the paused write).
			require.Eventually(t, func() bool {
				err := e.insp.DeleteTask(e.queue, run.Wake)
				if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
					return false
				}
				require.NoError(t, err)
				return true
			}, 5*time.Second, 5*time.Millisecond)
			deadline := run.Paused.Deadline
			require.False(t, deadline.IsZero())

			// Before the deadline: left alone, looked at again once the
			// timer should have fired.
			e.waitStale(ctx, id)
			rep, err := e.sweeper.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.RunReport{Examined: 1, Paused: 1}, rep)
			assert.Equal(t, deadline.UnixMilli(), e.score(ctx, id).UnixMilli(),
				"examined again when the entry is StaleAfter old: at the deadline plus StaleAfter")
			require.Empty(t, e.live())

			// Past it.
			require.Eventually(t, func() bool { return e.serverNow(ctx).After(deadline.Add(stale)) },
				10*time.Second, 10*time.Millisecond)
			rep, err = e.sweeper.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)

			final, err := e.engine.Wait(ctx, id)
			require.NoError(t, err)
			if withDefault {
				require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
				got, err := reactor.ValueOf[string](final)
				require.NoError(t, err)
				assert.Equal(t, "shipped, approved by auto", got)
				return
			}
			require.Equal(t, reactor.StatusFailed, final.Status)
			require.ErrorIs(t, final.Err(), reactor.ErrInterruptTimedOut)
			assert.Equal(t, []string{"run:prepare"}, tr.all())
		})
	}
}

// A Continue that recorded the interrupt's last payload but could not
// enqueue the run's wake-up leaves a paused run that holds everything it
// waits for: while the continue's wake-up is queued the pass leaves it to
// that; once it is not, the pass wakes the run, which takes the payload
// and completes.
func TestSweepWakesAFullInterruptWhoseContinueWakeIsLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	// A long timeout: its timer (the run's Wake) is scheduled far ahead,
	// and must not hide the lost continue.
	def := approvalFlow("paused_full", tr, time.Hour, nil)
	require.NoError(t, e.engine.Register(def))
	const id = "paused-full"
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID(id), reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPaused, res.Status)
	run := e.awaitPaused(ctx, id)

	// The continuer's engine cannot enqueue: the payload is recorded, the
	// run is not woken.
	cont, err := reactor.NewEngine(ctx, reactor.Config{Client: e.rdb, Prefix: e.prefix, Enqueuer: failingEnqueuer{}, Logger: discard})
	require.NoError(t, err)
	c, err := cont.Continue(ctx, id, "approve", approval{By: "bo"})
	require.Error(t, err)
	require.NotNil(t, c)
	require.False(t, c.Woken)
	require.Equal(t, 1, c.Received)

	// The continue's wake-up queued (a slow enqueue that went through
	// after all): the pass leaves the run to it.
	wake := fmt.Sprintf("resume:%s:continue:approve:1:1", id)
	require.NoError(t, e.client.Enqueue(ctx, reactor.Wake{ID: wake, RunID: id, Reactor: run.Reactor}))
	e.waitStale(ctx, id)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Contains(t, e.live(), wake)

	// Gone: the pass wakes the run.
	require.NoError(t, e.insp.DeleteTask(e.queue, wake))
	e.waitStale(ctx, id)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	require.Contains(t, e.live(), sweepTaskID(id, run.Version))

	e.startWorker()
	final, err := e.engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by bo", got)
}

var _ reactor.Enqueuer = failingEnqueuer{}
