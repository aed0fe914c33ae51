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

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

type fixture struct {
	engine *reactor.Engine
	queue  string
	prefix string
	mu     sync.Mutex
	ran    map[int]int
	undone []int
}

func newFixture(t *testing.T, withWorker bool) *fixture {
	t.Helper()
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	prefix := redistest.Prefix(t)
	e, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: client, Logger: logger})
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
func (f *fixture) element(name string, failOn ...int) *reactor.Definition {
	return reactor.MustDefine(name,
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("double", reactor.StepConfig[struct {
			N int `json:"n"`
		}, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(_ context.Context, in struct {
				N int `json:"n"`
			}) (int, error) {
				f.mu.Lock()
				f.ran[in.N]++
				f.mu.Unlock()
				for _, x := range failOn {
					if x == in.N {
						return 0, reactor.Permanent(fmt.Errorf("item %d is bad", in.N))
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
		reactor.Returns(reactor.FromStep("double")),
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

func sumOwner(name string, elem *reactor.Definition, fanOut, partial bool, after ...reactor.Part) *reactor.Definition {
	parts := []reactor.Part{
		reactor.Input[[]int]("items", reactor.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: fanOut, Partial: partial}),
		reactor.Step("sum", reactor.StepConfig[struct {
			R mapcore.Result `json:"r"`
		}, int]{
			Args: reactor.Bindings{"r": reactor.FromStep("each")},
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
		reactor.Returns(reactor.FromStep("sum")),
	}
	return reactor.MustDefine(name, append(parts, after...)...)
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
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := reactor.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 249*250, sum)
}

func TestInlineAtomicFailureRollsBackCompletedElements(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	def := sumOwner("inline-fail", f.element("inline-fail-el", 3), false, false)
	res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": items(10)})
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
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
		require.Equal(t, reactor.StatusCompleted, res.Status)
	}
}

func TestFanOutMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	def := sumOwner("fan", f.element("fan-el"), true, false)
	res, err := f.engine.Run(ctxT(t), def, map[string]any{"items": items(120)}, reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := reactor.ValueOf[int](res)
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
	require.Equal(t, reactor.StatusFailed, res.Status)
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
		def := reactor.MustDefine(fmt.Sprint("partial-", fan),
			reactor.Input[[]int]("items", reactor.Required()),
			mapcore.Map("each", mapcore.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: fan, Partial: true}),
			reactor.Returns(reactor.FromStep("each")))
		res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(8)})
		require.NoError(t, err)
		res, err = f.engine.Wait(ctxT(t), res.RunID)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, res.Status)
		r, err := reactor.ValueOf[mapcore.Result](res)
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
	fail := reactor.Step("boom", reactor.StepConfig[reactor.Args, int]{After: []string{"sum"},
		Run: func(context.Context, reactor.Args) (int, error) { return 0, errors.New("after map") }})
	def := sumOwner("after", f.element("after-el"), true, false, fail)
	res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(12)})
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
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
	_, err := f.engine.Run(ctx, def, map[string]any{"items": items(60)}, reactor.WithRunID("save-start-1"))
	require.ErrorContains(t, err, "injected crash")
	run, err := f.engine.Get(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRunning, run.Status, "an infrastructure error is not a step failure")

	res, err := f.engine.Resume(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	res, err = f.engine.Wait(ctx, "save-start-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := reactor.ValueOf[int](res)
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

func (s *numbers) Len(_ context.Context, with reactor.Args) (int, error) { return s.n, nil }
func (s *numbers) Page(_ context.Context, with reactor.Args, offset, limit int) ([]any, error) {
	base, err := reactor.Arg[int](with, "base")
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
		elem := reactor.MustDefine(fmt.Sprint("paged-el-", fan),
			reactor.Input[int]("item", reactor.Required()),
			reactor.Input[int]("base", reactor.Required()),
			reactor.Step("double", reactor.StepConfig[struct {
				N    int `json:"n"`
				Base int `json:"base"`
			}, int]{
				Args: reactor.Bindings{"n": reactor.FromInput("item"), "base": reactor.FromInput("base")},
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
			reactor.Returns(reactor.FromStep("double")))
		def := reactor.MustDefine(fmt.Sprint("paged-", fan),
			mapcore.Map("each", mapcore.Config{Element: elem, Pages: src, FanOut: fan, BatchSize: 40,
				With: reactor.Bindings{"base": reactor.Const(1000)}}),
			reactor.Returns(reactor.FromStep("each")))
		res, err := f.engine.Run(ctxT(t), def, nil)
		require.NoError(t, err)
		res, err = f.engine.Wait(ctxT(t), res.RunID)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
		r, err := reactor.ValueOf[mapcore.Result](res)
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
	inner := reactor.MustDefine("nested-inner",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("spread", reactor.StepConfig[struct {
			N int `json:"n"`
		}, []int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run: func(_ context.Context, in struct {
				N int `json:"n"`
			}) ([]int, error) {
				return []int{in.N * 10, in.N*10 + 1}, nil
			},
		}),
		mapcore.Map("leaves", mapcore.Config{Element: leaf, Items: reactor.FromStep("spread"), FanOut: true}),
		reactor.Returns(reactor.FromStep("leaves")))
	def := reactor.MustDefine("nested-outer",
		mapcore.Map("outer", mapcore.Config{Element: inner, Items: reactor.Const([]int{1, 2, 3}), FanOut: true}),
		reactor.Returns(reactor.FromStep("outer")))
	res, err := f.engine.Run(ctxT(t), def, nil)
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
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
	f := newFixture(t, true)
	gate := make(chan struct{})
	var completed sync.Map
	var started sync.WaitGroup
	started.Add(10)
	elem := reactor.MustDefine("cancel-fwd-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("work", reactor.StepConfig[struct {
			N int `json:"n"`
		}, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
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
		reactor.Returns(reactor.FromStep("work")))
	def := reactor.MustDefine("cancel-fwd",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: reactor.Const(items(120)), FanOut: true, BatchSize: 10}))
	ctx := ctxT(t)
	res, err := f.engine.Run(ctx, def, nil, reactor.WithRunID("cancel-fwd-1"), reactor.NoWait())
	require.NoError(t, err)
	require.Equal(t, reactor.OutcomeDispatched, res.Outcome())
	started.Wait() // elements 0-9 completed; batch [10, 20) is claimed and held
	require.NoError(t, f.engine.Cancel(ctx, "cancel-fwd-1"))
	close(gate)
	res, err = f.engine.Wait(ctx, "cancel-fwd-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status, "%v", res.Err())
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
	elem := reactor.MustDefine("abort-inline-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("first", reactor.StepConfig[in, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, x in) (int, error) { return x.N, nil },
			Undo: func(_ context.Context, x in, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, x.N)
				f.mu.Unlock()
				return nil
			},
		}),
		reactor.Step("second", reactor.StepConfig[in, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")}, After: []string{"first"},
			Run: func(ctx context.Context, x in) (int, error) {
				if x.N == 4 {
					cancel() // the caller gives up while element 4 runs
					<-ctx.Done()
					return 0, ctx.Err()
				}
				return x.N, nil
			},
		}))
	def := reactor.MustDefine("abort-inline",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: reactor.Const(items(10))}))
	res, err := f.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusAborted, res.Status)
	undone, err := f.engine.Undo(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, undone.Status, "%v", undone.Err())
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, []int{4, 3, 2, 1, 0}, f.undone, "newest first, the cut-short element included")
}
