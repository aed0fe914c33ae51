package sweeper_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// TestRetentionMemoryReport measures what finished runs cost Redis and that
// the retention gives it back: 1,000 fan-out runs of 100 elements each under
// a 1 s retention, on a redis-server of its own. It is a measurement, not a
// check of the suite: set GOREACTOR_MEMORY_REPORT=1 to run it.
//
//	GOREACTOR_MEMORY_REPORT=1 go test -run TestRetentionMemoryReport -v ./sweeper/
func TestRetentionMemoryReport(t *testing.T) {
	if os.Getenv("GOREACTOR_MEMORY_REPORT") == "" {
		t.Skip("set GOREACTOR_MEMORY_REPORT=1 to measure")
	}
	runs, elems := 1000, 100
	if v, _ := strconv.Atoi(os.Getenv("GOREACTOR_MEMORY_RUNS")); v > 0 {
		runs = v
	}
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	queue := "mem"
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Enqueuer: client, Logger: discard, Retention: time.Second})
	require.NoError(t, err)
	fan, _ := retentionDefs(func(context.Context, int) error { return nil })
	require.NoError(t, engine.Register(fan))
	w := worker.New(engine, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 50, Logger: discard})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })

	used := func() int64 {
		info, err := rdb.Info(ctx, "memory").Result()
		require.NoError(t, err)
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				require.NoError(t, err)
				return n
			}
		}
		t.Fatal("no used_memory in INFO memory")
		return 0
	}
	goreactorKeys := func() int {
		n := 0
		iter := rdb.Scan(ctx, 0, "goreactor:*", 1000).Iterator()
		for iter.Next(ctx) {
			// The running worker's own record ({workers}) stays while it runs.
			if !strings.Contains(iter.Val(), ":idx:") && !strings.Contains(iter.Val(), ":{workers}:") {
				n++
			}
		}
		require.NoError(t, iter.Err())
		return n
	}
	base := used()
	items := make([]int, elems)
	for i := range items {
		items[i] = i
	}
	began := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	var peakMu sync.Mutex
	peak := int64(0)
	for n := range runs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id := fmt.Sprintf("mem-%04d", n)
			_, err := engine.Enqueue(ctx, fan, map[string]any{"items": items}, reactor.WithRunID(id))
			require.NoError(t, err)
			res, err := engine.Wait(ctx, id)
			require.NoError(t, err)
			require.Equal(t, reactor.StatusCompleted, res.Status)
			if n%50 == 0 {
				u := used()
				peakMu.Lock()
				peak = max(peak, u)
				peakMu.Unlock()
			}
		}()
	}
	wg.Wait()
	finished := used()
	t.Logf("%d runs x %d elements finished in %s", runs, elems, time.Since(began).Round(time.Millisecond))
	t.Logf("used_memory: before %d B, highest sampled while running %d B, after the last run finished %d B (%d goreactor keys left)",
		base, peak, finished, goreactorKeys())
	require.Eventually(t, func() bool { return goreactorKeys() == 0 }, 30*time.Second, 100*time.Millisecond)
	after := used()
	t.Logf("used_memory after the retention: %d B (%+d B against before; the listing indexes and asynq's own keys remain until their trims)",
		after, after-base)
}
