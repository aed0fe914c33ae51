package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// orderDefinition is "order": reserve, whose undo adds "reserve:<item>" to
// <prefix>:undone (the prefix is the process's GOREACTOR_PREFIX).
func orderDefinition() *reactor.Definition {
	type in struct {
		Item string `json:"item"`
	}
	var (
		once sync.Once
		rdb  redis.UniversalClient
	)
	client := func() redis.UniversalClient {
		once.Do(func() {
			if redistest.ClusterAddrs() != nil {
				rdb = redistest.NewClient() // the test's cluster: GOREACTOR_TEST_CLUSTER is inherited
				return
			}
			opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
			if err != nil {
				panic(err)
			}
			rdb = redis.NewClient(opts)
		})
		return rdb
	}
	return reactor.MustDefine("order", reactor.Input[string]("item"),
		reactor.Step("reserve", reactor.StepConfig[in, string]{
			Args: reactor.Bindings{"item": reactor.FromInput("item")},
			Run:  func(_ context.Context, in in) (string, error) { return "reserved " + in.Item, nil },
			Undo: func(ctx context.Context, in in, _ string) error {
				return client().RPush(ctx, os.Getenv("GOREACTOR_PREFIX")+":undone", "reserve:"+in.Item).Err()
			},
		}),
		reactor.Returns(reactor.FromStep("reserve")),
	)
}

// A new user's first day: a client, a worker process and the dashboard
// talking on a prefix and a queue of their own, set only through
// GOREACTOR_PREFIX and GOREACTOR_QUEUE (no Prefix or queue in the code, no
// flag). The client's run reaches the worker, records the queue, and the
// dashboard's undo of it, through its HTTP API, is carried out on that
// queue: the run is undone.
func TestNewUserOnACustomPrefixAndQueue(t *testing.T) {
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	t.Setenv("GOREACTOR_PREFIX", prefix)
	t.Setenv("GOREACTOR_QUEUE", queue)
	ctx := ctxTimeout(t)

	// The worker process: worker.Main with its defaults and that
	// environment.
	w := startWorkerProcess(t, redisEnv(), "GOREACTOR_PREFIX="+prefix, "GOREACTOR_QUEUE="+queue)

	// The client process's code names neither.
	api, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Logger: discard, Enqueuer: worker.NewClient(rdb, "")})
	require.NoError(t, err)
	def := orderDefinition()
	res, err := api.Enqueue(ctx, def, map[string]any{"item": "book"})
	require.NoError(t, err)
	res, err = api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "failure: %v", res.Failure)
	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, queue, run.Queue, "the run records its real queue")
	n, err := rdb.Exists(ctx, prefix+":{run:"+res.RunID+"}:ctx").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the run is stored under GOREACTOR_PREFIX")

	// The dashboard, configured in code with its Redis and token alone.
	const token = "first-day"
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Token: token, Logger: discard})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	call := func(method, path string, out any) int {
		t.Helper()
		var send io.Reader
		if method == http.MethodPost {
			send = strings.NewReader(`{"reason":"a new user tries an undo"}`)
		}
		req, err := http.NewRequestWithContext(ctx, method, srv.URL+path, send)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(body, out), "%s", body)
		return resp.StatusCode
	}
	var stats struct {
		Queues []struct {
			Queue  string `json:"queue"`
			Served bool   `json:"served"`
		} `json:"queues"`
		ControlQueue string   `json:"control_queue"`
		Warnings     []string `json:"warnings"`
	}
	require.Equal(t, http.StatusOK, call(http.MethodGet, "/api/stats", &stats))
	require.Equal(t, queue, stats.ControlQueue)
	require.Len(t, stats.Queues, 1)
	require.Equal(t, queue, stats.Queues[0].Queue)
	require.True(t, stats.Queues[0].Served, "the worker process serves it")
	require.Empty(t, stats.Warnings)

	var accepted struct {
		TaskID  string `json:"task_id"`
		Queue   string `json:"queue"`
		Warning string `json:"warning"`
	}
	require.Equal(t, http.StatusAccepted, call(http.MethodPost, "/api/runs/"+res.RunID+"/undo", &accepted))
	require.Equal(t, queue, accepted.Queue, "the undo goes to the run's queue")
	require.Empty(t, accepted.Warning)
	require.Eventually(t, func() bool {
		run, err := api.Get(ctx, res.RunID)
		require.NoError(t, err)
		return run.Status == reactor.StatusCancelled
	}, 20*time.Second, 10*time.Millisecond, "the worker process undoes the run")
	require.Equal(t, []string{"reserve:book"}, rdb.LRange(ctx, prefix+":undone", 0, -1).Val())

	require.NoError(t, w.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, w.exited(t))
	for _, line := range w.out.all() {
		require.True(t, json.Valid([]byte(line)), "not a JSON line: %s", line)
	}
	require.True(t, strings.Contains(w.out.await(t, `"event":"worker.control.done"`), res.RunID))
}
