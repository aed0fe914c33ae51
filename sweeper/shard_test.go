package sweeper_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
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

// The map sweeper looks for a sharded map's tasks on their shard queues: a
// lost element task is found missing on its shard and enqueued there again,
// and the tasks still queued on the other shards are left alone (a sweeper
// looking on the base queue would find them all missing and enqueue the
// whole batch again). With a worker, the map then completes, every element
// run once.
func TestMapSweepRecoversALostTaskOnItsShard(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	queue, prefix := redistest.Queue(t), redistest.Prefix(t)
	const shards, n, batch = 3, 6, 6
	client, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: queue, Shards: shards})
	require.NoError(t, err)
	eng, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard,
		LockExpiry: 600 * time.Millisecond})
	require.NoError(t, err)
	ran := prefix + ":ran"
	elem := reactor.MustDefine("shard_sweep_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("apply", reactor.StepConfig[mapItem, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(ctx context.Context, in mapItem) (int, error) {
				return in.N, rdb.HIncrBy(context.WithoutCancel(ctx), ran, strconv.Itoa(in.N), 1).Err()
			},
		}))
	owner := reactor.MustDefine("shard_sweep_owner",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: batch}))
	require.NoError(t, eng.Register(owner))
	maps, err := sweeper.NewMapSweeper(sweeper.MapConfig{Engine: eng, StaleAfter: testStaleAfter, Logger: discard})
	require.NoError(t, err)
	ctx := ctxTimeout(t, 30*time.Second)

	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	const id = "sharded-sweep"
	res, err := eng.Run(ctx, owner, map[string]any{"items": items}, reactor.WithRunID(id), reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome(), "%v", res.Failure)
	mapID := mapstep.MapID(id, "each")

	insp := asynq.NewInspectorFromRedisClient(rdb)
	pending := func() map[string][]string {
		out := map[string][]string{}
		for _, q := range append([]string{queue}, client.ShardQueues()...) {
			ts, err := insp.ListPendingTasks(q)
			if errors.Is(err, asynq.ErrQueueNotFound) {
				continue
			}
			require.NoError(t, err)
			for _, ti := range ts {
				out[q] = append(out[q], ti.ID)
			}
			slices.Sort(out[q]) // a queue's pending order is the enqueue order, which a batch does not fix
		}
		return out
	}
	want := map[string][]string{}
	for i := range n {
		q := maptask.QueueOf(queue, shards, mapID, i)
		want[q] = append(want[q], maptask.ElementTask{MapID: mapID, Index: i}.TaskID())
	}
	for q := range want {
		slices.Sort(want[q])
	}
	require.Len(t, want, shards)
	require.Equal(t, want, pending(), "the batch is on its shards, none on the base queue")

	// Element 4's task is lost.
	lost := maptask.ElementTask{MapID: mapID, Index: 4}
	lostQueue := maptask.QueueOf(queue, shards, mapID, 4)
	require.NoError(t, insp.DeleteTask(lostQueue, lost.TaskID()))

	k := keys.New(prefix)
	require.Eventually(t, func() bool {
		srv, err := rdb.Time(ctx).Result()
		require.NoError(t, err)
		score, err := rdb.ZScore(ctx, k.Maps(), mapID).Result()
		require.NoError(t, err)
		touched, err := rdb.HGet(ctx, k.MapMeta(mapID), "touched").Int64()
		if errors.Is(err, redis.Nil) {
			touched = 0
		} else {
			require.NoError(t, err)
		}
		return int64(score) <= time.Now().Add(-testStaleAfter).UnixMilli() && touched <= srv.Add(-testStaleAfter).UnixMilli()
	}, 5*time.Second, 5*time.Millisecond)
	rep, err := maps.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.MapReport{Examined: 1, Elements: 1}, rep, "only the lost task is enqueued again")
	require.Equal(t, want, pending(), "on its own shard")

	w := worker.New(eng, rdb, worker.Config{Concurrency: 4, Logger: discard})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	final, err := eng.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Failure)
	counts, err := rdb.HGetAll(ctx, ran).Result()
	require.NoError(t, err)
	require.Len(t, counts, n)
	for i, c := range counts {
		require.Equal(t, "1", c, "element %s ran once", i)
	}
}
