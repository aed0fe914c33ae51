package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/promtest"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/metrics"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

var _ worker.Observer = (*metrics.Metrics)(nil)

// TestMetricsServedByARunWorker: a worker from worker.Run with
// -metrics-addr serves /metrics over HTTP. After a run whose fan-out map of
// eight elements (batches of three) succeeds and whose next step then fails, so that the map
// rolls back across the workers (one element's undo failing), the scrape
// counts every element task and rollback job once, three batches claimed
// per direction, one owner resume per direction, the undos by outcome (and
// their durations), the run finished failed, and no run live;
// the worker's own sweeper passes (-sweep-interval) are counted too and
// recover nothing.
func TestMetricsServedByARunWorker(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	const n = 8
	type itemIn struct {
		N int `json:"n"`
	}
	element := reactor.MustDefine("metrics-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[itemIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in itemIn) (int, error) { return in.N, nil },
			Undo: func(_ context.Context, in itemIn, _ int) error {
				if in.N == 3 {
					return reactor.Permanent(fmt.Errorf("release of item %d failed", in.N))
				}
				return nil
			},
		}),
	)
	// Batches of 3: the 8 elements go out, and are undone, in 3 batches each.
	owner := mapThenDeclineBatch("metrics-owner", element, 3)

	logs := newLogWatch()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		ran <- worker.Run(ctx, worker.Options{
			Definitions: []*reactor.Definition{owner, element},
			Args: append(redisArgs(), "-prefix", prefix, "-queue", queue, "-metrics-addr", "127.0.0.1:0",
				"-sweep-interval", "20ms", "-shutdown-timeout", "5s"),
			Getenv: noEnv,
			Stderr: logs,
		})
	}()
	var line struct {
		Addr string `json:"addr"`
	}
	require.NoError(t, json.Unmarshal([]byte(logs.await(t, `"event":"worker.metrics"`)), &line))
	url := "http://" + line.Addr + "/metrics"

	api, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard, Enqueuer: worker.NewClient(rdb, queue)})
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	res, err := api.Enqueue(wctx, owner, map[string]any{"items": items})
	require.NoError(t, err)
	res, err = api.Wait(wctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)

	// The run finished inside the handler of its rollback resume; that
	// handler reports to the worker's metrics when it returns. The
	// worker's sweeper (-sweep-interval) must also have made a pass after
	// the run.
	passes := promtest.Scrape(t, url).Value("goreactor_sweeper_passes_total")
	var fams promtest.Families
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		fams = promtest.Scrape(t, url)
		require.Equal(c, 1.0, fams.Value("goreactor_owner_resumes_total", "kind", "rollback"))
		require.Equal(c, float64(n), fams.Value("goreactor_map_rollback_jobs_total", "outcome", "done"))
		require.Greater(c, fams.Value("goreactor_sweeper_passes_total"), passes)
	}, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 0.0, fams.Value("goreactor_sweeper_recoveries_total"), "nothing was lost: the sweeper recovers nothing")
	require.Equal(t, 0.0, fams.Value("goreactor_sweeper_pass_errors_total"))

	v := fams.Value
	require.Equal(t, 1.0, v("goreactor_runs_started_total", "reactor", "metrics-owner"))
	require.Equal(t, 1.0, v("goreactor_runs_finished_total", "reactor", "metrics-owner", "status", "failed"))
	require.Equal(t, 0.0, v("goreactor_runs_finished_total", "reactor", "metrics-el"), "element runs are not root runs")
	require.Equal(t, float64(n), v("goreactor_map_elements_finished_total", "reactor", "metrics-el", "status", "completed"))
	require.Equal(t, float64(n), v("goreactor_map_element_tasks_total", "outcome", "done"))
	require.Equal(t, 0.0, v("goreactor_map_element_tasks_total", "outcome", "error"))
	require.Equal(t, 0.0, v("goreactor_map_rollback_jobs_total", "outcome", "error"))
	require.Equal(t, 1.0, v("goreactor_owner_resumes_total", "kind", "forward"))
	require.Equal(t, 1.0, v("goreactor_owner_resumes_total", "kind", "rollback"))
	require.Equal(t, float64(n-1), v("goreactor_undo_total", "reactor", "metrics-el", "kind", "undo", "outcome", "ok"))
	require.Equal(t, 1.0, v("goreactor_undo_total", "reactor", "metrics-el", "kind", "undo", "outcome", "failed"))
	require.Equal(t, 1.0, v("goreactor_undo_total", "reactor", "metrics-owner", "kind", "undo", "outcome", "ok"))
	require.Equal(t, float64(n-1), v("goreactor_undo_duration_seconds", "reactor", "metrics-el", "kind", "undo", "outcome", "ok"))
	require.Equal(t, 1.0, v("goreactor_undo_duration_seconds", "reactor", "metrics-el", "kind", "undo", "outcome", "failed"))
	require.Equal(t, 3.0, v("goreactor_map_batches_claimed_total", "reactor", "metrics-owner", "kind", "forward"))
	require.Equal(t, 3.0, v("goreactor_map_batches_claimed_total", "reactor", "metrics-owner", "kind", "rollback"))
	require.Equal(t, float64(n), v("goreactor_step_duration_seconds", "reactor", "metrics-el", "step", "reserve", "outcome", "completed"))
	require.Equal(t, 1.0, v("goreactor_step_duration_seconds", "reactor", "metrics-owner", "step", "decline", "outcome", "failed"))
	require.Equal(t, 1.0, v("goreactor_step_attempts_total", "reactor", "metrics-owner", "step", "decline"))
	require.Equal(t, 0.0, v("goreactor_lock_lost_total"))
	for _, s := range []string{"pending", "running", "paused", "rolling_back"} {
		require.Equal(t, 0.0, v("goreactor_runs", "status", s), "runs %s", s)
	}
	require.Positive(t, v("go_goroutines"), "the Go runtime collector")
	require.Positive(t, v("process_start_time_seconds"), "the process collector")

	cancel()
	require.NoError(t, <-ran)
}
