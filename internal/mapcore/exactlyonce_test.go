package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// This file pins the exactly-once owner resume of a fan-out map (DESIGN 4):
// of all the settles of a map, exactly one claims the owner signal (SET NX
// owner_signalled) and enqueues the owner's resume, whatever the
// interleaving, and a redelivered settle never signals again.
//
// The harness (eoHarness) is shared with scale_test.go and bench_test.go: an
// engine and a real asynq server serving the worker's handler through a
// recorder, so a test awaits "task X finished" instead of sleeping.

// ---- failpoint routing ----

// eoHooks are one map's failpoints; the process-global hooks route to them by
// owner run id (a map id is "<owner>~<step>").
type eoHooks struct {
	afterSettle func(mapID string, index int) error
	onSignal    func(mapID string, index int) error

	signals atomic.Int32 // OnSignal calls for this owner's maps
}

var eoRoutes sync.Map // owner run id -> *eoHooks

// eoInstallFailpoints installs the routing hooks for the duration of a
// non-parallel test (parallel tests of other files never run meanwhile) and
// clears them when it ends, as export_test.go asks.
func eoInstallFailpoints(t *testing.T) {
	route := func(mapID string) *eoHooks {
		owner, _, _ := strings.Cut(mapID, "~")
		h, ok := eoRoutes.Load(owner)
		if !ok {
			return nil
		}
		return h.(*eoHooks)
	}
	mapcore.SetFailpoints(mapcore.Failpoints{
		AfterSettle: func(mapID string, i int) error {
			if h := route(mapID); h != nil && h.afterSettle != nil {
				return h.afterSettle(mapID, i)
			}
			return nil
		},
		OnSignal: func(mapID string, i int) error {
			h := route(mapID)
			if h == nil {
				return nil
			}
			h.signals.Add(1)
			if h.onSignal != nil {
				return h.onSignal(mapID, i)
			}
			return nil
		},
	})
	t.Cleanup(func() { mapcore.SetFailpoints(mapcore.Failpoints{}) })
}

// eoOwnerID returns a fresh owner run id whose maps route to h (h may be nil
// for counting only).
func eoOwnerID(t testing.TB, h *eoHooks) (string, *eoHooks) {
	if h == nil {
		h = &eoHooks{}
	}
	id := "eo-" + engine.NewRunID()
	eoRoutes.Store(id, h)
	t.Cleanup(func() { eoRoutes.Delete(id) })
	return id, h
}

// ---- harness ----

type eoOptions struct {
	// concurrency of the asynq server. Default 4.
	concurrency int
	// engineRdb is the engine's Redis client, asynqRdb the asynq server's and
	// client's. Default: one fresh client each.
	engineRdb, asynqRdb redis.UniversalClient
	// noServer: start no server (the caller serves the queue itself).
	noServer bool
	// tracer is the engine's TracerProvider. Default none.
	tracer trace.TracerProvider
}

type eoHarness struct {
	t      testing.TB
	engine *engine.Engine
	rdb    redis.UniversalClient // the engine's
	client *worker.Client
	queue  string
	keys   keys.Keys
	insp   *asynq.Inspector
	rec    *eoRecorder

	mu        sync.Mutex
	ran       map[int]int                               // element item -> runs of its step
	onElement func(ctx context.Context, item int) error // optional, set before the map starts
	resumed   map[string]int                            // run id -> EventRunResumed
	finished  map[string]chan struct{}                  // run id -> closed at its terminal event
}

func eoLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// eoServerConfig is the asynq server configuration of every test and
// benchmark in these files: the worker's defaults (TaskCheckInterval 10 ms,
// DelayedTaskCheckInterval 200 ms, snoozes not failures), except that a
// failed task is retried after 10 ms instead of asynq's 15 s and more, so a
// redelivery test does not wait for it.
func eoServerConfig(queue string, concurrency int) asynq.Config {
	d := worker.Config{}.WithDefaults()
	return asynq.Config{
		Concurrency:              concurrency,
		Queues:                   map[string]int{queue: 1},
		TaskCheckInterval:        d.TaskCheckInterval,
		DelayedTaskCheckInterval: d.DelayedTaskCheckInterval,
		ShutdownTimeout:          d.ShutdownTimeout,
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			var s *worker.SnoozeError
			if errors.As(err, &s) {
				return worker.RetryDelay(n, err, t)
			}
			return 10 * time.Millisecond
		},
		IsFailure: worker.IsFailure,
		Logger:    eoAsynqLogger{},
		LogLevel:  asynq.FatalLevel,
	}
}

type eoAsynqLogger struct{}

func (eoAsynqLogger) Debug(...any) {}
func (eoAsynqLogger) Info(...any)  {}
func (eoAsynqLogger) Warn(...any)  {}
func (eoAsynqLogger) Error(...any) {}
func (eoAsynqLogger) Fatal(...any) {}

func newEOHarness(t testing.TB, o eoOptions) *eoHarness {
	t.Helper()
	if o.concurrency <= 0 {
		o.concurrency = 4
	}
	if o.engineRdb == nil {
		o.engineRdb = redistest.Client(t)
	}
	if o.asynqRdb == nil {
		o.asynqRdb = redistest.Client(t)
	}
	queue := redistest.Queue(t)
	prefix := redistest.Prefix(t)
	h := &eoHarness{t: t, rdb: o.engineRdb, queue: queue, keys: keys.New(prefix), rec: newEORecorder(),
		ran: map[int]int{}, resumed: map[string]int{}, finished: map[string]chan struct{}{}}
	h.client = worker.NewClient(o.asynqRdb, queue)
	hook := engine.HookFunc(func(_ context.Context, ev engine.Event) {
		switch ev.Kind {
		case engine.EventRunResumed:
			h.mu.Lock()
			h.resumed[ev.RunID]++
			h.mu.Unlock()
		case engine.EventRunCompleted, engine.EventRunFailed, engine.EventRunHalted, engine.EventRunCancelled:
			h.mu.Lock()
			if ch, ok := h.finished[ev.RunID]; ok {
				close(ch)
				delete(h.finished, ev.RunID)
			}
			h.mu.Unlock()
		}
	})
	e, err := engine.NewEngine(context.Background(), engine.Config{Client: o.engineRdb, Prefix: prefix,
		Enqueuer: h.client, Logger: eoLogger(), Hooks: []engine.Hook{hook}, TracerProvider: o.tracer})
	require.NoError(t, err)
	h.engine = e
	h.insp = asynq.NewInspectorFromRedisClient(o.asynqRdb)
	t.Cleanup(func() { _ = h.insp.Close() })
	if !o.noServer {
		// The worker's own handler, behind a recorder, on a server of our
		// own (worker.Handler's documented use) for the short retry delay.
		w := worker.New(e, o.asynqRdb, worker.Config{Queues: map[string]int{queue: 1}, Logger: eoLogger()})
		h.serve(o.asynqRdb, o.concurrency, h.rec.wrap(w.Handler()))
	}
	return h
}

// serve runs an asynq server with eoServerConfig until the test ends.
func (h *eoHarness) serve(rdb redis.UniversalClient, concurrency int, handler asynq.Handler) {
	srv := asynq.NewServerFromRedisClient(rdb, eoServerConfig(h.queue, concurrency))
	require.NoError(h.t, srv.Start(handler))
	h.t.Cleanup(srv.Shutdown)
}

// done returns a channel closed when run id reaches a terminal status in
// this engine. Call it before the run can finish.
func (h *eoHarness) done(id string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan struct{})
	h.finished[id] = ch
	return ch
}

func (h *eoHarness) resumes(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.resumed[id]
}

func (h *eoHarness) ranOf(item int) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ran[item]
}

func (h *eoHarness) setOnElement(f func(ctx context.Context, item int) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onElement = f
}

type eoIn struct {
	N int `json:"n"`
}

// element returns an element reactor that doubles its item and counts its
// runs.
func (h *eoHarness) element(name string) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("double", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(ctx context.Context, in eoIn) (int, error) {
				h.mu.Lock()
				h.ran[in.N]++
				f := h.onElement
				h.mu.Unlock()
				if f != nil {
					if err := f(ctx, in.N); err != nil {
						return 0, err
					}
				}
				return in.N * 2, nil
			},
			Undo: func(context.Context, eoIn, int) error { return nil },
		}),
		engine.Returns(engine.FromStep("double")),
	)
}

// owner returns an owner reactor: a fan-out map over items, then a step that
// sums the elements' values through the lazy reader.
func (h *eoHarness) owner(name string, items engine.Ref, batch int) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[[]int]("items"),
		mapcore.Map("each", mapcore.Config{Element: h.element(name + "-el"), Items: items, FanOut: true, BatchSize: batch}),
		engine.Step("sum", engine.StepConfig[struct {
			R mapcore.Result `json:"r"`
		}, int]{
			Args: engine.Bindings{"r": engine.FromStep("each")},
			Run: func(ctx context.Context, in struct {
				R mapcore.Result `json:"r"`
			}) (int, error) {
				rd, err := mapcore.Read[int](ctx, in.R)
				if err != nil {
					return 0, err
				}
				sum := 0
				for {
					el, ok, err := rd.Next(ctx)
					if err != nil {
						return 0, err
					}
					if !ok {
						return sum, nil
					}
					if !el.OK {
						return 0, fmt.Errorf("element %d did not complete", el.Index)
					}
					sum += el.Value
				}
			},
		}),
		engine.Returns(engine.FromStep("sum")),
	)
}

func (h *eoHarness) requireStatus(ctx context.Context, id string, want engine.Status) {
	h.t.Helper()
	run, err := h.engine.Get(ctx, id)
	require.NoError(h.t, err)
	require.Equal(h.t, want, run.Status)
}

func eoCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func eoAwait(t testing.TB, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
	}
}

func eoSeq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func resumeTaskID(owner, mapID string) string { return "resume:" + owner + ":fwd:" + mapID }

// ---- recorder ----

// eoRecorder records every delivery the server handled, by task id, and
// wakes waiters after each one.
type eoRecorder struct {
	mu      sync.Mutex
	changed chan struct{}
	ok      map[string]int // task id -> deliveries that returned nil
	failed  map[string]int // task id -> deliveries that failed (snoozes excluded)
	byType  map[string]int // task type -> deliveries that returned nil
}

func newEORecorder() *eoRecorder {
	return &eoRecorder{changed: make(chan struct{}), ok: map[string]int{}, failed: map[string]int{}, byType: map[string]int{}}
}

func (r *eoRecorder) wrap(next asynq.Handler) asynq.Handler {
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
		}
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
		return err
	})
}

// await blocks until cond (called with the recorder locked) holds.
func (r *eoRecorder) await(t testing.TB, ctx context.Context, what string, cond func(r *eoRecorder) bool) {
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

func (r *eoRecorder) counts(id string) (ok, failed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ok[id], r.failed[id]
}

// okWithPrefix counts successful deliveries of task ids starting with p.
func (r *eoRecorder) okWithPrefix(p string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for id, c := range r.ok {
		if strings.HasPrefix(id, p) {
			n += c
		}
	}
	return n
}

// ---- tests ----

// TestExactlyOnceOwnerResume is not parallel: it owns the process-global
// failpoints while it runs (its subtests run in parallel with each other and
// filter on their own owners' map ids).
func TestExactlyOnceOwnerResume(t *testing.T) {
	eoInstallFailpoints(t)

	// (a) The settle that claimed the signal dies before it enqueues the
	// owner's resume. asynq redelivers the element task; the redelivery
	// finds the element run finished and its outcome stored (HSETNX 0) and
	// must not signal again. Consequence, pinned here: nothing resumes the
	// owner. The map is settled and owner_signalled is claimed, the owner
	// stays running and unlocked, in the active index, and the map stays in
	// the maps index: the map sweeper must re-enqueue the resume of "a
	// settled map whose owner signal was claimed but whose resume is gone"
	// (DESIGN 7). Enqueueing that resume (as the sweeper would) completes
	// the owner.
	for _, window := range []string{"OnSignal", "AfterSettle"} {
		t.Run("SettleDiesBeforeResume/"+window, func(t *testing.T) {
			t.Parallel()
			ctx := eoCtx(t, 60*time.Second)
			// Concurrency 1 makes "the settle that claimed the signal"
			// observable from AfterSettle: no other settle runs between
			// the settle and its hook.
			h := newEOHarness(t, eoOptions{concurrency: 1})
			const n = 5
			var claimedBy atomic.Int32
			claimedBy.Store(-1)
			crash := func(_ string, i int) error {
				if claimedBy.CompareAndSwap(-1, int32(i)) {
					return errors.New("failpoint: the process dies before enqueueing the owner's resume")
				}
				return nil
			}
			hooks := &eoHooks{}
			if window == "OnSignal" {
				hooks.onSignal = crash
			} else {
				// The settle that stored the map's last outcome is the one
				// that claimed the signal.
				hooks.afterSettle = func(mapID string, i int) error {
					settled, err := h.rdb.HGet(ctx, h.keys.MapMeta(mapID), "settled").Int()
					if err != nil || settled < n {
						return err
					}
					return crash(mapID, i)
				}
			}
			owner, hooks := eoOwnerID(t, hooks)
			mapID := mapcore.MapID(owner, "each")
			def := h.owner("eo-crash-"+window, engine.FromInput("items"), 50)
			res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
			require.NoError(t, err)
			require.Equal(t, engine.OutcomeDispatched, res.Outcome())

			// The crashed delivery, then asynq's redelivery, both finished.
			h.rec.await(t, ctx, "the redelivery of the settle that claimed the signal", func(r *eoRecorder) bool {
				i := claimedBy.Load()
				id := fmt.Sprintf("el:%s:%d", mapID, i)
				return i >= 0 && r.failed[id] == 1 && r.ok[id] == 1
			})
			// Every other element task finished too (so nothing below is
			// still on its way).
			h.rec.await(t, ctx, "every element task", func(r *eoRecorder) bool {
				for i := range n {
					if r.ok[fmt.Sprintf("el:%s:%d", mapID, i)] != 1 {
						return false
					}
				}
				return true
			})

			for i := range n {
				require.Equal(t, 1, h.ranOf(i), "element %d ran once: the redelivery read its finished run", i)
			}
			wantSignals := int32(0) // AfterSettle: died before reaching OnSignal
			if window == "OnSignal" {
				wantSignals = 1
			}
			require.Equal(t, wantSignals, hooks.signals.Load(), "the redelivery did not signal again")
			sig, err := h.rdb.Get(ctx, h.keys.MapSignalled(mapID)).Result()
			require.NoError(t, err)
			require.Equal(t, "1", sig, "the signal stays claimed by the dead settle")
			settled, err := h.rdb.HGet(ctx, h.keys.MapMeta(mapID), "settled").Int()
			require.NoError(t, err)
			require.Equal(t, n, settled)

			// The gap: no resume was enqueued, none ran, the owner is
			// stranded (running, unlocked) where the sweeper looks.
			_, err = h.insp.GetTaskInfo(h.queue, resumeTaskID(owner, mapID))
			require.True(t, errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound), "resume task: %v", err)
			require.Zero(t, h.rec.okWithPrefix("resume:"), "no owner resume task ran")
			require.Zero(t, h.resumes(owner))
			h.requireStatus(ctx, owner, engine.StatusRunning)
			locked, err := engine.Locked(h.engine, ctx, owner)
			require.NoError(t, err)
			require.False(t, locked)
			_, err = h.rdb.ZScore(ctx, h.keys.Active(), owner).Result()
			require.NoError(t, err, "the stranded owner is in the active index")
			_, err = h.rdb.ZScore(ctx, h.keys.Maps(), mapID).Result()
			require.NoError(t, err, "the settled map is still in the maps index")

			// What the map sweeper is to do: enqueue the resume of the
			// claimed signal. The owner adopts the settled map once.
			finished := h.done(owner)
			require.NoError(t, h.client.Enqueue(ctx, engine.Wake{ID: resumeTaskID(owner, mapID), RunID: owner, Reactor: def.Name()}))
			eoAwait(t, ctx, finished, "the owner to finish")
			res, err = h.engine.Wait(ctx, owner)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
			sum, err := engine.ValueOf[int](res)
			require.NoError(t, err)
			require.Equal(t, n*(n-1), sum)
			require.Equal(t, 1, h.resumes(owner))
			require.Equal(t, wantSignals, hooks.signals.Load())
		})
	}

	// (b) The last two elements settle at the same moment: both are held
	// in their step until every other element has settled and both are
	// there, released together (so their settle scripts are sent at once),
	// then held again right after their settles and released together (so
	// both act on their settle's answer at once). Exactly one claims the
	// signal; the owner is resumed once.
	t.Run("LastTwoSettleTogether", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newEOHarness(t, eoOptions{concurrency: 4})
		const n = 10
		last := map[int]bool{n - 2: true, n - 1: true}
		othersSettled := make(chan struct{})
		var others atomic.Int32
		beforeSettle, afterSettle := newEOBarrier(2), newEOBarrier(2)
		h.setOnElement(func(ctx context.Context, item int) error {
			if !last[item] {
				return nil
			}
			select {
			case <-othersSettled:
			case <-ctx.Done():
				return ctx.Err()
			}
			return beforeSettle.wait(ctx)
		})
		var signalledBy []int
		var mu sync.Mutex
		owner, hooks := eoOwnerID(t, &eoHooks{
			afterSettle: func(_ string, i int) error {
				if !last[i] {
					if others.Add(1) == n-2 {
						close(othersSettled)
					}
					return nil
				}
				return afterSettle.wait(ctx)
			},
			onSignal: func(_ string, i int) error {
				mu.Lock()
				signalledBy = append(signalledBy, i)
				mu.Unlock()
				return nil
			},
		})
		mapID := mapcore.MapID(owner, "each")
		def := h.owner("eo-last-two", engine.FromInput("items"), 50)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, finished, "the owner to finish")
		// The terminal event fires inside the resume task; the recorder
		// counts the task when its handler returns.
		h.rec.await(t, ctx, "the last two element tasks and the resume", func(r *eoRecorder) bool {
			return r.ok[fmt.Sprintf("el:%s:%d", mapID, n-2)] == 1 && r.ok[fmt.Sprintf("el:%s:%d", mapID, n-1)] == 1 &&
				r.ok[resumeTaskID(owner, mapID)] == 1
		})

		require.Equal(t, int32(1), hooks.signals.Load(), "exactly one settle claimed the signal")
		mu.Lock()
		require.Len(t, signalledBy, 1)
		require.True(t, last[signalledBy[0]], "the signal came from one of the last two, not %d", signalledBy[0])
		mu.Unlock()
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
		require.Equal(t, 1, h.resumes(owner), "the owner was resumed once")
		require.Equal(t, 1, h.rec.okWithPrefix(resumeTaskID(owner, mapID)))
		for i := range n {
			require.Equal(t, 1, h.ranOf(i), "element %d", i)
		}
	})

	// Real concurrency, no interleaving forced: 300 elements in batches of
	// 50 on 20 concurrent workers.
	t.Run("FanOut300", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newEOHarness(t, eoOptions{concurrency: 20})
		const n = 300
		owner, hooks := eoOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		def := h.owner("eo-300", engine.FromInput("items"), 50)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
		sum, err := engine.ValueOf[int](res)
		require.NoError(t, err)
		require.Equal(t, n*(n-1), sum)
		h.rec.await(t, ctx, "every element task and the resume", func(r *eoRecorder) bool {
			return r.byType[worker.TypeElement] == n && r.ok[resumeTaskID(owner, mapID)] == 1
		})

		require.Equal(t, int32(1), hooks.signals.Load(), "one owner signal")
		require.Equal(t, 1, h.resumes(owner), "one owner resume executed")
		require.Equal(t, 1, h.rec.okWithPrefix("resume:"), "one resume task processed")
		for i := range n {
			require.Equal(t, 1, h.ranOf(i), "element %d", i)
		}
	})

	// Many small maps at once, their owners started by workers too: one
	// signal and one forward resume per map.
	t.Run("ManySmallMaps", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newEOHarness(t, eoOptions{concurrency: 20})
		const maps, n = 30, 10
		def := h.owner("eo-small", engine.FromInput("items"), 4) // several batches each
		owners := make([]string, maps)
		hooks := make([]*eoHooks, maps)
		done := make([]<-chan struct{}, maps)
		for m := range maps {
			owners[m], hooks[m] = eoOwnerID(t, nil)
			done[m] = h.done(owners[m])
		}
		var wg sync.WaitGroup
		errs := make([]error, maps)
		for m := range maps {
			wg.Go(func() {
				_, errs[m] = h.engine.Enqueue(ctx, def, map[string]any{"items": eoSeq(m*100, n)}, engine.WithRunID(owners[m]))
			})
		}
		wg.Wait()
		for m := range maps {
			require.NoError(t, errs[m])
		}
		for m := range maps {
			eoAwait(t, ctx, done[m], "owner "+owners[m])
		}
		h.rec.await(t, ctx, "every forward resume task", func(r *eoRecorder) bool {
			for _, o := range owners {
				if r.ok[resumeTaskID(o, mapcore.MapID(o, "each"))] == 0 {
					return false
				}
			}
			return r.byType[worker.TypeElement] == maps*n
		})
		for m, o := range owners {
			res, err := h.engine.Wait(ctx, o)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
			sum, err := engine.ValueOf[int](res)
			require.NoError(t, err)
			require.Equal(t, 2*(n*m*100+n*(n-1)/2), sum, "owner %d", m)
			require.Equal(t, int32(1), hooks[m].signals.Load(), "owner %d: one signal", m)
			ok, _ := h.rec.counts(resumeTaskID(o, mapcore.MapID(o, "each")))
			require.Equal(t, 1, ok, "owner %d: one forward resume", m)
			for i := range n {
				require.Equal(t, 1, h.ranOf(m*100+i), "owner %d element %d", m, i)
			}
		}
	})

	// A stray task after the map has settled, for a position the failed
	// map never claimed (the shape of the Ruby sweeper's flaw, DESIGN 10),
	// must neither run its element nor signal the owner a second time. It
	// is refused (ErrBadTask, archived) before anything runs; behind that,
	// settle.lua refuses never-claimed positions, and the SET NX on
	// owner_signalled is the last guard (defence in depth: the settle
	// condition becomes true at exactly one stored settle).
	t.Run("SettleAfterSettledDoesNotSignalAgain", func(t *testing.T) {
		t.Parallel()
		ctx := eoCtx(t, 60*time.Second)
		h := newEOHarness(t, eoOptions{concurrency: 2})
		// Item 0 is batch 0's trigger (with B = 2 the trigger is k*B-1-B/2):
		// its failure claims nothing, so the map never claims past 2.
		h.setOnElement(func(_ context.Context, item int) error {
			if item == 0 {
				return engine.Permanent(errors.New("item 0 is bad"))
			}
			return nil
		})
		owner, hooks := eoOwnerID(t, nil)
		mapID := mapcore.MapID(owner, "each")
		def := h.owner("eo-stray", engine.FromInput("items"), 2)
		finished := h.done(owner)
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, 6)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, finished, "the owner to finish")
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusFailed, res.Status)
		require.Equal(t, "each[0]/double", res.Failure.Step)
		h.rec.await(t, ctx, "the forward resume task", func(r *eoRecorder) bool { return r.ok[resumeTaskID(owner, mapID)] == 1 })
		require.Equal(t, int32(1), hooks.signals.Load())
		off, err := h.rdb.Get(ctx, h.keys.MapOffset(mapID)).Int()
		require.NoError(t, err)
		require.Equal(t, 2, off, "the failure stopped claims after batch 0")

		in, err := codec.Marshal(4)
		require.NoError(t, err)
		require.NoError(t, maptask.MustAdapt(h.client).EnqueueElement(ctx, maptask.ElementTask{MapID: mapID, Index: 4, Input: in}))
		stray := fmt.Sprintf("el:%s:4", mapID)
		h.rec.await(t, ctx, "the stray element task", func(r *eoRecorder) bool { return r.failed[stray] == 1 })
		ok, _ := h.rec.counts(stray)
		require.Zero(t, ok, "the stray task is refused, not run")
		require.Zero(t, h.ranOf(4), "a failed map runs no further element")
		require.Equal(t, int32(1), hooks.signals.Load(), "a settle after the map settled must not signal again")
	})
}

// eoBarrier releases its waiters together once n have arrived.
type eoBarrier struct {
	mu      sync.Mutex
	n       int
	release chan struct{}
}

func newEOBarrier(n int) *eoBarrier { return &eoBarrier{n: n, release: make(chan struct{})} }

func (b *eoBarrier) wait(ctx context.Context) error {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.release)
	}
	b.mu.Unlock()
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
