package worker_test

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// BenchmarkCheckoutThroughAWorker: the checkout, three independent
// calls of 300 ms (reserve, authorize, score) and a step consuming them, at
// MaxConcurrency 1 and 3, each run enqueued and awaited through a worker
// of 4 slots on a redis-server of its own. It reports ms per run and the
// run's time over the slowest call's.
//
//	go test -run '^$' -bench CheckoutThroughAWorker -benchtime 5x ./worker/
func BenchmarkCheckoutThroughAWorker(b *testing.B) {
	srv := redistest.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	const call = 300 * time.Millisecond
	for _, conc := range []int{1, 3} {
		queue := "checkout-bench"
		e, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: "bench", Enqueuer: worker.NewClient(rdb, queue),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(b, err)
		step := func(name string) reactor.Part {
			return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
				Run: func(ctx context.Context, _ reactor.Args) (string, error) {
					t := time.NewTimer(call)
					defer t.Stop()
					select {
					case <-t.C:
						return name, nil
					case <-ctx.Done():
						return "", ctx.Err()
					}
				},
				Undo: func(context.Context, reactor.Args, string) error { return nil },
			})
		}
		def := reactor.MustDefine("checkout-bench",
			reactor.MaxConcurrency(conc), step("reserve"), step("authorize"), step("score"),
			reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
				Args: reactor.Bindings{"r": reactor.FromStep("reserve"), "a": reactor.FromStep("authorize"), "s": reactor.FromStep("score")},
				Run:  func(context.Context, reactor.Args) (string, error) { return "ok", nil },
			}),
		)
		require.NoError(b, e.Register(def))
		w := worker.New(e, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 4,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		require.NoError(b, w.Start(ctx))
		b.Run("concurrency="+strconv.Itoa(conc), func(b *testing.B) {
			for range b.N {
				res, err := e.Enqueue(ctx, def, nil)
				require.NoError(b, err)
				final, err := e.Wait(ctx, res.RunID)
				require.NoError(b, err)
				require.Equal(b, reactor.StatusCompleted, final.Status)
			}
			per := b.Elapsed() / time.Duration(b.N)
			b.ReportMetric(float64(per.Microseconds())/1000, "ms/run")
			b.ReportMetric(float64(per)/float64(call), "x_slowest_call")
		})
		require.NoError(b, w.Stop(ctx))
	}
}
