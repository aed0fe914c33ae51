package worker_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// BenchmarkTaskStepThroughAWorker: what running a step as its own task
// (StepConfig.Task) costs against running it in the run: a run of one
// 10 ms step, each way, and the checkout (three 300 ms calls and a
// step consuming them) with the three as task steps at MaxConcurrency 3,
// each run enqueued and awaited through a worker of 4 slots on a
// redis-server of its own. It reports ms per run and the Redis commands
// the server ran per run (INFO commandstats; asynq's own polling of the
// queue while the run waits included).
//
//	go test -run '^$' -bench TaskStepThroughAWorker -benchtime 20x ./worker/
func BenchmarkTaskStepThroughAWorker(b *testing.B) {
	srv := redistest.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sleep := func(d time.Duration) func(ctx context.Context, _ reactor.Args) (string, error) {
		return func(ctx context.Context, _ reactor.Args) (string, error) {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return "ok", nil
			case <-ctx.Done():
				return "", ctx.Err()
			}
		}
	}
	one := func(task bool) *reactor.Definition {
		return reactor.MustDefine("one-step-task-"+strconv.FormatBool(task),
			reactor.Step("work", reactor.StepConfig[reactor.Args, string]{Task: task, Run: sleep(10 * time.Millisecond)}))
	}
	call := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{Task: true, Run: sleep(300 * time.Millisecond),
			Undo: func(context.Context, reactor.Args, string) error { return nil }})
	}
	checkout := reactor.MustDefine("checkout-tasks", reactor.MaxConcurrency(3), call("reserve"), call("authorize"), call("score"),
		reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"r": reactor.FromStep("reserve"), "a": reactor.FromStep("authorize"), "s": reactor.FromStep("score")},
			Run:  sleep(0),
		}))
	for _, bc := range []struct {
		name string
		def  *reactor.Definition
	}{{"step=in-run", one(false)}, {"step=task", one(true)}, {"checkout=tasks", checkout}} {
		queue := "task-bench-" + strings.ReplaceAll(bc.name, "=", "-")
		e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: "bench", Enqueuer: worker.NewClient(rdb, queue), Logger: quiet})
		require.NoError(b, err)
		require.NoError(b, e.Register(bc.def))
		w := worker.New(e, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 4, Logger: quiet})
		require.NoError(b, w.Start(ctx))
		b.Run(bc.name, func(b *testing.B) {
			before := serverCommands(b, rdb)
			for range b.N {
				res, err := e.Enqueue(ctx, bc.def, nil)
				require.NoError(b, err)
				final, err := e.Wait(ctx, res.RunID)
				require.NoError(b, err)
				require.Equal(b, reactor.StatusCompleted, final.Status)
			}
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(per.Microseconds())/1000, "ms/run")
			b.ReportMetric(float64(serverCommands(b, rdb)-before)/float64(b.N), "cmds/run")
		})
		require.NoError(b, w.Stop(ctx))
	}
}

// serverCommands is every command the server has run (INFO commandstats).
func serverCommands(b *testing.B, rdb *redis.Client) int {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(b, err)
	n := 0
	for _, l := range strings.Split(info, "\r\n") {
		if _, v, ok := strings.Cut(l, ":calls="); ok && strings.HasPrefix(l, "cmdstat_") {
			c, _, _ := strings.Cut(v, ",")
			k, err := strconv.Atoi(c)
			require.NoError(b, err)
			n += k
		}
	}
	return n
}
