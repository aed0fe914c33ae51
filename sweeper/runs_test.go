package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// crashAt builds s1 -> s2 -> s3 where the first execution of s2 dies the way
// a killed process looks from Redis: its lock passes to someone else (then
// the test deletes it, as if it expired) and it writes nothing more.
func crashAt(e *env, tr *trail, name, id string) *reactor.Definition {
	var crashed atomic.Bool
	return reactor.MustDefine(name,
		step(tr, "s1", nil),
		step(tr, "s2", func(ctx context.Context) error {
			if crashed.CompareAndSwap(false, true) {
				e.rdb.Set(context.WithoutCancel(ctx), e.lockKey(id), "someone-else", time.Minute)
				<-ctx.Done() // the heartbeat notices and cancels the step
				return ctx.Err()
			}
			return nil
		}, "s1"),
		step(tr, "s3", nil, "s2"),
	)
}

// A run left running, with no lock and no wake-up task (its process died
// between checkpoints), gets exactly one sweep wake-up, and a worker
// finishes it from its checkpoint.
func TestSweepWakesARunningRunWithNoLockAndNoTask(t *testing.T) {
	t.Parallel()
	// Two passes in a row must fall within StaleAfter of each other: a
	// loaded machine (the whole suite on two cores) can stretch 50 ms.
	e := newEnv(t, func(c *sweeper.RunConfig) { c.StaleAfter = 500 * time.Millisecond })
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "lost-running"
	def := crashAt(e, tr, "lost_running", id)

	_, err := e.engine.Run(ctx, def, nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, e.lockKey(id)).Err(), "the dead process's lock expires")

	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusRunning, run.Status)
	require.Equal(t, []string{"s1"}, run.Completed)
	require.Empty(t, run.Wake, "an in-process run has no wake-up task")
	require.Empty(t, e.queued())

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	task := sweepTaskID(id, run.Version)
	want := map[string]asynq.TaskState{task: asynq.TaskStatePending}
	require.Equal(t, want, e.queued(), "exactly one wake-up, named after the run's version")

	// A second pass at once: the first one touched the entry, so it is not
	// even examined before StaleAfter passes again.
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{}, rep)
	require.Equal(t, want, e.queued())

	// A pass after StaleAfter, with still no worker: the run still looks
	// lost, but its sweep wake-up is queued. It is not woken again.
	e.waitStale(ctx, id)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Equal(t, want, e.queued(), "no second task")

	e.startWorker()
	res, err := e.engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	require.Equal(t, []string{"run:s1", "run:s2", "run:s2", "run:s3"}, tr.all(),
		"s1 completed before the crash and is not re-run")
	// The index follows the terminal write, and the task's completion the
	// handler's return.
	require.Eventually(t, func() bool {
		return errors.Is(e.rdb.ZScore(ctx, e.activeKey(), id).Err(), redis.Nil) && len(e.queued()) == 0
	}, 5*time.Second, 10*time.Millisecond, "the run left the index and the wake-up task completed")
}

// A run whose lock is held is executing somewhere: it is not woken, however
// long ago it last wrote.
func TestSweepLeavesALockedRunAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "live"
	started, release := make(chan struct{}), make(chan struct{})
	def := reactor.MustDefine("live",
		step(tr, "slow", func(context.Context) error {
			close(started)
			<-release
			return nil
		}),
		step(tr, "after", nil, "slow"),
	)
	done := make(chan error, 1)
	go func() {
		res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID(id))
		if err == nil && res.Status != reactor.StatusCompleted {
			err = fmt.Errorf("run ended %s", res.Status)
		}
		done <- err
	}()
	<-started
	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusRunning, run.Status)
	locked, err := engine.Locked(e.engine, ctx, id)
	require.NoError(t, err)
	require.True(t, locked)

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Empty(t, e.queued())
	score, err := e.rdb.ZScore(ctx, e.activeKey(), id).Result()
	require.NoError(t, err, "a live run stays in the index")
	require.Greater(t, int64(score), run.UpdatedAt.UnixMilli(), "touched by the pass")

	close(release)
	require.NoError(t, <-done)
	require.Equal(t, []string{"run:slow", "run:after"}, tr.all())
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{}, rep, "the terminal write took the run out of the index")
}

// A run found locked is looked at again when its lock would expire, not
// StaleAfter after the pass that saw it: the first pass after a dead
// worker's lock expired wakes the run, however long StaleAfter is.
func TestSweepLooksAgainWhenTheLockExpires(t *testing.T) {
	t.Parallel()
	const stale = 2 * time.Second
	e := newEnv(t, func(c *sweeper.RunConfig) { c.StaleAfter = stale })
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "lock-expires"
	def := crashAt(e, tr, "lock_expires", id)
	_, err := e.engine.Run(ctx, def, nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusRunning, run.Status)

	// The dead holder's lock has a little life left.
	const left = 400 * time.Millisecond
	require.NoError(t, e.rdb.PExpire(ctx, e.lockKey(id), left).Err())
	before, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep, "locked: left alone")
	score, err := e.rdb.ZScore(ctx, e.activeKey(), id).Result()
	require.NoError(t, err)
	due := time.UnixMilli(int64(score)).Add(stale)
	require.WithinRange(t, due, before.Add(left-100*time.Millisecond), before.Add(left+time.Second),
		"due when the lock expires")

	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{}, rep, "not due before the lock expires")

	require.Eventually(t, func() bool {
		n, err := e.rdb.Exists(ctx, e.lockKey(id)).Result()
		require.NoError(t, err)
		return n == 0
	}, 5*time.Second, 5*time.Millisecond, "the lock expires")
	// Redis expires a key when it is read past its expiry, which can be a
	// moment before the pass's clock reaches the score.
	require.Eventually(t, func() bool {
		rep, err = e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		return rep.Examined > 0
	}, time.Second, 5*time.Millisecond)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep, "woken by the first pass after the lock expired, long before StaleAfter")
	require.Equal(t, map[string]asynq.TaskState{sweepTaskID(id, run.Version): asynq.TaskStatePending}, e.queued())
}

// A pending run whose start task is still queued will be delivered: it is
// not woken.
func TestSweepLeavesAPendingRunWithAQueuedTaskAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "queued"
	def := reactor.MustDefine("queued", step(tr, "a", nil))
	res, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, res.Status)

	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusPending, run.Status)
	start := "resume:" + id + ":start"
	require.Equal(t, start, run.Wake)

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Equal(t, map[string]asynq.TaskState{start: asynq.TaskStatePending}, e.queued())
	require.Empty(t, tr.all())
}

// A pending run whose start task was lost (the enqueue never happened, or
// the task was deleted) is woken, and a worker runs it.
func TestSweepWakesAPendingRunWhoseTaskWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "task-lost"
	def := reactor.MustDefine("task_lost", step(tr, "a", nil), step(tr, "b", nil, "a"))
	_, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.NoError(t, e.insp.DeleteTask(e.queue, "resume:"+id+":start"))
	require.Empty(t, e.queued())

	run := e.waitStale(ctx, id)
	require.Equal(t, reactor.StatusPending, run.Status)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	task := sweepTaskID(id, run.Version)
	require.Equal(t, map[string]asynq.TaskState{task: asynq.TaskStatePending}, e.queued())

	e.startWorker()
	res, err := e.engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	require.Equal(t, []string{"run:a", "run:b"}, tr.all())
}

// A finished run still in the active index (its process died between the
// terminal write and the index update) is dropped from the index, not woken.
func TestSweepDropsAFinishedRunLeftInTheIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "finished"
	def := reactor.MustDefine("finished", step(tr, "a", nil))
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	run, err := e.engine.Get(ctx, id)
	require.NoError(t, err)
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: float64(run.UpdatedAt.UnixMilli()), Member: id}).Err())
	e.waitPast(run.UpdatedAt)

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Dropped: 1}, rep)
	require.ErrorIs(t, e.rdb.ZScore(ctx, e.activeKey(), id).Err(), redis.Nil)
	require.Empty(t, e.queued())
	require.Equal(t, []string{"run:a"}, tr.all())
	again, err := e.engine.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, run.Version, again.Version, "the run itself is untouched")
}

// An index entry with no state, older than StaleAfter, is dropped; a young
// one is a run being created and is left alone.
func TestSweepDropsAnOldEntryWithNoState(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	old := time.Now().Add(-time.Hour).UnixMilli()
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(),
		redis.Z{Score: float64(old), Member: "ghost"},
		redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "newborn"},
	).Err())

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Dropped: 1}, rep)
	require.Equal(t, []string{"newborn"}, e.rdb.ZRange(ctx, e.activeKey(), 0, -1).Val())
	require.Empty(t, e.queued())
}

// Live runs at the head of the index do not hide a lost run behind them:
// each pass touches what it examined, so the next page reaches further.
func TestSweepPagesPastLiveRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *sweeper.RunConfig) { c.Page = 1 })
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}

	// The oldest entry: a live run, held by this process until the end.
	started, release := make(chan struct{}), make(chan struct{})
	live := reactor.MustDefine("live", step(tr, "hold", func(context.Context) error {
		close(started)
		<-release
		return nil
	}))
	done := make(chan error, 1)
	go func() {
		_, err := e.engine.Run(ctx, live, nil, reactor.WithRunID("live"))
		done <- err
	}()
	t.Cleanup(func() {
		close(release)
		require.NoError(t, <-done)
	})
	<-started

	// Behind it: a lost run.
	const id = "lost-behind"
	_, err := e.engine.Run(ctx, crashAt(e, tr, "lost_behind", id), nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, e.lockKey(id)).Err())
	e.waitStale(ctx, "live")
	run := e.waitStale(ctx, id)

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep, "the page holds the live run")
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep, "the next page reaches the lost run")
	require.Equal(t, map[string]asynq.TaskState{sweepTaskID(id, run.Version): asynq.TaskStatePending}, e.queued())
}

// A state that cannot be decoded fails its own examination only: the pass
// goes on, reports the error, and the entry does not hold the head of the
// index.
func TestSweepGoesPastARunItCannotRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	old := float64(time.Now().Add(-time.Hour).UnixMilli())
	require.NoError(t, e.rdb.HSet(ctx, e.prefix+":{run:poison}:ctx", "v", 1, "d", "\xc1 not msgpack").Err())
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: "poison"}).Err())

	const id = "lost-after-poison"
	_, err := e.engine.Run(ctx, crashAt(e, tr, "after_poison", id), nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, e.lockKey(id)).Err())
	e.waitStale(ctx, id)

	rep, err := e.sweeper.Sweep(ctx)
	require.ErrorContains(t, err, "run poison")
	require.Equal(t, sweeper.RunReport{Examined: 2, Woken: 1}, rep)
	score, err := e.rdb.ZScore(ctx, e.activeKey(), "poison").Result()
	require.NoError(t, err, "kept for an operator to look at")
	require.Greater(t, score, old, "but moved back")
}

// A sweep wake-up whose worker died with it active has a spent id: enqueueing
// it again would be an id conflict, a silent no-op. The next sweep wakes the
// run under a fresh id.
func TestSweepWakesUnderAFreshIDWhenItsTaskDiedActive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "died-twice"
	_, err := e.engine.Run(ctx, crashAt(e, tr, "died_twice", id), nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, e.lockKey(id)).Err())
	run := e.waitStale(ctx, id)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Woken)
	task := sweepTaskID(id, run.Version)

	// A "worker" takes the wake-up and dies before it takes the run's lock:
	// the task stays active, and nothing redelivers it for a minute and more.
	taken, dead := make(chan struct{}), make(chan struct{})
	took, die := sync.OnceFunc(func() { close(taken) }), sync.OnceFunc(func() { close(dead) })
	srv := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{
		Concurrency: 1, Queues: map[string]int{e.queue: 1}, TaskCheckInterval: 10 * time.Millisecond,
		LogLevel: asynq.FatalLevel,
	})
	require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		took()
		<-dead
		return nil
	})))
	t.Cleanup(func() { die(); srv.Shutdown() })
	<-taken
	require.Equal(t, map[string]asynq.TaskState{task: asynq.TaskStateActive}, e.queued())

	e.waitStale(ctx, id)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	queued := e.queued()
	require.Len(t, queued, 2)
	var fresh string
	for tid, state := range queued {
		if tid != task {
			fresh = tid
			require.Equal(t, asynq.TaskStatePending, state)
		}
	}
	require.Equal(t, task+":r1", fresh)

	// A later pass finds that wake-up queued and adds none.
	e.waitStale(ctx, id)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Len(t, e.queued(), 2)

	// The dead "worker" fetches nothing more; its task completes and goes.
	srv.Stop()
	die()
	srv.Shutdown()
	e.startWorker()
	res, err := e.engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	require.Equal(t, []string{"run:s1", "run:s2", "run:s2", "run:s3"}, tr.all())
}
