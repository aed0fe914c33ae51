package engine_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// BenchmarkRunInProcess measures what an in-process Engine.Run of a 3-step
// reactor (each step with an Undo, so each lands on the ledger) costs, run
// from 64 goroutines against a redis-server of its own: runs/s, the CPU of
// this process and of Redis per run, round trips per run (a go-redis hook:
// one per command or pipeline) and Redis commands per run (INFO
// commandstats, Lua's commands included), and the goroutines created per
// run (runtime/metrics). The logger is at Info, as in
// production: step events are Debug.
//
//	go test -run '^$' -bench RunInProcess -benchmem ./reactor/
//
// Compare builds as ratios within one session, old and new alternating: the
// absolute figures move with whatever else the machine runs.
func BenchmarkRunInProcess(b *testing.B) {
	srv := redistest.StartServer(b)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	b.Cleanup(func() { _ = rdb.Close() })
	rts := &cmdCounter{}
	rdb.AddHook(rts)
	ctx := context.Background()
	e, err := engine.NewEngine(ctx, engine.Config{Client: rdb, Prefix: "bench",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(b, err)
	step := func(name string, after ...string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, int]{
			After: after,
			Run:   func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo:  func(context.Context, engine.Args, int) error { return nil },
		})
	}
	def := engine.MustDefine("bench3", step("a"), step("b", "a"), step("c", "b"))

	const goroutines = 64
	b.Run("steps=3/goroutines=64", func(b *testing.B) {
		b.ReportAllocs()
		// RunParallel starts parallelism x GOMAXPROCS goroutines.
		b.SetParallelism((goroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		if res, err := e.Run(ctx, def, nil, engine.NoWait()); err != nil || res.Status != engine.StatusCompleted {
			b.Fatalf("warm-up run: %v %v", res, err)
		}
		before := sampleCost(b, rdb, rts)
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				res, err := e.Run(ctx, def, nil, engine.NoWait())
				if err != nil {
					b.Error(err)
					return
				}
				if res.Status != engine.StatusCompleted {
					b.Errorf("run %s ended %s", res.RunID, res.Status)
					return
				}
			}
		})
		took := time.Since(start)
		b.StopTimer()
		after := sampleCost(b, rdb, rts)
		n := float64(b.N)
		b.ReportMetric(n/took.Seconds(), "runs/s")
		b.ReportMetric(float64(after.rts-before.rts-1)/n, "rts/run") // the first sample's INFO
		b.ReportMetric(float64(after.cmds-before.cmds)/n, "cmds/run")
		b.ReportMetric(float64(after.goCPU-before.goCPU)/n/1e3, "go-us/run")
		b.ReportMetric(float64(after.redisCPU-before.redisCPU)/n/1e3, "redis-us/run")
		b.ReportMetric(float64(after.goroutines-before.goroutines)/n, "goroutines/run")
	})
}

// cost is a snapshot of the counters BenchmarkRunInProcess reports.
type cost struct {
	rts, cmds       int64
	goCPU, redisCPU time.Duration // user + system
	goroutines      uint64        // created since the process started
}

func sampleCost(b *testing.B, rdb *redis.Client, rts *cmdCounter) cost {
	b.Helper()
	var c cost
	n := rts.n.Load()
	info, err := rdb.Info(context.Background(), "commandstats", "cpu").Result()
	require.NoError(b, err)
	c.rts = n
	for line := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			m, err := strconv.ParseInt(calls, 10, 64)
			require.NoError(b, err, line)
			c.cmds += m
		case k == "used_cpu_user" || k == "used_cpu_sys":
			s, err := strconv.ParseFloat(v, 64)
			require.NoError(b, err, line)
			c.redisCPU += time.Duration(s * float64(time.Second))
		}
	}
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	c.goCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	m := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	if metrics.Read(m); m[0].Value.Kind() == metrics.KindUint64 {
		c.goroutines = m[0].Value.Uint64()
	}
	return c
}
