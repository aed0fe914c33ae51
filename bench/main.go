// Command bench measures what goreactor's fan-out map buys and costs.
//
//	go run ./bench                                  # the default run: a table
//	go run ./bench -json                            # the same, one JSON object
//	go run ./bench -sweep -plot docs/bench-sweep.svg
//	go run ./bench -heap 10000,100000               # owner heap, 10k vs 100k elements
//	go run ./bench -interrupts 10000                # 10k paused runs: idle cost, then continue them all
//	go run ./bench -limited 10000                   # a 10k fan-out map under a 20-at-a-time step limit
//	go run ./bench -fair 10000                      # a small tenant's map beside a 10k one under one fair limit
//
// The default run rolls back the same reactor twice on the same Redis: with
// an inline map and with a fan-out map over -elements items, each followed
// by a step that fails, so every element is undone (an undo is modelled as
// -undo-latency of work). Each rollback is timed from the failure to the
// run's final status. In the same run it measures bare asynq no-op
// throughput on a server configured like goreactor's workers, fan-out
// element throughput with no latency and one batch (B >= elements), the
// Redis round trips goreactor adds per element (a go-redis hook on each
// client) and Redis commands per element (INFO commandstats deltas),
// forward and rollback, and this process's heap during the rollbacks.
// Against bare asynq (a plain asynq client and server with the same
// workers, whose handler only sleeps) it times the same tasks: the
// rollback's undos and a forward fan-out whose elements do -work-latency
// of work (fanout_vs_bare_asynq_rollback and _forward), and it repeats the
// zero-latency throughput -rounds times, goreactor and bare asynq
// alternated, reporting medians, min/max and the ratio of medians. -heap
// runs each size on fresh keys and reports Redis persistence activity
// (writes, saves, AOF rewrites) during each run.
//
// It checks what it measures: every element is undone exactly once on both
// sides (each undo is recorded with HINCRBY in Redis, so undos in worker
// processes count), both runs end failed with their rollback complete, and
// back pressure holds: no action (the handling of one task, or the owner's
// start) enqueues more than -batch tasks, counted per action in every
// process, and no more than -batch + -batch/2 tasks are seen waiting in the
// queue at once. A wrong result exits with status 1, and so does a missed
// performance target, once the whole report is printed; -no-fail reports
// missed targets without failing.
//
// -limited N runs one fan-out map of N elements whose element step has a
// concurrency limit of -limit and does -element-ms of work, on -workers
// slots in -worker-sets worker.Workers in this process, and reports its
// rate against the ideal (limit x 1000 / element-ms) and the most holders
// at once, in Redis and in-process; more than the limit is a wrong result.
//
// Redis: -redis or REDIS_URL (one Redis), or -redis-cluster or
// REDIS_CLUSTER_ADDRS (a Redis Cluster's seeds, as worker.Main reads them),
// else 127.0.0.1:6379 if it answers, else an embedded miniredis (whose figures say little; GOREACTOR_EMBEDDED=1 forces
// it, as for cmd/demo). Keys live under a fresh
// prefix (goreactor-bench:<id>) and queue (goreactor-bench-<id>), deleted
// at exit; nothing else is touched. With -procs N the workers are N
// subprocesses of this binary sharing -workers; they are stopped at exit,
// on errors and on Ctrl-C, and exit by themselves if this process dies.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/envflag"
	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
)

func main() {
	if spec := os.Getenv(workerEnv); spec != "" {
		os.Exit(workerMain(spec, os.Stdin, os.Stdout, os.Stderr))
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err == nil && cfg.version {
		fmt.Println(version.Line())
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C ends the process at once
	}()
	err = run(ctx, cfg, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: FAILED: %v\n", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	elements    int
	workers     int
	procs       int
	batch       int
	undoLatency time.Duration
	workLatency time.Duration // each element's forward work in the forward comparison with bare asynq
	rounds      int           // zero-latency throughput rounds, goreactor and bare asynq alternated
	redis       redisurl.Target
	json        bool
	plot        string
	sweep       bool
	heap        []int
	cpuProfile  string
	noFail      bool // a missed target is reported, the exit status stays 0
	version     bool

	sweepWorkers []int // default 1, 2, 5, 10, 20, 50

	interrupts int           // > 0: the -interrupts run, over that many paused runs
	continuers int           // goroutines continuing them (and enqueueing bare asynq's tasks)
	idleWindow time.Duration // the idle window of the -interrupts run

	limited     int           // > 0: the -limited run, a fan-out map of that many elements
	limit       int           // its element step's concurrency limit
	elementWork time.Duration // each element's work (-element-ms)
	workerSets  int           // worker.Worker instances sharing -workers in the -limited run

	fair       int // > 0: the -fair run, the big tenant's map of that many elements
	fairSmall  int // the small tenant's elements
	fairRounds int // small maps timed alone, then under load

	// Not flags: tests set them.
	doubleUndo int // >= 0: that element's undo is recorded twice
	fakeBurst  int // > 0: element 0's action also notes this many fake enqueues
	limitSlack int // the -limited run's step declares -limit + limitSlack: the check must catch it
}

var defaultSweep = []int{1, 2, 5, 10, 20, 50}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	cfg := config{sweepWorkers: defaultSweep, doubleUndo: -1}
	var heap, sweepWorkers string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.elements, "elements", 2000, "elements in each map")
	fs.IntVar(&cfg.workers, "workers", 10, "total worker concurrency (tasks at once, over all worker processes)")
	fs.IntVar(&cfg.procs, "procs", 1, "worker subprocesses sharing -workers (0: workers run in this process)")
	fs.IntVar(&cfg.batch, "batch", 50, "the fan-out map's batch size B (most tasks one action enqueues)")
	fs.DurationVar(&cfg.undoLatency, "undo-latency", 10*time.Millisecond, "work done by each element's undo, modelled as latency")
	fs.DurationVar(&cfg.workLatency, "work-latency", 10*time.Millisecond,
		"work done by each element's forward step in the forward comparison with bare asynq (the rollback runs' forward steps do none)")
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds of the zero-latency throughput, each goreactor then bare asynq, reported as median and min/max")
	// Neither named: 127.0.0.1:6379 if it answers, then an embedded Redis.
	envflag.Redis(fs, envflag.New(os.Getenv), &cfg.redis, "")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON object instead of the table (and no progress)")
	fs.StringVar(&cfg.plot, "plot", "", "with -sweep: write the speedup chart to this SVG file")
	fs.BoolVar(&cfg.sweep, "sweep", false, "repeat the fan-out rollback over workers 1, 2, 5, 10, 20, 50 and report speedup against the ideal")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write CPU profiles of this process and of each worker process into this directory")
	fs.StringVar(&sweepWorkers, "sweep-workers", "1,2,5,10,20,50", "the worker counts of -sweep")
	fs.BoolVar(&cfg.noFail, "no-fail", false, "report missed performance targets without failing (a wrong result still exits 1)")
	fs.BoolVar(&cfg.version, "version", false, "print goreactor's version and exit")
	fs.IntVar(&cfg.interrupts, "interrupts", 0,
		"pause this many runs at an interrupt, measure what they cost idle (worker slots, Redis commands, a sweeper pass), then continue them all (docs/bench.md)")
	fs.IntVar(&cfg.continuers, "continuers", 8, "with -interrupts: goroutines that continue the runs (and enqueue bare asynq's tasks)")
	fs.DurationVar(&cfg.idleWindow, "idle-window", 5*time.Second, "with -interrupts: how long the paused runs are watched idle")
	fs.IntVar(&cfg.limited, "limited", 0,
		"run a fan-out map of this many elements whose element step has a concurrency limit of -limit, on -workers slots, against the ideal rate (docs/bench.md)")
	fs.IntVar(&cfg.limit, "limit", 20, "with -limited: the element step's concurrency limit")
	elementMS := fs.Int("element-ms", 10, "with -limited: each element's work in milliseconds")
	fs.IntVar(&cfg.workerSets, "worker-sets", 5, "with -limited: worker.Worker instances (each with its engine and Redis client) in this process sharing -workers")
	fs.IntVar(&cfg.fair, "fair", 0,
		"two tenants under one fair-shared limit of -limit (10 in this mode): a big map of this many elements, and a small tenant's map timed alone and under it, against a plain limit (docs/bench.md)")
	fs.IntVar(&cfg.fairSmall, "fair-small", 10, "with -fair: the small tenant's elements")
	fs.IntVar(&cfg.fairRounds, "fair-rounds", 5, "with -fair: small maps timed alone, then as many under the big one")
	fs.StringVar(&heap, "heap", "", "compare the owner's heap during rollbacks of these sizes (e.g. 10000,100000), no undo latency")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go run ./bench [flags]   (see the package comment, or docs/bench.md)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if cfg.version {
		return cfg, nil
	}
	cfg.elementWork = time.Duration(*elementMS) * time.Millisecond
	if cfg.limited > 0 || cfg.fair > 0 {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["workers"] {
			cfg.workers = 50 // the limited runs' default: more slots than the limit
		}
		if cfg.fair > 0 && !set["limit"] {
			cfg.limit = 10 // the fairness figure: one 10-at-a-time limit
		}
		if cfg.fair > 0 && !set["batch"] {
			// A map under a limit gains nothing from dispatching further
			// ahead than the limit: its elements would only wait in the
			// queue, ahead of the other tenant's (docs/limits.md).
			cfg.batch = cfg.limit
		}
	}
	cfg.sweepWorkers = nil
	for _, f := range splitList(sweepWorkers) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return cfg, fmt.Errorf("-sweep-workers %q: want positive worker counts separated by commas", sweepWorkers)
		}
		cfg.sweepWorkers = append(cfg.sweepWorkers, n)
	}
	for _, f := range splitList(heap) {
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return cfg, fmt.Errorf("-heap %q: want positive sizes separated by commas, like 10000,100000", heap)
		}
		cfg.heap = append(cfg.heap, n)
	}
	return cfg, cfg.validate()
}

func (c config) validate() error {
	switch {
	case c.elements < 2:
		return fmt.Errorf("-elements %d: need at least 2", c.elements)
	case c.workers < 1:
		return fmt.Errorf("-workers %d: need at least 1", c.workers)
	case c.procs < 0:
		return fmt.Errorf("-procs %d: cannot be negative", c.procs)
	case c.batch < 1:
		return fmt.Errorf("-batch %d: need at least 1", c.batch)
	case c.undoLatency < 0:
		return fmt.Errorf("-undo-latency %v: cannot be negative", c.undoLatency)
	case c.workLatency < 0:
		return fmt.Errorf("-work-latency %v: cannot be negative", c.workLatency)
	case c.rounds < 1:
		return fmt.Errorf("-rounds %d: need at least 1", c.rounds)
	case c.plot != "" && !c.sweep:
		return errors.New("-plot charts the sweep: add -sweep")
	case c.sweep && len(c.heap) > 0:
		return errors.New("-sweep and -heap are separate runs: choose one")
	case c.sweep && len(c.sweepWorkers) == 0:
		return errors.New("-sweep-workers: give at least one worker count")
	case c.interrupts < 0:
		return fmt.Errorf("-interrupts %d: cannot be negative", c.interrupts)
	case c.interrupts > 0 && (c.sweep || len(c.heap) > 0):
		return errors.New("-interrupts is a run of its own: not with -sweep or -heap")
	case c.interrupts > 0 && (c.continuers < 1 || c.idleWindow <= 0):
		return errors.New("-interrupts needs -continuers >= 1 and a positive -idle-window")
	case c.limited < 0:
		return fmt.Errorf("-limited %d: cannot be negative", c.limited)
	case c.limited > 0 && (c.sweep || len(c.heap) > 0 || c.interrupts > 0):
		return errors.New("-limited is a run of its own: not with -sweep, -heap or -interrupts")
	case c.limited > 0 && (c.limit < 1 || c.elementWork <= 0 || c.workerSets < 1):
		return errors.New("-limited needs -limit >= 1, -element-ms >= 1 and -worker-sets >= 1")
	case c.fair < 0:
		return fmt.Errorf("-fair %d: cannot be negative", c.fair)
	case c.fair > 0 && (c.sweep || len(c.heap) > 0 || c.interrupts > 0 || c.limited > 0):
		return errors.New("-fair is a run of its own: not with -sweep, -heap, -interrupts or -limited")
	case c.fair > 0 && (c.limit < 1 || c.elementWork <= 0 || c.workerSets < 1 || c.fairSmall < 1 || c.fairRounds < 1):
		return errors.New("-fair needs -limit >= 1, -element-ms >= 1, -worker-sets >= 1, -fair-small >= 1 and -fair-rounds >= 1")
	case len(c.heap) == 1:
		return errors.New("-heap compares sizes: give at least two, like 10000,100000")
	}
	return nil
}

// errChecks is returned when a measured result was wrong.
var errChecks = errors.New("correctness checks failed (listed above)")

// missedError is returned, after the report, when performance targets were
// missed (and -no-fail was not given).
type missedError struct{ targets []string }

func (e *missedError) Error() string {
	return fmt.Sprintf("performance target(s) missed: %s (-no-fail reports them without failing)", strings.Join(e.targets, ", "))
}

// targeted is a report with performance targets: missed names those it
// missed that count against the run.
type targeted interface{ missed() []string }

// bench is one benchmark run.
type bench struct {
	cfg   config
	tgt   *target
	admin redis.UniversalClient // checks, sampling, INFO, cleanup
	owner redis.UniversalClient // the owner engine's
	host  *host                 // the owner engine: runs start here
	// prefix and queue are where runs keep their keys and tasks; a
	// measurement on fresh keys (onFreshKeys) switches them for its length.
	prefix string
	queue  string
	queues []string // every queue used, for cleanup; [0] is the main queue
	bar    *bar
	log    *slog.Logger
	stderr io.Writer

	// bursts counts the tasks each action of this process enqueues (the
	// owner's, and the workers' with -procs 0).
	bursts *burstCounter

	mu       sync.Mutex
	failures []string
}

func (b *bench) fail(msg string) {
	b.mu.Lock()
	b.failures = append(b.failures, msg)
	b.mu.Unlock()
}

// run is the whole benchmark; its report goes to stdout, progress and
// warnings to stderr.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (err error) {
	began := time.Now()
	if cfg.cpuProfile != "" {
		stop, err := startProfile(filepath.Join(cfg.cpuProfile, "owner.pprof"))
		if err != nil {
			return err
		}
		defer stop()
	}
	tgt, err := pick(ctx, cfg.redis)
	if err != nil {
		return err
	}
	defer tgt.close()
	tgt.warm = len(cfg.heap) > 0
	id := shortID()
	b := &bench{cfg: cfg, tgt: tgt, prefix: "goreactor-bench:" + id, queue: "goreactor-bench-" + id, queues: []string{"goreactor-bench-" + id},
		bar: newBar(stderr, !cfg.json), stderr: stderr, bursts: newBurstCounter(),
		log: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	pool := 2*cfg.workers + 8
	b.admin = tgt.client(8)
	defer b.admin.Close()
	b.owner = tgt.client(pool)
	defer b.owner.Close()
	if !tgt.embedded {
		defer func() {
			if cerr := cleanup(b.admin, b.prefix, b.queues); cerr != nil {
				err = errors.Join(err, fmt.Errorf("delete the benchmark's keys (prefix %s): %w", b.prefix, cerr))
			}
		}()
	}
	batches := []int{cfg.batch, cfg.elements}
	if b.host, err = newHost(ctx, b.spec(kindReactor, batches), b.owner, b.owner, nil, b.bursts); err != nil {
		return err
	}
	defer b.host.close()

	b.bar.note("goreactor bench: redis %s; keys %s*, queue %s; %s", tgt.desc, b.prefix, b.queue, machine())
	var out any
	switch {
	case len(cfg.heap) > 0:
		out, err = b.heapCompare(ctx)
	case cfg.sweep:
		out, err = b.sweepRun(ctx)
	case cfg.interrupts > 0:
		out, err = b.interruptRun(ctx)
	case cfg.limited > 0:
		out, err = b.limitedRun(ctx)
	case cfg.fair > 0:
		out, err = b.fairRun(ctx)
	default:
		out, err = b.defaultRun(ctx)
	}
	if err != nil {
		return err
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		out.(printer).print(stdout)
		fmt.Fprintf(stdout, "\n(%s in all)\n", time.Since(began).Round(100*time.Millisecond))
	}
	var errs []error
	if len(b.failures) > 0 {
		for _, f := range b.failures {
			fmt.Fprintf(stderr, "bench: WRONG RESULT: %s\n", f)
		}
		errs = append(errs, errChecks)
	}
	if err := missedTargets(out, cfg.noFail); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// missedTargets is a *missedError naming the targets out missed, or nil
// when it met them, has none, or noFail is set.
func missedTargets(out any, noFail bool) error {
	t, ok := out.(targeted)
	if !ok || noFail {
		return nil
	}
	if m := t.missed(); len(m) > 0 {
		return &missedError{targets: m}
	}
	return nil
}

type printer interface{ print(io.Writer) }

// spec is a worker pool serving this run's reactors (or bare tasks) on the
// main queue.
func (b *bench) spec(kind string, batches []int) poolSpec {
	return poolSpec{Kind: kind, Redis: b.tgt.redis, Prefix: b.prefix, Queue: b.queue, Concurrency: b.cfg.workers,
		Batches: batches, DoubleUndo: b.cfg.doubleUndo, FakeBurst: b.cfg.fakeBurst, ProfileDir: b.cfg.cpuProfile, Warm: b.tgt.warm}
}

// withPool runs f while workers serve spec.
func (b *bench) withPool(ctx context.Context, spec poolSpec, procs int, f func() error) (err error) {
	srv, err := startPool(ctx, spec, procs, b.tgt, b.stderr, b.bursts)
	if err != nil {
		return err
	}
	defer func() {
		if serr := srv.stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop workers: %w", serr))
		}
	}()
	return f()
}

// machine describes where the benchmark runs.
func machine() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s, %d CPUs, %s, host %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), host)
}

// startProfile writes a CPU profile to path until the returned function is
// called.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}, nil
}

func ms(d time.Duration) float64      { return float64(d) / float64(time.Millisecond) }
func seconds(d time.Duration) float64 { return d.Seconds() }
