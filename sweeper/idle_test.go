package sweeper_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/sweeper"
)

// An active element task whose element nobody holds is dead after two looks
// IdleAfter apart of the server's time, its lease unchanged, not after
// asynq's lease has gone unextended for 15 s: the first look records it and
// makes the map due again IdleAfter later, sooner than StaleAfter; a look
// with the observation that old redelivers it under a fresh id.
func TestIdleElementTaskIsDeadAfterTwoLooks(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	// A StaleAfter well above IdleAfter, so the early look is the idle
	// verdict's doing.
	maps, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: m.engine, StaleAfter: time.Minute, Logger: discard})
	require.NoError(t, err)
	const id = "idle-two-looks"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 2) // 2, the trigger, claims [5,9]
	lease := time.Now().Add(20 * time.Second)
	m.activate(elTask(mapID, 3), lease) // taken, and its worker died before it began
	ageMap(t, m, mapID)

	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	rep, err := maps.Sweep(m.ctx)
	require.NoError(t, err)
	require.InDelta(t, sweeper.IdleAfter, rep.Soonest, float64(100*time.Millisecond), "the second look is due IdleAfter later")
	rep.Soonest = 0
	require.Equal(t, sweeper.MapReport{Examined: 1}, rep, "first look: no verdict yet")
	seen, err := m.rdb.HGetAll(m.ctx, sweeper.IdleSeenKey(m.prefix, m.queue, elTask(mapID, 3))).Result()
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(lease.Unix(), 10), seen["s"])
	// Due again IdleAfter after the look: its index score is the look's
	// time plus IdleAfter, less StaleAfter.
	score, err := m.rdb.ZScore(m.ctx, m.keys.Maps(), mapID).Result()
	require.NoError(t, err)
	due := time.UnixMilli(int64(score)).Add(time.Minute)
	require.WithinDuration(t, srv.Add(sweeper.IdleAfter), due, 500*time.Millisecond)

	// The second look, the observation as old as IdleAfter (seeded rather
	// than waited for).
	m.seenLease(elTask(mapID, 3), lease, sweeper.IdleAfter)
	ageMap(t, m, mapID)
	rep, err = maps.Sweep(m.ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1}, rep)
	require.Equal(t, asynq.TaskStatePending, m.queued()[elTask(mapID, 3)+":r1"], "redelivered under a fresh id")
	m.requireCompleted(m.finish(id))
}

// An element somebody holds is never redelivered, however old the idle
// observation of its task: the lock says a delivery is on it. The pass
// makes the map due again IdleAfter before the lock would lapse (and Run
// passes then), so that a dead holder's position is taken up as the lock
// lapses and not StaleAfter later.
func TestHeldElementIsLookedAtWhenItsLockLapses(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	maps, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: m.engine, StaleAfter: time.Minute, Logger: discard})
	require.NoError(t, err)
	const id = "held-lapses"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 2)
	lease := time.Now().Add(20 * time.Second)
	m.activate(elTask(mapID, 3), lease)
	m.seenLease(elTask(mapID, 3), lease, time.Minute) // seen idle before it was taken
	const held = 3 * time.Second
	lockKey := m.keys.ElemLock(mapstep.ElementID(mapID, 3))
	require.NoError(t, m.rdb.Set(m.ctx, lockKey, "a-live-holder", held).Err())
	ageMap(t, m, mapID)

	before := m.queued()
	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	rep, err := maps.Sweep(m.ctx)
	require.NoError(t, err)
	// Looked at again IdleAfter before the lock would lapse, to start the
	// observation of its task.
	require.InDelta(t, held-sweeper.IdleAfter, rep.Soonest, float64(500*time.Millisecond))
	rep.Soonest = 0
	require.Equal(t, sweeper.MapReport{Examined: 1}, rep)
	require.Equal(t, before, m.queued(), "a held element's task is left alone")
	score, err := m.rdb.ZScore(m.ctx, m.keys.Maps(), mapID).Result()
	require.NoError(t, err)
	due := time.UnixMilli(int64(score)).Add(time.Minute)
	require.WithinDuration(t, srv.Add(held-sweeper.IdleAfter), due, 500*time.Millisecond, "due when the lock is about to lapse")

	// The holder died; its lock lapsed. The task, seen idle a minute ago
	// before its delivery took the lock, is dead at the next look.
	require.NoError(t, m.rdb.Del(m.ctx, lockKey).Err())
	ageMap(t, m, mapID)
	rep, err = maps.Sweep(m.ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1}, rep)
	m.requireCompleted(m.finish(id))
}

// ageMap makes map mapID look as if it settled its last position, and was
// last examined, two minutes ago: stale for the tests' one-minute
// StaleAfter, without waiting it out.
func ageMap(t *testing.T, m *mapEnv, mapID string) {
	t.Helper()
	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	long := srv.Add(-2 * time.Minute).UnixMilli()
	require.NoError(t, m.rdb.HSet(m.ctx, m.keys.MapMeta(mapID), "touched", long).Err())
	require.NoError(t, m.rdb.ZAdd(m.ctx, m.keys.Maps(), redis.Z{Score: float64(long), Member: mapID}).Err())
}

// A lock within IdleAfter of lapsing starts the observation of its task
// (its holder has stopped extending it: a live one extends it every third
// of its expiry), and the map is due again just after the lapse, when the
// observation is old enough for a verdict.
func TestLapsingLockStartsTheIdleObservation(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	maps, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: m.engine, StaleAfter: time.Minute, Logger: discard})
	require.NoError(t, err)
	const id = "lock-lapsing"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 2)
	lease := time.Now().Add(20 * time.Second)
	m.activate(elTask(mapID, 3), lease)
	const left = 700 * time.Millisecond
	require.NoError(t, m.rdb.Set(m.ctx, m.keys.ElemLock(mapstep.ElementID(mapID, 3)), "a-dead-holder", left).Err())
	ageMap(t, m, mapID)

	rep, err := maps.Sweep(m.ctx)
	require.NoError(t, err)
	require.Greater(t, rep.Soonest, time.Duration(0))
	require.LessOrEqual(t, rep.Soonest, sweeper.IdleAfter, "due again once the lock lapsed and the observation is old enough")
	require.GreaterOrEqual(t, rep.Soonest, left-100*time.Millisecond)
	rep.Soonest = 0
	require.Equal(t, sweeper.MapReport{Examined: 1}, rep, "held: left alone")
	seen, err := m.rdb.HGetAll(m.ctx, sweeper.IdleSeenKey(m.prefix, m.queue, elTask(mapID, 3))).Result()
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(lease.Unix(), 10), seen["s"], "the observation started")
}
