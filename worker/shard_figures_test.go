package worker_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// TestShardFigures measures how a fan-out map's Redis commands split over
// the masters of a three-master cluster, without shards and with three:
// INFO commandstats deltas per master (every command but INFO and CLUSTER,
// the measurement's and the client's own) while maps run forward and roll
// back. It is a measurement, not a check of timing, so it runs only with
// GOREACTOR_SHARD_FIGURES=1; it still fails if sharding broke (the shard
// queues must have received the tasks). docs/configuration.md quotes it.
//
//	GOREACTOR_SHARD_FIGURES=1 go test -race -count=1 -run TestShardFigures -v ./worker/
func TestShardFigures(t *testing.T) {
	if os.Getenv("GOREACTOR_SHARD_FIGURES") != "1" {
		t.Skip("set GOREACTOR_SHARD_FIGURES=1 to measure the command split of sharded maps on a cluster")
	}
	addrs := redistest.StartCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, MaxRedirects: reactor.MinClusterRedirects})
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	masters := clusterMasters(t, ctx, cc)

	// A base name whose three shard queues hash to three different
	// masters (asynq's keys of queue q carry the tag {q}): with as many
	// shards as masters, CRC16 may put two shards on one master, which an
	// operator sees with CLUSTER KEYSLOT and avoids the same way, or by
	// having more shards than masters.
	base := ""
	for i := 0; base == ""; i++ {
		name := "fig" + strconv.Itoa(i)
		seen := map[string]bool{}
		for _, q := range maptask.ShardQueues(name, 3) {
			seen[nodeOf(t, ctx, cc, masters, "asynq:{"+q+"}")] = true
		}
		if len(seen) == 3 {
			base = name
		}
	}
	for _, tc := range []struct {
		maps, elements int
	}{{1, 600}, {20, 30}} {
		for _, shards := range []int{1, 3} {
			// One queue name for every case, so that its shards keep
			// their placement; each case has a prefix (and run ids) of
			// its own, and runs after the last one finished.
			queue := base
			place := []string{fmt.Sprintf("%s@%s", queue, masterIndex(masters, nodeOf(t, ctx, cc, masters, "asynq:{"+queue+"}")))}
			for _, q := range maptask.ShardQueues(queue, shards) {
				place = append(place, fmt.Sprintf("%s@%s", q, masterIndex(masters, nodeOf(t, ctx, cc, masters, "asynq:{"+q+"}"))))
			}
			per, took, received := runFigureMaps(t, ctx, cc, masters, queue, shards, tc.maps, tc.elements)
			if tc.maps == 1 {
				place = append(place, "{map}@"+masterIndex(masters, nodeOf(t, ctx, cc, masters,
					"{map:"+mapstep.MapID(fmt.Sprintf("fig-%dx%d-run0", tc.maps, tc.elements), "each")+"}")))
			}
			var total int64
			for _, n := range per {
				total += n
			}
			busiest := slices.Max(per)
			t.Logf("maps=%d elements=%d shards=%d: commands per master %v, total %d, busiest %.0f%%, %s; queues %s; tasks per shard queue %v",
				tc.maps, tc.elements, shards, per, total, 100*float64(busiest)/float64(total), took.Round(10*time.Millisecond),
				strings.Join(place, " "), received)
			if shards > 1 {
				require.Len(t, received, shards, "every shard queue received tasks")
				for q, n := range received {
					require.Positive(t, n, q)
				}
			}
		}
	}
}

// clusterMasters returns the masters' addresses, sorted.
func clusterMasters(t *testing.T, ctx context.Context, cc *redis.ClusterClient) []string {
	t.Helper()
	var mu sync.Mutex
	var out []string
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c.Options().Addr)
		mu.Unlock()
		return nil
	}))
	slices.Sort(out)
	require.Len(t, out, 3)
	return out
}

// nodeOf returns the address of the master that holds key's slot.
func nodeOf(t *testing.T, ctx context.Context, cc *redis.ClusterClient, _ []string, key string) string {
	t.Helper()
	c, err := cc.MasterForKey(ctx, key)
	require.NoError(t, err)
	return c.Options().Addr
}

func masterIndex(masters []string, addr string) string {
	return "m" + strconv.Itoa(slices.Index(masters, addr))
}

// commandCounts returns each master's total command calls (INFO
// commandstats), but for INFO and CLUSTER.
func commandCounts(t *testing.T, ctx context.Context, cc *redis.ClusterClient, masters []string) []int64 {
	t.Helper()
	out := make([]int64, len(masters))
	var mu sync.Mutex
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var n int64
		for line := range strings.SplitSeq(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok || name == "cmdstat_info" || strings.HasPrefix(name, "cmdstat_cluster") {
				continue
			}
			calls, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				return err
			}
			n += v
		}
		mu.Lock()
		out[slices.Index(masters, c.Options().Addr)] = n
		mu.Unlock()
		return nil
	}))
	return out
}

// runFigureMaps runs maps fan-out maps of elements elements each at once,
// each rolled back by its owner's failing last step, with a worker (16 at
// once) on queue with shards, and returns the commands each master served
// meanwhile, the time it took, and how many element and rollback tasks
// each shard queue received.
func runFigureMaps(t *testing.T, ctx context.Context, cc *redis.ClusterClient, masters []string, queue string, shards, nmaps, elements int) ([]int64, time.Duration, map[string]int) {
	t.Helper()
	// A prefix of its own, and run ids the same for every shard count:
	// a map's own keys, {map:<id>}, then sit on the same master in both
	// cases (the prefix is outside the hash tag).
	prefix := fmt.Sprintf("fig-%dx%d-s%d", nmaps, elements, shards)
	client, err := worker.NewClientWithConfig(cc, worker.ClientConfig{Queue: queue, Shards: shards})
	require.NoError(t, err)
	var mu sync.Mutex
	received := map[string]int{}
	note := func(ctx context.Context) {
		if q, ok := asynq.GetQueueName(ctx); ok && q != queue {
			mu.Lock()
			received[q]++
			mu.Unlock()
		}
	}
	elem := reactor.MustDefine("fig_el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("apply", reactor.StepConfig[shardItem, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(ctx context.Context, in shardItem) (int, error) { note(ctx); return in.N, nil },
			Undo: func(ctx context.Context, _ shardItem, _ int) error { note(ctx); return nil },
		}))
	owner := reactor.MustDefine("fig_owner",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true}),
		reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, reactor.Permanent(errors.New("boom")) },
		}))
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: cc, Prefix: prefix, Enqueuer: client, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, eng.Register(owner, elem))
	w := worker.New(eng, cc, worker.Config{Concurrency: 16, Logger: discard})
	require.NoError(t, w.Start(ctx))
	defer func() { require.NoError(t, w.Stop(context.Background())) }()
	require.Eventually(t, func() bool { s, err := client.Served(ctx); return err == nil && s }, 10*time.Second, 20*time.Millisecond)

	items := make([]int, elements)
	for i := range items {
		items[i] = i
	}
	before := commandCounts(t, ctx, cc, masters)
	began := time.Now()
	ids := make([]string, nmaps)
	for m := range ids {
		res, err := eng.Enqueue(ctx, owner, map[string]any{"items": items}, reactor.WithRunID(fmt.Sprintf("fig-%dx%d-run%d", nmaps, elements, m)))
		require.NoError(t, err)
		ids[m] = res.RunID
	}
	for _, id := range ids {
		res, err := eng.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusFailed, res.Status)
		require.Empty(t, res.Failure.RollbackFailures)
	}
	took := time.Since(began)
	after := commandCounts(t, ctx, cc, masters)
	per := make([]int64, len(masters))
	for i := range per {
		per[i] = after[i] - before[i]
	}
	mu.Lock()
	defer mu.Unlock()
	return per, took, maps.Clone(received)
}
