package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// The harness of the map sweeper tests (maps_test.go). State is built by
// the real protocol: an owner run with a fan-out map is started in this
// process and hands its first batch to the queue; no worker consumes the
// queue, so every task stays pending until the test delivers it by hand
// (deliver: take it off the queue and give it to a worker's handler, as the
// drainer of the mapstep tests does) or starts a worker (finish). Faults are
// then made the way they happen: a task deleted from the queue (a dropped
// enqueue), archived, or left active with a lease nobody extends (its worker
// died).

// mapBatch and mapItems: every owner maps 12 items in batches of 5, so the
// map has three batches, [0,4], [5,9] and [10,11]. A batch's trigger is its
// position k*5-1-2, half a batch before its end: the settle of position 2
// claims [5,9], that of 7 claims [10,11]. Rollback positions (0 = the newest
// element) are batched and triggered the same way.
const (
	mapBatch = 5
	mapItems = 12
)

// mapEnv is one test's env (engine, queue, run sweeper) plus a fan-out map
// owner, a map sweeper and a hand driver of the queue.
type mapEnv struct {
	*env
	ctx     context.Context
	keys    keys.Keys
	maps    *sweeper.MapSweeper
	handler asynq.Handler
	owner   *reactor.Definition

	mu sync.Mutex
	// hook, if set, runs inside the element step's Run ("run") or Undo
	// ("undo") after it recorded the call.
	hook func(ctx context.Context, what string, item int) error
}

// newMapEnv builds a mapEnv on rdb, or on the shared Redis when rdb is nil.
func newMapEnv(t *testing.T, rdb redis.UniversalClient) *mapEnv {
	t.Helper()
	if rdb == nil {
		rdb = redistest.Client(t)
	}
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{
		Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard,
		// A lock taken away is noticed within a third of this.
		LockExpiry: 600 * time.Millisecond,
	})
	require.NoError(t, err)
	runs, err := sweeper.NewRunSweeper(sweeper.RunConfig{Engine: engine, Client: rdb, Enqueuer: client,
		StaleAfter: testStaleAfter, Logger: discard})
	require.NoError(t, err)
	maps, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: engine, StaleAfter: testStaleAfter, Logger: discard})
	require.NoError(t, err)
	m := &mapEnv{
		env: &env{t: t, rdb: rdb, prefix: prefix, queue: queue, client: client, engine: engine,
			insp: asynq.NewInspectorFromRedisClient(rdb), sweeper: runs, stale: testStaleAfter},
		ctx:  ctxTimeout(t, 30*time.Second),
		keys: keys.New(prefix),
		maps: maps,
		// A worker that is never started: only its handler is used.
		handler: worker.New(engine, rdb, worker.Config{Queues: map[string]int{queue: 1}, Logger: discard}).Handler(),
	}
	m.owner = m.define()
	require.NoError(t, engine.Register(m.owner))
	return m
}

type mapItem struct {
	N int `json:"n"`
}

type mapTotalIn struct {
	R    mapstep.Result `json:"r"`
	Fail bool           `json:"fail"`
}

// define returns the owner: a fan-out map "each" of the element reactor
// over the input "items", then "total", which sums the elements' values,
// or fails permanently when the input "fail" is set, which rolls the map
// back. The element has one step, "apply" (item n -> 10n), recording each
// execution in the hash <prefix>:ran and each undo in <prefix>:undone.
func (m *mapEnv) define() *reactor.Definition {
	elem := reactor.MustDefine("sweep_elem",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("apply", reactor.StepConfig[mapItem, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(ctx context.Context, in mapItem) (int, error) {
				if err := m.rdb.HIncrBy(context.WithoutCancel(ctx), m.prefix+":ran", strconv.Itoa(in.N), 1).Err(); err != nil {
					return 0, err
				}
				if err := m.callHook(ctx, "run", in.N); err != nil {
					return 0, err
				}
				return 10 * in.N, nil
			},
			Undo: func(ctx context.Context, in mapItem, _ int) error {
				if err := m.rdb.HIncrBy(context.WithoutCancel(ctx), m.prefix+":undone", strconv.Itoa(in.N), 1).Err(); err != nil {
					return err
				}
				return m.callHook(ctx, "undo", in.N)
			},
		}),
		reactor.Returns(reactor.FromStep("apply")),
	)
	return reactor.MustDefine("sweep_owner",
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Input[bool]("fail", reactor.Default(false)),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: mapBatch}),
		reactor.Step("total", reactor.StepConfig[mapTotalIn, int]{
			Args: reactor.Bindings{"r": reactor.FromStep("each"), "fail": reactor.FromInput("fail")},
			Run: func(ctx context.Context, in mapTotalIn) (int, error) {
				if in.Fail {
					return 0, reactor.Permanent(errors.New("total refuses"))
				}
				rd, err := mapstep.Read[int](ctx, in.R)
				if err != nil {
					return 0, err
				}
				all, err := rd.All(ctx)
				if err != nil {
					return 0, err
				}
				sum := 0
				for _, el := range all {
					if !el.OK {
						return 0, reactor.Permanent(fmt.Errorf("element %d did not complete", el.Index))
					}
					sum += el.Value
				}
				return sum, nil
			},
		}),
		reactor.Returns(reactor.FromStep("total")),
	)
}

// mapWantTotal is the owner's value when every element completed.
func mapWantTotal() int {
	sum := 0
	for i := range mapItems {
		sum += 10 * i
	}
	return sum
}

func (m *mapEnv) setHook(h func(ctx context.Context, what string, item int) error) {
	m.mu.Lock()
	m.hook = h
	m.mu.Unlock()
}

func (m *mapEnv) callHook(ctx context.Context, what string, item int) error {
	m.mu.Lock()
	hook := m.hook
	m.mu.Unlock()
	if hook == nil {
		return nil
	}
	return hook(ctx, what, item)
}

// start runs owner id in this process until its map hands off, and returns
// the map's id. The first batch is then pending in the queue.
func (m *mapEnv) start(id string, fail bool) string {
	m.t.Helper()
	items := make([]int, mapItems)
	for i := range items {
		items[i] = i
	}
	res, err := m.engine.Run(m.ctx, m.owner, map[string]any{"items": items, "fail": fail}, reactor.WithRunID(id), reactor.NoWait())
	require.NoError(m.t, err)
	require.Equal(m.t, reactor.OutcomeDispatched, res.Outcome(), "%v", res.Failure)
	mapID := mapstep.MapID(id, "each")
	require.Equal(m.t, elTasks(mapID, 0, 1, 2, 3, 4), m.pending(), "the first batch")
	return mapID
}

// toRollback drives owner id's map forward to the end, delivers the owner's
// resume, whose "total" fails, and checks that the owner handed off the
// map's rollback with its first batch of jobs.
func (m *mapEnv) toRollback(id, mapID string) {
	m.t.Helper()
	m.drain(elPrefix(mapID))
	require.Equal(m.t, []string{fwdResumeID(id, mapID)}, m.pending())
	require.NoError(m.t, m.deliver(fwdResumeID(id, mapID)))
	run, err := m.engine.Get(m.ctx, id)
	require.NoError(m.t, err)
	require.Equal(m.t, reactor.StatusRollingBack, run.Status)
	require.Equal(m.t, rbTasks(mapID, 0, 1, 2, 3, 4), m.pending(), "the rollback's first batch")
}

// Task ids, as the map protocol names them.

func elTask(mapID string, i int) string { return maptask.ElementTask{MapID: mapID, Index: i}.TaskID() }
func rbTask(mapID string, p int) string {
	return maptask.RollbackTask{MapID: mapID, Gen: 1, Pos: p}.TaskID()
}
func elPrefix(mapID string) string             { return "el:" + mapID + ":" }
func rbPrefix(mapID string) string             { return "rb:" + mapID + ":1:" }
func fwdResumeID(owner, mapID string) string   { return "resume:" + owner + ":fwd:" + mapID }
func rbResumeID(owner, mapID string) string    { return "resume:" + owner + ":rb:" + mapID + ":1" }
func elTasks(mapID string, is ...int) []string { return taskIDs(elTask, mapID, is) }
func rbTasks(mapID string, ps ...int) []string { return taskIDs(rbTask, mapID, ps) }

// positions returns from, from+1, ..., to.
func positions(from, to int) []int {
	out := make([]int, 0, to-from+1)
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

func taskIDs(f func(string, int) string, mapID string, ns []int) []string {
	out := make([]string, len(ns))
	for j, n := range ns {
		out[j] = f(mapID, n)
	}
	slices.Sort(out)
	return out
}

// pending returns the ids of the queue's tasks, sorted, and checks that
// they are all pending: nothing scheduled, retrying, active or archived.
func (m *mapEnv) pending() []string {
	m.t.Helper()
	out := []string{}
	for id, state := range m.queued() {
		require.Equal(m.t, asynq.TaskStatePending, state, "task %s", id)
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// deliver runs pending task id once, as a worker would: it leaves the queue
// (a finished task without retention) and the worker's handler executes it.
// It returns the handler's error.
func (m *mapEnv) deliver(id string) error {
	m.t.Helper()
	return m.handler.ProcessTask(m.ctx, m.take(id))
}

// take takes pending task id off the queue, as a worker that will run it
// and forget it, and returns it.
func (m *mapEnv) take(id string) *asynq.Task {
	m.t.Helper()
	info, err := m.insp.GetTaskInfo(m.queue, id)
	require.NoError(m.t, err)
	require.Equal(m.t, asynq.TaskStatePending, info.State, "task %s", id)
	require.NoError(m.t, m.insp.DeleteTask(m.queue, id))
	return asynq.NewTask(info.Type, info.Payload)
}

// deliverAll delivers tasks prefix+n for each n, in order.
func (m *mapEnv) deliverAll(prefix string, ns ...int) {
	m.t.Helper()
	for _, n := range ns {
		require.NoError(m.t, m.deliver(prefix+strconv.Itoa(n)))
	}
}

// drain delivers the pending tasks whose id starts with prefix, lowest
// number first, including those the deliveries enqueue, until none is left.
func (m *mapEnv) drain(prefix string) {
	m.t.Helper()
	for {
		var next []int
		for _, id := range m.pending() {
			if n, ok := strings.CutPrefix(id, prefix); ok {
				i, err := strconv.Atoi(n)
				require.NoError(m.t, err, "task %s", id)
				next = append(next, i)
			}
		}
		if len(next) == 0 {
			return
		}
		require.NoError(m.t, m.deliver(prefix+strconv.Itoa(slices.Min(next))))
	}
}

// drop deletes pending tasks: their enqueue was lost.
func (m *mapEnv) drop(ids ...string) {
	m.t.Helper()
	for _, id := range ids {
		require.NoError(m.t, m.insp.DeleteTask(m.queue, id), "drop %s", id)
	}
}

// asynq v0.26's keys of the env's queue (internal/base).
func (m *mapEnv) qkey(suffix string) string { return "asynq:{" + m.queue + "}:" + suffix }

// activate moves pending task id to the active state with the given lease
// expiry, exactly as asynq's dequeue script does when a worker takes it:
// pending list -> active list, state "active", lease in the lease set
// (Unix seconds). A worker alive extends the lease every few seconds; one
// that died leaves it to expire.
func (m *mapEnv) activate(id string, lease time.Time) *asynq.TaskInfo {
	m.t.Helper()
	n, err := m.rdb.LRem(m.ctx, m.qkey("pending"), 0, id).Result()
	require.NoError(m.t, err)
	require.EqualValues(m.t, 1, n, "task %s was not pending", id)
	_, err = m.rdb.TxPipelined(m.ctx, func(p redis.Pipeliner) error {
		p.LPush(m.ctx, m.qkey("active"), id)
		p.HSet(m.ctx, m.qkey("t:"+id), "state", "active")
		p.HDel(m.ctx, m.qkey("t:"+id), "pending_since")
		p.ZAdd(m.ctx, m.qkey("lease"), redis.Z{Score: float64(lease.Unix()), Member: id})
		return nil
	})
	require.NoError(m.t, err)
	info, err := m.insp.GetTaskInfo(m.queue, id)
	require.NoError(m.t, err)
	require.Equal(m.t, asynq.TaskStateActive, info.State)
	return info
}

// seenLease seeds the sweeper's observation of active task id's lease,
// with its map position's element held by nobody: a pass saw it expire at
// lease, ago of the Redis server's time, as a pass records it (the expiry
// in Unix seconds, the server time in ms).
func (m *mapEnv) seenLease(id string, lease time.Time, ago time.Duration) {
	m.t.Helper()
	srv, err := m.rdb.Time(m.ctx).Result()
	require.NoError(m.t, err)
	key := sweeper.IdleSeenKey(m.prefix, m.queue, id)
	require.NoError(m.t, m.rdb.HSet(m.ctx, key, "s", strconv.FormatInt(lease.Unix(), 10), "at", srv.Add(-ago).UnixMilli()).Err())
	require.NoError(m.t, m.rdb.PExpire(m.ctx, key, time.Minute).Err())
}

// done removes active task id the way asynq does when its handler returned
// nil (no retention).
func (m *mapEnv) done(id string) {
	m.t.Helper()
	_, err := m.rdb.TxPipelined(m.ctx, func(p redis.Pipeliner) error {
		p.LRem(m.ctx, m.qkey("active"), 0, id)
		p.ZRem(m.ctx, m.qkey("lease"), id)
		p.Del(m.ctx, m.qkey("t:"+id))
		return nil
	})
	require.NoError(m.t, err)
	_, err = m.insp.GetTaskInfo(m.queue, id)
	require.ErrorIs(m.t, err, asynq.ErrTaskNotFound)
}

// waitMapStale waits until the map sweeper examines map mapID: its index
// entry and its last settle (forward and rollback) are older than
// StaleAfter. Settles stamp the map with the Redis server's clock, the
// index with the writer's; both are this machine's.
func (m *mapEnv) waitMapStale(mapID string) {
	m.t.Helper()
	touched := func(key string) int64 {
		v, err := m.rdb.HGet(m.ctx, key, "touched").Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		require.NoError(m.t, err)
		return v
	}
	require.Eventually(m.t, func() bool {
		srv, err := m.rdb.Time(m.ctx).Result()
		require.NoError(m.t, err)
		score, err := m.rdb.ZScore(m.ctx, m.keys.Maps(), mapID).Result()
		require.NoError(m.t, err, "map %s is not in the map index", mapID)
		before := srv.Add(-testStaleAfter).UnixMilli()
		return int64(score) <= time.Now().Add(-testStaleAfter).UnixMilli() &&
			touched(m.keys.MapMeta(mapID)) <= before && touched(m.keys.MapRbMeta(mapID, 1)) <= before
	}, 5*time.Second, 5*time.Millisecond)
}

// sweep runs one map sweeper pass, which must not fail.
func (m *mapEnv) sweep() sweeper.MapReport {
	m.t.Helper()
	rep, err := m.maps.Sweep(m.ctx)
	require.NoError(m.t, err)
	return rep
}

// requireQuietPass waits for map mapID to be examined again and checks that
// the pass enqueues nothing: what the last pass enqueued is still queued.
func (m *mapEnv) requireQuietPass(mapID string) {
	m.t.Helper()
	before := m.queued()
	m.waitMapStale(mapID)
	require.Equal(m.t, sweeper.MapReport{Examined: 1}, m.sweep(), "a second pass")
	require.Equal(m.t, before, m.queued(), "a second pass")
}

// requireTouched checks that a pass begun at began moved map mapID's index
// entry to its own time, so that passes leave the map alone for StaleAfter
// and the next page of the index gets its turn.
func (m *mapEnv) requireTouched(mapID string, began time.Time) {
	m.t.Helper()
	score, err := m.rdb.ZScore(m.ctx, m.keys.Maps(), mapID).Result()
	require.NoError(m.t, err)
	require.GreaterOrEqual(m.t, int64(score), began.UnixMilli(), "the pass touched the map's index entry")
}

// finish starts a worker and waits for owner id to end.
func (m *mapEnv) finish(id string) *reactor.Result {
	m.t.Helper()
	m.startWorker()
	res, err := m.engine.Wait(m.ctx, id)
	require.NoError(m.t, err)
	return res
}

// requireCompleted checks a completed owner's value and that every element
// ran once (except those in ranTwice, whose first delivery died mid-step)
// and none was undone.
func (m *mapEnv) requireCompleted(res *reactor.Result, ranTwice ...int) {
	m.t.Helper()
	require.Equal(m.t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
	v, err := reactor.ValueOf[int](res)
	require.NoError(m.t, err)
	require.Equal(m.t, mapWantTotal(), v)
	m.requireCounts("ran", ranTwice...)
	require.Empty(m.t, m.counts("undone"))
}

// requireRolledBack checks that owner id failed in "total" and that every
// element ran once and was undone once.
func (m *mapEnv) requireRolledBack(res *reactor.Result) {
	m.t.Helper()
	require.Equal(m.t, reactor.StatusFailed, res.Status)
	require.NotNil(m.t, res.Failure)
	require.Equal(m.t, "total", res.Failure.Step)
	require.Empty(m.t, res.Failure.RollbackFailures)
	m.requireCounts("ran")
	m.requireCounts("undone")
}

// requireCounts checks that hash <prefix>:<what> counts 1 for every item,
// 2 for the items in twice.
func (m *mapEnv) requireCounts(what string, twice ...int) {
	m.t.Helper()
	want := map[int]int{}
	for i := range mapItems {
		want[i] = 1
		if slices.Contains(twice, i) {
			want[i] = 2
		}
	}
	require.Equal(m.t, want, m.counts(what), what)
}

func (m *mapEnv) counts(what string) map[int]int {
	m.t.Helper()
	h, err := m.rdb.HGetAll(m.ctx, m.prefix+":"+what).Result()
	require.NoError(m.t, err)
	out := map[int]int{}
	for k, v := range h {
		i, err := strconv.Atoi(k)
		require.NoError(m.t, err)
		out[i], err = strconv.Atoi(v)
		require.NoError(m.t, err)
	}
	return out
}

// forwardAndRollback runs body twice, as parallel subtests: on a map going
// forward, and on a map rolling back.
func forwardAndRollback(t *testing.T, body func(t *testing.T, rollback bool)) {
	for _, rollback := range []bool{false, true} {
		name := "forward"
		if rollback {
			name = "rollback"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body(t, rollback)
		})
	}
}

// requireFinished lets owner id finish and checks it completed, or rolled
// back when its map was made to roll back.
func (m *mapEnv) requireFinished(id string, rollback bool) {
	if rollback {
		m.requireRolledBack(m.finish(id))
	} else {
		m.requireCompleted(m.finish(id))
	}
}
