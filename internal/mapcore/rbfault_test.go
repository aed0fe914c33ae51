package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// This file injects faults into a map's rollback (DESIGN 5 and 9): an
// element's second undo interrupted then redelivered, a held element lock,
// an element run that expired, and the windows of the two-flag handshake
// that resumes the owner exactly once, forced with the rollback failpoints.
//
// The owners here run a map ("each") and then a step ("boom") that fails, so
// the map's elements are rolled back after they all completed. The element
// reactor has three steps, s1, s2 and s3, each with an Undo that counts its
// calls per item; the rollback undoes them s3, s2, s1.
//
// The harness (rbfHarness) is shared with rbscale_test.go: an engine and a
// real asynq server serving the worker's own handler through a recorder, so
// tests await "task X finished" or "event E of run R" instead of sleeping.
// It reuses the helpers of exactlyonce_test.go (eoServerConfig, eoCtx,
// eoAwait, eoSeq, eoIn, newEOBarrier).

// ---- failpoint routing ----

// rbfHooks are one owner's rollback failpoints; the process-global hooks
// route to them by owner run id (a map id is "<owner>~<step>").
type rbfHooks struct {
	afterSettle   func(mapID string, pos int) error
	jobSignal     func(mapID string, pos int) error
	beforeHandOff func(mapID string, pos int) error
	ownerSignal   func(mapID string, pos int) error

	jobSignals   atomic.Int32 // RbJobSignal calls: a job claimed the owner signal
	ownerSignals atomic.Int32 // RbOwnerSignal calls: the owner claimed it itself
	handOffs     atomic.Int32 // RbBeforeHandOff calls: owner hand-offs

	mu        sync.Mutex
	signalPos []int // positions of the jobs that claimed the signal
}

func (h *rbfHooks) signals() int { return int(h.jobSignals.Load() + h.ownerSignals.Load()) }

var rbfRoutes sync.Map // owner run id -> *rbfHooks

// rbfInstallFailpoints installs the routing hooks for the duration of a
// non-parallel test (its parallel subtests run before it ends; no other
// top-level test runs meanwhile) and clears them when it ends.
func rbfInstallFailpoints(t *testing.T) {
	route := func(mapID string) *rbfHooks {
		owner, _, _ := strings.Cut(mapID, "~")
		h, ok := rbfRoutes.Load(owner)
		if !ok {
			return nil
		}
		return h.(*rbfHooks)
	}
	mapcore.SetFailpoints(mapcore.Failpoints{
		RbAfterSettle: func(mapID string, pos int) error {
			if h := route(mapID); h != nil && h.afterSettle != nil {
				return h.afterSettle(mapID, pos)
			}
			return nil
		},
		RbJobSignal: func(mapID string, pos int) error {
			h := route(mapID)
			if h == nil {
				return nil
			}
			h.jobSignals.Add(1)
			h.mu.Lock()
			h.signalPos = append(h.signalPos, pos)
			h.mu.Unlock()
			if h.jobSignal != nil {
				return h.jobSignal(mapID, pos)
			}
			return nil
		},
		RbBeforeHandOff: func(mapID string, pos int) error {
			h := route(mapID)
			if h == nil {
				return nil
			}
			h.handOffs.Add(1)
			if h.beforeHandOff != nil {
				return h.beforeHandOff(mapID, pos)
			}
			return nil
		},
		RbOwnerSignal: func(mapID string, pos int) error {
			h := route(mapID)
			if h == nil {
				return nil
			}
			h.ownerSignals.Add(1)
			if h.ownerSignal != nil {
				return h.ownerSignal(mapID, pos)
			}
			return nil
		},
	})
	t.Cleanup(func() { mapcore.SetFailpoints(mapcore.Failpoints{}) })
}

// rbfOwnerID returns a fresh owner run id whose maps route to h.
func rbfOwnerID(t testing.TB, h *rbfHooks) (string, *rbfHooks) {
	if h == nil {
		h = &rbfHooks{}
	}
	id := "rbf-" + engine.NewRunID()
	rbfRoutes.Store(id, h)
	t.Cleanup(func() { rbfRoutes.Delete(id) })
	return id, h
}

// ---- harness ----

type rbfOptions struct {
	// concurrency of the asynq server. Default 4.
	concurrency int
	// worker configures the worker whose handler the server serves (its
	// queue and logger are set here).
	worker worker.Config
	// noServer: start no server (the test starts its own with serve).
	noServer bool
	// hooks are more engine hooks.
	hooks []engine.Hook
	// undoLockWait is the engine's UndoLockWait (run-level Undo; a map's
	// rollback ignores it and waits the map rollback lock wait). Default the
	// engine's.
	undoLockWait time.Duration
	// lockExpiry is the engine's LockExpiry. Default the engine's.
	lockExpiry time.Duration
	// wrap wraps the worker's handler, inside the recorder (so whatever it
	// does for a delivery is done when the recorder sees it).
	wrap func(asynq.Handler) asynq.Handler
	// logger is the engine's logger. Default rbfLogger (discards).
	logger *slog.Logger
	// retention is the engine's Retention. Default the engine's.
	retention time.Duration
}

type rbfHarness struct {
	t       testing.TB
	engine  *engine.Engine
	rdb     redis.UniversalClient
	client  *worker.Client
	queue   string
	keys    keys.Keys
	insp    *asynq.Inspector
	rec     *rbfRecorder
	handler asynq.Handler // the worker's handler behind the recorder

	mu      sync.Mutex
	resumed map[string]int                  // run id -> EventRunResumed
	events  map[rbfEventKey][]chan struct{} // waiters, closed at the next such event
	counts  map[rbfEventKey]int
	// intercepts run synchronously inside the engine's hook, on the
	// goroutine executing the run, so a test can hold it at an event.
	intercepts map[rbfEventKey]func(ctx context.Context)
}

type rbfEventKey struct {
	kind engine.EventKind
	run  string
}

func newRBFHarness(t testing.TB, o rbfOptions) *rbfHarness {
	t.Helper()
	if o.concurrency <= 0 {
		o.concurrency = 4
	}
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	prefix := redistest.Prefix(t)
	h := &rbfHarness{t: t, rdb: rdb, queue: queue, keys: keys.New(prefix), rec: newRBFRecorder(),
		resumed: map[string]int{}, events: map[rbfEventKey][]chan struct{}{}, counts: map[rbfEventKey]int{},
		intercepts: map[rbfEventKey]func(ctx context.Context){}}
	h.client = worker.NewClient(rdb, queue)
	hook := engine.HookFunc(func(ctx context.Context, ev engine.Event) {
		h.mu.Lock()
		intercept := h.intercepts[rbfEventKey{ev.Kind, ev.RunID}]
		h.mu.Unlock()
		if intercept != nil {
			intercept(ctx)
		}
		k := rbfEventKey{ev.Kind, ev.RunID}
		switch ev.Kind {
		case engine.EventRunCompleted, engine.EventRunFailed, engine.EventRunHalted, engine.EventRunCancelled:
			k.kind = rbfTerminal
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if ev.Kind == engine.EventRunResumed {
			h.resumed[ev.RunID]++
		}
		h.counts[k]++
		for _, ch := range h.events[k] {
			close(ch)
		}
		delete(h.events, k)
	})
	logger := rbfLogger
	if o.logger != nil {
		logger = o.logger
	}
	e, err := engine.NewEngine(context.Background(), engine.Config{Client: rdb, Prefix: prefix,
		Enqueuer: h.client, Logger: logger, Hooks: append([]engine.Hook{hook}, o.hooks...), UndoLockWait: o.undoLockWait, LockExpiry: o.lockExpiry, Retention: o.retention})
	require.NoError(t, err)
	h.engine = e
	h.insp = asynq.NewInspectorFromRedisClient(rdb)
	t.Cleanup(func() { _ = h.insp.Close() })
	wc := o.worker
	wc.Queues = map[string]int{queue: 1}
	wc.Logger = rbfLogger
	h.handler = worker.New(e, rdb, wc).Handler()
	if o.wrap != nil {
		h.handler = o.wrap(h.handler)
	}
	h.handler = h.rec.wrap(h.handler)
	if !o.noServer {
		h.serve(o.concurrency, 0)
	}
	return h
}

// rbfLogger drops every record without formatting it.
var rbfLogger = slog.New(slog.DiscardHandler)

// rbfTerminal stands for any terminal run event in waiters.
const rbfTerminal engine.EventKind = "test.terminal"

// serve starts an asynq server (eoServerConfig) on the harness's handler
// until the test ends; shutdownTimeout 0 keeps the worker's default.
func (h *rbfHarness) serve(concurrency int, shutdownTimeout time.Duration) *asynq.Server {
	cfg := eoServerConfig(h.queue, concurrency)
	if shutdownTimeout > 0 {
		cfg.ShutdownTimeout = shutdownTimeout
	}
	srv := asynq.NewServerFromRedisClient(h.rdb, cfg)
	require.NoError(h.t, srv.Start(h.handler))
	h.t.Cleanup(srv.Shutdown) // idempotent
	return srv
}

// on returns a channel closed at the next event kind of run (rbfTerminal
// for any terminal event). Call it before the event can happen.
func (h *rbfHarness) on(kind engine.EventKind, run string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan struct{})
	k := rbfEventKey{kind, run}
	h.events[k] = append(h.events[k], ch)
	return ch
}

func (h *rbfHarness) done(run string) <-chan struct{} { return h.on(rbfTerminal, run) }

// intercept runs f inside the engine's hook at every event kind of run, on
// the goroutine executing the run (f may block it).
func (h *rbfHarness) intercept(kind engine.EventKind, run string, f func(ctx context.Context)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.intercepts[rbfEventKey{kind, run}] = f
}

func (h *rbfHarness) resumes(run string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resumed[run]
}

func (h *rbfHarness) eventCount(kind engine.EventKind, run string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[rbfEventKey{kind, run}]
}

// rbTaskID is the asynq task id of the rollback job of position pos.
func rbTaskID(mapID string, pos int) string { return fmt.Sprintf("rb:%s:1:%d", mapID, pos) }

// rbResumeID is the task id of the owner's rollback resume.
func rbResumeID(owner, mapID string) string { return "resume:" + owner + ":rb:" + mapID + ":1" }

// rbfOutcome mirrors the stored rollback outcome of one position.
type rbfOutcome struct {
	Index    int                      `msgpack:"i"`
	Outcome  string                   `msgpack:"o"`
	Failures []engine.RollbackFailure `msgpack:"f"`
}

// outcome reads the stored rollback outcome of position pos.
func (h *rbfHarness) outcome(ctx context.Context, mapID string, pos int) rbfOutcome {
	h.t.Helper()
	raw, err := h.rdb.HGet(ctx, h.keys.MapRbResults(mapID, 1), strconv.Itoa(pos)).Result()
	require.NoError(h.t, err, "outcome of position %d", pos)
	var o rbfOutcome
	require.NoError(h.t, codec.Unmarshal([]byte(raw), &o))
	return o
}

// rbMeta reads the rollback's metadata hash.
func (h *rbfHarness) rbMeta(ctx context.Context, mapID string) map[string]string {
	h.t.Helper()
	m, err := h.rdb.HGetAll(ctx, h.keys.MapRbMeta(mapID, 1)).Result()
	require.NoError(h.t, err)
	return m
}

func (h *rbfHarness) exists(ctx context.Context, key string) bool {
	h.t.Helper()
	n, err := h.rdb.Exists(ctx, key).Result()
	require.NoError(h.t, err)
	return n == 1
}

// awaitRetryState polls asynq (its state changes raise no signal) until the
// task is in the retry set, and returns its info there.
func (h *rbfHarness) awaitRetryState(ctx context.Context, id string) *asynq.TaskInfo {
	h.t.Helper()
	for {
		info, err := h.insp.GetTaskInfo(h.queue, id)
		if err == nil && info.State == asynq.TaskStateRetry {
			return info
		}
		select {
		case <-ctx.Done():
			h.t.Fatalf("timed out waiting for task %s in the retry state (last: %v, %v)", id, info, err)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// ---- recorder ----

// rbfRecorder records every delivery the server handled, by task id, and
// wakes waiters after each one.
type rbfRecorder struct {
	mu      sync.Mutex
	changed chan struct{}
	ok      map[string]int // deliveries that returned nil
	failed  map[string]int // deliveries that failed
	snoozed map[string]int // deliveries that snoozed (not failures)
	byType  map[string]int // task type -> deliveries that returned nil
}

func newRBFRecorder() *rbfRecorder {
	return &rbfRecorder{changed: make(chan struct{}), ok: map[string]int{}, failed: map[string]int{},
		snoozed: map[string]int{}, byType: map[string]int{}}
}

func (r *rbfRecorder) wrap(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		err := next.ProcessTask(ctx, t)
		id, _ := asynq.GetTaskID(ctx)
		r.mu.Lock()
		switch {
		case err == nil:
			r.ok[id]++
			r.byType[t.Type()]++
		case worker.IsFailure(err):
			r.failed[id]++
		default:
			r.snoozed[id]++
		}
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
		return err
	})
}

// await blocks until cond (called with the recorder locked) holds.
func (r *rbfRecorder) await(t testing.TB, ctx context.Context, what string, cond func(r *rbfRecorder) bool) {
	t.Helper()
	for {
		r.mu.Lock()
		if cond(r) {
			r.mu.Unlock()
			return
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// awaitOK waits until a delivery of task id returned nil (a run's terminal
// event fires inside a task, before the task's handler returns).
func (r *rbfRecorder) awaitOK(t testing.TB, ctx context.Context, id string) {
	t.Helper()
	r.await(t, ctx, "task "+id, func(r *rbfRecorder) bool { return r.ok[id] >= 1 })
}

func (r *rbfRecorder) get(id string) (ok, failed, snoozed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok[id], r.failed[id], r.snoozed[id]
}

// awaitRollbackJobs waits until the rollback job of every position in
// [0, n) returned nil.
func (r *rbfRecorder) awaitRollbackJobs(t testing.TB, ctx context.Context, mapID string, n int) {
	t.Helper()
	r.await(t, ctx, "every rollback job of "+mapID, func(r *rbfRecorder) bool {
		for p := range n {
			if r.ok[rbTaskID(mapID, p)] == 0 {
				return false
			}
		}
		return true
	})
}

// ---- reactors ----

// rbfCounts counts, per item, the runs and undo calls of the element
// reactor's three steps, and lets a test act inside an undo.
type rbfCounts struct {
	mu     sync.Mutex
	ran    map[int]*[3]int
	undone map[int]*[3]int
	// onUndo, if set, runs inside every undo call (after it is counted);
	// step is 1, 2 or 3.
	onUndo func(ctx context.Context, item, step int) error
}

func newRBFCounts() *rbfCounts {
	return &rbfCounts{ran: map[int]*[3]int{}, undone: map[int]*[3]int{}}
}

func (c *rbfCounts) setOnUndo(f func(ctx context.Context, item, step int) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onUndo = f
}

func (c *rbfCounts) count(m map[int]*[3]int, item, step int) {
	a := m[item]
	if a == nil {
		a = &[3]int{}
		m[item] = a
	}
	a[step-1]++
}

// undos returns the undo calls of item's s1, s2, s3.
func (c *rbfCounts) undos(item int) [3]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.undone[item]; a != nil {
		return *a
	}
	return [3]int{}
}

func (c *rbfCounts) runs(item int) [3]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.ran[item]; a != nil {
		return *a
	}
	return [3]int{}
}

// requireUndos checks every item of [0, n): each step ran once, and each
// undo ran as want says (default: once; a missing item in want means once).
func (c *rbfCounts) requireUndos(t testing.TB, n int, want map[int][3]int) {
	t.Helper()
	for i := range n {
		require.Equal(t, [3]int{1, 1, 1}, c.runs(i), "forward runs of element %d (s1, s2, s3)", i)
		w, ok := want[i]
		if !ok {
			w = [3]int{1, 1, 1}
		}
		require.Equal(t, w, c.undos(i), "undo calls of element %d (s1, s2, s3)", i)
	}
}

// element returns the element reactor: s1, s2, s3 in a chain, each with a
// counted Undo.
func (c *rbfCounts) element(name string) *engine.Definition {
	step := func(k int) engine.Part {
		var after []string
		if k > 1 {
			after = []string{fmt.Sprintf("s%d", k-1)}
		}
		return engine.Step(fmt.Sprintf("s%d", k), engine.StepConfig[eoIn, int]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			After: after,
			Run: func(_ context.Context, in eoIn) (int, error) {
				c.mu.Lock()
				c.count(c.ran, in.N, k)
				c.mu.Unlock()
				return in.N, nil
			},
			Undo: func(ctx context.Context, in eoIn, _ int) error {
				c.mu.Lock()
				c.count(c.undone, in.N, k)
				f := c.onUndo
				c.mu.Unlock()
				if f != nil {
					return f(ctx, in.N, k)
				}
				return nil
			},
		})
	}
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		step(1), step(2), step(3),
		engine.Returns(engine.FromStep("s3")),
	)
}

var errBoom = errors.New("boom")

// rbfOwner returns an owner: a map "each" over the items input, then "boom",
// which calls before (if set) and fails.
func rbfOwner(name string, elem *engine.Definition, fanOut bool, batch int, before func(ctx context.Context) error) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fanOut, BatchSize: batch}),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{
			After: []string{"each"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				if before != nil {
					if err := before(ctx); err != nil {
						return 0, err
					}
				}
				return 0, errBoom
			},
		}),
	)
}

// requireBoom checks that the owner failed at boom, with the given rollback
// failures (none when want is empty).
func requireBoom(t testing.TB, res *engine.Result, want ...engine.RollbackFailure) {
	t.Helper()
	require.Equal(t, engine.StatusFailed, res.Status, "%v", res.Failure)
	require.NotNil(t, res.Failure)
	require.Equal(t, "boom", res.Failure.Step)
	require.Equal(t, "boom", res.Failure.Message)
	require.Zero(t, res.Failure.RollbackFailuresOmitted)
	if len(want) == 0 {
		require.Empty(t, res.Failure.RollbackFailures)
		return
	}
	got := make([]engine.RollbackFailure, len(res.Failure.RollbackFailures))
	for i, f := range res.Failure.RollbackFailures {
		f.Message = "" // compared apart
		got[i] = f
	}
	require.Equal(t, want, got)
}

// runFanOut starts owner def (fan-out) on items and returns when the owner
// reached a terminal status, with its result.
func (h *rbfHarness) runFanOut(ctx context.Context, def *engine.Definition, owner string, items []int) *engine.Result {
	h.t.Helper()
	finished := h.done(owner)
	res, err := h.engine.Run(ctx, def, map[string]any{"items": items}, engine.WithRunID(owner), engine.NoWait())
	require.NoError(h.t, err)
	require.Equal(h.t, engine.OutcomeDispatched, res.Outcome())
	eoAwait(h.t, ctx, finished, "the owner "+owner+" to finish")
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(h.t, err)
	return res
}

// requireElementUndone checks element i's run: cancelled (undone with its
// map), its three undos recorded as compensated, s3 first, no failure kept.
func (h *rbfHarness) requireElementUndone(ctx context.Context, mapID string, i int) {
	h.t.Helper()
	run, err := engine.Element(h.engine, ctx, mapcore.ElementID(mapID, i))
	require.NoError(h.t, err)
	require.Equal(h.t, engine.StatusCancelled, run.Status)
	require.Empty(h.t, run.Ledger)
	require.NotNil(h.t, run.Failure)
	require.Empty(h.t, run.Failure.RollbackFailures)
	steps := make([]string, 0, len(run.Rollbacks))
	for _, r := range run.Rollbacks {
		require.Equal(h.t, engine.RollbackCompensated, r.Status, "%+v", r)
		steps = append(steps, r.Step)
	}
	require.Equal(h.t, []string{"s3", "s2", "s1"}, steps)
}

func ledgerSteps(run *engine.Run) []string {
	out := make([]string, len(run.Ledger))
	for i, e := range run.Ledger {
		out[i] = e.Step
	}
	return out
}

// ---- tests ----

// An element's second undo (s2: undo runs s3, s2, s1) is interrupted on the
// first rollback attempt of that element, and the rollback is delivered
// again: s3's undo ran once (its pop was saved before s2 started), s2's
// twice (at-least-once for the entry in flight), s1's once, nothing else
// repeated, and the owner ends failed at boom with no rollback failure.
func TestRbFaultInterruptedSecondUndo(t *testing.T) {
	t.Parallel()
	const n, target = 4, 1

	// The worker running the job dies: the undo blocks until its context
	// ends, the asynq server is shut down (its in-flight task is requeued
	// after a 100 ms shutdown timeout, then its context cancelled), and a
	// second server picks the requeued job up.
	t.Run("WorkerKilled", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{noServer: true})
		c := newRBFCounts()
		entered := make(chan struct{})
		var first atomic.Bool
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			if item != target || step != 2 || !first.CompareAndSwap(false, true) {
				return nil
			}
			close(entered)
			<-ctx.Done() // the worker dies under it
			return ctx.Err()
		})
		owner, _ := rbfOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		def := rbfOwner("rbf-killed", c.element("rbf-killed-el"), true, 50, nil)
		// Concurrency 1: the job in the undo is the only task in flight.
		srvA := h.serve(1, 100*time.Millisecond)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, entered, "the interrupted undo")
		require.Equal(t, [3]int{0, 1, 1}, c.undos(target), "s3 undone, s2 in flight")
		srvA.Shutdown() // requeues the job, then cancels it
		run, err := engine.Element(h.engine, ctx, mapcore.ElementID(mapID, target))
		require.NoError(t, err)
		require.Equal(t, engine.StatusRollingBack, run.Status, "the element rollback stopped mid-way")
		require.Equal(t, []string{"s1", "s2"}, ledgerSteps(run), "s3's pop was saved before s2's undo began")
		h.serve(4, 0)
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		requireBoom(t, res)

		pos := n - 1 - target
		// The dead delivery (its context cancelled) and the redelivery.
		h.rec.await(t, ctx, "the dead and the redelivered rollback job", func(r *rbfRecorder) bool {
			return r.failed[rbTaskID(mapID, pos)] == 1 && r.ok[rbTaskID(mapID, pos)] == 1
		})
		c.requireUndos(t, n, map[int][3]int{target: {1, 2, 1}})
		for i := range n {
			h.requireElementUndone(ctx, mapID, i)
			require.Equal(t, "undone", h.outcome(ctx, mapID, n-1-i).Outcome, "element %d", i)
		}
		h.rec.awaitOK(t, ctx, rbResumeID(owner, mapID))
		ok, _, _ := h.rec.get(rbResumeID(owner, mapID))
		require.Equal(t, 1, ok, "one rollback resume of the owner")
	})

	// The job's element lock is taken over: s2's undo overwrites the lock
	// with a foreign token and fails; the failure is never saved (the
	// fenced write is refused), the job snoozes on the lost lock, then on
	// the held lock, and runs again once the foreign holder lets go.
	t.Run("LockTakenOver", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{})
		c := newRBFCounts()
		owner, _ := rbfOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		lockKey := h.keys.ElemLock(mapcore.ElementID(mapID, target))
		var first atomic.Bool
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			if item != target || step != 2 || !first.CompareAndSwap(false, true) {
				return nil
			}
			if err := h.rdb.Set(ctx, lockKey, "rbf-foreign-token", 0).Err(); err != nil {
				return err
			}
			return errors.New("rbf: interrupted after a lock takeover")
		})
		def := rbfOwner("rbf-takeover", c.element("rbf-takeover-el"), true, 50, nil)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())

		pos := n - 1 - target
		h.rec.await(t, ctx, "the interrupted job to snooze", func(r *rbfRecorder) bool { return r.snoozed[rbTaskID(mapID, pos)] >= 1 })
		require.Equal(t, [3]int{0, 1, 1}, c.undos(target))
		run, err := engine.Element(h.engine, ctx, mapcore.ElementID(mapID, target))
		require.NoError(t, err)
		require.Equal(t, engine.StatusRollingBack, run.Status, "the element rollback stopped mid-way")
		require.Equal(t, []string{"s1", "s2"}, ledgerSteps(run), "s3's pop was saved; s2's failure was not")
		require.NoError(t, h.rdb.Del(ctx, lockKey).Err()) // the foreign holder lets go
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		requireBoom(t, res)

		h.rec.awaitOK(t, ctx, rbTaskID(mapID, pos))
		ok, failed, _ := h.rec.get(rbTaskID(mapID, pos))
		require.Equal(t, 1, ok)
		require.Zero(t, failed, "a lost or held lock is a snooze, never a failure")
		c.requireUndos(t, n, map[int][3]int{target: {1, 2, 1}})
		for i := range n {
			h.requireElementUndone(ctx, mapID, i)
		}
	})

	// An inline map: the owner's process is stopped (its context ends)
	// during the element's second undo, and the owner is resumed.
	t.Run("Inline", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{noServer: true})
		c := newRBFCounts()
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		var first atomic.Bool
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			if item != target || step != 2 || !first.CompareAndSwap(false, true) {
				return nil
			}
			stop()
			<-ctx.Done()
			return ctx.Err()
		})
		owner, _ := rbfOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		def := rbfOwner("rbf-inline-int", c.element("rbf-inline-int-el"), false, 0, nil)
		_, err := h.engine.Run(runCtx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner))
		require.ErrorContains(t, err, "rollback interrupted")
		run, err := h.engine.Get(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusRollingBack, run.Status)
		require.Equal(t, [3]int{0, 1, 1}, c.undos(target))

		res, err := h.engine.Resume(ctx, owner)
		require.NoError(t, err)
		requireBoom(t, res)
		c.requireUndos(t, n, map[int][3]int{target: {1, 2, 1}})
		for i := range n {
			h.requireElementUndone(ctx, mapID, i)
		}
	})
}

// A held element lock: the rollback job snoozes (asynq's retry state, its
// retry count untouched) without reporting, and completes once the lock is
// free: undone, no element_in_flight. (A lock held past the map rollback
// lock wait is waited for too: TestHardeningDeadElementLockSameWaitBothModes.)
func TestRbFaultHeldElementLock(t *testing.T) {
	t.Parallel()
	const n = 5

	t.Run("SnoozesThenUndone", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{})
		c := newRBFCounts()
		owner, _ := rbfOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		// Element 1's lock is deleted by its holder; element 3's expires.
		const deleted, expires = 1, 3
		lockOf := func(i int) string { return h.keys.ElemLock(mapcore.ElementID(mapID, i)) }
		hold := func(ctx context.Context) error {
			for _, i := range []int{deleted, expires} {
				if err := h.rdb.Set(ctx, lockOf(i), "rbf-foreign-token", time.Minute).Err(); err != nil {
					return err
				}
			}
			return nil
		}
		t.Cleanup(func() { h.rdb.Del(context.Background(), lockOf(deleted), lockOf(expires)) })
		def := rbfOwner("rbf-held", c.element("rbf-held-el"), true, 50, hold)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())

		for _, i := range []int{deleted, expires} {
			id := rbTaskID(mapID, n-1-i)
			h.rec.await(t, ctx, "a snooze of "+id, func(r *rbfRecorder) bool { return r.snoozed[id] >= 1 })
			info := h.awaitRetryState(ctx, id)
			require.Zero(t, info.Retried, "a snooze does not spend the retry budget")
			require.Contains(t, info.LastErr, "snoozing")
			require.Equal(t, [3]int{}, c.undos(i), "nothing undone under a held lock")
			_, err := h.rdb.HGet(ctx, h.keys.MapRbResults(mapID, 1), strconv.Itoa(n-1-i)).Result()
			require.ErrorIs(t, err, redis.Nil, "a snooze reports nothing")
		}
		require.NoError(t, h.rdb.Del(ctx, lockOf(deleted)).Err())
		require.NoError(t, h.rdb.PExpire(ctx, lockOf(expires), 50*time.Millisecond).Err())
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		requireBoom(t, res) // no element_in_flight, no failure at all

		c.requireUndos(t, n, nil)
		meta := h.rbMeta(ctx, mapID)
		require.Equal(t, strconv.Itoa(n), meta["n:undone"])
		require.NotContains(t, meta, "n:element_in_flight")
		for _, i := range []int{deleted, expires} {
			pos := n - 1 - i
			require.Equal(t, "undone", h.outcome(ctx, mapID, pos).Outcome, "element %d", i)
			h.rec.awaitOK(t, ctx, rbTaskID(mapID, pos))
			ok, failed, snoozed := h.rec.get(rbTaskID(mapID, pos))
			require.Equal(t, 1, ok)
			require.Zero(t, failed)
			require.GreaterOrEqual(t, snoozed, 1)
			attempts, err := strconv.Atoi(meta["attempts:"+strconv.Itoa(pos)])
			require.NoError(t, err)
			require.Equal(t, snoozed, attempts, "every snooze was a held lock")
			h.requireElementUndone(ctx, mapID, i)
		}
	})

}

// An inline map rolls back in the owner's process, which waits for a held
// element lock (one lock attempt after another) instead of snoozing: a lock
// freed within the wait is no reason to report anything.
func TestRbFaultHeldElementLockInline(t *testing.T) {
	t.Parallel()
	const n, held = 5, 2

	t.Run("FreedWithinTheWait", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{noServer: true})
		c := newRBFCounts()
		owner, _ := rbfOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		lockKey := h.keys.ElemLock(mapcore.ElementID(mapID, held))
		// Inline undoes newest first: element held+1, then held. The
		// lock of held is set to expire 300 ms after element held+1's last
		// undo, so the rollback finds it held and waits.
		var tried atomic.Bool
		var expiring, undoing atomic.Int64
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			switch {
			case item == held+1 && step == 1 && tried.CompareAndSwap(false, true):
				expiring.Store(time.Now().UnixNano())
				return h.rdb.PExpire(ctx, lockKey, 300*time.Millisecond).Err()
			case item == held && step == 3:
				undoing.Store(time.Now().UnixNano())
			}
			return nil
		})
		def := rbfOwner("rbf-held-inline", c.element("rbf-held-inline-el"), false, 0, func(ctx context.Context) error {
			return h.rdb.Set(ctx, lockKey, "rbf-foreign-token", time.Minute).Err()
		})
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner))
		require.NoError(t, err)
		requireBoom(t, res)
		c.requireUndos(t, n, nil)
		require.Equal(t, "undone", h.outcome(ctx, mapID, n-1-held).Outcome)
		require.NotContains(t, h.rbMeta(ctx, mapID), "n:element_in_flight")
		h.requireElementUndone(ctx, mapID, held)
		waited := time.Duration(undoing.Load() - expiring.Load())
		require.GreaterOrEqual(t, waited, 250*time.Millisecond, "the rollback waited for the lock")
	})

}

// An element run that expired before the rollback (its state key deleted):
// the owner's Failure reports it once, context_unavailable at each[i], on
// the inline and the fan-out path.
func TestRbFaultExpiredElementRun(t *testing.T) {
	t.Parallel()
	const n, gone = 5, 2
	for _, fanOut := range []bool{false, true} {
		name := map[bool]string{false: "Inline", true: "FanOut"}[fanOut]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := eoCtx(t, 60*time.Second)
			h := newRBFHarness(t, rbfOptions{noServer: !fanOut})
			c := newRBFCounts()
			owner, _ := rbfOwnerID(t, nil)
			mapID := mapcore.MapID(owner, "each")
			stateKey := h.keys.ElemState(mapcore.ElementID(mapID, gone))
			expire := func(ctx context.Context) error {
				n, err := h.rdb.Del(ctx, stateKey).Result()
				if err == nil && n != 1 {
					err = fmt.Errorf("no element state at %s", stateKey)
				}
				return err
			}
			def := rbfOwner("rbf-expired-"+name, c.element("rbf-expired-el-"+name), fanOut, 50, expire)
			var res *engine.Result
			if fanOut {
				res = h.runFanOut(ctx, def, owner, eoSeq(0, n))
			} else {
				var err error
				res, err = h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner))
				require.NoError(t, err)
			}
			requireBoom(t, res, engine.RollbackFailure{Step: "each[2]", Kind: engine.ActionUndo, Reason: "context_unavailable"})
			require.Contains(t, res.Failure.RollbackFailures[0].Message, "element 2")

			o := h.outcome(ctx, mapID, n-1-gone)
			require.Equal(t, "context_unavailable", o.Outcome)
			require.Equal(t, gone, o.Index)
			meta := h.rbMeta(ctx, mapID)
			require.Equal(t, "1", meta["n:context_unavailable"])
			require.Equal(t, "1", meta["failed"])
			c.requireUndos(t, n, map[int][3]int{gone: {}})
			_, err := engine.Element(h.engine, ctx, mapcore.ElementID(mapID, gone))
			require.ErrorIs(t, err, engine.ErrNotFound)
		})
	}
}

// The two-flag handshake (DESIGN 5): the owner sets handed_off after its
// hand-off save, then claims the signal if every job settled; a job claims
// it if it saw both. Each window is forced with the failpoints, and each
// time the owner's rollback is resumed exactly once: one signal (jobs' plus
// the owner's), one run of the resume task, one rollback resume event.
//
// Not parallel: it owns the process-global failpoints while it runs.
func TestRbFaultHandshake(t *testing.T) {
	rbfInstallFailpoints(t)
	const n = 6

	// check asserts the end of every handshake subtest: the owner failed at
	// boom, every element was undone once, and the rollback resumed the
	// owner once.
	check := func(t *testing.T, ctx context.Context, h *rbfHarness, c *rbfCounts, hooks *rbfHooks, owner string, res *engine.Result, ownerResumes int) {
		t.Helper()
		mapID := mapcore.MapID(owner, "each")
		requireBoom(t, res)
		c.requireUndos(t, n, nil)
		require.Equal(t, 1, hooks.signals(), "exactly one owner signal (job %d, owner %d)", hooks.jobSignals.Load(), hooks.ownerSignals.Load())
		h.rec.await(t, ctx, "the owner's rollback resume", func(r *rbfRecorder) bool { return r.ok[rbResumeID(owner, mapID)] >= 1 })
		ok, failed, _ := h.rec.get(rbResumeID(owner, mapID))
		require.Equal(t, 1, ok, "one rollback resume task")
		require.Zero(t, failed)
		require.Equal(t, ownerResumes, h.resumes(owner), "owner resumes (forward, rollback, early)")
		require.Equal(t, "1", h.rdb.Get(ctx, h.keys.MapRbSignalled(mapID, 1)).Val())
	}

	// (a) The owner saved its hand-off but has not set handed_off yet
	// (RbBeforeHandOff holds it) while every job settles: no job may
	// resume it. Released, the owner's own AfterSave claims the signal.
	t.Run("OwnerSavedJobsSettleFirst", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{concurrency: 4})
		c := newRBFCounts()
		atHandOff, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		owner, hooks := rbfOwnerID(t, &rbfHooks{
			beforeHandOff: func(string, int) error {
				once.Do(func() { close(atHandOff) })
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			},
		})
		// No element is undone before the owner is in the window, so the
		// owner hands off (it would adopt a rollback already settled).
		c.setOnUndo(func(ctx context.Context, _, _ int) error {
			select {
			case <-atHandOff:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		mapID := mapcore.MapID(owner, "each")
		def := rbfOwner("rbf-hs-a", c.element("rbf-hs-a-el"), true, 50, nil)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())

		eoAwait(t, ctx, atHandOff, "the owner in the hand-off window")
		h.rec.awaitRollbackJobs(t, ctx, mapID, n)
		meta := h.rbMeta(ctx, mapID)
		require.Equal(t, strconv.Itoa(n), meta["settled"], "every job settled")
		require.False(t, h.exists(ctx, h.keys.MapRbHandedOff(mapID, 1)), "handed_off not set yet")
		require.False(t, h.exists(ctx, h.keys.MapRbSignalled(mapID, 1)), "no job claimed the signal")
		require.Zero(t, hooks.jobSignals.Load())
		run, err := h.engine.Get(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusRollingBack, run.Status, "the hand-off was saved")
		require.NotNil(t, run.Rollback)
		require.Equal(t, "each", run.Ledger[len(run.Ledger)-1].Step, "the map's entry stays on the stack")
		locked, err := engine.Locked(h.engine, ctx, owner)
		require.NoError(t, err)
		require.True(t, locked, "the owner still holds its run in AfterSave")
		ok, _, _ := h.rec.get(rbResumeID(owner, mapID))
		require.Zero(t, ok)
		_, err = h.insp.GetTaskInfo(h.queue, rbResumeID(owner, mapID))
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "the owner's resume is not even enqueued")

		close(release)
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		check(t, ctx, h, c, hooks, owner, res, 2)
		require.Equal(t, int32(1), hooks.ownerSignals.Load(), "the owner resumed itself")
		require.Equal(t, int32(1), hooks.handOffs.Load())
	})

	// (b) handed_off is set before the last job settles: that job resumes
	// the owner.
	t.Run("HandedOffBeforeLastSettle", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{concurrency: 4})
		c := newRBFCounts()
		othersSettled := make(chan struct{})
		var others atomic.Int32
		owner, hooks := rbfOwnerID(t, &rbfHooks{
			afterSettle: func(_ string, pos int) error {
				if pos != n-1 && others.Add(1) == n-1 {
					close(othersSettled)
				}
				return nil
			},
		})
		handedOff := h.on(engine.EventRollbackHandedOff, owner)
		// Element 0 (position n-1) is undone last, after the hand-off.
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			if item != 0 || step != 3 {
				return nil
			}
			for _, ch := range []<-chan struct{}{handedOff, othersSettled} {
				select {
				case <-ch:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
		def := rbfOwner("rbf-hs-b", c.element("rbf-hs-b-el"), true, 50, nil)
		res := h.runFanOut(ctx, def, owner, eoSeq(0, n))
		check(t, ctx, h, c, hooks, owner, res, 2)
		require.Equal(t, int32(1), hooks.jobSignals.Load(), "the last job resumed the owner")
		hooks.mu.Lock()
		require.Equal(t, []int{n - 1}, hooks.signalPos)
		hooks.mu.Unlock()
		require.Zero(t, hooks.ownerSignals.Load())
		require.Equal(t, 1, h.eventCount(engine.EventRollbackHandedOff, owner))
	})

	// (c) The last job and the owner race: the owner held right before its
	// hand-off script (RbBeforeHandOff), the last job held right before its
	// settle script (at its element run's terminal event, emitted after the
	// element's final save, which is all that is left before the job's
	// settle), both released together. Whichever script runs second sees
	// both flags; exactly one claims. Several rounds; both orders happen.
	t.Run("LastJobAndOwnerRace", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{concurrency: 4})
		winners := map[string]int{}
		for round := range 12 {
			c := newRBFCounts()
			bar := newEOBarrier(2)
			othersSettled := make(chan struct{})
			var others atomic.Int32
			owner, hooks := rbfOwnerID(t, &rbfHooks{
				afterSettle: func(_ string, pos int) error {
					if pos != n-1 && others.Add(1) == n-1 {
						close(othersSettled)
					}
					return nil
				},
				beforeHandOff: func(string, int) error { return bar.wait(ctx) },
			})
			mapID := mapcore.MapID(owner, "each")
			// Element 0 is position n-1: its job settles last.
			h.intercept(engine.EventRunCancelled, mapcore.ElementID(mapID, 0), func(ctx context.Context) {
				select {
				case <-othersSettled:
				case <-ctx.Done():
					return
				}
				_ = bar.wait(ctx)
			})
			def := rbfOwner(fmt.Sprintf("rbf-hs-c%d", round), c.element(fmt.Sprintf("rbf-hs-c%d-el", round)), true, 50, nil)
			res := h.runFanOut(ctx, def, owner, eoSeq(0, n))
			check(t, ctx, h, c, hooks, owner, res, 2)
			require.Equal(t, int32(1), hooks.handOffs.Load())
			if hooks.jobSignals.Load() == 1 {
				hooks.mu.Lock()
				require.Equal(t, []int{n - 1}, hooks.signalPos, "only the last job can see both flags")
				hooks.mu.Unlock()
				winners["job"]++
			} else {
				winners["owner"]++
			}
		}
		t.Logf("signal claimed by: %v", winners)
	})

	// (d) An early resume of the owner (a duplicate wake, a sweeper) hands
	// off a second time while the rollback is still out: its AfterSave is
	// held (RbBeforeHandOff) while the last job settles, sees handed_off
	// (set by the first hand-off) and claims the signal. Released, the
	// second hand-off finds the rollback settled and handed_off set, the
	// same two flags: only the SET NX on signalled keeps it from resuming
	// the owner a second time. (This is the subtest that fails with the NX
	// guards removed; in (a) to (c) the condition becomes true at exactly
	// one script.)
	t.Run("SecondHandOffAfterJobSignal", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newRBFHarness(t, rbfOptions{concurrency: 4})
		c := newRBFCounts()
		othersSettled, atSecond, releaseOwner, jobSignalled := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
		releaseLast := make(chan struct{})
		var signalOnce sync.Once
		var others atomic.Int32
		hooks := &rbfHooks{}
		owner, _ := rbfOwnerID(t, hooks)
		*hooks = rbfHooks{
			afterSettle: func(_ string, pos int) error {
				if pos != n-1 && others.Add(1) == n-1 {
					close(othersSettled)
				}
				return nil
			},
			beforeHandOff: func(string, int) error {
				if hooks.handOffs.Load() != 2 {
					return nil
				}
				close(atSecond)
				select {
				case <-releaseOwner:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			},
			jobSignal: func(string, int) error {
				signalOnce.Do(func() { close(jobSignalled) })
				return nil
			},
		}
		c.setOnUndo(func(ctx context.Context, item, step int) error {
			if item != 0 || step != 3 {
				return nil
			}
			select {
			case <-releaseLast:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		mapID := mapcore.MapID(owner, "each")
		def := rbfOwner("rbf-hs-d", c.element("rbf-hs-d-el"), true, 50, nil)
		firstHandOff := h.on(engine.EventRollbackHandedOff, owner)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, firstHandOff, "the first hand-off")
		eoAwait(t, ctx, othersSettled, "every job but the last to settle")
		require.True(t, h.exists(ctx, h.keys.MapRbHandedOff(mapID, 1)))

		// The early resume.
		early := make(chan error, 1)
		go func() {
			res, err := engine.Process(h.engine, ctx, owner)
			if err == nil && res.Status != engine.StatusRollingBack {
				err = fmt.Errorf("the early resume ended %s", res.Status)
			}
			early <- err
		}()
		eoAwait(t, ctx, atSecond, "the second hand-off's window")
		close(releaseLast)
		eoAwait(t, ctx, jobSignalled, "the last job to claim the signal")
		close(releaseOwner)
		select {
		case err := <-early:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("timed out waiting for the early resume")
		}
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		check(t, ctx, h, c, hooks, owner, res, 3)
		require.Equal(t, int32(1), hooks.jobSignals.Load())
		require.Zero(t, hooks.ownerSignals.Load(), "the second hand-off must not signal again")
		require.Equal(t, int32(2), hooks.handOffs.Load())
	})
}
