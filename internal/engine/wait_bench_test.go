package engine_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// nopEnqueuer accepts wake-ups and runs nothing: enqueued runs stay pending
// until the test executes them with Process.
type nopEnqueuer struct{}

func (nopEnqueuer) Enqueue(context.Context, engine.Wake) error { return nil }

// TestWaitLoad measures what 1,000 concurrent Waits on unfinished runs cost
// Redis: commands per second while they wait (INFO commandstats of a Redis
// server of its own, so nothing else's traffic counts), then how long the
// last Wait takes to return once every run finished. It is a load
// measurement, not a unit test: it runs only with GOREACTOR_WAIT_LOAD=1.
//
//	GOREACTOR_WAIT_LOAD=1 go test -run TestWaitLoad -count=1 -v ./reactor/
//
// GOREACTOR_WAIT_N changes the number of waiters, GOREACTOR_WAIT_WINDOW the
// measured window (default 5s).
func TestWaitLoad(t *testing.T) {
	if os.Getenv("GOREACTOR_WAIT_LOAD") != "1" {
		t.Skip("a load measurement: set GOREACTOR_WAIT_LOAD=1")
	}
	n := envInt(t, "GOREACTOR_WAIT_N", 1000)
	window := 5 * time.Second
	if s := os.Getenv("GOREACTOR_WAIT_WINDOW"); s != "" {
		var err error
		window, err = time.ParseDuration(s)
		require.NoError(t, err)
	}
	for _, mode := range waitLoadModes {
		t.Run(mode.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
			t.Cleanup(func() { _ = rdb.Close() })
			ctx := t.Context()
			e, err := engine.NewEngine(ctx, engine.Config{Client: rdb, Prefix: "load", Enqueuer: nopEnqueuer{},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			require.NoError(t, err)
			def := engine.MustDefine("waited", engine.Step("noop", engine.StepConfig[engine.Args, int]{
				Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			}))
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("w-%d", i)
				res, err := e.Enqueue(ctx, def, nil, engine.WithRunID(ids[i]))
				require.NoError(t, err)
				require.Equal(t, engine.StatusPending, res.Status)
			}

			wctx, cancel := context.WithTimeout(ctx, window+time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for _, id := range ids {
				wg.Go(func() {
					res, err := mode.wait(e, wctx, id)
					if err == nil && res.Status != engine.StatusCompleted {
						err = fmt.Errorf("run %s ended %s", id, res.Status)
					}
					if err != nil {
						errs <- err
					}
				})
			}
			// Let every waiter settle into its steady state (the polling
			// backoff reaches its ceiling in about half a second).
			time.Sleep(time.Second)
			before := commandCalls(t, rdb)
			time.Sleep(window)
			after := commandCalls(t, rdb)
			perSec := float64(after.total-before.total-1) / window.Seconds() // -1: the first INFO
			t.Logf("%s: %d waiters: %.0f Redis commands/s while waiting (%s); %d subscriber connections",
				mode.name, n, perSec, after.diff(before), engine.WaitConnections(e))

			start := time.Now()
			for _, id := range ids {
				_, err := engine.Process(e, ctx, id)
				require.NoError(t, err)
			}
			finished := time.Since(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			t.Logf("%s: all %d runs finished in %s; every Wait returned %s after the last finished",
				mode.name, n, finished.Round(time.Millisecond), (time.Since(start) - finished).Round(time.Millisecond))
		})
	}
}

type waitLoadMode struct {
	name string
	wait func(e *engine.Engine, ctx context.Context, id string) (*engine.Result, error)
}

// commandStats is INFO commandstats: calls by command, and their sum.
type commandStats struct {
	total int64
	calls map[string]int64
}

func (a commandStats) diff(b commandStats) string {
	var parts []string
	for name, n := range a.calls {
		if d := n - b.calls[name]; d > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", name, d))
		}
	}
	return strings.Join(parts, " ")
}

func commandCalls(t *testing.T, rdb *redis.Client) commandStats {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	cs := commandStats{calls: map[string]int64{}}
	for line := range strings.SplitSeq(info, "\n") {
		// cmdstat_hmget:calls=12,usec=...
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(num, 10, 64)
		require.NoError(t, err)
		name = strings.TrimPrefix(name, "cmdstat_")
		cs.calls[name] = c
		cs.total += c
	}
	return cs
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

var waitLoadModes = []waitLoadMode{
	{name: "poll", wait: engine.PollWait},
	{name: "Wait", wait: (*engine.Engine).Wait},
}
