package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// BenchmarkIndependentSteps: one in-process run of 20 independent steps of
// 10 ms each (an Undo each), at MaxConcurrency 1, 4 and 20, against a
// redis-server of its own. It reports ms per run against the ideal
// (20 / concurrency x 10 ms) and the round trips per run.
//
//	go test -run '^$' -bench IndependentSteps ./internal/engine/
func BenchmarkIndependentSteps(b *testing.B) {
	srv := redistest.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	b.Cleanup(func() { _ = rdb.Close() })
	rts := &cmdCounter{}
	rdb.AddHook(rts)
	ctx := context.Background()
	e, err := engine.NewEngine(ctx, engine.Config{Client: rdb, Prefix: "bench",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	const steps, work = 20, 10 * time.Millisecond
	for _, conc := range []int{1, 4, 20} {
		parts := []engine.Part{engine.MaxConcurrency(conc)}
		for i := range steps {
			parts = append(parts, engine.Step(fmt.Sprintf("s%02d", i), engine.StepConfig[engine.Args, int]{
				Run: func(ctx context.Context, _ engine.Args) (int, error) {
					t := time.NewTimer(work)
					defer t.Stop()
					select {
					case <-t.C:
						return i, nil
					case <-ctx.Done():
						return 0, ctx.Err()
					}
				},
				Undo: func(context.Context, engine.Args, int) error { return nil },
			}))
		}
		def := engine.MustDefine(fmt.Sprintf("independent-%d", conc), parts...)
		b.Run(fmt.Sprintf("steps=20/concurrency=%d", conc), func(b *testing.B) {
			rts.n.Store(0)
			b.ResetTimer()
			for range b.N {
				res, err := e.Run(ctx, def, nil)
				if err != nil || res.Status != engine.StatusCompleted {
					b.Fatalf("run: %v %v", res, err)
				}
			}
			b.StopTimer()
			per := b.Elapsed() / time.Duration(b.N)
			ideal := time.Duration((steps+conc-1)/conc) * work
			b.ReportMetric(float64(per.Microseconds())/1000, "ms/run")
			b.ReportMetric(float64(per)/float64(ideal), "x_ideal")
			b.ReportMetric(float64(rts.n.Load())/float64(b.N), "roundtrips/run")
		})
	}
}
