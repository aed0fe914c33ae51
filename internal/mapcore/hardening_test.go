package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/worker"
)

// The hardening tests: each one pins an invariant a review found broken.
// They use the step-wise drainer (drainer_test.go) where the order of
// deliveries matters, and the rollback-fault harness (rbfault_test.go)
// where a real server must snooze tasks.

// hxAwait waits for ch or fails the test when ctx ends.
func hxAwait(t *testing.T, ctx context.Context, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatalf("timed out waiting for %s", what)
	}
}

// A duplicate delivery of an element (asynq re-queues a task whose lease
// lapsed; the sweeper redelivers) arrives after the map failed, while the
// first delivery still runs the element. It must not settle the position
// ("stopped") under the running element: it snoozes on the element lock,
// the first delivery settles what it did, and the rollback undoes it. On
// the old code the duplicate settled at once, the map settled, and the
// rollback job found the element locked (and, after its attempts, gave up
// with element_in_flight while the element went on to complete).
func TestHardeningStoppedSettleWaitsForLiveDelivery(t *testing.T) {
	t.Parallel()
	ctx := drainCtx(t)
	f := newDrainFixture(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.crash = func(ctx context.Context, n int) error {
		if n != 0 {
			return nil
		}
		first := false
		once.Do(func() { first = true })
		if first {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	def := f.owner("hx-stop", mapcore.Config{Element: f.element("hx-stop-el", 1), FanOut: true})
	runID, first := f.start(def, 2)
	require.Equal(t, 2, first.Burst())
	mapID := mapcore.MapID(runID, "each")

	// The first delivery of element 0 blocks inside its step, holding the
	// element lock.
	t0 := f.d.ElementTask(mapID, 0)
	require.NotNil(t, t0)
	f.d.Drop(t0)
	firstDone := make(chan error, 1)
	go func() { firstDone <- f.d.handler.ProcessTask(ctx, asynq.NewTask(t0.Type, t0.Payload)) }()
	hxAwait(t, ctx, entered, "the first delivery of element 0 to start its step")

	// Element 1 fails: the map has failed, position 0 is still open.
	r1 := f.d.Run(f.d.ElementTask(mapID, 1))
	require.NoError(t, r1.Err)
	require.Zero(t, r1.Resumes())

	// The duplicate of element 0 snoozes: the position is not settled.
	dup := f.d.Again(t0)
	var snooze *worker.SnoozeError
	require.ErrorAs(t, dup.Err, &snooze, "a duplicate must snooze while the element runs elsewhere")
	require.Zero(t, dup.Resumes(), "the map settled while a delivery of element 0 was running")
	// Nothing may be queued now (no owner resume, no rollback job).
	f.d.Drain()

	close(release)
	require.NoError(t, <-firstDone)
	f.d.Drain()
	res := f.result(runID)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[1]/double", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures, "element 0 was undone, not reported in flight")
	f.mu.Lock()
	require.Equal(t, []int{0}, f.undone, "element 0 completed and is undone exactly once")
	f.mu.Unlock()

	// The duplicate, redelivered now, changes nothing.
	again := f.d.Again(t0)
	require.NoError(t, again.Err)
	require.Empty(t, again.New)
}

// An element task naming a position its map never claimed, or one past
// its end, is refused before anything runs, even when it carries an item:
// no element run is created and no step runs. The map is unaffected.
func TestHardeningElementTaskOutsideMap(t *testing.T) {
	t.Parallel()
	ctx := drainCtx(t)
	f := newDrainFixture(t)
	def := f.owner("hx-range", mapcore.Config{Element: f.element("hx-range-el"), FanOut: true, BatchSize: 4})
	runID, first := f.start(def, 10)
	require.Equal(t, 4, first.Burst())
	mapID := mapcore.MapID(runID, "each")
	item, err := codec.Marshal(7)
	require.NoError(t, err)

	for _, i := range []int{4, 7, 9, 10, 42, -1} {
		err := mapcore.ProcessElement(ctx, f.engine, maptask.ElementTask{MapID: mapID, Index: i, Input: item})
		require.ErrorIs(t, err, maptask.ErrBadTask, "element %d", i)
		if i >= 0 {
			_, err = engine.Element(f.engine, ctx, mapcore.ElementID(mapID, i))
			require.ErrorIs(t, err, engine.ErrNotFound, "element %d must have no run", i)
		}
	}
	f.mu.Lock()
	require.Empty(t, f.ran, "no element step may run for a position outside the map")
	f.mu.Unlock()

	// Through the worker it is archived (SkipRetry), not retried.
	bad := maptask.ElementTask{MapID: mapID, Index: 8, Input: item, Redelivery: "hx"}
	require.NoError(t, maptask.MustAdapt(f.client).EnqueueElement(ctx, bad))
	r := f.d.Run(f.d.Pending(bad.TaskID()))
	require.ErrorIs(t, r.Err, maptask.ErrBadTask)
	require.ErrorIs(t, r.Err, asynq.SkipRetry)

	f.d.Drain()
	res := f.result(runID)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	f.requireRanOnce(10)
}

// hxBoomOwner maps cfg over the input "items", then fails at "boom".
func hxBoomOwner(name string, cfg mapcore.Config) *engine.Definition {
	cfg.Items = engine.FromInput("items")
	return engine.MustDefine(name,
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", cfg),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, engine.Args) (int, error) { return 0, errBoom },
		}),
	)
}

// A rollback task for a position the rollback has not claimed (or past its
// end) is refused before it undoes anything: rollback positions are undone
// newest first, and only claimed ones settle.
func TestHardeningRollbackTaskOutsideRollback(t *testing.T) {
	t.Parallel()
	ctx := drainCtx(t)
	f := newDrainFixture(t)
	const n, batch = 10, 4
	def := hxBoomOwner("hx-rbrange", mapcore.Config{Element: f.element("hx-rbrange-el"), FanOut: true, BatchSize: batch})
	runID, _ := f.start(def, n)
	mapID := mapcore.MapID(runID, "each")
	next := f.d.DrainUntil(func(ti *asynq.TaskInfo) bool { return ti.Type == worker.TypeRollback })
	require.NotNil(t, next, "the rollback started")

	for _, p := range []int{batch, 7, n - 1} {
		task := maptask.RollbackTask{MapID: mapID, Gen: 1, Pos: p, Index: n - 1 - p, Redelivery: "hx"}
		require.NoError(t, maptask.MustAdapt(f.client).EnqueueRollback(ctx, task))
		r := f.d.Run(f.d.Pending(task.TaskID()))
		require.ErrorIs(t, r.Err, maptask.ErrBadTask, "position %d", p)
		require.ErrorIs(t, r.Err, asynq.SkipRetry)
	}
	// Past the end (the worker refuses its payload before: Index < 0).
	err := mapcore.ProcessRollback(ctx, f.engine, maptask.RollbackTask{MapID: mapID, Gen: 1, Pos: n, Index: -1})
	require.ErrorIs(t, err, maptask.ErrBadTask)
	f.mu.Lock()
	require.Empty(t, f.undone, "nothing may be undone for an unclaimed rollback position")
	f.mu.Unlock()

	f.d.Drain()
	res := f.result(runID)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)
	f.mu.Lock()
	undone := append([]int(nil), f.undone...)
	f.mu.Unlock()
	require.ElementsMatch(t, drainItems(n), undone, "every element undone once")
}

// hxReserveElement is an element reactor: "reserve" (whose undo fails for
// item bad), then "charge" (which fails for item bad). Element bad thus
// fails and rolls itself back, and its own rollback fails at reserve.
func hxReserveElement(name string, bad int) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("reserve", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, in eoIn) (int, error) { return in.N, nil },
			Undo: func(_ context.Context, in eoIn, _ int) error {
				if in.N == bad {
					return engine.Permanent(fmt.Errorf("cannot release the reservation of item %d", in.N))
				}
				return nil
			},
		}),
		engine.Step("charge", engine.StepConfig[eoIn, int]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			After: []string{"reserve"},
			Run: func(_ context.Context, in eoIn) (int, error) {
				if in.N == bad {
					return 0, engine.Permanent(fmt.Errorf("item %d declined", in.N))
				}
				return in.N, nil
			},
		}),
		engine.Returns(engine.FromStep("charge")),
	)
}

// When the failing element's own rollback fails, the map's Failure names
// those rollback failures with the element's path (each[3]/reserve, not
// reserve), and the inline and fan-out maps end with the same Failure.
func TestHardeningFailingElementRollbackFailuresKeepTheirPath(t *testing.T) {
	t.Parallel()
	const n, bad = 6, 3
	run := func(t *testing.T, fanOut bool) *engine.Failure {
		f := newDrainFixture(t)
		name := fmt.Sprintf("hx-path-%t", fanOut)
		def := f.owner(name, mapcore.Config{Element: hxReserveElement(name+"-el", bad), FanOut: fanOut})
		res, err := f.engine.Run(drainCtx(t), def, map[string]any{"items": drainItems(n)}, engine.NoWait())
		require.NoError(t, err)
		if fanOut {
			require.Equal(t, engine.OutcomeDispatched, res.Outcome())
			f.d.Drain()
			res = f.result(res.RunID)
		}
		require.Equal(t, engine.StatusFailed, res.Status)
		return res.Failure
	}
	inline, fanOut := run(t, false), run(t, true)
	for _, f := range []*engine.Failure{inline, fanOut} {
		require.Equal(t, fmt.Sprintf("each[%d]/charge", bad), f.Step)
		require.Len(t, f.RollbackFailures, 1, "%+v", f.RollbackFailures)
		rf := f.RollbackFailures[0]
		require.Equal(t, fmt.Sprintf("each[%d]/reserve", bad), rf.Step)
		require.Equal(t, engine.ActionUndo, rf.Kind)
		require.Contains(t, rf.Message, "cannot release the reservation of item 3")
	}
	hxSameFailure(t, inline, fanOut)
}

// hxSameFailure checks that the inline and the fan-out map ended with the
// same Failure: step, error, and rollback failures (messages included).
func hxSameFailure(t *testing.T, inline, fanOut *engine.Failure) {
	t.Helper()
	require.NotNil(t, inline)
	require.NotNil(t, fanOut)
	require.Equal(t, inline.Step, fanOut.Step)
	require.Equal(t, inline.Code, fanOut.Code)
	require.Equal(t, inline.Message, fanOut.Message)
	require.Equal(t, inline.Retryable, fanOut.Retryable)
	require.Equal(t, inline.RollbackFailures, fanOut.RollbackFailures)
	require.Equal(t, inline.RollbackFailuresOmitted, fanOut.RollbackFailuresOmitted)
}

// hxRecords is a slog handler that keeps every record.
type hxRecords struct {
	mu   sync.Mutex
	recs []hxRecord
}

type hxRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (h *hxRecords) Enabled(context.Context, slog.Level) bool { return true }

func (h *hxRecords) Handle(_ context.Context, r slog.Record) error {
	rec := hxRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	h.recs = append(h.recs, rec)
	h.mu.Unlock()
	return nil
}

// WithAttrs and WithGroup flatten: the tests only look at keys.
func (h *hxRecords) WithAttrs(as []slog.Attr) slog.Handler {
	return &hxWith{h: h, attrs: as}
}
func (h *hxRecords) WithGroup(string) slog.Handler { return h }

type hxWith struct {
	h     *hxRecords
	attrs []slog.Attr
}

func (w *hxWith) Enabled(ctx context.Context, l slog.Level) bool { return true }
func (w *hxWith) Handle(ctx context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(w.attrs...)
	return w.h.Handle(ctx, r)
}
func (w *hxWith) WithAttrs(as []slog.Attr) slog.Handler {
	return &hxWith{h: w.h, attrs: append(append([]slog.Attr(nil), w.attrs...), as...)}
}
func (w *hxWith) WithGroup(string) slog.Handler { return w }

// A rollback logs one line per map at Info and every per-element line at
// Debug, also for an element whose undo failed (the owner's Failure and its
// terminal event carry that; an operator must not get a line per element).
func TestHardeningPerElementRollbackLogsAtDebug(t *testing.T) {
	t.Parallel()
	logs := &hxRecords{}
	f := newDrainFixture(t, func(c *engine.Config) { c.Logger = slog.New(logs) })
	const n, bad = 4, 1
	elem := engine.MustDefine("hx-log-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("reserve", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, in eoIn) (int, error) { return in.N, nil },
			Undo: func(_ context.Context, in eoIn, _ int) error {
				if in.N == bad {
					return engine.Permanent(errors.New("cannot release"))
				}
				return nil
			},
		}))
	def := hxBoomOwner("hx-log", mapcore.Config{Element: elem, FanOut: true})
	runID, _ := f.start(def, n)
	mapID := mapcore.MapID(runID, "each")
	f.d.Drain()
	res := f.result(runID)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Len(t, res.Failure.RollbackFailures, 1)

	logs.mu.Lock()
	defer logs.mu.Unlock()
	elementLines := 0
	var reactorSide []string
	for _, r := range logs.recs {
		ev := r.attrs["event"]
		perElement := r.attrs["index"] != "" || strings.HasPrefix(r.attrs["run"], mapID+".")
		if !perElement {
			continue
		}
		if strings.HasPrefix(ev, "reactor.map.") {
			elementLines++
			require.Equal(t, slog.LevelDebug, r.level, "per-element map line %q (%s) above Debug", r.msg, ev)
		} else if r.level > slog.LevelDebug {
			// Events of the element runs themselves come from the
			// reactor's executor (reactor/events.go picks their level).
			reactorSide = append(reactorSide, fmt.Sprintf("%s %s", r.level, ev))
		}
	}
	require.Equal(t, n, elementLines, "one per-element rollback line per element")
	if len(reactorSide) > 0 {
		t.Logf("reactor-side element-run lines above Debug (not mapstep's): %v", reactorSide)
	}
}

// A worker that died while it held an element's lock leaves the lock key
// with its TTL. Inline and fan-out rollbacks wait for it the same way (the
// same time budget, longer than a lock's expiry) and end with the same
// Failure: the element is undone once the lock expires. On the old code the
// inline rollback gave up after UndoLockWait and reported element_in_flight
// where the fan-out one snoozed on and undid the element.
func TestHardeningDeadElementLockSameWaitBothModes(t *testing.T) {
	t.Parallel()
	const n, held = 5, 2
	// The engine's lock expiry is 2 s; the dead holder's lock has 1.5 s to
	// live when the rollback first finds it (a worker's lock lives at most
	// one expiry past its last heartbeat). UndoLockWait is far shorter.
	opts := rbfOptions{undoLockWait: 300 * time.Millisecond, lockExpiry: 2 * time.Second}
	run := func(t *testing.T, fanOut bool, ttl time.Duration) (*engine.Result, *rbfHarness, *rbfCounts, string) {
		ctx := eoCtx(t, 60*time.Second)
		o := opts
		o.noServer = !fanOut
		h := newRBFHarness(t, o)
		c := newRBFCounts()
		// Both modes use the same owner id (each harness has its own key
		// prefix and queue), so their Failures can be compared whole.
		owner := "hx-dead-owner"
		mapID := mapcore.MapID(owner, "each")
		lockKey := h.keys.ElemLock(mapcore.ElementID(mapID, held))
		t.Cleanup(func() { h.rdb.Del(context.Background(), lockKey) })
		name := fmt.Sprintf("hx-dead-%t-%d", fanOut, ttl/time.Millisecond)
		def := rbfOwner(name, c.element(name+"-el"), fanOut, 50, func(ctx context.Context) error {
			return h.rdb.Set(ctx, lockKey, "dead-worker-token", ttl).Err()
		})
		if fanOut {
			return h.runFanOut(ctx, def, owner, eoSeq(0, n)), h, c, mapID
		}
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner))
		require.NoError(t, err)
		return res, h, c, mapID
	}

	t.Run("UndoneOnceTheLockExpires", func(t *testing.T) {
		t.Parallel()
		var mu sync.Mutex
		failures := map[bool]*engine.Failure{}
		t.Run("modes", func(t *testing.T) {
			for _, fanOut := range []bool{false, true} {
				t.Run(fmt.Sprintf("fanOut=%t", fanOut), func(t *testing.T) {
					t.Parallel()
					res, h, c, mapID := run(t, fanOut, 1500*time.Millisecond)
					requireBoom(t, res)
					c.requireUndos(t, n, nil)
					require.Equal(t, "undone", h.outcome(context.Background(), mapID, n-1-held).Outcome)
					h.requireElementUndone(context.Background(), mapID, held)
					mu.Lock()
					failures[fanOut] = res.Failure
					mu.Unlock()
				})
			}
		})
		hxSameFailure(t, failures[false], failures[true])
	})

	t.Run("LiveHolderPastTheBudgetIsWaitedFor", func(t *testing.T) {
		t.Parallel()
		// A lock still held past the wait belongs to a live holder: the
		// rollback warns once and goes on waiting; the element is undone
		// when the holder lets go, and the Failure is the same as ever.
		var mu sync.Mutex
		failures := map[bool]*engine.Failure{}
		t.Run("modes", func(t *testing.T) {
			for _, fanOut := range []bool{false, true} {
				t.Run(fmt.Sprintf("fanOut=%t", fanOut), func(t *testing.T) {
					t.Parallel()
					ctx := eoCtx(t, 60*time.Second)
					logs := &hxRecords{}
					o := opts
					o.noServer = !fanOut
					o.lockExpiry = 600 * time.Millisecond // wait = 800 ms
					o.logger = slog.New(logs)
					h := newRBFHarness(t, o)
					c := newRBFCounts()
					owner := "hx-live-owner"
					mapID := mapcore.MapID(owner, "each")
					lockKey := h.keys.ElemLock(mapcore.ElementID(mapID, held))
					t.Cleanup(func() { h.rdb.Del(context.Background(), lockKey) })
					name := fmt.Sprintf("hx-live-%t", fanOut)
					def := rbfOwner(name, c.element(name+"-el"), fanOut, 50, func(ctx context.Context) error {
						return h.rdb.Set(ctx, lockKey, "live-holder-token", time.Minute).Err()
					})
					done := make(chan *engine.Result, 1)
					go func() {
						if fanOut {
							done <- h.runFanOut(ctx, def, owner, eoSeq(0, n))
							return
						}
						res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner))
						assert.NoError(t, err)
						done <- res
					}()
					warnings := func() int {
						logs.mu.Lock()
						defer logs.mu.Unlock()
						k := 0
						for _, r := range logs.recs {
							if r.attrs["event"] == "reactor.map.rollback.element_held" {
								k++
								assert.Equal(t, slog.LevelWarn, r.level)
								assert.Equal(t, strconv.Itoa(held), r.attrs["index"])
							}
						}
						return k
					}
					require.Eventually(t, func() bool { return warnings() == 1 }, 30*time.Second, 10*time.Millisecond,
						"an operator is told once the wait passes")
					select {
					case <-done:
						t.Fatal("the rollback gave up on a live holder")
					default:
					}
					require.NoError(t, h.rdb.Del(ctx, lockKey).Err()) // the holder lets go
					res := <-done
					requireBoom(t, res)
					c.requireUndos(t, n, nil)
					require.Equal(t, "undone", h.outcome(context.Background(), mapID, n-1-held).Outcome)
					require.Equal(t, 1, warnings(), "one warning, however long the wait")
					mu.Lock()
					failures[fanOut] = res.Failure
					mu.Unlock()
				})
			}
		})
		hxSameFailure(t, failures[false], failures[true])
	})
}

// hxGatedSource pages the ints [0, n). Once gated, a page of one item
// (what an item-less element task reads) signals entered and waits for
// release, so a test can hold a delivery between its read of the map and
// its element run.
type hxGatedSource struct {
	n       int
	mu      sync.Mutex
	gated   bool
	entered chan struct{}
	release chan struct{}
}

func (s *hxGatedSource) Len(context.Context, engine.Args) (int, error) { return s.n, nil }

func (s *hxGatedSource) Page(ctx context.Context, _ engine.Args, offset, limit int) ([]any, error) {
	s.mu.Lock()
	gated := s.gated && limit == 1
	s.gated = s.gated && !gated // once
	s.mu.Unlock()
	if gated {
		close(s.entered)
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	out := make([]any, 0, limit)
	for i := offset; i < offset+limit && i < s.n; i++ {
		out = append(out, i)
	}
	return out, nil
}

// A delivery of element 0 reads its map while the map still runs, then
// stalls before it reaches the element (here: paging its item from the
// Source, as a sweeper redelivery does). Meanwhile the map fails, another
// delivery settles element 0 "stopped", the map settles and its rollback
// finds no element 0 to undo. When the stalled delivery goes on, element 0
// must not run: the stopped settle created it finished. On the old code it
// ran, completed, and nothing ever undid it.
func TestHardeningStoppedElementCannotStartLater(t *testing.T) {
	t.Parallel()
	ctx := drainCtx(t)
	f := newDrainFixture(t)
	src := &hxGatedSource{n: 2, entered: make(chan struct{}), release: make(chan struct{})}
	def := engine.MustDefine("hx-late",
		mapcore.Map("each", mapcore.Config{Element: f.element("hx-late-el", 1), Pages: src, FanOut: true}),
	)
	res, err := f.engine.Run(ctx, def, nil, engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	require.Equal(t, 2, f.d.Observe().Burst())
	runID, mapID := res.RunID, mapcore.MapID(res.RunID, "each")
	t0 := f.d.ElementTask(mapID, 0)
	require.NotNil(t, t0)
	f.d.Drop(t0)

	src.mu.Lock()
	src.gated = true
	src.mu.Unlock()
	late := make(chan error, 1)
	go func() { late <- mapcore.ProcessElement(ctx, f.engine, maptask.ElementTask{MapID: mapID, Index: 0}) }()
	hxAwait(t, ctx, src.entered, "the late delivery to read the map")

	require.NoError(t, f.d.Run(f.d.ElementTask(mapID, 1)).Err) // element 1 fails the map
	stop := f.d.Again(t0)                                      // settles element 0 stopped
	require.NoError(t, stop.Err)
	require.Equal(t, 1, stop.Resumes(), "the map settled")
	f.d.Drain()
	res = f.result(runID)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[1]/double", res.Failure.Step)
	require.Empty(t, res.Failure.RollbackFailures)

	close(src.release)
	require.NoError(t, <-late)
	f.mu.Lock()
	require.Zero(t, f.ran[0], "element 0 ran after its map was rolled back")
	require.Empty(t, f.undone)
	f.mu.Unlock()
	run, err := engine.Element(f.engine, ctx, mapcore.ElementID(mapID, 0))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.ErrorIs(t, run.Failure, engine.ErrElementStopped)
	require.Zero(t, f.d.Len(), "the late delivery settled nothing and enqueued nothing")
}
