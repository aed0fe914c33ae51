// Command dashboard serves goreactor's dashboard: the HTML status view, the
// JSON API over the run indexes and the maps (docs/dashboard-api.md) and
// /metrics. It needs no
// reactor definitions: it reads Redis, and its actions (undo, cancel,
// retry) are carried out by the workers.
//
//	dashboard -redis redis://localhost:6379/0 -addr 127.0.0.1:8080
//
// Every flag falls back to an environment variable, then to its default:
//
//	-addr           GOREACTOR_DASHBOARD_ADDR  127.0.0.1:8080 (loopback: put a proxy in front to expose it)
//	-redis          REDIS_URL                 redis://localhost:6379/0 (one Redis)
//	-redis-cluster  REDIS_CLUSTER_ADDRS       "" (a Redis Cluster's seeds; not with -redis: see worker.Main)
//	-prefix         GOREACTOR_PREFIX          goreactor
//	-queue          GOREACTOR_QUEUE           goreactor (the workers' queue list, name[:priority],...)
//	-queue-shards   GOREACTOR_QUEUE_SHARDS    1 (the workers' shard queues of the first -queue, reported after it)
//	-queues         GOREACTOR_QUEUES          "" (the queues /api/stats reports: the -queue list; "*" for
//	                                              every asynq queue in the Redis)
//	-log-level      GOREACTOR_LOG_LEVEL       info
//	-version                                  print "goreactor <version>" and exit
//
// -prefix and -queue are the one configuration every goreactor binary and
// library default reads (docs/configuration.md): the dashboard started in
// the workers' environment finds their runs and sends its actions where
// they are served. Actions on a run go to the queue the run recorded; on a
// run that recorded none (an in-process run), to the first -queue. The
// overview and /api/stats report the listed queues, each marked served or
// not, and warn about one no worker serves; an action queued where no
// worker serves answers 202 with a warning saying so.
//
// -control-queue (GOREACTOR_CONTROL_QUEUE) is the deprecated name of
// -queue: it still works, with a warning in the log; -queue wins when both
// are set.
//
// The actions need a token, read only from the environment so that it never
// shows in a process list: GOREACTOR_DASHBOARD_TOKEN. Without it they are
// refused (403) with a message saying how to enable them; with it a request
// must carry "Authorization: Bearer <token>".
//
// SIGTERM or SIGINT stops accepting connections and lets the requests in
// progress finish (up to 10 s). Exit status: 0, 1 when Redis does not answer
// at startup (or a cluster's state is not ok) or the address cannot be
// listened on, 2 for a bad command line (a URL and cluster seeds both
// named included).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/redislog"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

const (
	pingTimeout     = 5 * time.Second
	shutdownTimeout = 10 * time.Second
)

type config struct {
	addr    string
	redis   *redisurl.Endpoint
	prefix  string
	queues  []string // what /api/stats reports
	shards  int      // -queue-shards: the workers' shards of control
	control string   // the first of -queue: actions on runs without a queue
	// deprecated names the deprecated settings used, for a warning.
	deprecated []string
	token      string
	hosts      []string          // -allowed-hosts
	operators  map[string]string // -operators-file: token -> name
	opHeader   string            // -operator-header
	logLevel   slog.Level
	version    bool          // -version: print the version, nothing else
	stallAfter time.Duration // -stall-after
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var (
		cfg                          config
		target                       redisurl.Target
		level, queues, queue, legacy string
		hosts, operatorsFile         string
	)
	env := envflag.New(getenv)
	fs := flag.NewFlagSet("dashboard", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.addr, "addr", env.String("GOREACTOR_DASHBOARD_ADDR", "127.0.0.1:8080"),
		"host:port to serve on (loopback by default); env GOREACTOR_DASHBOARD_ADDR")
	envflag.Connection(fs, env, &target, &cfg.prefix)
	envflag.Queue(fs, env, &queue, "the workers'; actions on runs that recorded no queue go to the first")
	envflag.QueueShards(fs, env, &cfg.shards, "the workers'; /api/stats reports every shard queue")
	fs.StringVar(&queues, "queues", env.String("GOREACTOR_QUEUES", ""),
		"comma-separated asynq queues /api/stats reports; empty: the -queue list; \"*\": every queue in the Redis; env GOREACTOR_QUEUES")
	fs.StringVar(&legacy, "control-queue", "",
		"DEPRECATED: use -queue (GOREACTOR_QUEUE); the same setting under its old name; env GOREACTOR_CONTROL_QUEUE")
	fs.StringVar(&hosts, "allowed-hosts", env.String("GOREACTOR_DASHBOARD_ALLOWED_HOSTS", ""),
		"comma-separated host names the dashboard answers to besides IP addresses and localhost (\"*.example.com\" for subdomains, \"*\" for any); "+
			"other Host headers are refused, against DNS rebinding; env GOREACTOR_DASHBOARD_ALLOWED_HOSTS")
	fs.StringVar(&operatorsFile, "operators-file", env.String("GOREACTOR_DASHBOARD_OPERATORS_FILE", ""),
		"a file of \"<name> <token>\" lines: each token enables the actions, and the audit records its holder's name with each request; env GOREACTOR_DASHBOARD_OPERATORS_FILE")
	fs.StringVar(&cfg.opHeader, "operator-header", env.String("GOREACTOR_DASHBOARD_OPERATOR_HEADER", ""),
		"a header your authenticating proxy sets to the person's name (X-Forwarded-User); trusted as is, and enough to act when no token is set: "+
			"only when nothing else can reach the dashboard; env GOREACTOR_DASHBOARD_OPERATOR_HEADER")
	fs.DurationVar(&cfg.stallAfter, "stall-after", env.Duration("GOREACTOR_DASHBOARD_STALL_AFTER", dashboard.DefaultStallAfter),
		"how long a live run may go without progress before the dashboard marks it stalled, with why, and offers re-dispatch; "+
			"env GOREACTOR_DASHBOARD_STALL_AFTER")
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
	// The deprecated -control-queue and GOREACTOR_CONTROL_QUEUE count only
	// where -queue and GOREACTOR_QUEUE are not set.
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case set["control-queue"]:
		cfg.deprecated = append(cfg.deprecated, "-control-queue")
		if !set["queue"] {
			queue = legacy
		}
	case getenv("GOREACTOR_CONTROL_QUEUE") != "":
		cfg.deprecated = append(cfg.deprecated, "GOREACTOR_CONTROL_QUEUE")
		if !set["queue"] && getenv(envconfig.QueueVar) == "" {
			queue = getenv("GOREACTOR_CONTROL_QUEUE")
		}
	}
	names, err := envconfig.QueueNames(queue)
	if err != nil {
		return cfg, fmt.Errorf("-queue: %w", err)
	}
	cfg.control, cfg.queues = names[0], names
	if strings.TrimSpace(queues) != "" {
		cfg.queues = nil
		for _, q := range strings.Split(queues, ",") {
			if q = strings.TrimSpace(q); q != "" {
				cfg.queues = append(cfg.queues, q)
			}
		}
		if slices.Contains(cfg.queues, "*") && len(cfg.queues) > 1 {
			return cfg, fmt.Errorf("-queues %q: \"*\" (every asynq queue) stands alone", queues)
		}
	}
	if err := envflag.CheckQueueShards(cfg.shards); err != nil {
		return cfg, err
	}
	if cfg.stallAfter <= 0 {
		return cfg, fmt.Errorf("-stall-after %s: want a positive duration (like 2m)", cfg.stallAfter)
	}
	if _, _, err := net.SplitHostPort(cfg.addr); err != nil {
		return cfg, fmt.Errorf("-addr %q: want host:port (like 127.0.0.1:8080): %v", cfg.addr, err)
	}
	if cfg.prefix == "" {
		return cfg, errors.New("-prefix: must not be empty")
	}
	cfg.token = getenv("GOREACTOR_DASHBOARD_TOKEN")
	if operatorsFile != "" {
		f, err := os.Open(operatorsFile)
		if err != nil {
			return cfg, fmt.Errorf("-operators-file: %w", err)
		}
		cfg.operators, err = dashboard.ParseOperators(f)
		_ = f.Close()
		if err != nil {
			return cfg, fmt.Errorf("-operators-file %s: %w", operatorsFile, err)
		}
	}
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			cfg.hosts = append(cfg.hosts, h)
		}
	}
	return cfg, nil
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dashboard: %v\n", err)
		return 2
	}
	if cfg.version {
		fmt.Fprintln(stdout, version.Line())
		return 0
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.logLevel}))
	slog.SetDefault(log)
	redislog.Set(log)
	for _, d := range cfg.deprecated {
		log.Warn(d+" is deprecated: use -queue or GOREACTOR_QUEUE, the queue setting every goreactor binary reads",
			"event", "dashboard.deprecated", "setting", d)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serve(ctx, cfg, log, nil); err != nil {
		log.Error(err.Error(), "event", "dashboard.exit")
		return 1
	}
	return 0
}

// serve serves the dashboard until ctx ends, then shuts the server down
// gracefully. ready, if set, receives the address listened on.
func serve(ctx context.Context, cfg config, log *slog.Logger, ready chan<- string) error {
	rdb, err := cfg.redis.Dial(ctx, pingTimeout)
	if err != nil {
		return err
	}
	defer rdb.Close()
	h, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: cfg.prefix, Token: cfg.token, Queues: cfg.queues,
		ControlQueue: cfg.control, QueueShards: cfg.shards, AllowedHosts: cfg.hosts, StallAfter: cfg.stallAfter,
		Operators: cfg.operators, OperatorHeader: cfg.opHeader, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute}
	log.Info("dashboard started", "event", "dashboard.started", "addr", ln.Addr().String(), "redis", cfg.redis.Addr(), "db", cfg.redis.DB(),
		"cluster", cfg.redis.IsCluster(),
		"prefix", cfg.prefix, "queue", cfg.control, "queue_shards", cfg.shards, "stats_queues", strings.Join(cfg.queues, ","), "actions", cfg.token != "" || len(cfg.operators) > 0 || cfg.opHeader != "", "operators", len(cfg.operators))
	if cfg.token == "" && len(cfg.operators) == 0 && cfg.opHeader == "" {
		log.Info("dashboard actions are disabled: set GOREACTOR_DASHBOARD_TOKEN to enable undo, cancel and retry", "event", "dashboard.actions_disabled")
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down: %w", err)
	}
	log.Info("dashboard stopped", "event", "dashboard.stopped")
	return nil
}
