package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/liveness"
	"github.com/goreactor/goreactor/sweeper"
)

// deadWorker seeds what a killed worker leaves in its liveness lease: its
// registry entry and its record of task ids on the env's queue, and no alive
// key (it expired).
func (m *mapEnv) deadWorker(name string, ids ...string) {
	m.t.Helper()
	k := liveness.NewKeys(m.prefix)
	require.NoError(m.t, m.rdb.ZAdd(m.ctx, k.Registry(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: name}).Err())
	for _, id := range ids {
		require.NoError(m.t, m.rdb.HSet(m.ctx, k.Tasks(name), id, "1 "+m.queue).Err())
	}
	require.NoError(m.t, m.rdb.PExpire(m.ctx, k.Tasks(name), time.Minute).Err())
}

// liveWorker starts a liveness lease, as a running worker holds, that has
// taken task ids of the env's queue.
func (m *mapEnv) liveWorker(ids ...string) {
	m.t.Helper()
	l, err := liveness.Start(m.ctx, liveness.Config{Client: m.rdb, Prefix: m.prefix, TTL: 3 * time.Second, Logger: discard})
	require.NoError(m.t, err)
	m.t.Cleanup(func() { require.NoError(m.t, l.Stop(context.Background())) })
	for _, id := range ids {
		_, err := l.Begin(m.ctx, m.queue, id)
		require.NoError(m.t, err)
	}
}

// The map sweeper judges an active task whose element is not locked by the
// workers' liveness leases, not by asynq's 30 s lease: one taken by a
// worker whose lease lapsed is redelivered at the first pass (under a fresh
// id), however fresh its asynq lease still is; one a live worker holds is
// left alone; one no lease lists is judged by its asynq lease, as before
// (seen for the first time: live), a server without a lease serving the
// queue (TestMapSweepJudgesAnUnlistedActiveTask has the other case).
// Forward and rolling back.
func TestMapSweepJudgesActiveTasksByTheWorkersLeases(t *testing.T) {
	t.Parallel()
	forwardAndRollback(t, func(t *testing.T, rollback bool) {
		m := newMapEnv(t, nil)
		sweeper.AssumeUnleasedServer(m.maps)
		const id = "leases"
		mapID := m.start(id, rollback)
		task := elTask
		want := sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1, WorkersLive: 1, WorkersDead: 1}
		if rollback {
			m.toRollback(id, mapID)
			task = rbTask
			want.Elements, want.Rollbacks = 0, 1
		}
		// 2, 3 and 4 were taken a moment ago: asynq's leases are fresh.
		infos := map[int]*asynq.TaskInfo{}
		for _, p := range []int{2, 3, 4} {
			infos[p] = m.activate(task(mapID, p), time.Now().Add(30*time.Second))
		}
		m.deadWorker("killed", task(mapID, 2))
		m.liveWorker(task(mapID, 3))

		m.waitMapStale(mapID)
		require.Equal(t, want, m.sweep())
		require.Equal(t, map[string]asynq.TaskState{
			task(mapID, 0):         asynq.TaskStatePending,
			task(mapID, 1):         asynq.TaskStatePending,
			task(mapID, 2):         asynq.TaskStateActive,  // the dead worker's: asynq's to reclaim, in time
			task(mapID, 2) + ":r1": asynq.TaskStatePending, // its redelivery
			task(mapID, 3):         asynq.TaskStateActive,  // a live worker's
			task(mapID, 4):         asynq.TaskStateActive,  // nobody's record: asynq's lease, fresh
		}, m.queued())

		// The redelivery is not repeated while it is queued.
		m.waitMapStale(mapID)
		want.Elements, want.Rollbacks, want.Fresh = 0, 0, 0
		require.Equal(t, want, m.sweep())

		// The live workers finish 3 and 4.
		for _, p := range []int{3, 4} {
			require.NoError(t, m.handler.ProcessTask(m.ctx, asynq.NewTask(infos[p].Type, infos[p].Payload)))
			m.done(task(mapID, p))
		}
		m.requireFinished(id, rollback)
	})
}

// An owner resume taken by a worker that died is redelivered at the first
// pass after the worker's lease lapsed.
func TestMapSweepRedeliversTheOwnerResumeOfADeadWorker(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	const id = "resume-dead"
	mapID := m.start(id, false)
	m.drain(elPrefix(mapID))
	resume := fwdResumeID(id, mapID)
	require.Equal(t, []string{resume}, m.pending())
	m.activate(resume, time.Now().Add(30*time.Second))
	m.deadWorker("killed", resume)

	m.waitMapStale(mapID)
	require.Equal(t, sweeper.MapReport{Examined: 1, Resumes: 1, Fresh: 1, WorkersDead: 1}, m.sweep())
	require.Equal(t, map[string]asynq.TaskState{
		resume:         asynq.TaskStateActive,
		resume + ":r1": asynq.TaskStatePending,
	}, m.queued())
	m.requireCompleted(m.finish(id))
}

// A task taken by a worker killed before it recorded the task is listed
// nowhere. While every asynq server of the queue records its deliveries
// (here: none serves it), the sweeper calls it dead once two looks half a second
// apart found it unlisted with an unextended asynq lease (half a second at least); one whose lease
// was extended between the looks (a live server holds it) is not. With a
// server that keeps no record on the queue, asynq's lease decides, over 15 s.
func TestMapSweepJudgesAnUnlistedActiveTask(t *testing.T) {
	t.Parallel()
	for _, unleased := range []bool{false, true} {
		t.Run(map[bool]string{false: "every server leased", true: "an unleased server"}[unleased], func(t *testing.T) {
			t.Parallel()
			m := newMapEnv(t, nil)
			if unleased {
				sweeper.AssumeUnleasedServer(m.maps)
			}
			const id = "unlisted"
			mapID := m.start(id, false)
			m.deliverAll(elPrefix(mapID), 0, 1, 4)
			lease := time.Now().Add(30 * time.Second)
			m.activate(elTask(mapID, 2), lease)
			m.activate(elTask(mapID, 3), lease)

			m.waitMapStale(mapID)
			require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep(), "first look: live")
			// 3's lease is extended, as its server's heartbeat does.
			require.NoError(t, m.rdb.ZAdd(m.ctx, m.qkey("lease"), redis.Z{Score: float64(lease.Unix() + 5), Member: elTask(mapID, 3)}).Err())
			time.Sleep(time.Second)
			m.waitMapStale(mapID)
			want := map[string]asynq.TaskState{
				elTask(mapID, 2): asynq.TaskStateActive,
				elTask(mapID, 3): asynq.TaskStateActive,
			}
			if unleased {
				require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep(), "asynq's lease: not dead before 15 s")
			} else {
				require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1, WorkersDead: 1}, m.sweep())
				want[elTask(mapID, 2)+":r1"] = asynq.TaskStatePending
			}
			require.Equal(t, want, m.queued())
		})
	}
}
