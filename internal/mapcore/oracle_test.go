package mapcore_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// The rollback oracle of DESIGN 5: the same reactor with an inline map and
// with a fan-out map ends with the same final Failure (message, step, set of
// rollback failures) whenever exactly one element fails, a step after the
// map fails, or a completed run is undone; and on each side the elements
// undone are exactly the elements completed, each undone once.
//
// A fan-out map may complete more elements of the failing batch than an
// inline map (the elements after the failing one run concurrently with it),
// so the undone sets of the two sides may differ, and so would rollback
// failures of those extra elements. The element undos that fail are
// therefore all before the failing element, and the failing element waits
// (on a signal) until every element before it completed, which the inline
// side does by construction: both sides then complete, and undo, at least
// the elements before the failing one.

// oracleTracker counts, per item, an element reactor's runs, completions and
// undos on one side of the oracle.
type oracleTracker struct {
	failOn    int   // the item that fails (-1: none)
	undoFail  []int // the items whose undo fails
	prepFails bool  // the owner's "prep" undo fails

	mu         sync.Mutex
	ran        map[int]int
	completed  map[int]int
	undone     map[int]int
	prepUndone int
	// before is closed once every item before failOn completed.
	before     chan struct{}
	beforeLeft int
}

func newOracleTracker(failOn int, undoFail []int, prepFails bool) *oracleTracker {
	tr := &oracleTracker{failOn: failOn, undoFail: undoFail, prepFails: prepFails,
		ran: map[int]int{}, completed: map[int]int{}, undone: map[int]int{},
		before: make(chan struct{}), beforeLeft: max(failOn, 0)}
	if tr.beforeLeft == 0 {
		close(tr.before)
	}
	return tr
}

type oracleItem struct {
	N int `json:"n"`
}

// element doubles its item; item failOn fails (permanently) once every item
// before it completed; the undo of the items in undoFail fails.
func (tr *oracleTracker) element(name string) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("double", engine.StepConfig[oracleItem, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(ctx context.Context, in oracleItem) (int, error) {
				tr.mu.Lock()
				tr.ran[in.N]++
				tr.mu.Unlock()
				if in.N == tr.failOn {
					select {
					case <-tr.before:
					case <-ctx.Done():
						return 0, ctx.Err()
					}
					return 0, engine.Permanent(fmt.Errorf("item %d is bad", in.N))
				}
				tr.mu.Lock()
				tr.completed[in.N]++
				if in.N < tr.failOn && tr.completed[in.N] == 1 {
					if tr.beforeLeft--; tr.beforeLeft == 0 {
						close(tr.before)
					}
				}
				tr.mu.Unlock()
				return in.N * 2, nil
			},
			Undo: func(_ context.Context, in oracleItem, _ int) error {
				tr.mu.Lock()
				tr.undone[in.N]++
				tr.mu.Unlock()
				if slices.Contains(tr.undoFail, in.N) {
					return fmt.Errorf("cannot undo item %d", in.N)
				}
				return nil
			},
		}),
		engine.Returns(engine.FromStep("double")),
	)
}

// owner runs "prep" (undoable), maps the element over "items" in "each",
// sums the results in "sum" and, with boom, fails in "boom" after that.
func (tr *oracleTracker) owner(name string, fanOut bool, batch int, boom bool) *engine.Definition {
	parts := []engine.Part{
		engine.Input[[]int]("items", engine.Required()),
		engine.Step("prep", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, engine.Args, int) error {
				tr.mu.Lock()
				tr.prepUndone++
				tr.mu.Unlock()
				if tr.prepFails {
					return errors.New("cannot release prep")
				}
				return nil
			},
		}),
		mapcore.Map("each", mapcore.Config{Element: tr.element(name + "-el"), Items: engine.FromInput("items"),
			FanOut: fanOut, BatchSize: batch, After: []string{"prep"}}),
		drainSumStep(),
	}
	if boom {
		parts = append(parts, engine.Step("boom", engine.StepConfig[engine.Args, int]{After: []string{"sum"},
			Run: func(context.Context, engine.Args) (int, error) {
				return 0, engine.Permanent(errors.New("boom after the map"))
			}}))
	}
	return engine.MustDefine(name, append(parts, engine.Returns(engine.FromStep("sum")))...)
}

// requireUndoneCompleted checks one side: every completed element was
// undone exactly once, nothing else was undone, no element ran twice, and
// the failing element (failed, so it rolled itself back) was never undone
// by the map. It returns the completed items, sorted.
func (tr *oracleTracker) requireUndoneCompleted(t *testing.T, side string) []int {
	t.Helper()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	done := []int{}
	for n, c := range tr.completed {
		require.Equal(t, 1, c, "%s: completions of element %d", side, n)
		require.Equal(t, 1, tr.undone[n], "%s: undos of completed element %d", side, n)
		done = append(done, n)
	}
	for n, u := range tr.undone {
		require.Equal(t, 1, tr.completed[n], "%s: element %d undone %d time(s) but never completed", side, n, u)
	}
	for n, r := range tr.ran {
		require.Equal(t, 1, r, "%s: runs of element %d", side, n)
	}
	if tr.failOn >= 0 {
		require.Equal(t, 1, tr.ran[tr.failOn], "%s: the failing element ran", side)
		require.Zero(t, tr.undone[tr.failOn], "%s: the failing element is not undone by the map", side)
	}
	require.Equal(t, 1, tr.prepUndone, "%s: prep undone once", side)
	slices.Sort(done)
	return done
}

// oracleFixture is an engine with a real asynq worker on a per-test queue.
type oracleFixture struct {
	engine *engine.Engine
}

func newOracleFixture(t *testing.T) *oracleFixture {
	t.Helper()
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, err := engine.NewEngine(context.Background(), engine.Config{Client: rdb, Prefix: redistest.Prefix(t),
		Enqueuer: worker.NewClient(rdb, queue), Logger: logger})
	require.NoError(t, err)
	w := worker.New(e, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 4, Logger: logger})
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
	return &oracleFixture{engine: e}
}

// run executes def to its end: in-process for an inline map, through the
// workers (dispatched, then waited for) for a fan-out map.
func (f *oracleFixture) run(t *testing.T, def *engine.Definition, n int, fanOut bool) *engine.Result {
	t.Helper()
	ctx := ctxT(t)
	res, err := f.engine.Run(ctx, def, map[string]any{"items": drainItems(n)})
	require.NoError(t, err)
	// Run runs to the end either way: a fan-out map's Run waits for the
	// workers.
	require.True(t, res.Status.Terminal(), "fan-out %t: got %s", fanOut, res.Status)
	return res
}

// undo undoes the completed run id: at once for an inline map; a fan-out map
// hands its rollback to workers (rolling_back), and Wait gives the end.
func (f *oracleFixture) undo(t *testing.T, id string, fanOut bool) *engine.Result {
	t.Helper()
	ctx := ctxT(t)
	res, err := f.engine.Undo(ctx, id)
	require.NoError(t, err)
	if !fanOut {
		require.Equal(t, engine.StatusCancelled, res.Status, "an inline map rolls back in-process")
		return res
	}
	require.Equal(t, engine.StatusRollingBack, res.Status, "a fan-out map hands its rollback off")
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	res, err = f.engine.Wait(ctx, id)
	require.NoError(t, err)
	return res
}

func sortedRollbackFailures(fs []engine.RollbackFailure) []engine.RollbackFailure {
	out := slices.Clone(fs)
	slices.SortFunc(out, func(a, b engine.RollbackFailure) int {
		return cmp.Or(cmp.Compare(a.Step, b.Step), cmp.Compare(a.Kind, b.Kind),
			cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Message, b.Message))
	})
	return out
}

// requireSameFailure is the oracle's verdict on the final Failures.
func requireSameFailure(t *testing.T, inline, fan *engine.Failure) {
	t.Helper()
	require.NotNil(t, inline)
	require.NotNil(t, fan)
	require.Equal(t, inline.Step, fan.Step, "failing step")
	require.Equal(t, inline.Message, fan.Message, "message")
	require.Equal(t, inline.Code, fan.Code, "code")
	require.Equal(t, inline.Retryable, fan.Retryable, "retryable")
	require.Equal(t, sortedRollbackFailures(inline.RollbackFailures), sortedRollbackFailures(fan.RollbackFailures),
		"the set of rollback failures")
	require.Equal(t, inline.RollbackFailuresOmitted, fan.RollbackFailuresOmitted)
}

func rollbackSteps(t *testing.T, fs []engine.RollbackFailure) []string {
	t.Helper()
	out := make([]string, len(fs))
	for i, f := range fs {
		require.Equal(t, engine.ActionUndo, f.Kind, "%+v", f)
		out[i] = f.Step
	}
	slices.Sort(out)
	return out
}

func TestOracleInlineAndFanOutEndAlike(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		n, batch  int
		failOn    int   // element that fails (-1: none)
		boom      bool  // a step after the map fails
		undo      bool  // the run completes, then is undone on request
		undoFail  []int // element undos that fail
		prepFails bool
		status    engine.Status
		step, msg string
		// wantRb are the steps of the rollback failures.
		wantRb []string
	}{
		{name: "ElementFails", n: 30, batch: 10, failOn: 7, undoFail: []int{2, 5},
			status: engine.StatusFailed, step: "each[7]/double", msg: "item 7 is bad",
			wantRb: []string{"each[2]/double", "each[5]/double"}},
		{name: "FirstElementFails", n: 12, batch: 5, failOn: 0, prepFails: true,
			status: engine.StatusFailed, step: "each[0]/double", msg: "item 0 is bad",
			wantRb: []string{"prep"}},
		{name: "LastElementOfBatchFails", n: 25, batch: 10, failOn: 19, undoFail: []int{0, 10, 18}, prepFails: true,
			status: engine.StatusFailed, step: "each[19]/double", msg: "item 19 is bad",
			wantRb: []string{"each[0]/double", "each[10]/double", "each[18]/double", "prep"}},
		{name: "StepAfterMapFails", n: 45, batch: 10, failOn: -1, boom: true, undoFail: []int{0, 13, 44}, prepFails: true,
			status: engine.StatusFailed, step: "boom", msg: "boom after the map",
			wantRb: []string{"each[0]/double", "each[13]/double", "each[44]/double", "prep"}},
		{name: "UndoOfCompletedRun", n: 25, batch: 10, failOn: -1, undo: true, undoFail: []int{3, 24},
			status: engine.StatusCancelled, step: "", msg: "undone on request",
			wantRb: []string{"each[24]/double", "each[3]/double"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newOracleFixture(t)
			failures := map[bool]*engine.Failure{}
			completed := map[bool][]int{}
			for _, fan := range []bool{false, true} {
				side := map[bool]string{false: "inline", true: "fan-out"}[fan]
				tr := newOracleTracker(tc.failOn, tc.undoFail, tc.prepFails)
				def := tr.owner(fmt.Sprintf("oracle-%s-%s", tc.name, side), fan, tc.batch, tc.boom)
				res := f.run(t, def, tc.n, fan)
				if tc.undo {
					require.Equal(t, engine.StatusCompleted, res.Status, "%s: %v", side, res.Failure)
					sum, err := engine.ValueOf[int](res)
					require.NoError(t, err)
					require.Equal(t, tc.n*(tc.n-1), sum)
					res = f.undo(t, res.RunID, fan)
				}
				require.Equal(t, tc.status, res.Status, "%s: %v", side, res.Failure)
				require.NotNil(t, res.Failure, side)
				require.Equal(t, tc.step, res.Failure.Step, side)
				require.Equal(t, tc.msg, res.Failure.Message, side)
				require.Equal(t, tc.wantRb, rollbackSteps(t, res.Failure.RollbackFailures), "%s: rollback failures", side)
				failures[fan] = res.Failure
				completed[fan] = tr.requireUndoneCompleted(t, side)
			}
			requireSameFailure(t, failures[false], failures[true])
			t.Logf("completed: inline %v, fan-out %v", completed[false], completed[true])

			// What each side completed: the inline map stops at the failing
			// element; the fan-out map completed at least as much.
			switch {
			case tc.failOn >= 0:
				require.Equal(t, drainItems(tc.failOn), completed[false], "inline completes up to the failure")
				require.Subset(t, completed[true], completed[false], "fan-out completes at least the same")
				require.NotContains(t, completed[true], tc.failOn)
			default:
				require.Equal(t, drainItems(tc.n), completed[false])
				require.Equal(t, drainItems(tc.n), completed[true])
			}
		})
	}
}

// A fan-out map inside a composed child rolls back through the child: the
// rollback resumes the root (the owner), which carries on in the child and
// ends failed with the same Failure as the inline version.
func TestOracleComposedChild(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		failOn    int
		boom      bool
		step, msg string
		wantRb    []string
	}{
		{name: "ElementFails", failOn: 11, step: "child/each[11]/double", msg: "item 11 is bad",
			wantRb: []string{"child/each[4]/double", "child/each[9]/double", "child/prep"}},
		{name: "StepAfterMapFails", failOn: -1, boom: true, step: "child/boom", msg: "boom after the map",
			wantRb: []string{"child/each[4]/double", "child/each[9]/double", "child/prep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newOracleFixture(t)
			const n = 24
			failures := map[bool]*engine.Failure{}
			for _, fan := range []bool{false, true} {
				side := map[bool]string{false: "inline", true: "fan-out"}[fan]
				tr := newOracleTracker(tc.failOn, []int{4, 9}, true)
				name := fmt.Sprintf("oracle-composed-%s-%s", tc.name, side)
				child := tr.owner(name+"-child", fan, 5, tc.boom)
				var rootUndone int
				root := engine.MustDefine(name,
					engine.Input[[]int]("items", engine.Required()),
					engine.Step("open", engine.StepConfig[engine.Args, int]{
						Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
						Undo: func(context.Context, engine.Args, int) error {
							tr.mu.Lock()
							rootUndone++
							tr.mu.Unlock()
							return nil
						},
					}),
					engine.Compose("child", child, engine.ComposeConfig{After: []string{"open"},
						Args: engine.Bindings{"items": engine.FromInput("items")}}),
					engine.Returns(engine.FromStep("child")))
				res := f.run(t, root, n, fan)
				require.Equal(t, engine.StatusFailed, res.Status, "%s: %v", side, res.Failure)
				require.Equal(t, tc.step, res.Failure.Step, side)
				require.Equal(t, tc.msg, res.Failure.Message, side)
				require.Equal(t, tc.wantRb, rollbackSteps(t, res.Failure.RollbackFailures), "%s: rollback failures", side)
				failures[fan] = res.Failure
				done := tr.requireUndoneCompleted(t, side)
				if tc.failOn >= 0 {
					require.Subset(t, done, drainItems(tc.failOn), side)
				} else {
					require.Equal(t, drainItems(n), done, side)
				}
				tr.mu.Lock()
				require.Equal(t, 1, rootUndone, "%s: the root's own step undone once, after the child", side)
				tr.mu.Unlock()
				if fan {
					// The map's owner is the root: its rollback resumed the root.
					mapID := mapcore.MapID(res.RunID, "child/each")
					p, ok, err := mapcore.ProgressOf(ctxT(t), f.engine, mapID)
					require.NoError(t, err)
					require.True(t, ok, "map %s", mapID)
					require.Positive(t, p.Settled)
				}
			}
			requireSameFailure(t, failures[false], failures[true])
		})
	}
}

// Undo and Cancel of a run whose distributed rollback is outstanding are
// refused with ErrRollbackInProgress (a composed child rolling back counts),
// change nothing, and the rollback ends as if they never came. The drainer
// holds the rollback where the test wants it.
func TestOracleRefusesUndoAndCancelWhileRollingBack(t *testing.T) {
	t.Parallel()
	for _, composed := range []bool{false, true} {
		name := map[bool]string{false: "Plain", true: "ComposedChild"}[composed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newDrainFixture(t)
			ctx := drainCtx(t)
			const n = 120
			def := rbDrainOwner(f, "refuse-"+name, 0)
			step, mapStep := "boom", "each"
			if composed {
				def = engine.MustDefine("refuse-root-"+name,
					engine.Input[[]int]("items", engine.Required()),
					engine.Compose("child", def, engine.ComposeConfig{Args: engine.Bindings{"items": engine.FromInput("items")}}),
					engine.Returns(engine.FromStep("child")))
				step, mapStep = "child/boom", "child/each"
			}
			id, _ := f.start(def, n)
			mapID := mapcore.MapID(id, mapStep)
			rbResume := fmt.Sprintf("resume:%s:rb:%s:1", id, mapID)
			isRb := func(pos int) func(*asynq.TaskInfo) bool {
				return func(ti *asynq.TaskInfo) bool {
					k := drainTaskKey(ti)
					return k.typ == worker.TypeRollback && k.index == pos
				}
			}

			refused := func(when string) {
				t.Helper()
				before, err := f.engine.Get(ctx, id)
				require.NoError(t, err)
				if !composed {
					require.Equal(t, engine.StatusRollingBack, before.Status, when)
				}
				for _, op := range []string{"undo", "cancel"} {
					var err error
					if op == "undo" {
						_, err = f.engine.Undo(ctx, id)
					} else {
						err = f.engine.Cancel(ctx, id)
					}
					require.ErrorIs(t, err, engine.ErrRollbackInProgress, "%s: %s", when, op)
					var se *engine.StatusError
					require.ErrorAs(t, err, &se)
					require.Equal(t, op, se.Op)
					require.Equal(t, engine.StatusRollingBack, se.Status)
				}
				after, err := f.engine.Get(ctx, id)
				require.NoError(t, err)
				require.Equal(t, before.Version, after.Version, "%s: the refusals wrote nothing", when)
				require.Equal(t, before.Status, after.Status)
				locked, err := engine.Locked(f.engine, ctx, id)
				require.NoError(t, err)
				require.False(t, locked, "%s: the refusals released the run lock", when)
				require.Empty(t, f.d.Observe().IDs(), "%s: the refusals enqueued nothing", when)
			}

			// The owner handed off: the first rollback job is queued.
			require.NotNil(t, f.d.DrainUntil(isRb(0)))
			refused("hand-off")
			// Mid-way: the first batch is undone, the second is out.
			require.NotNil(t, f.d.DrainUntil(isRb(60)))
			refused("mid-rollback")
			// Settled, the owner's resume queued but not yet delivered.
			ti := f.d.DrainUntil(func(ti *asynq.TaskInfo) bool { return ti.ID == rbResume })
			require.NotNil(t, ti)
			refused("settled, before the owner adopts")

			f.d.Drain()
			require.Equal(t, 2, f.d.Appeared(worker.TypeRun))
			require.Equal(t, n, f.d.Appeared(worker.TypeRollback))
			res := f.result(id)
			require.Equal(t, engine.StatusFailed, res.Status)
			require.Equal(t, step, res.Failure.Step)
			require.Equal(t, "boom after the map", res.Failure.Message)
			f.requireRanOnce(n)
			f.mu.Lock()
			undone := slices.Clone(f.undone)
			f.mu.Unlock()
			want := drainItems(n)
			slices.Reverse(want)
			require.Equal(t, want, undone, "every element undone once, newest first")

			// Finished now: Undo and Cancel say so, not "in progress".
			_, err := f.engine.Undo(ctx, id)
			require.ErrorIs(t, err, engine.ErrNotUndoable)
			require.ErrorIs(t, f.engine.Cancel(ctx, id), engine.ErrAlreadyFinished)
		})
	}
}
