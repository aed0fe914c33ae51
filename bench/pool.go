package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// Worker processes. With -procs 0 the workers run in this process; with
// -procs N the benchmark re-executes its own binary N times in worker mode
// (the environment variable below carries a JSON poolSpec), splitting the
// total concurrency between them. A child exits when told to (SIGTERM,
// SIGINT) and when its stdin closes, which happens however the parent
// ends, so no worker outlives the benchmark.

// workerEnv marks a worker subprocess; its value is the JSON poolSpec.
const workerEnv = "GOREACTOR_BENCH_WORKER"

const (
	kindReactor = "reactor" // goreactor's worker with the bench reactors
	kindBare    = "bare"    // a bare asynq server whose handler sleeps poolSpec.Latency (no-op at 0)

	readyLine     = "ready"
	readyTimeout  = 20 * time.Second
	stopTimeout   = 10 * time.Second
	shutdownGrace = 5 * time.Second
)

// poolSpec is what a worker process serves.
type poolSpec struct {
	Kind        string          `json:"kind"`
	Redis       redisurl.Target `json:"redis"`
	Prefix      string          `json:"prefix"`
	Queue       string          `json:"queue"`
	Concurrency int             `json:"concurrency"`
	Batches     []int           `json:"batches"`
	DoubleUndo  int             `json:"double_undo"`
	FakeBurst   int             `json:"fake_burst,omitempty"`
	// Latency is how long a bare asynq task's handler sleeps (kindBare
	// only; 0: a no-op handler).
	Latency time.Duration `json:"latency,omitempty"`
	// Traced gives the engine a recording tracer provider (every span
	// sampled, exported in batches to an exporter that drops them), to
	// measure what tracing costs.
	Traced bool `json:"traced,omitempty"`
	// Warm opens every Redis pool up front (see target.warm).
	Warm bool `json:"warm,omitempty"`
	// ProfileDir, when set, receives a CPU profile of the process.
	ProfileDir string `json:"profile_dir,omitempty"`
}

// serverConfig is the asynq configuration of every server in the benchmark,
// goreactor's and the bare baseline's alike: worker.New's.
func serverConfig(queue string, concurrency int) asynq.Config {
	d := worker.Config{}.WithDefaults()
	return asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{queue: 1},
		TaskCheckInterval:        d.TaskCheckInterval,
		DelayedTaskCheckInterval: d.DelayedTaskCheckInterval,
		ShutdownTimeout:          shutdownGrace,
		RetryDelayFunc:           worker.RetryDelay,
		IsFailure:                worker.IsFailure,
		LogLevel:                 asynq.WarnLevel,
	}
}

// server is one running set of workers, in this process or not.
type server interface {
	stop() error
}

// startPool starts spec.Concurrency workers: in this process when procs is
// 0, else in min(procs, concurrency) subprocesses.
// In-process workers count their enqueues in cnt.
func startPool(ctx context.Context, spec poolSpec, procs int, tgt *target, stderr io.Writer, cnt *burstCounter) (server, error) {
	if spec.Concurrency < 1 {
		return nil, fmt.Errorf("a pool of %d workers", spec.Concurrency)
	}
	if procs <= 0 {
		return startLocal(ctx, spec, tgt, stderr, cnt)
	}
	procs = min(procs, spec.Concurrency)
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary to start worker processes: %w", err)
	}
	g := &procGroup{}
	for i := range procs {
		s := spec
		s.Concurrency = spec.Concurrency / procs
		if i < spec.Concurrency%procs {
			s.Concurrency++
		}
		if err := g.spawn(ctx, exe, s, stderr); err != nil {
			return nil, errors.Join(err, g.stop())
		}
	}
	return g, nil
}

// ---- in this process ----

type localServer struct {
	stopFn func() error
}

func (l *localServer) stop() error { return l.stopFn() }

// startLocal serves spec in this process; its engine's enqueues are counted
// in cnt.
func startLocal(ctx context.Context, spec poolSpec, tgt *target, stderr io.Writer, cnt *burstCounter) (*localServer, error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rdb := tgt.client(2*spec.Concurrency + 4)
	switch spec.Kind {
	case kindBare:
		cfg := serverConfig(spec.Queue, spec.Concurrency)
		cfg.Logger = asynqLog{log}
		srv := asynq.NewServerFromRedisClient(rdb, cfg)
		latency := spec.Latency
		if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error { return sleep(ctx, latency) })); err != nil {
			_ = rdb.Close()
			return nil, fmt.Errorf("start the bare asynq server: %w", err)
		}
		return &localServer{stopFn: func() error { srv.Shutdown(); return rdb.Close() }}, nil
	case kindReactor:
		h, err := newHost(ctx, spec, rdb, rdb, nil, cnt)
		if err != nil {
			_ = rdb.Close()
			return nil, err
		}
		w := worker.New(h.engine, rdb, worker.Config{Concurrency: spec.Concurrency, Queues: map[string]int{spec.Queue: 1},
			ShutdownTimeout: shutdownGrace, Logger: log})
		if err := w.Start(ctx); err != nil {
			h.close()
			_ = rdb.Close()
			return nil, fmt.Errorf("start the worker: %w", err)
		}
		return &localServer{stopFn: func() error {
			sctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
			defer cancel()
			err := w.Stop(sctx)
			h.close()
			return errors.Join(err, rdb.Close())
		}}, nil
	}
	_ = rdb.Close()
	return nil, fmt.Errorf("unknown worker kind %q", spec.Kind)
}

// host is an engine with the bench reactors registered, and the world
// their steps record into.
type host struct {
	engine *reactor.Engine
	world  *world
	inline *reactor.Definition
	fanOut map[int]*reactor.Definition
	// approval is the -interrupts run's one-interrupt reactor.
	approval *reactor.Definition
	enqueue  *worker.Client
	books    redis.UniversalClient
	tracer   *sdktrace.TracerProvider // with poolSpec.Traced
}

// newHost builds an engine on engineRdb whose Enqueuer (asynq's client)
// uses asynqRdb and counts every map task in cnt; books, when nil, is a
// new client of its own.
func newHost(ctx context.Context, spec poolSpec, engineRdb, asynqRdb, books redis.UniversalClient, cnt *burstCounter) (*host, error) {
	ownBooks := books == nil
	if ownBooks {
		tgt, err := newTarget(spec.Redis, "")
		if err != nil {
			return nil, err
		}
		tgt.warm = spec.Warm
		books = tgt.client(spec.Concurrency + 4)
	}
	w := &world{rdb: books, doubleUndo: spec.DoubleUndo, fakeBurst: spec.FakeBurst, bursts: cnt}
	inline, fanOut, err := w.definitions(spec.Batches)
	if err != nil {
		return nil, err
	}
	client := worker.NewClient(asynqRdb, spec.Queue)
	cfg := reactor.Config{Client: engineRdb, Prefix: spec.Prefix, Enqueuer: countingEnqueuer{inner: client, c: cnt},
		Logger: slog.New(slog.DiscardHandler)}
	var tracer *sdktrace.TracerProvider
	if spec.Traced {
		tracer = sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(dropSpans{}))
		cfg.TracerProvider = tracer
	}
	e, err := reactor.NewEngine(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	approval := approvalDefinition()
	defs := []*reactor.Definition{inline, approval}
	for _, d := range fanOut {
		defs = append(defs, d)
	}
	if err := e.Register(defs...); err != nil {
		return nil, err
	}
	h := &host{engine: e, world: w, inline: inline, fanOut: fanOut, approval: approval, enqueue: client, books: books, tracer: tracer}
	if !ownBooks {
		h.books = nil // not ours to close
	}
	return h, nil
}

func (h *host) close() {
	if h.books != nil {
		_ = h.books.Close()
	}
	if h.tracer != nil {
		_ = h.tracer.Shutdown(context.Background())
	}
}

// asynqLog routes asynq's logs to slog.
type asynqLog struct{ l *slog.Logger }

func (a asynqLog) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLog) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLog) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLog) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLog) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }

// ---- subprocesses ----

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed once the process has been waited for
	err   error         // its exit status, once done
}

// liveChildren counts worker processes started and not yet waited for.
var liveChildren atomic.Int32

// procGroup is the worker subprocesses of one pool.
type procGroup struct {
	mu       sync.Mutex
	children []*child
}

// spawn starts one worker process and waits until it reports ready.
func (g *procGroup) spawn(ctx context.Context, exe string, spec poolSpec, stderr io.Writer) error {
	enc, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(enc))
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start a worker process: %w", err)
	}
	liveChildren.Add(1)
	c := &child{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	g.mu.Lock()
	g.children = append(g.children, c)
	g.mu.Unlock()

	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		line := ""
		if sc.Scan() {
			line = sc.Text()
		}
		ready <- line
		_, _ = io.Copy(io.Discard, stdout) // until it exits
		c.err = cmd.Wait()
		liveChildren.Add(-1)
		close(c.done)
	}()
	select {
	case line := <-ready:
		if line != readyLine {
			<-c.done
			return fmt.Errorf("worker process %d did not start (exit: %v; its stderr is above)", cmd.Process.Pid, c.err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(readyTimeout):
		return fmt.Errorf("worker process %d not ready after %v", cmd.Process.Pid, readyTimeout)
	}
}

// stop asks every child to stop (stdin closed, SIGTERM), waits for them, and
// kills those still running after stopTimeout. It is idempotent.
func (g *procGroup) stop() error {
	g.mu.Lock()
	children := g.children
	g.children = nil
	g.mu.Unlock()
	for _, c := range children {
		_ = c.stdin.Close()
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(stopTimeout)
	var errs []error
	for _, c := range children {
		select {
		case <-c.done:
		case <-deadline:
			_ = c.cmd.Process.Kill()
			<-c.done
			errs = append(errs, fmt.Errorf("worker process %d did not stop in %v: killed", c.cmd.Process.Pid, stopTimeout))
		}
		if c.err != nil && !isSignalExit(c.err) {
			errs = append(errs, fmt.Errorf("worker process %d: %w", c.cmd.Process.Pid, c.err))
		}
	}
	return errors.Join(errs...)
}

func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

// workerMain is the whole life of a worker subprocess: serve spec until
// told to stop or until the parent goes away (stdin closes). It returns the
// exit status.
func workerMain(specJSON string, stdin io.Reader, stdout, stderr io.Writer) int {
	var spec poolSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintf(stderr, "bench worker: bad %s: %v\n", workerEnv, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, stdin) // EOF: the parent closed it, or died
		cancel()
	}()
	if spec.ProfileDir != "" {
		stop, err := startProfile(filepath.Join(spec.ProfileDir, fmt.Sprintf("worker-%s-%d.pprof", spec.Kind, os.Getpid())))
		if err != nil {
			fmt.Fprintf(stderr, "bench worker: %v\n", err)
			return 1
		}
		defer stop()
	}
	tgt, err := newTarget(spec.Redis, "")
	if err != nil {
		fmt.Fprintf(stderr, "bench worker: %v\n", err)
		return 1
	}
	tgt.warm = spec.Warm
	cnt := newBurstCounter()
	srv, err := startLocal(ctx, spec, tgt, stderr, cnt)
	if err != nil {
		fmt.Fprintf(stderr, "bench worker: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, readyLine)
	<-ctx.Done()
	if err := srv.stop(); err != nil {
		fmt.Fprintf(stderr, "bench worker: stop: %v\n", err)
		return 1
	}
	if spec.Kind == kindReactor {
		// Every handler has returned: hand the per-action counts to the
		// parent, in one command.
		rdb := tgt.client(1)
		defer rdb.Close()
		pctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		if err := cnt.publish(pctx, rdb, spec.Prefix); err != nil {
			fmt.Fprintf(stderr, "bench worker: publish the burst counts: %v\n", err)
			return 1
		}
	}
	return 0
}

// splitList parses "1,2,5" style flags.
func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// dropSpans is a span exporter that drops what it is given: the traced
// benchmark pays for recording and batching spans, not for a collector.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }
