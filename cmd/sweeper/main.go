// Command sweeper recovers goreactor work that was lost: runs whose worker
// died, map element tasks and rollback jobs that were never delivered, batch
// claims and owner resumes that never happened. It needs no reactor
// definitions: it only reads Redis and enqueues tasks for the workers.
//
//	sweeper -redis redis://localhost:6379/0 -interval 10s   # a long-running loop
//	sweeper -once                                           # one pass, for a cron job
//
// Every flag falls back to an environment variable, then to its default:
//
//	-redis         REDIS_URL                   redis://localhost:6379/0 (one Redis)
//	-redis-cluster REDIS_CLUSTER_ADDRS         "" (a Redis Cluster's seeds; not with -redis: see worker.Main)
//	-prefix        GOREACTOR_PREFIX            goreactor
//	-queue         GOREACTOR_QUEUE             goreactor (the workers' queue list; the first is swept)
//	-queue-shards  GOREACTOR_QUEUE_SHARDS      1 (the workers' shard queues of the first queue, all swept)
//	-interval      GOREACTOR_SWEEP_INTERVAL    10s
//	-stale-after   GOREACTOR_STALE_AFTER       10s
//	-paused-recheck GOREACTOR_PAUSED_RECHECK   1h (how long a paused run still waiting is left alone)
//	-run-page      GOREACTOR_SWEEP_RUN_PAGE    200
//	-map-page      GOREACTOR_SWEEP_MAP_PAGE    100
//	-trim-page     GOREACTOR_SWEEP_TRIM_PAGE   100 (entries per listing index per pass)
//	-retention     GOREACTOR_RETENTION         168h (your engines' Config.Retention)
//	-leader-ttl    GOREACTOR_SWEEP_LEADER_TTL  30s
//	-metrics-addr  GOREACTOR_METRICS_ADDR      "" (off; e.g. :9102 serves /metrics)
//	-log-level     GOREACTOR_LOG_LEVEL         info
//	-once                                      run one pass and exit
//	-version                                   print "goreactor <version>" and exit
//
// -prefix and -queue are the one configuration every goreactor binary and
// library default reads (docs/configuration.md): set GOREACTOR_PREFIX and
// GOREACTOR_QUEUE once for the workers, the sweeper and the dashboard. The
// queue list is the workers' ("critical:6,goreactor:3"); the sweeper looks
// for tasks and enqueues on its first queue, where the workers enqueue.
//
// worker.Main runs this sweeper in every worker by default, so this binary
// is needed only beside workers started with -sweep-interval 0, or for a
// cron job.
//
// Each pass takes a leader lock first, so any number of replicas (or a cron
// job overlapping a loop) sweep one at a time; a replica that finds the lock
// held skips its tick. A pass logs one JSON summary line (event
// reactor.sweep.pass) with what it recovered and the running totals. SIGTERM
// or SIGINT lets the pass in progress finish and exits; a second signal
// cuts it short (every recovery step is idempotent, so that is safe too).
//
// Exit status: 0, or 1 when Redis does not answer at startup (or a
// cluster's state is not ok) or a -once pass had errors, or 2 for a bad
// command line (a URL and cluster seeds both named included).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/metricshttp"
	"github.com/goreactor/goreactor/internal/redislog"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/metrics"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const pingTimeout = 5 * time.Second

type config struct {
	redis       *redisurl.Endpoint
	prefix      string
	queue       string
	shards      int
	once        bool
	interval    time.Duration
	staleAfter  time.Duration
	pausedCheck time.Duration
	runPage     int
	mapPage     int
	trimPage    int
	retention   time.Duration
	leaderTTL   time.Duration
	metricsAddr string
	logLevel    slog.Level
	version     bool // -version: print the version, nothing else
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var (
		cfg           config
		target        redisurl.Target
		level, queues string
	)
	env := envflag.New(getenv)

	fs := flag.NewFlagSet("sweeper", flag.ContinueOnError)
	fs.SetOutput(stderr)
	envflag.Connection(fs, env, &target, &cfg.prefix)
	envflag.Queue(fs, env, &queues, "the workers' queues; the sweeper inspects and enqueues on the first")
	envflag.QueueShards(fs, env, &cfg.shards, "the workers'; the sweeper looks for lost map tasks on every shard")
	fs.BoolVar(&cfg.once, "once", false, "run one pass and exit (for a cron job)")
	fs.DurationVar(&cfg.interval, "interval", env.Duration("GOREACTOR_SWEEP_INTERVAL", 10*time.Second),
		"time between passes; env GOREACTOR_SWEEP_INTERVAL")
	fs.DurationVar(&cfg.staleAfter, "stale-after", env.Duration("GOREACTOR_STALE_AFTER", 10*time.Second),
		"how long a run or map must go without progress before a pass looks at it; env GOREACTOR_STALE_AFTER")
	fs.DurationVar(&cfg.pausedCheck, "paused-recheck", env.Duration("GOREACTOR_PAUSED_RECHECK", time.Hour),
		"how long a run paused at an interrupt that still waits is left before a pass looks at it again (a pass looks at it at its deadline anyway); env GOREACTOR_PAUSED_RECHECK")
	fs.IntVar(&cfg.runPage, "run-page", env.Int("GOREACTOR_SWEEP_RUN_PAGE", 200), "runs examined per pass; env GOREACTOR_SWEEP_RUN_PAGE")
	fs.IntVar(&cfg.mapPage, "map-page", env.Int("GOREACTOR_SWEEP_MAP_PAGE", 100), "maps examined per pass; env GOREACTOR_SWEEP_MAP_PAGE")
	fs.IntVar(&cfg.trimPage, "trim-page", env.Int("GOREACTOR_SWEEP_TRIM_PAGE", 100),
		"entries of each listing index (idx:runs, idx:status:*, idx:needs_human, ...) the trim examines per pass; env GOREACTOR_SWEEP_TRIM_PAGE")
	fs.DurationVar(&cfg.retention, "retention", env.Duration("GOREACTOR_RETENTION", 7*24*time.Hour),
		"how long your engines keep a finished run (their Config.Retention); older listing entries of gone runs are trimmed; env GOREACTOR_RETENTION")
	fs.DurationVar(&cfg.leaderTTL, "leader-ttl", env.Duration("GOREACTOR_SWEEP_LEADER_TTL", 30*time.Second),
		"expiry of the leader lock, kept alive while a pass runs; env GOREACTOR_SWEEP_LEADER_TTL")
	fs.StringVar(&cfg.metricsAddr, "metrics-addr", env.String("GOREACTOR_METRICS_ADDR", ""),
		"serve Prometheus metrics (the sweeper's, the runs gauge, Go runtime and process) at http://ADDR/metrics; empty: off; env GOREACTOR_METRICS_ADDR")
	fs.StringVar(&level, "log-level", env.String("GOREACTOR_LOG_LEVEL", "info"), "debug, info, warn or error; env GOREACTOR_LOG_LEVEL")
	fs.BoolVar(&cfg.version, "version", false, "print goreactor's version and exit")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if cfg.version { // whatever the environment holds
		return cfg, nil
	}
	if err := env.Err(); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return cfg, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	var err error
	if cfg.redis, err = target.Parse(); err != nil {
		return cfg, err
	}
	if _, cfg.queue, err = envconfig.ParseQueues(queues); err != nil {
		return cfg, fmt.Errorf("-queue: %w", err)
	}
	if err := envflag.CheckQueueShards(cfg.shards); err != nil {
		return cfg, err
	}
	switch {
	case cfg.interval <= 0:
		return cfg, fmt.Errorf("-interval %s: must be positive", cfg.interval)
	case cfg.staleAfter <= 0:
		return cfg, fmt.Errorf("-stale-after %s: must be positive", cfg.staleAfter)
	case cfg.pausedCheck <= 0:
		return cfg, fmt.Errorf("-paused-recheck %s: must be positive", cfg.pausedCheck)
	case cfg.runPage < 1 || cfg.mapPage < 1 || cfg.trimPage < 1:
		return cfg, errors.New("-run-page, -map-page and -trim-page: must be at least 1")
	case cfg.retention <= 0:
		return cfg, fmt.Errorf("-retention %s: must be positive", cfg.retention)
	case cfg.leaderTTL < time.Second:
		return cfg, fmt.Errorf("-leader-ttl %s: must be at least 1s", cfg.leaderTTL)
	case cfg.prefix == "":
		return cfg, errors.New("-prefix: must not be empty")
	}
	return cfg, nil
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "sweeper: %v\n", err)
		return 2
	}
	if cfg.version {
		fmt.Fprintln(stdout, version.Line())
		return 0
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	slog.SetDefault(log)
	redislog.Set(log)

	// The first signal stops the loop after the pass in progress; the
	// second cuts the pass short.
	stopLoop, stopLoopCancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stopLoopCancel()
	passCtx, abort := context.WithCancel(context.Background())
	defer abort()
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sig)
		select {
		case <-sig: // the first, which also ended stopLoop
		case <-passCtx.Done():
			return
		}
		select {
		case <-sig:
			log.Warn("second signal: cutting the pass short", "event", "sweeper.abort")
			abort()
		case <-passCtx.Done():
		}
	}()
	if err := serve(stopLoop, passCtx, cfg, log); err != nil {
		log.Error(err.Error(), "event", "sweeper.exit")
		return 1
	}
	return 0
}

func serve(loop, pass context.Context, cfg config, log *slog.Logger) error {
	rdb, err := cfg.redis.Dial(pass, pingTimeout)
	if err != nil {
		return err
	}
	defer rdb.Close()
	client, err := worker.NewClientWithConfig(rdb, worker.ClientConfig{Queue: cfg.queue, Shards: cfg.shards})
	if err != nil {
		return err // parseConfig checked the shards
	}
	engine, err := reactor.NewEngine(pass, reactor.Config{Client: rdb, Prefix: cfg.prefix, Logger: log, Enqueuer: client})
	if err != nil {
		return fmt.Errorf("start engine: %w", err)
	}
	scfg := sweeper.Config{Engine: engine, Queue: cfg.queue, Interval: cfg.interval, StaleAfter: cfg.staleAfter,
		PausedRecheck: cfg.pausedCheck, RunPage: cfg.runPage, MapPage: cfg.mapPage, TrimPage: cfg.trimPage, Retention: cfg.retention, LeaderTTL: cfg.leaderTTL, Logger: log}
	var m *metrics.Metrics
	if cfg.metricsAddr != "" {
		m = metrics.New(metrics.Options{Client: rdb, Prefix: cfg.prefix, Logger: log})
		scfg.Metrics = m
	}
	sw, err := sweeper.New(scfg)
	if err != nil {
		return err
	}
	log.Info("sweeper started", "event", "sweeper.started", "redis", cfg.redis.Addr(), "db", cfg.redis.DB(),
		"cluster", cfg.redis.IsCluster(), "prefix", cfg.prefix,
		"queue", cfg.queue, "queue_shards", cfg.shards, "once", cfg.once, "interval", cfg.interval.String(), "stale_after", cfg.staleAfter.String(),
		"retention", cfg.retention.String())

	if m != nil {
		srv, err := metricshttp.Listen(cfg.metricsAddr, metrics.NewRegistry(m))
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info("serving metrics", "event", "sweeper.metrics", "addr", srv.Addr())
	}

	if cfg.once {
		_, err := sw.Once(pass)
		return err
	}
	t := time.NewTicker(cfg.interval)
	defer t.Stop()
	for {
		if _, err := sw.Once(pass); err != nil && pass.Err() == nil {
			log.Warn("sweep pass had errors", "event", "reactor.sweep.error", "error", err.Error())
		}
		select {
		case <-loop.Done():
			tot := sw.Totals()
			log.Info("sweeper stopped", "event", "sweeper.stopped", "passes", tot.Passes,
				"recovered", tot.RunsWoken+tot.Elements+tot.Rollbacks+tot.Resumes, "trimmed", tot.Trimmed)
			return nil
		case <-t.C:
		}
	}
}
