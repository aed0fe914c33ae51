package sweeper_test

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// Seeded-state tests of the map sweeper (DESIGN 7): each test builds a map's
// state with the real protocol (mapenv_test.go), breaks it the way a crash
// or a lost enqueue would, and checks that ONE pass enqueues exactly the
// lost work, and nothing else: never more than a batch for one map, never a
// second claim, nothing for work that is live. A worker then finishes the
// owner, and every element ran once (and was undone once, for a rollback).

// One pass recovers each kind of lost work.
func TestMapSweepRecoversEachSeededFault(t *testing.T) {
	t.Parallel()

	t.Run("dropped element task", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "dropped-el"
		mapID := m.start(id, false)
		// 2 is the batch's trigger: while it is lost, the second batch is
		// not claimed, and the lost task is the map's only open work.
		m.deliverAll(elPrefix(mapID), 0, 1, 3, 4)
		m.drop(elTask(mapID, 2)) // its enqueue was lost
		require.Empty(t, m.pending())

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1}, m.sweep())
		require.Equal(t, elTasks(mapID, 2), m.pending(), "the lost position, nothing else")
		m.requireQuietPass(mapID)
		m.requireCompleted(m.finish(id))
	})

	t.Run("dropped rollback job", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "dropped-rb"
		mapID := m.start(id, true)
		m.toRollback(id, mapID)
		m.deliverAll(rbPrefix(mapID), 0, 1, 3, 4)
		m.drop(rbTask(mapID, 2)) // the trigger: the second batch is not claimed
		require.Empty(t, m.pending())

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Rollbacks: 1}, m.sweep())
		require.Equal(t, rbTasks(mapID, 2), m.pending(), "the lost position, nothing else")
		m.requireQuietPass(mapID)
		m.requireRolledBack(m.finish(id))
	})

	// A lost trigger: every claimed position settled, positions remain,
	// and the next batch was never claimed. The settle script claims
	// atomically with the trigger's outcome, so the seed undoes a claim
	// after the fact, once the whole first batch settled: the offset goes
	// back to the first batch's end and the claimed batch's tasks go.
	lostTrigger := func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		const id = "lost-trigger"
		mapID := m.start(id, rollback)
		prefix, task, offsetKey := elPrefix(mapID), elTask, m.keys.MapOffset(mapID)
		want := sweeper.MapReport{Examined: 1, Claims: 1, Elements: mapBatch}
		if rollback {
			m.toRollback(id, mapID)
			prefix, task, offsetKey = rbPrefix(mapID), rbTask, m.keys.MapRbOffset(mapID, 1)
			want.Elements, want.Rollbacks = 0, mapBatch
		}
		m.deliverAll(prefix, 0, 1, 2)
		second := taskIDs(task, mapID, positions(5, 9))
		require.Equal(t, taskIDs(task, mapID, append([]int{3, 4}, positions(5, 9)...)), m.pending(),
			"2, the trigger, claimed the second batch")
		require.Equal(t, "10", m.rdb.Get(m.ctx, offsetKey).Val())
		m.deliverAll(prefix, 3, 4)
		require.Equal(t, second, m.pending())
		m.drop(second...)
		require.NoError(t, m.rdb.Set(m.ctx, offsetKey, 5, 0).Err())

		m.waitMapStale(mapID)
		began := time.Now()
		require.Equal(t, want, m.sweep())
		require.Equal(t, second, m.pending(), "exactly the next batch")
		require.Equal(t, "10", m.rdb.Get(m.ctx, offsetKey).Val())
		// The pass moved the map's index entry to its own time: the map is
		// not examined again for StaleAfter. Then it is found claimed and
		// queued.
		m.requireTouched(mapID, began)
		m.requireQuietPass(mapID)
		require.Equal(t, "10", m.rdb.Get(m.ctx, offsetKey).Val(), "no second claim")
		m.requireFinished(id, rollback)
	}
	t.Run("lost batch trigger", func(t *testing.T) {
		t.Parallel()
		lostTrigger(t, false)
	})
	t.Run("lost rollback batch trigger", func(t *testing.T) {
		t.Parallel()
		lostTrigger(t, true)
	})

	t.Run("dropped owner resume", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "dropped-resume"
		mapID := m.start(id, false)
		m.drain(elPrefix(mapID))
		resume := fwdResumeID(id, mapID)
		require.Equal(t, []string{resume}, m.pending())
		require.EqualValues(t, 1, m.rdb.Exists(m.ctx, m.keys.MapSignalled(mapID)).Val(), "the last settle claimed the signal")
		m.drop(resume)

		// While the owner's lock is held, the owner is running somewhere:
		// it is left alone.
		require.NoError(t, m.rdb.Set(m.ctx, m.lockKey(id), "someone-else", time.Minute).Err())
		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep())
		require.Empty(t, m.pending())
		require.NoError(t, m.rdb.Del(m.ctx, m.lockKey(id)).Err())

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Resumes: 1}, m.sweep())
		require.Equal(t, []string{resume}, m.pending())
		m.requireQuietPass(mapID)
		m.requireCompleted(m.finish(id))

		// The owner adopted the map and took it off the index. Were it
		// left there (the unindex is best effort), a pass finds the owner
		// finished and removes it.
		require.ErrorIs(t, m.rdb.ZScore(m.ctx, m.keys.Maps(), mapID).Err(), redis.Nil)
		require.NoError(t, m.rdb.ZAdd(m.ctx, m.keys.Maps(), redis.Z{Score: 1, Member: mapID}).Err())
		require.NoError(t, m.rdb.SAdd(m.ctx, m.keys.RunMaps(id), mapID).Err())
		require.Equal(t, sweeper.MapReport{Examined: 1, Removed: 1}, m.sweep())
		require.Zero(t, m.rdb.ZCard(m.ctx, m.keys.Maps()).Val())
		require.Zero(t, m.rdb.SCard(m.ctx, m.keys.RunMaps(id)).Val())
	})

	t.Run("dropped rollback owner resume", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "dropped-rb-resume"
		mapID := m.start(id, true)
		m.toRollback(id, mapID)
		m.drain(rbPrefix(mapID))
		resume := rbResumeID(id, mapID)
		require.Equal(t, []string{resume}, m.pending())
		require.EqualValues(t, 1, m.rdb.Exists(m.ctx, m.keys.MapRbSignalled(mapID, 1)).Val())
		m.drop(resume)

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Resumes: 1}, m.sweep())
		require.Equal(t, []string{resume}, m.pending())
		m.requireQuietPass(mapID)
		m.requireRolledBack(m.finish(id))
	})

	// A worker took element 3, started it and died: its task stays active
	// with a lease nobody extends, and the element's lock expired.
	t.Run("element task of a dead worker", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "dead-worker"
		mapID := m.start(id, false)
		m.deliverAll(elPrefix(mapID), 0, 1, 2) // 2, the trigger, claims [5,9]
		require.Equal(t, elTasks(mapID, 3, 4, 5, 6, 7, 8, 9), m.pending())

		elemID := mapstep.ElementID(mapID, 3)
		lockKey := m.keys.ElemLock(elemID)
		m.setHook(func(ctx context.Context, what string, item int) error {
			if what != "run" || item != 3 {
				return nil
			}
			// The process stops here and writes nothing more. Its lock
			// is taken away, so that its heartbeat (every 200 ms) ends
			// the step instead of the test waiting out the expiry.
			if err := m.rdb.Set(context.WithoutCancel(ctx), lockKey, "someone-else", time.Minute).Err(); err != nil {
				return err
			}
			<-ctx.Done()
			return ctx.Err()
		})
		// The lease ran out a second ago, and an earlier pass saw it with
		// that expiry, the element held by nobody, two seconds ago of the
		// server's time: the sweeper calls the worker dead (a running
		// delivery holds its element's lock), while asynq's own recovery
		// waits 30 s past the expiry and stays out of this test.
		lease := time.Now().Add(-time.Second)
		dead := m.activate(elTask(mapID, 3), lease)
		m.seenLease(elTask(mapID, 3), lease, 2*sweeper.IdleAfter)
		err := m.handler.ProcessTask(m.ctx, asynq.NewTask(dead.Type, dead.Payload))
		var snooze *worker.SnoozeError
		require.ErrorAs(t, err, &snooze)
		m.setHook(nil)
		require.NoError(t, m.rdb.Del(m.ctx, lockKey).Err(), "the dead worker's lock expires")
		el, err := engine.Element(m.engine, m.ctx, elemID)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusRunning, el.Status, "cut short mid-step")
		require.Empty(t, el.Completed)

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1}, m.sweep())
		queued := map[string]asynq.TaskState{
			elTask(mapID, 3):         asynq.TaskStateActive,  // the dead task: asynq's to reclaim, in time
			elTask(mapID, 3) + ":r1": asynq.TaskStatePending, // its redelivery, under a fresh id
		}
		for _, i := range []int{4, 5, 6, 7, 8, 9} {
			queued[elTask(mapID, i)] = asynq.TaskStatePending // live: left alone
		}
		require.Equal(t, queued, m.queued())

		// The original task is still active and dead at the next pass: the
		// redelivery queued by this pass is not duplicated.
		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep())
		require.Equal(t, queued, m.queued())

		m.requireCompleted(m.finish(id), 3)
	})

	t.Run("archived element task", func(t *testing.T) {
		t.Parallel()
		m := newMapEnv(t, nil)
		const id = "archived-el"
		mapID := m.start(id, false)
		// 2, the trigger, is archived: the second batch is not claimed.
		m.deliverAll(elPrefix(mapID), 0, 1, 3, 4)
		require.NoError(t, m.insp.ArchiveTask(m.queue, elTask(mapID, 2)))
		require.Equal(t, map[string]asynq.TaskState{elTask(mapID, 2): asynq.TaskStateArchived}, m.queued())

		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Deleted: 1}, m.sweep())
		require.Equal(t, map[string]asynq.TaskState{elTask(mapID, 2): asynq.TaskStatePending}, m.queued(),
			"the archived task deleted and its id enqueued again")
		m.requireQuietPass(mapID)
		m.requireCompleted(m.finish(id))
	})
}

// A map with more than a batch of lost positions gets a batch per pass,
// lowest positions first, and the rest on the next pass.
func TestMapSweepEnqueuesAtMostABatchPerPass(t *testing.T) {
	t.Parallel()
	forwardAndRollback(t, func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		const id = "bounded"
		mapID := m.start(id, rollback)
		task := elTask
		report := func(n int) sweeper.MapReport { return sweeper.MapReport{Examined: 1, Elements: n} }
		if rollback {
			m.toRollback(id, mapID)
			task = rbTask
			report = func(n int) sweeper.MapReport { return sweeper.MapReport{Examined: 1, Rollbacks: n} }
		}
		// The first batch's trigger, position 2, settles first and
		// claims the second batch: nine positions are outstanding, and
		// all nine tasks are lost.
		require.NoError(t, m.deliver(task(mapID, 2)))
		lost := append([]int{0, 1, 3, 4}, positions(5, 9)...)
		require.Equal(t, taskIDs(task, mapID, lost), m.pending())
		m.drop(taskIDs(task, mapID, lost)...)

		m.waitMapStale(mapID)
		began := time.Now()
		require.Equal(t, report(mapBatch), m.sweep())
		require.Equal(t, taskIDs(task, mapID, []int{0, 1, 3, 4, 5}), m.pending(), "a batch, lowest positions first")
		m.requireTouched(mapID, began)

		m.waitMapStale(mapID)
		require.Equal(t, report(4), m.sweep())
		require.Equal(t, taskIDs(task, mapID, lost), m.pending(), "the rest")
		m.requireQuietPass(mapID)

		m.requireFinished(id, rollback)
	})
}

// A map whose work is live gets nothing: a queued task, an element whose
// lock a worker holds, a task active on a worker whose lease is fresh, and
// a map that settled something within StaleAfter. The same for a map
// rolling back.
func TestMapSweepLeavesALiveMapAlone(t *testing.T) {
	t.Parallel()
	forwardAndRollback(t, func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		const id = "live-map"
		mapID := m.start(id, rollback)
		task, what, elem := elTask, "run", func(p int) int { return p }
		if rollback {
			m.toRollback(id, mapID)
			task, what, elem = rbTask, "undo", func(p int) int { return mapItems - 1 - p }
		}

		// Position 1: a worker is executing it and holds its element's
		// lock (its task is off the queue, as with a worker that runs a
		// task and forgets it).
		entered, release := make(chan struct{}), make(chan struct{})
		m.setHook(func(ctx context.Context, w string, item int) error {
			if w != what || item != elem(1) {
				return nil
			}
			close(entered)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		one := m.take(task(mapID, 1))
		var oneErr error
		oneDone := make(chan struct{})
		go func() {
			defer close(oneDone)
			oneErr = m.handler.ProcessTask(m.ctx, one)
		}()
		released := sync.OnceFunc(func() { close(release) })
		t.Cleanup(func() {
			released()
			<-oneDone
		})
		select {
		case <-entered:
		case <-oneDone:
			t.Fatalf("position 1 ended before its step ran: %v", oneErr)
		}
		require.EqualValues(t, 1, m.rdb.Exists(m.ctx, m.keys.ElemLock(mapstep.ElementID(mapID, elem(1)))).Val())
		// Position 2: a worker took its task a moment ago; the lease is
		// fresh and the element not locked yet.
		two := m.activate(task(mapID, 2), time.Now().Add(30*time.Second))
		// Position 3 settles; 0 and 4 stay queued. 2, the trigger, has
		// not settled: the second batch is not claimed.
		require.NoError(t, m.deliver(task(mapID, 3)))
		want := map[string]asynq.TaskState{
			task(mapID, 0): asynq.TaskStatePending,
			task(mapID, 2): asynq.TaskStateActive,
			task(mapID, 4): asynq.TaskStatePending,
		}
		require.Equal(t, want, m.queued())

		// A map that settled within StaleAfter is live, however old its
		// index entry.
		recent, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: m.engine, StaleAfter: time.Minute, Logger: discard})
		require.NoError(t, err)
		require.NoError(t, m.rdb.ZAdd(m.ctx, m.keys.Maps(), redis.Z{Score: 1, Member: mapID}).Err())
		rep, err := recent.Sweep(m.ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.MapReport{Examined: 1, Live: 1}, rep)
		require.Equal(t, want, m.queued())

		// Once it is stale, each open position is examined, and each is
		// live.
		m.waitMapStale(mapID)
		require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep())
		require.Equal(t, want, m.queued())

		// The workers finish: position 1's, and position 2's.
		released()
		<-oneDone
		require.NoError(t, oneErr)
		m.setHook(nil)
		require.NoError(t, m.handler.ProcessTask(m.ctx, asynq.NewTask(two.Type, two.Payload)))
		m.done(task(mapID, 2))
		m.requireFinished(id, rollback)
	})
}

// The run sweeper leaves an owner waiting for its unsettled fan-out map (or
// map rollback) alone: the map's workers resume it. Once the map settled
// and that resume was lost, the run sweeper wakes it.
func TestRunSweeperAwaitsAnUnsettledMap(t *testing.T) {
	t.Parallel()
	forwardAndRollback(t, func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		const id = "awaiting"
		mapID := m.start(id, rollback)
		prefix, resume := elPrefix(mapID), fwdResumeID(id, mapID)
		if rollback {
			m.toRollback(id, mapID)
			prefix, resume = rbPrefix(mapID), rbResumeID(id, mapID)
		}
		before := m.pending()

		run := m.waitStale(m.ctx, id)
		require.False(t, run.Status.Terminal())
		locked, err := engine.Locked(m.engine, m.ctx, id)
		require.NoError(t, err)
		require.False(t, locked, "the owner handed off")
		awaiting, _, err := mapcore.Awaiting(m.ctx, m.engine, id)
		require.NoError(t, err)
		require.True(t, awaiting)
		rep, err := m.sweeper.Sweep(m.ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1}, rep, "not woken")
		require.Equal(t, before, m.pending())

		m.drain(prefix)
		require.Equal(t, []string{resume}, m.pending())
		awaiting, resumes, err := mapcore.Awaiting(m.ctx, m.engine, id)
		require.NoError(t, err)
		require.False(t, awaiting, "settled")
		require.Equal(t, []string{resume}, resumes, "the owner was signalled")

		// The map's own resume is queued: the run is not lost.
		m.waitStale(m.ctx, id)
		rep, err = m.sweeper.Sweep(m.ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1}, rep, "not woken while its resume is queued")
		require.Equal(t, []string{resume}, m.pending())

		m.drop(resume)

		run = m.waitStale(m.ctx, id)
		rep, err = m.sweeper.Sweep(m.ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
		require.Equal(t, []string{sweepTaskID(id, run.Version)}, m.pending())
		m.requireFinished(id, rollback)
	})
}

// The combined sweeper passes only under its leader lock: while another
// holder has it, Once does nothing and says so.
func TestSweeperOnceTakesTheLeaderLock(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	const id = "leader"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 3, 4)
	m.drop(elTask(mapID, 2)) // the trigger: nothing else is claimed
	sw, err := sweeper.New(sweeper.Config{Engine: m.engine, StaleAfter: testStaleAfter, Logger: discard})
	require.NoError(t, err)

	// Another replica's pass holds the leader lock.
	held, err := lock.New(m.rdb, time.Minute).TryAcquire(m.ctx, m.keys.SweeperLeader())
	require.NoError(t, err)
	m.waitStale(m.ctx, id)
	m.waitMapStale(mapID)
	rep, err := sw.Once(m.ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Report{}, rep, "not the leader: nothing done")
	require.Empty(t, m.pending())
	require.Equal(t, sweeper.Totals{Skipped: 1}, sw.Totals())

	require.NoError(t, held.Release(m.ctx))
	rep, err = sw.Once(m.ctx)
	require.NoError(t, err)
	require.True(t, rep.Leader)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep.Runs, "the owner awaits its map")
	require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1}, rep.Maps)
	require.Equal(t, elTasks(mapID, 2), m.pending())
	require.Zero(t, m.rdb.Exists(m.ctx, m.keys.SweeperLeader()).Val(), "released after the pass")
	require.Equal(t, sweeper.Totals{Passes: 1, Skipped: 1, Elements: 1, RunsExamined: 1, Examined: 1}, sw.Totals())
	m.requireCompleted(m.finish(id))
}

// After a Redis restart (or SCRIPT FLUSH) the script cache is empty; a pass
// that needs the claim script loads it again. The flush runs on a Redis of
// this test's own. On the shared one it would be harmless too (go-redis
// answers NOSCRIPT by sending the script's source, for every test's
// scripts), but a flush there would reach into every other test running.
func TestMapSweepReloadsScriptsAfterAFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	m := newMapEnv(t, rdb)
	const id = "flushed"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 2, 3, 4)
	m.drop(elTasks(mapID, positions(5, 9)...)...)
	require.NoError(t, rdb.Set(m.ctx, m.keys.MapOffset(mapID), 5, 0).Err()) // the trigger's claim is lost

	src, err := os.ReadFile("../internal/mapcore/lua/claim.lua")
	require.NoError(t, err)
	claim := redis.NewScript(string(src))
	require.NoError(t, claim.Load(m.ctx, rdb).Err())
	require.NoError(t, rdb.ScriptFlush(m.ctx).Err())
	require.Equal(t, []bool{false}, claim.Exists(m.ctx, rdb).Val())

	m.waitMapStale(mapID)
	require.Equal(t, sweeper.MapReport{Examined: 1, Claims: 1, Elements: mapBatch}, m.sweep())
	require.Equal(t, elTasks(mapID, positions(5, 9)...), m.pending())
	require.Equal(t, []bool{true}, claim.Exists(m.ctx, rdb).Val(), "loaded again by the pass")
	m.requireCompleted(m.finish(id))
}
