package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// shardLog records, per element index, the queues its runs and its undos
// were delivered on (asynq.GetQueueName of the task's context).
type shardLog struct {
	mu     sync.Mutex
	ran    map[int][]string
	undone map[int][]string
	owner  []string
}

func newShardLog() *shardLog { return &shardLog{ran: map[int][]string{}, undone: map[int][]string{}} }

func (l *shardLog) add(ctx context.Context, into map[int][]string, i int) {
	q, ok := asynq.GetQueueName(ctx)
	if !ok {
		q = "(not an asynq task)"
	}
	l.mu.Lock()
	into[i] = append(into[i], q)
	l.mu.Unlock()
}

type shardItem struct {
	N int `json:"n"`
}

// shardedMap defines an element reactor recording its deliveries in l, and
// an owner fanning it out over its "items" in batches of 6 that fails
// after the map when fail is set (rolling the map back).
func shardedMap(name string, l *shardLog, fail bool) *reactor.Definition {
	elem := reactor.MustDefine(name+"_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("apply", reactor.StepConfig[shardItem, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(ctx context.Context, in shardItem) (int, error) {
				l.add(ctx, l.ran, in.N)
				return in.N, nil
			},
			Undo: func(ctx context.Context, in shardItem, _ int) error {
				l.add(ctx, l.undone, in.N)
				return nil
			},
		}))
	return reactor.MustDefine(name,
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Step("where", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				q, _ := asynq.GetQueueName(ctx)
				l.mu.Lock()
				l.owner = append(l.owner, q)
				l.mu.Unlock()
				return q, nil
			},
		}),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 6,
			After: []string{"where"}}),
		reactor.Step("finish", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				if fail {
					return "", reactor.Permanent(errors.New("declined"))
				}
				return "done", nil
			},
		}),
	)
}

// A sharded client's map runs and rolls back with its element and rollback
// tasks on the shard queues the map id and index choose, every element
// run once and undone once, every shard used, and the owner's tasks on
// the base queue; the worker serves the shards without being told.
func TestShardedMapRunsAndRollsBackOverEveryShard(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	queue, prefix := redistest.Queue(t), redistest.Prefix(t)
	const shards, n = 3, 30
	client, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: queue, Shards: shards})
	require.NoError(t, err)
	require.Equal(t, shards, client.Shards())
	require.Equal(t, []string{queue + ".shard0", queue + ".shard1", queue + ".shard2"}, client.ShardQueues())
	eng, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard})
	require.NoError(t, err)
	okLog, rbLog := newShardLog(), newShardLog()
	ok, rb := shardedMap("shard_ok", okLog, false), shardedMap("shard_rb", rbLog, true)
	require.NoError(t, eng.Register(ok, rb))
	ctx := ctxTimeout(t)

	served, err := client.Served(ctx)
	require.NoError(t, err)
	require.False(t, served, "no worker yet")
	// Queues names only the base queue: the shards come with the client.
	w := worker.New(eng, rdb, worker.Config{Queues: map[string]int{queue: 2}, Concurrency: 8, Logger: discard,
		ShutdownTimeout: 5 * time.Second})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	require.Eventually(t, func() bool { s, err := client.Served(ctx); return err == nil && s }, 10*time.Second, 20*time.Millisecond,
		"the worker serves the base queue and every shard")
	servers, err := asynq.NewInspectorFromRedisClient(rdb).Servers()
	require.NoError(t, err)
	var polled map[string]int
	for _, s := range servers {
		if _, mine := s.Queues[queue]; mine {
			polled = s.Queues
		}
	}
	require.Equal(t, map[string]int{queue: 2, queue + ".shard0": 2, queue + ".shard1": 2, queue + ".shard2": 2}, polled,
		"the shards at the base queue's priority")

	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	okRun, err := eng.Enqueue(ctx, ok, map[string]any{"items": items}, reactor.WithRunID("sharded-ok"))
	require.NoError(t, err)
	rbRun, err := eng.Enqueue(ctx, rb, map[string]any{"items": items}, reactor.WithRunID("sharded-rb"))
	require.NoError(t, err)
	res, err := eng.Wait(ctx, okRun.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
	res, err = eng.Wait(ctx, rbRun.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "finish", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)

	check := func(l *shardLog, runID string, undo bool) {
		t.Helper()
		mapID := mapstep.MapID(runID, "each")
		l.mu.Lock()
		defer l.mu.Unlock()
		require.Equal(t, []string{queue}, l.owner, "%s: the owner's task is on the base queue", runID)
		used := map[string]int{}
		for i := range n {
			want := maptask.QueueOf(queue, shards, mapID, i)
			require.Equal(t, []string{want}, l.ran[i], "%s: element %d ran once, on its shard", runID, i)
			used[want]++
			if undo {
				require.Equal(t, []string{want}, l.undone[i], "%s: element %d undone once, on its shard", runID, i)
			}
		}
		if !undo {
			require.Empty(t, l.undone, runID)
		}
		require.Len(t, used, shards, "%s: every shard queue received tasks: %v", runID, used)
		for q, c := range used {
			require.Equal(t, n/shards, c, "%s: round-robin over the shards: %s had %d", runID, q, c)
		}
	}
	check(okLog, okRun.RunID, false)
	check(rbLog, rbRun.RunID, true)
}

// The client refuses a shard count it cannot serve, and NewClient has none.
func TestClientShardsAreChecked(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	for _, bad := range []int{-1, worker.MaxQueueShards + 1} {
		_, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: "q", Shards: bad})
		require.ErrorContains(t, err, "worker: ClientConfig.Shards: "+fmt.Sprint(bad)+" shards")
	}
	c, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: "q"})
	require.NoError(t, err)
	require.Equal(t, 1, c.Shards())
	require.Nil(t, c.ShardQueues())
	require.Equal(t, 1, worker.NewClient(rdb, "q").Shards())
}

// A worker started for a base queue whose shard queues hold tasks that no
// worker polls (a client enqueuing with more shards than the workers
// have) warns once, naming them; a worker that serves them does not.
func TestWorkerWarnsOfUnservedShards(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	queue, prefix := redistest.Queue(t), redistest.Prefix(t)
	sharded, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: queue, Shards: 4})
	require.NoError(t, err)
	ctx := ctxTimeout(t)
	// Two elements of a map nobody started, on two shards.
	tasks := maptask.MustAdapt(sharded)
	var want []string
	for i := range 2 {
		require.NoError(t, tasks.EnqueueElement(ctx, maptask.ElementTask{MapID: "unserved~each", Index: i}))
		want = append(want, maptask.QueueOf(queue, 4, "unserved~each", i))
	}
	slices.Sort(want)

	start := func(c *worker.Client) *syncBuffer {
		logs := &syncBuffer{}
		eng, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: c, Logger: discard})
		require.NoError(t, err)
		w := worker.New(eng, rdb, worker.Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), ShutdownTimeout: time.Second})
		require.NoError(t, w.Start(ctx))
		require.NoError(t, w.Stop(ctx)) // Stop waits for the check
		return logs
	}
	logs := start(worker.NewClient(rdb, queue))
	require.Equal(t, 1, strings.Count(logs.String(), "event=worker.shards.unserved"), logs.String())
	require.Contains(t, logs.String(), "queues="+strings.Join(want, ","))
	require.Contains(t, logs.String(), "level=WARN")

	logs = start(sharded)
	require.NotContains(t, logs.String(), "worker.shards.unserved", "a worker with the shards serves them")
}
