package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

type fixture struct {
	engine *engine.Engine
	queue  string
	prefix string
	mu     sync.Mutex
	ran    map[int]int
	undone []int
}

func newFixture(t *testing.T, withWorker bool) *fixture {
	t.Helper()
	return newFixtureOn(t, redistest.Client(t), withWorker)
}

// newFixtureOn is newFixture on rdb, the engine's Config changed by mod.
func newFixtureOn(t *testing.T, rdb redis.UniversalClient, withWorker bool, mod ...func(*engine.Config)) *fixture {
	t.Helper()
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	prefix := redistest.Prefix(t)
	cfg := engine.Config{Client: rdb, Prefix: prefix, Enqueuer: client, Logger: logger}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := engine.NewEngine(context.Background(), cfg)
	require.NoError(t, err)
	f := &fixture{engine: e, queue: queue, prefix: prefix, ran: map[int]int{}}
	if withWorker {
		w := worker.New(e, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 4, Logger: logger})
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
	}
	return f
}

// element doubles its item; it fails for items in failOn.
func (f *fixture) element(name string, failOn ...int) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("double", engine.StepConfig[struct {
			N int `json:"n"`
		}, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(_ context.Context, in struct {
				N int `json:"n"`
			}) (int, error) {
				f.mu.Lock()
				f.ran[in.N]++
				f.mu.Unlock()
				for _, x := range failOn {
					if x == in.N {
						return 0, engine.Permanent(fmt.Errorf("item %d is bad", in.N))
					}
				}
				return in.N * 2, nil
			},
			Undo: func(_ context.Context, in struct {
				N int `json:"n"`
			}, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, in.N)
				f.mu.Unlock()
				return nil
			},
		}),
		engine.Returns(engine.FromStep("double")),
	)
}

// ranOf is how many times the element of item i ran.
func (f *fixture) ranOf(i int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ran[i]
}

func items(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func sumOwner(name string, elem *engine.Definition, fanOut, partial bool, after ...engine.Part) *engine.Definition {
	parts := []engine.Part{
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fanOut, Partial: partial}),
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
				all, err := rd.All(ctx)
				if err != nil {
					return 0, err
				}
				sum := 0
				for i, el := range all {
					if el.Index != i {
						return 0, fmt.Errorf("element %d read at position %d", el.Index, i)
					}
					sum += el.Value
				}
				return sum, nil
			},
		}),
		engine.Returns(engine.FromStep("sum")),
	}
	return engine.MustDefine(name, append(parts, after...)...)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestInlineMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	def := sumOwner("inline", f.element("inline-el"), false, false)
	res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": items(250)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 249*250, sum)
}

func TestInlineAtomicFailureRollsBackCompletedElements(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	def := sumOwner("inline-fail", f.element("inline-fail-el", 3), false, false)
	res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": items(10)})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[3]/double", res.Failure.Step)
	require.Equal(t, "item 3 is bad", res.Failure.Message)
	require.Equal(t, []int{2, 1, 0}, f.undone, "completed elements undone newest first")
	require.Zero(t, f.ran[4], "no element after the failure runs")
}

func TestEmptyMapSettlesAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	for _, fan := range []bool{false, true} {
		def := sumOwner(fmt.Sprint("empty-", fan), f.element(fmt.Sprint("empty-el-", fan)), fan, false)
		res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": []int{}})
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status)
	}
}

func TestFanOutMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	def := sumOwner("fan", f.element("fan-el"), true, false)
	res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": items(120)}, engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 119*120, sum)
	for i := range 120 {
		require.Equal(t, 1, f.ran[i], "element %d", i)
	}
}

func TestFanOutAtomicFailure(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	def := sumOwner("fan-fail", f.element("fan-fail-el", 7), true, false)
	res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(30)})
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[7]/double", res.Failure.Step)
	f.mu.Lock()
	defer f.mu.Unlock()
	completed := 0
	for i, n := range f.ran {
		if i != 7 && n > 0 {
			completed++
		}
	}
	require.Len(t, f.undone, completed, "every completed element is undone")
}

func TestPartialMapKeepsSuccessesAndFailures(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	for _, fan := range []bool{false, true} {
		elem := f.element(fmt.Sprint("partial-el-", fan), 2, 5)
		def := engine.MustDefine(fmt.Sprint("partial-", fan),
			engine.Input[[]int]("items", engine.Required()),
			mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fan, Partial: true}),
			engine.Returns(engine.FromStep("each")))
		res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(8)})
		require.NoError(t, err)
		res, err = f.engine.Wait(ctxT(t), res.RunID)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status)
		r, err := engine.ValueOf[mapcore.Result](res)
		require.NoError(t, err)
		require.Equal(t, 2, r.Failed)
		all, err := mapcore.ReadWith[int](f.engine, r).All(ctxT(t))
		require.NoError(t, err)
		require.Len(t, all, 8)
		for _, el := range all {
			if el.Index == 2 || el.Index == 5 {
				require.NotNil(t, el.Failure, "element %d", el.Index)
				require.False(t, el.OK)
			} else {
				require.True(t, el.OK, "element %d", el.Index)
				require.Equal(t, el.Index*2, el.Value)
			}
		}
	}
}

func TestStepFailureAfterMapUndoesElements(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	fail := engine.Step("boom", engine.StepConfig[engine.Args, int]{After: []string{"sum"},
		Run: func(context.Context, engine.Args) (int, error) { return 0, errors.New("after map") }})
	def := sumOwner("after", f.element("after-el"), true, false, fail)
	res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(12)})
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.ElementsMatch(t, items(12), f.undone)
}

// A crash between the owner's save of its map id and the start script: the
// resumed owner creates the map and dispatches it, instead of failing.
func TestCrashBetweenSaveAndStartResumes(t *testing.T) {
	f := newFixture(t, true)
	def := sumOwner("save-start", f.element("save-start-el"), true, false)
	crashed := false
	mapcore.SetFailpoints(mapcore.Failpoints{BeforeStart: func(mapID string, _ int) error {
		if !crashed && mapID == mapcore.MapID("save-start-1", "each") {
			crashed = true
			return errors.New("injected crash before the start script")
		}
		return nil
	}})
	t.Cleanup(func() { mapcore.SetFailpoints(mapcore.Failpoints{}) })
	ctx := ctxT(t)
	_, err := f.engine.Run(ctx, def, map[string]any{"items": items(60)}, engine.WithRunID("save-start-1"))
	require.ErrorContains(t, err, "injected crash")
	run, err := f.engine.Get(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, run.Status, "an infrastructure error is not a step failure")

	res, err := f.engine.Resume(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	res, err = f.engine.Wait(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 59*60, sum)
}

// numbers is a paging Source of n ints, offset by the "base" With argument;
// it records the largest page asked for.
type numbers struct {
	n       int
	mu      sync.Mutex
	maxPage int
	pages   int
}

func (s *numbers) Len(_ context.Context, with engine.Args) (int, error) { return s.n, nil }
func (s *numbers) Page(_ context.Context, with engine.Args, offset, limit int) ([]any, error) {
	base, err := engine.Arg[int](with, "base")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.maxPage = max(s.maxPage, limit)
	s.pages++
	s.mu.Unlock()
	out := make([]any, 0, limit)
	for i := offset; i < offset+limit && i < s.n; i++ {
		out = append(out, base+i)
	}
	return out, nil
}

func TestPagedSource(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	for _, fan := range []bool{false, true} {
		src := &numbers{n: 230}
		// With feeds both the Source and every element.
		elem := engine.MustDefine(fmt.Sprint("paged-el-", fan),
			engine.Input[int]("item", engine.Required()),
			engine.Input[int]("base", engine.Required()),
			engine.Step("double", engine.StepConfig[struct {
				N    int `json:"n"`
				Base int `json:"base"`
			}, int]{
				Args: engine.Bindings{"n": engine.FromInput("item"), "base": engine.FromInput("base")},
				Run: func(_ context.Context, in struct {
					N    int `json:"n"`
					Base int `json:"base"`
				}) (int, error) {
					if in.Base != 1000 {
						return 0, fmt.Errorf("base %d", in.Base)
					}
					return in.N * 2, nil
				},
			}),
			engine.Returns(engine.FromStep("double")))
		def := engine.MustDefine(fmt.Sprint("paged-", fan),
			mapcore.Map("each", mapcore.Config{Element: elem, Pages: src, FanOut: fan, BatchSize: 40,
				With: engine.Bindings{"base": engine.Const(1000)}}),
			engine.Returns(engine.FromStep("each")))
		res, err := f.engine.Run(ctxT(t), def, nil)
		require.NoError(t, err)
		res, err = f.engine.Wait(ctxT(t), res.RunID)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
		r, err := engine.ValueOf[mapcore.Result](res)
		require.NoError(t, err)
		all, err := mapcore.ReadWith[int](f.engine, r).All(ctxT(t))
		require.NoError(t, err)
		require.Len(t, all, 230)
		for i, el := range all {
			require.Equal(t, 2*(1000+i), el.Value)
		}
		if fan {
			require.LessOrEqual(t, src.maxPage, 40, "each claim fetches one batch")
			require.Equal(t, 6, src.pages, "one page per batch: 230 items in batches of 40")
		} else {
			require.LessOrEqual(t, src.maxPage, 100, "inline maps read a chunk at a time")
		}
	}
}

// A map inside a map element runs inline, in the element's job.
func TestNestedMapRunsInline(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	leaf := f.element("nested-leaf")
	inner := engine.MustDefine("nested-inner",
		engine.Input[int]("item", engine.Required()),
		engine.Step("spread", engine.StepConfig[struct {
			N int `json:"n"`
		}, []int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(_ context.Context, in struct {
				N int `json:"n"`
			}) ([]int, error) {
				return []int{in.N * 10, in.N*10 + 1}, nil
			},
		}),
		mapcore.Map("leaves", mapcore.Config{Element: leaf, Items: engine.FromStep("spread"), FanOut: true}),
		engine.Returns(engine.FromStep("leaves")))
	def := engine.MustDefine("nested-outer",
		mapcore.Map("outer", mapcore.Config{Element: inner, Items: engine.Const([]int{1, 2, 3}), FanOut: true}),
		engine.Returns(engine.FromStep("outer")))
	res, err := f.engine.Run(ctxT(t), def, nil)
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range []int{10, 11, 20, 21, 30, 31} {
		require.Equal(t, 1, f.ran[n], "leaf %d", n)
	}
	// The inner maps ran inline: their meta says so.
	for i := range 3 {
		innerMap := mapcore.MapID(mapcore.ElementID(mapcore.MapID(res.RunID, "outer"), i), "leaves")
		p, ok, err := mapcore.ProgressOf(ctxT(t), f.engine, innerMap)
		require.NoError(t, err)
		require.True(t, ok, "inner map %s", innerMap)
		require.Equal(t, 2, p.Settled)
	}
}

// Cancel while a fan-out map still runs forward: the map stops claiming,
// the elements in flight settle, and every element that completed is
// undone exactly once; the run ends cancelled.
func TestCancelDuringFanOutForward(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	// More slots than a batch: the ten elements held at the gate cannot
	// take every slot while one of elements 0-9 still waits for one (a
	// task retried or snoozed under load goes behind the next batch).
	w := worker.New(f.engine, engine.Client(f.engine), worker.Config{Queues: map[string]int{f.queue: 1}, Concurrency: 16,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	gate := make(chan struct{})
	var completed sync.Map
	var started sync.WaitGroup
	started.Add(10)
	elem := engine.MustDefine("cancel-fwd-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("work", engine.StepConfig[struct {
			N int `json:"n"`
		}, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(ctx context.Context, in struct {
				N int `json:"n"`
			}) (int, error) {
				if in.N >= 10 {
					select { // held until the cancel is in
					case <-gate:
					case <-ctx.Done():
						return 0, ctx.Err()
					}
				} else {
					defer started.Done()
				}
				completed.Store(in.N, true)
				return in.N, nil
			},
			Undo: func(_ context.Context, in struct {
				N int `json:"n"`
			}, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, in.N)
				f.mu.Unlock()
				return nil
			},
		}),
		engine.Returns(engine.FromStep("work")))
	def := engine.MustDefine("cancel-fwd",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(items(120)), FanOut: true, BatchSize: 10}))
	ctx := ctxT(t)
	res, err := f.engine.Run(ctx, def, nil, engine.WithRunID("cancel-fwd-1"), engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	started.Wait() // elements 0-9 completed; batch [10, 20) is claimed and held
	require.NoError(t, f.engine.Cancel(ctx, "cancel-fwd-1"))
	close(gate)
	res, err = f.engine.Wait(ctx, "cancel-fwd-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status, "%v", res.Err())
	var want []int
	completed.Range(func(k, _ any) bool { want = append(want, k.(int)); return true })
	f.mu.Lock()
	defer f.mu.Unlock()
	require.ElementsMatch(t, want, f.undone, "every completed element undone exactly once")
	require.Less(t, len(want), 120, "the map stopped claiming")
}

// An inline map cut short (its caller's context ended mid-map), then Undo:
// the elements that completed are undone, and so are the completed steps of
// the element that was cut short.
func TestUndoOfRunAbortedMidInlineMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	ctx, cancel := context.WithCancel(ctxT(t))
	type in struct {
		N int `json:"n"`
	}
	elem := engine.MustDefine("abort-inline-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("first", engine.StepConfig[in, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, x in) (int, error) { return x.N, nil },
			Undo: func(_ context.Context, x in, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, x.N)
				f.mu.Unlock()
				return nil
			},
		}),
		engine.Step("second", engine.StepConfig[in, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")}, After: []string{"first"},
			Run: func(ctx context.Context, x in) (int, error) {
				if x.N == 4 {
					cancel() // the caller gives up while element 4 runs
					<-ctx.Done()
					return 0, ctx.Err()
				}
				return x.N, nil
			},
		}))
	def := engine.MustDefine("abort-inline",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(items(10))}))
	res, err := f.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusAborted, res.Status)
	undone, err := f.engine.Undo(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, undone.Status, "%v", undone.Err())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []int{4, 3, 2, 1, 0}, f.undone, "newest first, the cut-short element included")
}
