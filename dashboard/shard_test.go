package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// With QueueShards, /api/stats lists the control queue's shard queues right
// after it, each with its own counts and served or not, and warns about
// the unserved ones; a worker with as many shards serves them all.
func TestStatsListsTheShardQueues(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	client, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: queue, Shards: 3})
	require.NoError(t, err)
	engine, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard, Enqueuer: client})
	require.NoError(t, err)
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, ControlQueue: queue, QueueShards: 3, Logger: discard})
	require.NoError(t, err)
	dashboard.ForgetServed(dash, 0)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	type queueStats struct {
		Queue   string `json:"queue"`
		Served  bool   `json:"served"`
		Pending int    `json:"pending"`
	}
	stats := func() (qs []queueStats, warnings []string) {
		t.Helper()
		res, err := http.Get(srv.URL + "/api/stats")
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var st struct {
			Queues   []queueStats `json:"queues"`
			Warnings []string     `json:"warnings"`
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&st))
		return st.Queues, st.Warnings
	}

	// Two element tasks of a map, on their shards.
	ctx := t.Context()
	pending := map[string]int{}
	for i := range 2 {
		require.NoError(t, maptask.MustAdapt(client).EnqueueElement(ctx, maptask.ElementTask{MapID: "stats~each", Index: i}))
		pending[maptask.QueueOf(queue, 3, "stats~each", i)]++
	}
	qs, warnings := stats()
	require.Len(t, qs, 4)
	for i, q := range qs {
		name := queue
		if i > 0 {
			name = fmt.Sprintf("%s.shard%d", queue, i-1)
		}
		require.Equal(t, name, q.Queue)
		require.False(t, q.Served)
		require.Equal(t, pending[name], q.Pending, name)
	}
	require.Len(t, warnings, 4, "%q", warnings)
	require.Contains(t, warnings[1], fmt.Sprintf("no worker serves queue %q, a shard of %q", queue+".shard0", queue))
	require.Contains(t, warnings[1], "-queue-shards 3")

	w := worker.New(engine, rdb, worker.Config{Logger: discard, ShutdownTimeout: 5 * time.Second})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	insp := asynq.NewInspectorFromRedisClient(rdb)
	require.Eventually(t, func() bool {
		servers, err := insp.Servers()
		require.NoError(t, err)
		for _, s := range servers {
			if s.Queues[queue+".shard2"] > 0 {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the worker is in asynq's registry")
	dashboard.ForgetServed(dash, 0)
	qs, warnings = stats()
	require.Len(t, qs, 4)
	for _, q := range qs {
		require.True(t, q.Served, q.Queue)
	}
	require.Empty(t, warnings)
}

func TestConfigRefusesABadShardCount(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	for _, bad := range []int{-2, 65} {
		_, err := dashboard.New(dashboard.Config{Client: rdb, QueueShards: bad, Logger: discard})
		require.ErrorContains(t, err, "dashboard: Config.QueueShards: ")
	}
}
