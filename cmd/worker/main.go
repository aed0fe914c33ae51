// Command worker is a deployable goreactor worker: it executes the runs that
// engines hand to workers (Engine.Enqueue, hand-off points, sweeps), and can
// run the run sweeper too.
//
//	worker -redis redis://localhost:6379/0 -queue critical:6,goreactor:3 -sweep-interval 30s
//
// Every flag falls back to an environment variable, then to its default:
//
//	-redis             REDIS_URL                   redis://localhost:6379/0
//	-prefix            GOREACTOR_PREFIX            goreactor
//	-queue             GOREACTOR_QUEUE             goreactor (comma-separated name:priority)
//	-concurrency       GOREACTOR_CONCURRENCY       10
//	-lock-expiry       GOREACTOR_LOCK_EXPIRY       15s
//	-shutdown-timeout  GOREACTOR_SHUTDOWN_TIMEOUT  10s
//	-log-level         GOREACTOR_LOG_LEVEL         info (debug, info, warn, error)
//	-sweep-interval    GOREACTOR_SWEEP_INTERVAL    0 (off)
//
// The first queue listed is the one this process enqueues on (hand-offs,
// sweeps) and the one its sweeper inspects. With -sweep-interval above zero
// the process also runs the sweeper (runs and maps, as cmd/sweeper does) on
// that interval, so a small deployment needs no separate sweeper; every
// replica may do so, because each pass takes a leader lock first.
//
// Logs are JSON (log/slog) on stderr. SIGTERM or SIGINT stops the worker
// gracefully: it stops fetching tasks and waits up to -shutdown-timeout for
// running ones, whose runs are checkpointed and redelivered if cut short. A
// Redis that does not answer at startup makes it exit with status 1.
//
// This binary registers the example definitions (package examples). Build
// your own from this file and register your definitions instead: every
// reactor that may be enqueued must be registered on every worker.
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
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

// pingTimeout bounds the startup check of Redis.
const pingTimeout = 5 * time.Second

// run is the whole program; it returns the exit status.
func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	slog.SetDefault(log)
	redis.SetLogger(redisLogger{log})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, stop, cfg, log); err != nil {
		log.Error(err.Error(), "event", "worker.exit")
		return 1
	}
	return 0
}

// config is the parsed command line.
type config struct {
	redisURL        string
	prefix          string
	queues          map[string]int
	firstQueue      string
	concurrency     int
	lockExpiry      time.Duration
	shutdownTimeout time.Duration
	logLevel        slog.Level
	sweepInterval   time.Duration
}

// parseConfig reads the flags, each defaulting to its environment variable
// and then to its built-in default.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var (
		cfg    config
		queues string
		level  string
	)
	env := envflag.New(getenv)

	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.redisURL, "redis", env.String("REDIS_URL", "redis://localhost:6379/0"),
		"Redis URL (redis://[user:password@]host:port/db, rediss:// for TLS); env REDIS_URL")
	fs.StringVar(&cfg.prefix, "prefix", env.String("GOREACTOR_PREFIX", "goreactor"),
		"key prefix, the same as your engines' Config.Prefix; env GOREACTOR_PREFIX")
	fs.StringVar(&queues, "queue", env.String("GOREACTOR_QUEUE", worker.DefaultQueue),
		"queues to serve, comma-separated name[:priority]; the first is where this process enqueues; env GOREACTOR_QUEUE")
	fs.IntVar(&cfg.concurrency, "concurrency", env.Int("GOREACTOR_CONCURRENCY", 10),
		"tasks processed at once; env GOREACTOR_CONCURRENCY")
	fs.DurationVar(&cfg.lockExpiry, "lock-expiry", env.Duration("GOREACTOR_LOCK_EXPIRY", 15*time.Second),
		"how long a run lock outlives a dead worker (heartbeat every third of it); env GOREACTOR_LOCK_EXPIRY")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", env.Duration("GOREACTOR_SHUTDOWN_TIMEOUT", 10*time.Second),
		"how long a stop waits for running tasks; env GOREACTOR_SHUTDOWN_TIMEOUT")
	fs.StringVar(&level, "log-level", env.String("GOREACTOR_LOG_LEVEL", "info"),
		"debug, info, warn or error; env GOREACTOR_LOG_LEVEL")
	fs.DurationVar(&cfg.sweepInterval, "sweep-interval", env.Duration("GOREACTOR_SWEEP_INTERVAL", 0),
		"run the sweeper (runs and maps) every interval in this process (0: off); env GOREACTOR_SWEEP_INTERVAL")
	if err := env.Err(); err != nil {
		return cfg, err
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	var err error
	if cfg.queues, cfg.firstQueue, err = parseQueues(queues); err != nil {
		return cfg, fmt.Errorf("-queue: %w", err)
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return cfg, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	switch {
	case cfg.concurrency < 1:
		return cfg, fmt.Errorf("-concurrency %d: must be at least 1", cfg.concurrency)
	case cfg.lockExpiry < time.Second:
		return cfg, fmt.Errorf("-lock-expiry %s: must be at least 1s", cfg.lockExpiry)
	case cfg.shutdownTimeout <= 0:
		return cfg, fmt.Errorf("-shutdown-timeout %s: must be positive", cfg.shutdownTimeout)
	case cfg.sweepInterval < 0:
		return cfg, fmt.Errorf("-sweep-interval %s: must be 0 (off) or positive", cfg.sweepInterval)
	case cfg.prefix == "":
		return cfg, errors.New("-prefix: must not be empty")
	}
	return cfg, nil
}

// parseQueues parses "name[:priority],..." into asynq's queue priorities and
// returns the first name.
func parseQueues(s string) (map[string]int, string, error) {
	queues := map[string]int{}
	first := ""
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, prio, hasPrio := strings.Cut(item, ":")
		name = strings.TrimSpace(name)
		p := 1
		if hasPrio {
			n, err := strconv.Atoi(strings.TrimSpace(prio))
			if err != nil || n < 1 {
				return nil, "", fmt.Errorf("queue %q: priority must be a positive integer", item)
			}
			p = n
		}
		if name == "" {
			return nil, "", fmt.Errorf("queue %q: empty name", item)
		}
		if _, dup := queues[name]; dup {
			return nil, "", fmt.Errorf("queue %q listed twice", name)
		}
		queues[name] = p
		if first == "" {
			first = name
		}
	}
	if first == "" {
		return nil, "", errors.New("no queue given")
	}
	return queues, first, nil
}

// serve runs the worker (and the sweeper) until ctx ends, then shuts down.
// stop releases the signal handlers, so that a second signal kills the
// process while it shuts down.
func serve(ctx context.Context, stop func(), cfg config, log *slog.Logger) error {
	rdb, opts, err := redisurl.Dial(ctx, cfg.redisURL, "-redis/REDIS_URL", pingTimeout)
	if err != nil {
		return err
	}
	defer rdb.Close()

	client := worker.NewClient(rdb, cfg.firstQueue)
	defer client.Close()
	engine, err := reactor.NewEngine(ctx, reactor.Config{
		Client:     rdb,
		Prefix:     cfg.prefix,
		Logger:     log,
		LockExpiry: cfg.lockExpiry,
		Enqueuer:   client,
	})
	if err != nil {
		return fmt.Errorf("start engine: %w", err)
	}
	// Your binary registers your own definitions here; this one serves the
	// examples. Every reactor that may be enqueued must be registered on
	// every worker (an unknown one is retried, so a rolling deploy is safe).
	if err := examples.Register(engine); err != nil {
		return err
	}

	w := worker.New(engine, rdb, worker.Config{
		Concurrency:     cfg.concurrency,
		Queues:          cfg.queues,
		ShutdownTimeout: cfg.shutdownTimeout,
		Logger:          log,
	})
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	names := make([]string, 0, len(cfg.queues))
	for q, p := range cfg.queues {
		names = append(names, fmt.Sprintf("%s:%d", q, p))
	}
	sort.Strings(names)
	log.Info("worker started", "event", "worker.started",
		"redis", opts.Addr, "db", opts.DB, "prefix", cfg.prefix, "queues", strings.Join(names, ","),
		"concurrency", cfg.concurrency, "lock_expiry", cfg.lockExpiry.String(),
		"sweep_interval", cfg.sweepInterval.String())

	var wg sync.WaitGroup
	if cfg.sweepInterval > 0 {
		sw, err := sweeper.New(sweeper.Config{Engine: engine, Queue: cfg.firstQueue, Interval: cfg.sweepInterval, Logger: log})
		if err != nil {
			_ = w.Stop(context.Background())
			return err
		}
		wg.Go(func() { _ = sw.Run(ctx) })
	}

	<-ctx.Done()
	stop()
	log.Info("shutting down", "event", "worker.stopping", "timeout", cfg.shutdownTimeout.String())
	wg.Wait()
	// Stop waits ShutdownTimeout for running tasks, then cancels them; give
	// it a little beyond that before giving up on it.
	sctx, scancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout+5*time.Second)
	defer scancel()
	if err := w.Stop(sctx); err != nil {
		return fmt.Errorf("stop worker: %w", err)
	}
	log.Info("worker stopped", "event", "worker.stopped")
	return nil
}

// redisLogger routes go-redis's internal log lines (connection pool trouble)
// to slog, so every line the process writes is JSON.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.l.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}
