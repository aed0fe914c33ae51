package worker

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
	"strings"
	"sync"
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
)

// Main is a whole worker program: your main calls it with every reactor
// that may be enqueued (each worker must have all of them) and it does not
// return.
//
//	func main() {
//		worker.Main(orders.Checkout, orders.Refund, billing.Invoice)
//	}
//
// It reads its settings from the command line, each flag falling back to an
// environment variable and then to its default:
//
//	-redis             REDIS_URL                   redis://localhost:6379/0 (one Redis)
//	-redis-cluster     REDIS_CLUSTER_ADDRS         "" (a Redis Cluster's seeds: host:port,... or redis://...,...)
//	-prefix            GOREACTOR_PREFIX            goreactor (your engines' Config.Prefix)
//	-queue             GOREACTOR_QUEUE             goreactor (comma-separated name[:priority])
//	-queue-shards      GOREACTOR_QUEUE_SHARDS      1 (map tasks over <first queue>.shard0.., all served; see ClientConfig.Shards)
//	-concurrency       GOREACTOR_CONCURRENCY       10
//	-lock-expiry       GOREACTOR_LOCK_EXPIRY       3s
//	-sweep-interval    GOREACTOR_SWEEP_INTERVAL    1s (0: no sweeper in this process)
//	-stale-after       GOREACTOR_STALE_AFTER       2s
//	-paused-recheck    GOREACTOR_PAUSED_RECHECK    1h (how long the sweeper leaves a paused run that still waits)
//	-shutdown-timeout  GOREACTOR_SHUTDOWN_TIMEOUT  10s
//	-log-level         GOREACTOR_LOG_LEVEL         info (debug, info, warn, error)
//	-metrics-addr      GOREACTOR_METRICS_ADDR      "" (off; e.g. :9101 serves /metrics)
//
// -version prints "goreactor <version>" (the goreactor module's version
// this program was built with) on stdout and exits 0.
//
// GOREACTOR_PREFIX and GOREACTOR_QUEUE are the same two settings every
// goreactor binary (cmd/sweeper, cmd/dashboard) and every library default
// (reactor.Config.Prefix, NewClient's queue) reads, so a client process and
// its workers started in one environment agree without further settings
// (docs/configuration.md).
//
// -redis-cluster names a Redis Cluster instead of one Redis: seed nodes as
// host:port,... or as redis:// (rediss://) URLs, whose user, password and
// TLS are every node's and whose db, if any, is 0. Naming a URL (-redis or
// REDIS_URL) as well is a usage error: which of the two wins would be a
// guess. At startup every master must answer with cluster_state:ok.
//
// The queues are read in one place for both sides of the worker: it serves
// every queue listed, and its engine's Enqueuer (a Client: hand-offs,
// map elements, sweeps) enqueues on the first one.
//
// Recovery: the process also runs the sweeper (runs, maps and the listing
// indexes, as cmd/sweeper does) every -sweep-interval, inspecting the first
// queue. Every replica runs the loop and each pass takes a leader lock
// first, so N workers make one sweeper and no other process is needed. With
// the defaults a run whose worker was killed (kill -9, a lost machine) is
// resumed by another worker 3 to 4 s after the death (under 5 s): its
// lock expires within -lock-expiry, the next pass (within -sweep-interval)
// wakes it. A longer -lock-expiry lengthens that by as much. -sweep-interval
// 0 turns the in-process sweeper off (run cmd/sweeper instead).
//
// With -metrics-addr the process serves Prometheus metrics at
// http://ADDR/metrics on a registry of its own: package metrics' collector
// (added to the engine's Hooks and the worker's and sweeper's Metrics) and
// the Go runtime and process collectors. It logs the address it listens on
// (event worker.metrics), so port 0 picks a free one.
//
// Logs are JSON (log/slog) on stderr, go-redis's and asynq's included, and
// the JSON logger becomes slog's default. SIGTERM or SIGINT stops the worker
// gracefully: it stops fetching tasks and waits up to -shutdown-timeout for
// running ones, whose runs stay checkpointed and are delivered again if cut
// short; a second signal during that wait kills the process.
//
// Exit status: 0 after a graceful stop (or -h, -version), 2 for a
// malformed flag or environment variable (a URL and cluster seeds both
// named included), 1 for anything else, such as a Redis that does not
// answer at startup (the message names the URL, password redacted) or a
// cluster whose state is not ok.
//
// Use Run instead to embed the worker in a program of your own or to set
// engine options (hooks, middleware, retention) that have no flag.
func Main(defs ...*reactor.Definition) {
	os.Exit(mainStatus(defs, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// mainStatus is Main up to its exit status.
func mainStatus(defs []*reactor.Definition, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Once the first signal arrived the handlers are released, so a second
	// one kills the process while it shuts down.
	context.AfterFunc(ctx, stop)

	var log *slog.Logger
	err := run(ctx, Options{Definitions: defs, Args: args, Getenv: getenv, Stdout: stdout, Stderr: stderr}, func(l *slog.Logger) {
		log = l
		slog.SetDefault(l)
		redislog.Set(l)
	})
	var usage *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, err)
		return 2
	case log == nil:
		fmt.Fprintln(stderr, err)
		return 1
	default:
		log.Error(err.Error(), "event", "worker.exit")
		return 1
	}
}

// Options configure Run. Only Definitions is required.
type Options struct {
	// Definitions are the reactors the worker executes: every reactor that
	// may be enqueued, on every worker (a run of one it lacks is retried,
	// so a rolling deploy is safe). Required.
	Definitions []*reactor.Definition
	// Args are the command-line arguments without the program name, the
	// flags Main documents. Default none: every setting from Getenv or its
	// default. Main passes os.Args[1:].
	Args []string
	// Getenv reads the environment variables Main documents. Default
	// os.Getenv.
	Getenv func(string) string
	// Stderr receives the JSON logs and the flags' usage. Default os.Stderr.
	Stderr io.Writer
	// Stdout receives the line -version prints. Default os.Stdout.
	Stdout io.Writer
	// Engine, when set, adjusts the engine's config after the flags filled
	// it in and before the engine is made: set Hooks, Middleware,
	// Retention, UndoTimeout and the like here. Client, Prefix and Enqueuer
	// belong to the flags (they decide which Redis, keys and queue the
	// worker uses); Run refuses a function that changes them. Default none.
	Engine func(*reactor.Config)
}

// UsageError is a malformed flag, environment variable or argument given to
// Run: the operator's command line or environment must change. Main exits
// with status 2 on it.
type UsageError struct {
	// Err says which setting is wrong and what it wants.
	Err error
}

func (e *UsageError) Error() string {
	return "worker: " + e.Err.Error() + " (run with -h for the flags)"
}

// Unwrap returns Err.
func (e *UsageError) Unwrap() error { return e.Err }

// Run is Main without the process around it: it reads the settings from
// opts.Args and opts.Getenv as Main does, connects to Redis, serves
// opts.Definitions until ctx ends, then shuts down gracefully (up to
// -shutdown-timeout for running tasks) and returns. It returns nil after a
// graceful stop, flag.ErrHelp when the arguments ask for help (the usage is
// on opts.Stderr), nil at once for -version (its line on opts.Stdout,
// nothing connected), a *UsageError for a malformed setting, and any other
// error when the worker could not start or stop.
//
// Unlike Main, Run sets no process-wide state: slog's default logger and
// go-redis's logger stay as they are.
func Run(ctx context.Context, opts Options) error {
	return run(ctx, opts, nil)
}

// run is Run; logger, when set, is given the worker's logger before
// anything is logged.
func run(ctx context.Context, opts Options, logger func(*slog.Logger)) error {
	if len(opts.Definitions) == 0 {
		return errors.New("worker: no definitions to serve: pass every reactor that may be enqueued to worker.Main or Options.Definitions")
	}
	if opts.Getenv == nil {
		opts.Getenv = os.Getenv
	}
	if opts.Stderr == nil {
		opts.Stderr = os.Stderr
	}
	if opts.Stdout == nil {
		opts.Stdout = os.Stdout
	}
	cfg, err := parseSettings(opts.Args, opts.Getenv, opts.Stderr)
	if errors.Is(err, errVersion) {
		_, err = fmt.Fprintln(opts.Stdout, version.Line())
		return err
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(opts.Stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	if logger != nil {
		logger(log)
	}
	return serve(ctx, opts, cfg, log)
}

// The defaults of Main's recovery settings. Together they bound how long a
// run whose worker died (kill -9, a lost machine) waits before another
// worker resumes it: its lock expires at most DefaultLockExpiry after the
// death, the sweeper of any live worker finds it at its next pass (at most
// DefaultSweepInterval later; a run it saw locked is looked at again when
// that lock would expire) and a worker takes the wake-up at once: 3 to
// 4 s in all, with no process besides the workers.
const (
	// DefaultLockExpiry is Main's -lock-expiry: how long a dead worker's
	// run lock outlives it. The heartbeat extends it every third (1 s),
	// so a Redis that stalls longer than two thirds of it makes a worker
	// lose its runs' locks (the run is resumed, never run twice at once).
	DefaultLockExpiry = 3 * time.Second
	// DefaultSweepInterval is Main's -sweep-interval: the time between
	// sweeper passes. Every worker runs the loop, one of them leads each
	// pass (a leader lock), so N workers make one sweeper.
	DefaultSweepInterval = time.Second
	// DefaultStaleAfter is Main's -stale-after: how long an unlocked run
	// must go without a write before the sweeper wakes it. It is shorter
	// than DefaultLockExpiry, so a run killed just after a write is
	// recovered when its lock expires.
	DefaultStaleAfter = 2 * time.Second
)

// pingTimeout bounds the startup check of Redis.
const pingTimeout = 5 * time.Second

// settings are a worker process's parsed flags and environment.
type settings struct {
	redis           *redisurl.Endpoint
	prefix          string
	queues          map[string]int
	firstQueue      string
	shards          int
	concurrency     int
	lockExpiry      time.Duration
	shutdownTimeout time.Duration
	logLevel        slog.Level
	sweepInterval   time.Duration
	staleAfter      time.Duration
	pausedRecheck   time.Duration
	metricsAddr     string
	replicaAcks     int
	replicaAckWait  time.Duration
}

// errVersion is parseSettings' answer to -version.
var errVersion = errors.New("worker: -version")

// parseSettings reads the flags, each defaulting to its environment
// variable and then to its built-in default. Every error is a *UsageError,
// except flag.ErrHelp and errVersion.
func parseSettings(args []string, getenv func(string) string, stderr io.Writer) (settings, error) {
	var (
		cfg         settings
		target      redisurl.Target
		queues      string
		level       string
		showVersion bool
	)
	env := envflag.New(getenv)

	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	envflag.Connection(fs, env, &target, &cfg.prefix)
	envflag.Queue(fs, env, &queues, "served by this process, the first is where it enqueues")
	envflag.QueueShards(fs, env, &cfg.shards, "served by this process too")
	fs.IntVar(&cfg.concurrency, "concurrency", env.Int("GOREACTOR_CONCURRENCY", 10),
		"tasks processed at once; env GOREACTOR_CONCURRENCY")
	fs.DurationVar(&cfg.lockExpiry, "lock-expiry", env.Duration("GOREACTOR_LOCK_EXPIRY", DefaultLockExpiry),
		"how long a run lock outlives a dead worker (heartbeat every third of it); env GOREACTOR_LOCK_EXPIRY")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", env.Duration("GOREACTOR_SHUTDOWN_TIMEOUT", 10*time.Second),
		"how long a stop waits for running tasks; env GOREACTOR_SHUTDOWN_TIMEOUT")
	fs.StringVar(&level, "log-level", env.String("GOREACTOR_LOG_LEVEL", "info"),
		"debug, info, warn or error; env GOREACTOR_LOG_LEVEL")
	fs.DurationVar(&cfg.sweepInterval, "sweep-interval", env.Duration("GOREACTOR_SWEEP_INTERVAL", DefaultSweepInterval),
		"run the sweeper (runs, maps, indexes; one replica at a time) every interval in this process (0: off); env GOREACTOR_SWEEP_INTERVAL")
	fs.DurationVar(&cfg.staleAfter, "stale-after", env.Duration("GOREACTOR_STALE_AFTER", DefaultStaleAfter),
		"how long an unlocked run or map must go without progress before the sweeper recovers it; env GOREACTOR_STALE_AFTER")
	fs.DurationVar(&cfg.pausedRecheck, "paused-recheck", env.Duration("GOREACTOR_PAUSED_RECHECK", time.Hour),
		"how long the sweeper leaves a run paused at an interrupt that still waits before it looks again (at its deadline anyway); env GOREACTOR_PAUSED_RECHECK")
	fs.StringVar(&cfg.metricsAddr, "metrics-addr", env.String("GOREACTOR_METRICS_ADDR", ""),
		"serve Prometheus metrics at http://ADDR/metrics (empty: off); env GOREACTOR_METRICS_ADDR")
	fs.IntVar(&cfg.replicaAcks, "replica-acks", env.Int("GOREACTOR_REPLICA_ACKS", 0),
		"replicas that must have each checkpoint and settle before a run goes on (WAIT; 0: asynchronous replication); env GOREACTOR_REPLICA_ACKS")
	fs.DurationVar(&cfg.replicaAckWait, "replica-ack-timeout", env.Duration("GOREACTOR_REPLICA_ACK_TIMEOUT", time.Second),
		"how long each -replica-acks wait lasts before the run goes on without them; env GOREACTOR_REPLICA_ACK_TIMEOUT")
	fs.BoolVar(&showVersion, "version", false, "print goreactor's version and exit")
	usage := func(err error) (settings, error) { return cfg, &UsageError{Err: err} }
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return cfg, err
	} else if err != nil {
		return usage(err)
	}
	if showVersion { // whatever the environment holds
		return cfg, errVersion
	}
	if err := env.Err(); err != nil {
		return usage(err)
	}
	if fs.NArg() > 0 {
		return usage(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}

	var err error
	if cfg.redis, err = target.Parse(); err != nil {
		return usage(err)
	}
	if cfg.queues, cfg.firstQueue, err = envconfig.ParseQueues(queues); err != nil {
		return usage(fmt.Errorf("-queue: %w", err))
	}
	if err := cfg.logLevel.UnmarshalText([]byte(level)); err != nil {
		return usage(fmt.Errorf("-log-level %q: want debug, info, warn or error", level))
	}
	if err := envflag.CheckQueueShards(cfg.shards); err != nil {
		return usage(err)
	}
	switch {
	case cfg.concurrency < 1:
		return usage(fmt.Errorf("-concurrency %d: must be at least 1", cfg.concurrency))
	case cfg.lockExpiry < time.Second:
		return usage(fmt.Errorf("-lock-expiry %s: must be at least 1s", cfg.lockExpiry))
	case cfg.shutdownTimeout <= 0:
		return usage(fmt.Errorf("-shutdown-timeout %s: must be positive", cfg.shutdownTimeout))
	case cfg.sweepInterval < 0:
		return usage(fmt.Errorf("-sweep-interval %s: must be 0 (off) or positive", cfg.sweepInterval))
	case cfg.staleAfter <= 0:
		return usage(fmt.Errorf("-stale-after %s: must be positive", cfg.staleAfter))
	case cfg.pausedRecheck <= 0:
		return usage(fmt.Errorf("-paused-recheck %s: must be positive", cfg.pausedRecheck))
	case cfg.prefix == "":
		return usage(errors.New("-prefix: must not be empty"))
	case cfg.replicaAcks < 0:
		return usage(fmt.Errorf("-replica-acks %d: must be 0 (off) or positive", cfg.replicaAcks))
	case cfg.replicaAckWait < time.Millisecond:
		return usage(fmt.Errorf("-replica-ack-timeout %s: must be at least 1ms", cfg.replicaAckWait))
	}
	return cfg, nil
}

// serve runs the worker (and the sweeper) until ctx ends, then shuts down.
func serve(ctx context.Context, opts Options, cfg settings, log *slog.Logger) error {
	rdb, err := cfg.redis.Dial(ctx, pingTimeout)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	defer rdb.Close()

	// One queue setting for both sides: the client enqueues on the first
	// queue the worker serves (New refuses a worker that does not serve
	// its engine's client's queue).
	client, err := NewClientWithConfig(rdb, ClientConfig{Queue: cfg.firstQueue, Shards: cfg.shards})
	if err != nil {
		return err // parseSettings checked the shards
	}
	defer client.Close()
	ecfg := reactor.Config{
		Client:     rdb,
		Prefix:     cfg.prefix,
		Logger:     log,
		LockExpiry: cfg.lockExpiry,
		Enqueuer:   client,

		ReplicaAcks:       cfg.replicaAcks,
		ReplicaAckTimeout: cfg.replicaAckWait,
	}
	if opts.Engine != nil {
		opts.Engine(&ecfg)
		if ecfg.Client != rdb || ecfg.Prefix != cfg.prefix || ecfg.Enqueuer != reactor.Enqueuer(client) {
			return errors.New("worker: Options.Engine changed the engine's Client, Prefix or Enqueuer: " +
				"those come from -redis (or -redis-cluster), -prefix and -queue (and their environment variables); set them there")
		}
	}
	var m *metrics.Metrics
	if cfg.metricsAddr != "" {
		// Added after Options.Engine, so a user's hooks cannot drop it.
		m = metrics.New(metrics.Options{Client: rdb, Prefix: cfg.prefix, Logger: log})
		ecfg.Hooks = append(ecfg.Hooks, m)
	}
	engine, err := reactor.NewEngine(ctx, ecfg)
	if err != nil {
		return fmt.Errorf("worker: start engine: %w", err)
	}
	if err := engine.Register(opts.Definitions...); err != nil {
		return fmt.Errorf("worker: %w", err)
	}

	wcfg := Config{
		Concurrency:     cfg.concurrency,
		Queues:          cfg.queues,
		ShutdownTimeout: cfg.shutdownTimeout,
		Logger:          log,
	}
	var swMetrics sweeper.Observer
	if m != nil {
		wcfg.Metrics, swMetrics = m, m
		srv, err := metricshttp.Listen(cfg.metricsAddr, metrics.NewRegistry(m))
		if err != nil {
			return fmt.Errorf("worker: %w", err)
		}
		defer srv.Close()
		log.Info("serving metrics", "event", "worker.metrics", "addr", srv.Addr())
	}
	w := New(engine, rdb, wcfg)
	if err := w.Start(ctx); err != nil {
		return fmt.Errorf("worker: start: %w", err)
	}
	served := withShards(cfg.queues, client)
	names := make([]string, 0, len(served))
	for q, p := range served {
		names = append(names, fmt.Sprintf("%s:%d", q, p))
	}
	sort.Strings(names)
	log.Info("worker started", "event", "worker.started",
		"redis", cfg.redis.Addr(), "db", cfg.redis.DB(), "cluster", cfg.redis.IsCluster(), "prefix", cfg.prefix, "queues", strings.Join(names, ","),
		"enqueue_queue", cfg.firstQueue, "queue_shards", cfg.shards, "concurrency", cfg.concurrency, "lock_expiry", cfg.lockExpiry.String(),
		"sweep_interval", cfg.sweepInterval.String(), "stale_after", cfg.staleAfter.String(), "replica_acks", cfg.replicaAcks,
		"reactors", engine.Names())

	var wg sync.WaitGroup
	if cfg.sweepInterval > 0 {
		// The leader lock lives as long as a run lock: a replica killed
		// mid-pass holds up the others' sweeps no longer than its runs.
		sw, err := sweeper.New(sweeper.Config{Engine: engine, Queue: cfg.firstQueue, Interval: cfg.sweepInterval,
			StaleAfter: cfg.staleAfter, PausedRecheck: cfg.pausedRecheck, LeaderTTL: cfg.lockExpiry, Logger: log, Metrics: swMetrics})
		if err != nil {
			_ = w.Stop(context.Background())
			return fmt.Errorf("worker: start the sweeper: %w", err)
		}
		wg.Go(func() { _ = sw.Run(ctx) })
	}

	<-ctx.Done()
	log.Info("shutting down", "event", "worker.stopping", "timeout", cfg.shutdownTimeout.String())
	wg.Wait()
	// Stop waits ShutdownTimeout for running tasks, then cancels them; give
	// it a little beyond that before giving up on it.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.shutdownTimeout+5*time.Second)
	defer scancel()
	if err := w.Stop(sctx); err != nil {
		return fmt.Errorf("worker: stop: %w", err)
	}
	log.Info("worker stopped", "event", "worker.stopped")
	return nil
}
