package worker_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// Run named a Redis Cluster by its seeds serves a run that fans out over
// it: the owner and its elements, whose keys land on every master, run to
// completion on the worker, and its in-process sweeper passes there.
func TestRunOnACluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t)
	prefix, queue := "cl", "cl-q"

	type itemIn struct {
		N int `json:"n"`
	}
	var (
		mu   sync.Mutex
		done []int
	)
	element := reactor.MustDefine("cluster-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("pack", reactor.StepConfig[itemIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(_ context.Context, in itemIn) (int, error) {
				mu.Lock()
				done = append(done, in.N)
				mu.Unlock()
				return in.N, nil
			},
		}),
	)
	owner := reactor.MustDefine("cluster-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) { return "held", nil },
		}),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 4,
			After: []string{"hold"}}),
		reactor.Returns(reactor.FromStep("hold")),
	)

	logs := newLogWatch()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		ran <- worker.Run(ctx, worker.Options{
			Definitions: []*reactor.Definition{owner, element},
			Args: []string{"-redis-cluster", strings.Join(addrs, ","), "-prefix", prefix, "-queue", queue,
				"-sweep-interval", "50ms", "-shutdown-timeout", "5s"},
			Getenv: noEnv,
			Stderr: logs,
		})
	}()
	started := logs.await(t, `"event":"worker.started"`)
	require.Contains(t, started, `"cluster":true`)

	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	client := worker.NewClient(rdb, queue)
	defer client.Close()
	api, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard, Enqueuer: client})
	require.NoError(t, err)
	items := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	res, err := api.Enqueue(wctx, owner, map[string]any{"items": items})
	require.NoError(t, err)
	res, err = api.Wait(wctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "failure: %v", res.Failure)
	mu.Lock()
	got := slices.Sorted(slices.Values(done))
	mu.Unlock()
	require.Equal(t, items, got)
	logs.await(t, `"event":"reactor.sweep.pass"`)

	// The runs' keys are spread over the masters: the worker did not get
	// by on one node.
	holding := 0
	require.NoError(t, rdb.ForEachMaster(t.Context(), func(ctx context.Context, node *redis.Client) error {
		keys, err := node.Keys(ctx, prefix+":*").Result()
		if len(keys) > 0 {
			mu.Lock()
			holding++
			mu.Unlock()
		}
		return err
	}))
	require.GreaterOrEqual(t, holding, 2)

	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.NotContains(t, strings.Join(logs.all(), "\n"), `"level":"ERROR"`)
}
