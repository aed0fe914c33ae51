package reactortest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// DefaultTimeout bounds Run and Wait when their context has no deadline.
const DefaultTimeout = 30 * time.Second

// Harness is one test's goreactor deployment in miniature: an engine, a
// worker client and an in-process worker, on a real Redis, isolated from
// every other test.
type Harness struct {
	// Engine runs, enqueues and inspects runs. Its Enqueuer is Client.
	Engine *reactor.Engine
	// Client enqueues on Queue.
	Client *worker.Client
	// Worker executes the runs enqueued on Queue with Engine. It is
	// started by New and stopped in t.Cleanup; stopping it earlier (to
	// leave runs pending) is allowed.
	Worker *worker.Worker
	// Redis is the client everything uses. It is closed in t.Cleanup.
	Redis redis.UniversalClient
	// Prefix is the engine's key prefix, unique to the test.
	Prefix string
	// Queue is the asynq queue, unique to the test.
	Queue string

	timeout time.Duration
}

// Options adjust a Harness. The zero value is what New uses.
type Options struct {
	// Engine adjusts the engine's configuration (Hooks, Middleware,
	// LockExpiry, Logger...). Client, Prefix and Enqueuer are the
	// harness's and are set again afterwards. The default Logger discards.
	Engine func(*reactor.Config)
	// Worker adjusts the worker's configuration. Queues is the harness's
	// and is set again afterwards. The default Logger discards and the
	// default ShutdownTimeout is 5 s.
	Worker func(*worker.Config)
	// Timeout bounds Run and Wait when their context has no deadline.
	// Default DefaultTimeout.
	Timeout time.Duration
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// New returns a Harness with defs registered and its worker started. It
// fails the test if Redis cannot be reached.
func New(t testing.TB, defs ...*reactor.Definition) *Harness {
	t.Helper()
	return NewWithOptions(t, Options{}, defs...)
}

// NewWithOptions is New with Options.
func NewWithOptions(t testing.TB, o Options, defs ...*reactor.Definition) *Harness {
	t.Helper()
	// Cleanups run last registered first: the worker stops before its
	// queue and keys are deleted and before the Redis client closes.
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)

	cfg := reactor.Config{Logger: discard}
	if o.Engine != nil {
		o.Engine(&cfg)
	}
	cfg.Client, cfg.Prefix, cfg.Enqueuer = rdb, prefix, client
	engine, err := reactor.NewEngine(context.Background(), cfg)
	if err != nil {
		t.Fatalf("reactortest: new engine: %v", err)
	}
	if err := engine.Register(defs...); err != nil {
		t.Fatalf("reactortest: register definitions: %v", err)
	}

	wcfg := worker.Config{Logger: discard, ShutdownTimeout: 5 * time.Second}
	if o.Worker != nil {
		o.Worker(&wcfg)
	}
	wcfg.Queues = map[string]int{queue: 1}
	w := worker.New(engine, rdb, wcfg)
	if err := w.Start(context.Background()); err != nil {
		t.Fatalf("reactortest: start worker: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), wcfg.WithDefaults().ShutdownTimeout+5*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("reactortest: stop worker: %v", err)
		}
	})

	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &Harness{Engine: engine, Client: client, Worker: w, Redis: rdb,
		Prefix: prefix, Queue: queue, timeout: timeout}
}

// Main runs the tests, fails the binary if a key or queue of a test's
// harness is still in Redis afterwards or goroutines leaked, stops the
// redis-server the harness may have started, and exits. Call it from
// TestMain.
func Main(m *testing.M) { redistest.Main(m) }

// Shutdown stops the redis-server the harness started when no Redis was
// reachable, if it did. Main calls it.
func Shutdown() { redistest.Shutdown() }

func (h *Harness) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, h.timeout)
}

// Run enqueues a run of def for the worker, as production code calling
// Engine.Enqueue does, and waits until it finishes (see Wait). It returns
// the final result; an error means the run could not be enqueued or did not
// finish in time.
func (h *Harness) Run(ctx context.Context, def *reactor.Definition, inputs map[string]any, opts ...reactor.RunOption) (*reactor.Result, error) {
	ctx, cancel := h.bound(ctx)
	defer cancel()
	res, err := h.Engine.Enqueue(ctx, def, inputs, opts...)
	if err != nil {
		return nil, err
	}
	if res.Status.Terminal() { // an id that already finished
		return res, nil
	}
	return h.Engine.Wait(ctx, res.RunID)
}

// RunInline executes a run of def in the calling goroutine with Engine.Run,
// which runs to the end: after a hand-off point or a fan-out map it waits
// for the worker (pass reactor.NoWait() to get the dispatched result).
func (h *Harness) RunInline(ctx context.Context, def *reactor.Definition, inputs map[string]any, opts ...reactor.RunOption) (*reactor.Result, error) {
	return h.Engine.Run(ctx, def, inputs, opts...)
}

// Wait waits until run runID finishes and returns its result. Without a
// deadline on ctx it waits at most Options.Timeout.
func (h *Harness) Wait(ctx context.Context, runID string) (*reactor.Result, error) {
	ctx, cancel := h.bound(ctx)
	defer cancel()
	return h.Engine.Wait(ctx, runID)
}

// Get returns the stored run, failing the test if it cannot be read.
func (h *Harness) Get(t testing.TB, runID string) *reactor.Run {
	t.Helper()
	run, _ := h.get(t, runID)
	return run
}

func (h *Harness) get(t testing.TB, runID string) (*reactor.Run, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), h.timeout)
	defer cancel()
	run, err := h.Engine.Get(ctx, runID)
	if err != nil {
		t.Fatalf("reactortest: read run %s: %v", runID, err)
		return nil, false
	}
	return run, true
}

// RequireStatus fails the test unless run runID is in status want.
func (h *Harness) RequireStatus(t testing.TB, runID string, want reactor.Status) {
	t.Helper()
	run, ok := h.get(t, runID)
	if !ok {
		return
	}
	if run.Status != want {
		t.Fatalf("reactortest: run %s of %q is %s, want %s%s", runID, run.Reactor, run.Status, want, describe(run))
	}
}

// RequireUndone fails the test unless the steps whose undo succeeded in run
// runID's rollbacks (its Rollbacks entries of kind undo with status
// compensated) are exactly steps, newest first: the order a rollback undoes
// them. Steps inside a composed child are named "compose/step". With no
// steps it requires that nothing was undone.
func (h *Harness) RequireUndone(t testing.TB, runID string, steps ...string) {
	t.Helper()
	run, ok := h.get(t, runID)
	if !ok {
		return
	}
	var undone []string
	for _, r := range run.Rollbacks {
		if r.Kind == reactor.ActionUndo && r.Status == reactor.RollbackCompensated {
			undone = append(undone, r.Step)
		}
	}
	if !slices.Equal(undone, steps) {
		t.Fatalf("reactortest: run %s of %q undid %s, want %s (newest first)%s",
			runID, run.Reactor, list(undone), list(steps), describe(run))
	}
}

// RequireCompleted fails the test unless run runID completed and, when steps
// are given, the steps that completed are exactly steps, in execution order
// (skipped steps are not listed).
func (h *Harness) RequireCompleted(t testing.TB, runID string, steps ...string) {
	t.Helper()
	run, ok := h.get(t, runID)
	if !ok {
		return
	}
	if run.Status != reactor.StatusCompleted {
		t.Fatalf("reactortest: run %s of %q is %s, want completed%s", runID, run.Reactor, run.Status, describe(run))
		return
	}
	if len(steps) > 0 && !slices.Equal(run.Completed, steps) {
		t.Fatalf("reactortest: run %s of %q completed steps %s, want %s%s",
			runID, run.Reactor, list(run.Completed), list(steps), describe(run))
	}
}

func list(steps []string) string {
	if len(steps) == 0 {
		return "nothing"
	}
	return "[" + strings.Join(steps, ", ") + "]"
}

// describe is what a failure message adds about the run, to debug from.
func describe(run *reactor.Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n  completed steps: %s", list(run.Completed))
	if len(run.Skipped) > 0 {
		fmt.Fprintf(&b, "; skipped: %s", list(run.Skipped))
	}
	if run.Failure != nil {
		fmt.Fprintf(&b, "\n  failure: %s", run.Failure.Error())
	}
	if run.Reason != "" {
		fmt.Fprintf(&b, "\n  reason: %s", run.Reason)
	}
	if len(run.Rollbacks) > 0 {
		b.WriteString("\n  rollback report:")
		for _, r := range run.Rollbacks {
			fmt.Fprintf(&b, "\n    %s %s: %s", r.Kind, r.Step, r.Status)
			if r.Message != "" {
				fmt.Fprintf(&b, " (%s)", r.Message)
			}
		}
	}
	return b.String()
}
