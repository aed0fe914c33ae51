package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// /api/stats counts by status and by reactor x status from the indexes, and
// reports the goreactor queue from asynq; /metrics serves the collector.
func TestStatsAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	ok, bad := echo("st-ok"), failing("st-bad")
	e.startWorker(ok, bad)
	e.enqueueAll(ctx, ok, ids("s-", 3), map[string]any{"note": "x"})
	e.enqueueAll(ctx, bad, ids("f-", 2), nil)
	// A run waiting in the queue, never picked up: another queue's.
	_, err := e.engine.Enqueue(ctx, ok, map[string]any{"note": "later"}, reactor.WithRunID("later"), reactor.WithQueue(redistest.Queue(t)))
	require.NoError(t, err)

	var st struct {
		ByStatus  map[string]int64            `json:"by_status"`
		ByReactor map[string]map[string]int64 `json:"by_reactor"`
		Queues    []struct {
			Queue            string `json:"queue"`
			Pending          int    `json:"pending"`
			Active           int    `json:"active"`
			Scheduled        int    `json:"scheduled"`
			Retry            int    `json:"retry"`
			Archived         int    `json:"archived"`
			OldestPendingAge int64  `json:"oldest_pending_age_ms"`
			Served           bool   `json:"served"`
		} `json:"queues"`
		ControlQueue string   `json:"control_queue"`
		Warnings     []string `json:"warnings"`
	}
	e.get("/api/stats", http.StatusOK, &st)
	require.Equal(t, int64(3), st.ByStatus["completed"])
	require.Equal(t, int64(2), st.ByStatus["failed"])
	require.Equal(t, int64(1), st.ByStatus["pending"])
	require.Len(t, st.ByStatus, len(reactor.Statuses()))
	require.Equal(t, map[string]int64{"completed": 3, "pending": 1}, st.ByReactor["st-ok"])
	require.Equal(t, map[string]int64{"failed": 2}, st.ByReactor["st-bad"])
	require.Len(t, st.Queues, 1)
	require.Equal(t, e.queue, st.Queues[0].Queue)
	require.Zero(t, st.Queues[0].Pending)
	require.True(t, st.Queues[0].Served, "the worker serves it")
	require.Equal(t, e.ctl, st.ControlQueue)
	require.Len(t, st.Warnings, 1, "only the control queue is unserved: %q", st.Warnings)
	require.Contains(t, st.Warnings[0], fmt.Sprintf("no worker serves queue %q, where actions on runs that recorded no queue go", e.ctl))

	res := e.do(http.MethodGet, "/metrics", "", "")
	require.Equal(t, http.StatusOK, res.code)
	require.True(t, strings.Contains(string(res.body), "goreactor_runs"), "the collector's gauge")
}

// statsServing is the part of /api/stats about the queues being served.
type statsServing struct {
	Queues []struct {
		Queue  string `json:"queue"`
		Served bool   `json:"served"`
	} `json:"queues"`
	Warnings []string `json:"warnings"`
}

// The overview warns about a configured queue no worker serves, from
// asynq's server registry: nothing serves the queue, then a real worker
// does, then it stopped. The registry is read once per TTL: within it the
// answer is the cached one.
func TestStatsWarnsAboutUnservedQueues(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	engine, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard,
		Enqueuer: worker.NewClient(rdb, queue)})
	require.NoError(t, err)
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, ControlQueue: queue, Logger: discard})
	require.NoError(t, err)
	dashboard.ForgetServed(dash, time.Hour) // a test's reads of the registry are explicit
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	stats := func() statsServing {
		t.Helper()
		res, err := http.Get(srv.URL + "/api/stats")
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var st statsServing
		require.NoError(t, json.NewDecoder(res.Body).Decode(&st))
		return st
	}

	st := stats()
	require.Len(t, st.Queues, 1, "Config.Queues defaults to the control queue")
	require.Equal(t, queue, st.Queues[0].Queue)
	require.False(t, st.Queues[0].Served)
	require.Len(t, st.Warnings, 1)
	require.Contains(t, st.Warnings[0], fmt.Sprintf("no worker serves queue %q", queue))
	require.Contains(t, st.Warnings[0], "-queue "+queue)

	w := worker.New(engine, rdb, worker.Config{Logger: discard, ShutdownTimeout: 5 * time.Second})
	require.NoError(t, w.Start(t.Context()))
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			require.NoError(t, w.Stop(context.Background()))
		}
	})
	// asynq's heartbeat registers the server: wait for the registry, not
	// for the dashboard.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	require.Eventually(t, func() bool {
		servers, err := insp.Servers()
		require.NoError(t, err)
		for _, s := range servers {
			if s.Queues[queue] > 0 {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the worker is in asynq's registry")
	require.False(t, stats().Queues[0].Served, "the registry was read within the TTL: cached")
	dashboard.ForgetServed(dash, 0)
	st = stats()
	require.True(t, st.Queues[0].Served)
	require.Empty(t, st.Warnings)
	require.NotNil(t, st.Warnings, "an empty list, never null")

	require.NoError(t, w.Stop(context.Background()))
	stopped = true
	dashboard.ForgetServed(dash, 0)
	st = stats()
	require.False(t, st.Queues[0].Served, "a stopped worker leaves the registry")
	require.Len(t, st.Warnings, 1)
}

// Config.Queues "*" reports every asynq queue in the Redis (each marked
// served or not) and warns only about the control queue; "*" stands alone.
func TestStatsEveryQueue(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue, other := redistest.Prefix(t), redistest.Queue(t), redistest.Queue(t)
	_, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, Queues: []string{"*", queue}, Logger: discard})
	require.ErrorContains(t, err, "stands alone")

	engine, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard,
		Enqueuer: worker.NewClient(rdb, queue)})
	require.NoError(t, err)
	def := reactor.MustDefine("every-q", reactor.Step("s", reactor.StepConfig[reactor.Args, int]{
		Run: func(context.Context, reactor.Args) (int, error) { return 1, nil },
	}))
	_, err = engine.Enqueue(t.Context(), def, nil, reactor.WithQueue(other)) // never served: it stays queued
	require.NoError(t, err)
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, ControlQueue: queue, Queues: []string{"*"}, Logger: discard})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	res, err := http.Get(srv.URL + "/api/stats")
	require.NoError(t, err)
	defer res.Body.Close()
	var st statsServing
	require.NoError(t, json.NewDecoder(res.Body).Decode(&st))
	var names []string
	for _, q := range st.Queues {
		names = append(names, q.Queue)
	}
	require.Contains(t, names, other, "every asynq queue, not only the configured ones")
	require.Len(t, st.Warnings, 1, "only the control queue is warned about: %q", st.Warnings)
	require.Contains(t, st.Warnings[0], fmt.Sprintf("%q", queue))
}
