package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// Timings of the soak's engines and sweepers: short, so that a killed
// worker's locks expire and its work is recovered within seconds.
const (
	lockExpiry    = 2 * time.Second
	sweepInterval = 500 * time.Millisecond
	staleAfter    = time.Second
	leaderTTL     = 3 * time.Second
)

// claimDelay bounds the random delay the claim audit adds after each claim
// in the worker processes: it widens the window between a claim (a batch,
// an owner signal) and the enqueues that act on it, so that kills land
// there and the sweepers must recover lost triggers and resumes.
const claimDelay = 400 * time.Millisecond

// newClient returns a Redis client carrying the claim audit (with delay),
// and a recorder for process pid on it. The soak starts a Redis of its own
// (one node, which it restarts), so it needs no -redis or -redis-cluster;
// the rest of the soak holds a redis.UniversalClient and scans through
// redisnode, as it would on a cluster.
func newClient(addr string, pid int, delay time.Duration) (redis.UniversalClient, *recorder) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second})
	r := newRecorder(rdb, pid)
	rdb.AddHook(claimAudit{rdb: rdb, rec: r, delay: delay})
	return rdb, r
}

// newEngine builds an engine, retrying while Redis does not answer (it
// loads its scripts).
func newEngine(ctx context.Context, cfg reactor.Config) (*reactor.Engine, error) {
	cfg.Prefix, cfg.LockExpiry = prefix, lockExpiry
	var err error
	for range 60 {
		var e *reactor.Engine
		if e, err = reactor.NewEngine(ctx, cfg); err == nil {
			return e, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil, err
}

// workerMain is a worker process: a goreactor worker with the soak's
// reactors and, when its spec says so, a sweeper replica. It writes "ready"
// on stdout once it serves, and exits when its stdin closes (the soak is
// gone) or when it is killed, which is how the soak stops it.
func workerMain(specJSON string) int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "soak worker: bad spec: %v\n", err)
		return 2
	}
	level := slog.LevelWarn
	if spec.Verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	ctx := context.Background()

	rdb, rec := newClient(spec.Addr, os.Getpid(), claimDelay)
	engine, err := newEngine(ctx, reactor.Config{Client: rdb, Enqueuer: worker.NewClient(rdb, queue), Logger: log,
		Hooks: []reactor.Hook{rec.hook()}})
	if err != nil {
		log.Error("cannot build the engine", "error", err)
		return 1
	}
	if err := engine.Register(rec.definitions()...); err != nil {
		log.Error("cannot register the reactors", "error", err)
		return 1
	}
	w := worker.New(engine, rdb, worker.Config{Concurrency: spec.Concurrency, Queues: map[string]int{queue: 1}, Logger: log})
	if err := w.Start(ctx); err != nil {
		log.Error("cannot start the worker", "error", err)
		return 1
	}
	if spec.Sweep {
		// The sweeper's engine is its own, so that everything it enqueues
		// goes through the checking Enqueuer.
		q := newSweepEnqueuer(rdb)
		se, err := newEngine(ctx, reactor.Config{Client: rdb, Enqueuer: q, Logger: log})
		if err != nil {
			log.Error("cannot build the sweeper's engine", "error", err)
			return 1
		}
		sw, err := sweeper.New(sweeper.Config{Engine: se, Interval: sweepInterval, StaleAfter: staleAfter,
			LeaderTTL: leaderTTL, Logger: log})
		if err != nil {
			log.Error("cannot build the sweeper", "error", err)
			return 1
		}
		go func() {
			t := time.NewTicker(sweepInterval)
			defer t.Stop()
			for range t.C {
				q.pass(ctx, sw)
			}
		}()
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 3
}
