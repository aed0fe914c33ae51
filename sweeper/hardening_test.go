package sweeper_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// Seeded-state tests of the sweeper's hardening: each writes the exact Redis
// state of one hazard and runs one pass.

// An active task with no entry in asynq's lease set is an absent reading,
// not a dead worker: the sweeper leaves it (asynq's recoverer owns the
// lease set) instead of redelivering it.
func TestHardeningLeaseMissingIsNotDead(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	const id = "lease-missing"
	mapID := m.start(id, false)
	// 2, the trigger, stays open: the second batch is not claimed.
	m.deliverAll(elPrefix(mapID), 0, 1, 3, 4)
	m.activate(elTask(mapID, 2), time.Now().Add(-time.Minute))
	require.NoError(t, m.rdb.ZRem(m.ctx, m.qkey("lease"), elTask(mapID, 2)).Err())
	want := map[string]asynq.TaskState{elTask(mapID, 2): asynq.TaskStateActive}
	require.Equal(t, want, m.queued())

	m.waitMapStale(mapID)
	require.Equal(t, sweeper.MapReport{Examined: 1}, m.sweep())
	require.Equal(t, want, m.queued(), "no redelivery")
}

// A lease is judged by the Redis server's clock alone, never by comparing
// its score (the worker's clock) with the sweeper's: an expiry long past by
// the sweeper's clock, seen for the first time, is not dead; an expiry in
// the future by the sweeper's clock that has not changed, the element held
// by nobody, for two seconds of server time is.
func TestHardeningLeaseJudgedByServerTime(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	const id = "lease-clock"
	mapID := m.start(id, false)
	m.deliverAll(elPrefix(mapID), 0, 1, 4)
	// 2: its worker's clock is a minute behind the sweeper's (or the
	// sweeper's ahead); the lease has never been looked at.
	behind := time.Now().Add(-time.Minute)
	m.activate(elTask(mapID, 2), behind)
	// 3: fresh by the sweeper's clock, but a pass saw this same expiry
	// two seconds ago of server time: nobody extended it or took its
	// element since.
	ahead := time.Now().Add(30 * time.Second)
	m.activate(elTask(mapID, 3), ahead)
	m.seenLease(elTask(mapID, 3), ahead, 2*sweeper.IdleAfter)

	m.waitMapStale(mapID)
	require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1, Fresh: 1}, m.sweep())
	require.Equal(t, map[string]asynq.TaskState{
		elTask(mapID, 2):         asynq.TaskStateActive,
		elTask(mapID, 3):         asynq.TaskStateActive,
		elTask(mapID, 3) + ":r1": asynq.TaskStatePending,
	}, m.queued(), "only 3 is redelivered")

	// The pass recorded 2's lease as first seen now, by the server's clock.
	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	seen, err := m.rdb.HGetAll(m.ctx, sweeper.IdleSeenKey(m.prefix, m.queue, elTask(mapID, 2))).Result()
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(behind.Unix(), 10), seen["s"])
	at, err := strconv.ParseInt(seen["at"], 10, 64)
	require.NoError(t, err)
	require.InDelta(t, srv.UnixMilli(), at, float64(10*time.Second/time.Millisecond))
	require.Positive(t, m.rdb.PTTL(m.ctx, sweeper.IdleSeenKey(m.prefix, m.queue, elTask(mapID, 2))).Val(), "the observation expires")
}

// A run is stale by the server time of its last state write (the state
// hash's `at`), not by the writer's clock (UpdatedAt): a run whose UpdatedAt
// is old but whose last write is recent by the server is not woken; without
// `at` (a state written before writes stamped it), UpdatedAt decides.
func TestHardeningRunStalenessByServerTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *sweeper.RunConfig) { c.StaleAfter = time.Second })
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "at-fresh"
	_, err := e.engine.Run(ctx, crashAt(e, tr, "at_fresh", id), nil, reactor.WithRunID(id))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Del(ctx, e.lockKey(id)).Err())
	run := e.waitStale(ctx, id)

	// The writer's clock lags: its UpdatedAt is old, the server's time of
	// the write is now.
	srv, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	state := e.prefix + ":{run:" + id + "}:ctx"
	require.NoError(t, e.rdb.HSet(ctx, state, "at", srv.UnixMilli()).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: 1, Member: id}).Err())
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
	require.Empty(t, e.queued(), "written a moment ago by the server's clock: not woken")

	// A state from before the stamp: UpdatedAt is all there is.
	require.NoError(t, e.rdb.HDel(ctx, state, "at").Err())
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: 1, Member: id}).Err())
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	require.Equal(t, map[string]asynq.TaskState{sweepTaskID(id, run.Version): asynq.TaskStatePending}, e.queued())
}

// The run sweeper removes an active-index entry only if it is unchanged
// since the pass read it: an Undo or a resume that re-indexed the run in
// between keeps it visible. A vanished run (no state) is dropped only when
// its lock is free: a run being created holds its lock before its index
// entry and its state exist.
func TestHardeningRunIndexRemovalIsConditional(t *testing.T) {
	t.Parallel()
	old := float64(time.Now().Add(-time.Hour).UnixMilli())
	reindex := func(e *env, ctx context.Context) func(string) {
		return func(id string) {
			// The racing writer: Undo's MarkStatus to rolling_back.
			require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old + 1, Member: id}).Err())
		}
	}

	t.Run("finished run re-indexed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx := ctxTimeout(t, 20*time.Second)
		tr := &trail{}
		const id = "finished-undone"
		res, err := e.engine.Run(ctx, reactor.MustDefine("finished_undone", step(tr, "a", nil)), nil, reactor.WithRunID(id))
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, res.Status)
		require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: id}).Err())
		sweeper.SetBeforeRemove(e.sweeper, reindex(e, ctx))

		rep, err := e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
		require.NoError(t, e.rdb.ZScore(ctx, e.activeKey(), id).Err(), "the re-indexed run stays visible")

		// Unchanged since the read: dropped.
		sweeper.SetBeforeRemove(e.sweeper, nil)
		require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: id}).Err())
		rep, err = e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1, Dropped: 1}, rep)
		require.ErrorIs(t, e.rdb.ZScore(ctx, e.activeKey(), id).Err(), redis.Nil)
	})

	t.Run("vanished run re-indexed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx := ctxTimeout(t, 20*time.Second)
		require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: "reborn"}).Err())
		sweeper.SetBeforeRemove(e.sweeper, reindex(e, ctx))
		rep, err := e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
		require.NoError(t, e.rdb.ZScore(ctx, e.activeKey(), "reborn").Err())
	})

	t.Run("vanished run being created", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx := ctxTimeout(t, 20*time.Second)
		// Its creator holds the lock and indexed it; the state is not
		// written yet. However old the entry looks by any clock, it stays.
		require.NoError(t, e.rdb.Set(ctx, e.lockKey("newborn"), "creator", time.Minute).Err())
		require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: "newborn"}).Err())
		rep, err := e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1}, rep)
		require.NoError(t, e.rdb.ZScore(ctx, e.activeKey(), "newborn").Err())
		require.Empty(t, e.queued())

		// The creator died before the create: its lock expires, and the
		// entry goes.
		require.NoError(t, e.rdb.Del(ctx, e.lockKey("newborn")).Err())
		require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: old, Member: "newborn"}).Err())
		rep, err = e.sweeper.Sweep(ctx)
		require.NoError(t, err)
		require.Equal(t, sweeper.RunReport{Examined: 1, Dropped: 1}, rep)
		require.Zero(t, e.rdb.ZCard(ctx, e.activeKey()).Val())
	})
}

// A map index entry with no map keys is dropped only when its owner is gone
// or finished too (an expired map of an expired run); while the owner is
// live, the entry stays: the owner indexes its map before creating it, and
// a revived owner creates it.
func TestHardeningMapIndexMissingMapFollowsItsOwner(t *testing.T) {
	t.Parallel()
	m := newMapEnv(t, nil)
	tr := &trail{}
	const owner = "owner-alive"
	_, err := m.engine.Run(m.ctx, crashAt(m.env, tr, "owner_alive", owner), nil, reactor.WithRunID(owner))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, m.rdb.Del(m.ctx, m.lockKey(owner)).Err())
	const done = "owner-done"
	res, err := m.engine.Run(m.ctx, reactor.MustDefine("owner_done", step(tr, "a", nil)), nil, reactor.WithRunID(done))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)

	require.NoError(t, m.rdb.SAdd(m.ctx, m.keys.RunMaps("owner-expired"), "owner-expired~each").Err())
	require.NoError(t, m.rdb.ZAdd(m.ctx, m.keys.Maps(),
		redis.Z{Score: 1, Member: "owner-expired~each"},
		redis.Z{Score: 2, Member: done + "~each"},
		redis.Z{Score: 3, Member: owner + "~each"},
	).Err())
	began, err := m.rdb.Time(m.ctx).Result()
	require.NoError(t, err)
	require.Equal(t, sweeper.MapReport{Examined: 3, Removed: 2}, m.sweep())
	require.Equal(t, []string{owner + "~each"}, m.rdb.ZRange(m.ctx, m.keys.Maps(), 0, -1).Val())
	m.requireTouched(owner+"~each", began)
	require.Zero(t, m.rdb.Exists(m.ctx, m.keys.RunMaps("owner-expired")).Val(), "the gone owner's set of maps goes too")
}

// The listing indexes (idx:runs, idx:status:<s>) lose the entries of runs
// whose state is gone, a bounded page per index per pass: entries older
// than the retention in idx:runs and the terminal status indexes, older
// than StaleAfter in the others. A retained run (state present), a live run
// and a run being created (lock held, no state yet) keep theirs, and so does
// a young entry.
func TestHardeningIndexTrim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const page = 2
	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: e.engine, StaleAfter: e.stale, Page: page, Logger: discard})
	require.NoError(t, err)

	res, err := e.engine.Run(ctx, reactor.MustDefine("retained", step(tr, "a", nil)), nil, reactor.WithRunID("retained"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	_, err = e.engine.Run(ctx, crashAt(e, tr, "live", "live"), nil, reactor.WithRunID("live"))
	require.ErrorIs(t, err, reactor.ErrLockLost)
	require.NoError(t, e.rdb.Set(ctx, e.lockKey("creating"), "creator", time.Minute).Err())

	srv, err := e.rdb.Time(ctx).Result()
	require.NoError(t, err)
	old := float64(srv.Add(-engine.Retention(e.engine) - 24*time.Hour).UnixMilli())
	runs, completed, running := e.prefix+":idx:runs", e.prefix+":idx:status:completed", e.prefix+":idx:status:running"
	require.NoError(t, e.rdb.ZAdd(ctx, runs,
		redis.Z{Score: old, Member: "gone-1"}, redis.Z{Score: old + 1, Member: "gone-2"},
		redis.Z{Score: old + 2, Member: "retained"}, redis.Z{Score: old + 3, Member: "creating"},
		redis.Z{Score: old + 4, Member: "gone-3"}, redis.Z{Score: old + 5, Member: "live"},
	).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, completed,
		redis.Z{Score: old, Member: "gone-c"}, redis.Z{Score: old + 1, Member: "retained"},
		redis.Z{Score: float64(srv.UnixMilli()), Member: "gone-young"},
	).Err())
	require.NoError(t, e.rdb.ZAdd(ctx, running,
		redis.Z{Score: float64(srv.Add(-time.Hour).UnixMilli()), Member: "gone-r"},
	).Err())

	// One page per index: two of idx:runs's three trimmable entries.
	rep, err := trim.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.TrimReport{Examined: 5, Trimmed: 4}, rep)
	require.Equal(t, []string{"retained", "creating", "gone-3", "live"}, e.rdb.ZRange(ctx, runs, 0, -1).Val())

	// Later passes go past the kept entries and reach the third.
	var trimmed int
	for range 4 {
		rep, err := trim.Trim(ctx)
		require.NoError(t, err)
		require.LessOrEqual(t, rep.Examined, page*len(reactor.Statuses())+page)
		trimmed += rep.Trimmed
	}
	require.Equal(t, 1, trimmed)
	require.Equal(t, []string{"retained", "creating", "live"}, e.rdb.ZRange(ctx, runs, 0, -1).Val())
	require.Equal(t, []string{"retained", "gone-young"}, e.rdb.ZRange(ctx, completed, 0, -1).Val())
	require.Equal(t, []string{"live"}, e.rdb.ZRange(ctx, running, 0, -1).Val(), "the live run's own entry")
}
