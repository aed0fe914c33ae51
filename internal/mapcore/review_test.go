package mapcore_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
)

// undoRecorder builds an element reactor whose step records its undos.
func undoRecorder(f *fixture, name string, run func(ctx context.Context, n int) error) *engine.Definition {
	type in struct {
		N int `json:"n"`
	}
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("work", engine.StepConfig[in, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(ctx context.Context, x in) (int, error) {
				if run != nil {
					if err := run(ctx, x.N); err != nil {
						return 0, err
					}
				}
				return x.N, nil
			},
			Undo: func(_ context.Context, x in, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, x.N)
				f.mu.Unlock()
				return nil
			},
		}),
		engine.Step("halt_some", engine.StepConfig[in, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")}, After: []string{"work"},
			Run: func(_ context.Context, x in) (int, error) {
				if x.N == 1 {
					return 0, engine.Halt("item 1 stops here")
				}
				return x.N, nil
			},
		}))
}

// Cancel while a fan-out map inside a composed child still runs forward:
// the child's map is stopped and rolled back with it.
func TestCancelDuringFanOutInComposedChild(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	gate := make(chan struct{})
	var first sync.WaitGroup
	first.Add(2)
	var completed sync.Map
	elem := undoRecorder(f, "cc-el", func(ctx context.Context, n int) error {
		if n >= 2 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		} else {
			defer first.Done()
		}
		completed.Store(n, true)
		return nil
	})
	child := engine.MustDefine("cc-child",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(items(6)), FanOut: true, BatchSize: 2, Partial: true}))
	def := engine.MustDefine("cc-root", engine.Compose("child", child, engine.ComposeConfig{}))
	ctx := ctxT(t)
	res, err := f.engine.Run(ctx, def, nil, engine.WithRunID("cc-1"), engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	first.Wait()
	require.NoError(t, f.engine.Cancel(ctx, "cc-1"))
	close(gate)
	res, err = f.engine.Wait(ctx, "cc-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status, "%v", res.Err())
	var want []int
	completed.Range(func(k, _ any) bool { want = append(want, k.(int)); return true })
	f.mu.Lock()
	defer f.mu.Unlock()
	require.ElementsMatch(t, want, f.undone)
	require.Less(t, len(want), 6, "the child's map stopped claiming")
}

// A halted element kept what it completed; undoing its map undoes it.
func TestHaltedElementIsUndone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	elem := undoRecorder(f, "halted-el", nil)
	def := engine.MustDefine("halted-map",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(items(3)), Partial: true}),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{After: []string{"each"},
			Run: func(context.Context, engine.Args) (int, error) { return 0, errors.New("after") }}))
	res, err := f.engine.Run(ctxT(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []int{2, 1, 0}, f.undone)
}

// A delivery that completed its element but died before settling, then the
// map failed: the redelivery settles "stopped" without running, and the
// rollback still undoes what the first delivery completed.
func TestElementCompletedBeforeMapFailedIsUndone(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false) // no worker: this test delivers by hand
	elem := undoRecorder(f, "zombie-el", func(_ context.Context, n int) error {
		if n == 1 {
			return engine.Permanent(errors.New("item 1 fails"))
		}
		return nil
	})
	def := engine.MustDefine("zombie-map",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(items(4)), FanOut: true}))
	ctx := ctxT(t)
	res, err := f.engine.Run(ctx, def, nil, engine.WithRunID("zombie-1"), engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	mapID := mapcore.MapID("zombie-1", "each")
	// Element 2's first delivery: runs to completion, then "dies" before
	// its settle.
	_, err = engine.ExecuteElement(f.engine, ctx, elem, mapcore.ElementID(mapID, 2), map[string]codec.Raw{"item": mustEncode(t, 2)})
	require.NoError(t, err)
	for _, i := range []int{0, 1, 3, 2} { // 1 fails the map; 2 is the redelivery
		require.NoError(t, mapcore.ProcessElement(ctx, f.engine, maptask.ElementTask{MapID: mapID, Index: i, Input: mustEncode(t, i)}))
	}
	// Resume the owner by hand (the settle enqueued it on a queue nobody
	// serves here), then run the rollback inline through the jobs.
	res, err = engine.Process(f.engine, ctx, "zombie-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, res.Status)
	for p := range 4 {
		require.NoError(t, mapcore.ProcessRollback(ctx, f.engine, maptask.RollbackTask{MapID: mapID, Gen: 1, Pos: p, Index: 3 - p}))
	}
	res, err = engine.Process(f.engine, ctx, "zombie-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.ElementsMatch(t, []int{0, 2}, f.undone, "element 2 completed in its first delivery and is undone; 3 never ran")
}

func mustEncode(t *testing.T, v any) codec.Raw {
	t.Helper()
	b, err := codec.Marshal(v)
	require.NoError(t, err)
	return b
}

// An enqueue that fails while the owner starts a fan-out rollback is not a
// rollback failure: the run stays rolling_back at its checkpoint, and the
// owner's retry dispatches the first batch again and finishes.
func TestTransientErrorDuringRollbackStartIsRetried(t *testing.T) {
	f := newFixture(t, true)
	elem := undoRecorder(f, "transient-el", nil)
	def := engine.MustDefine("transient-map",
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const([]int{0, 2, 3}), FanOut: true}),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{After: []string{"each"},
			Run: func(context.Context, engine.Args) (int, error) { return 0, engine.Permanent(errors.New("after")) }}))
	mapID := mapcore.MapID("transient-1", "each")
	var once sync.Once
	mapcore.SetFailpoints(mapcore.Failpoints{RbBeforeEnqueue: func(id string, _ int) error {
		var err error
		if id == mapID {
			once.Do(func() { err = errors.New("injected: connection reset") })
		}
		return err
	}})
	t.Cleanup(func() { mapcore.SetFailpoints(mapcore.Failpoints{}) })
	ctx := ctxT(t)
	_, err := f.engine.Run(ctx, def, nil, engine.WithRunID("transient-1"))
	require.NoError(t, err)
	res, err := f.engine.Wait(ctx, "transient-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Empty(t, res.Failure.RollbackFailures, "a transient error is not a rollback failure")
	f.mu.Lock()
	defer f.mu.Unlock()
	require.ElementsMatch(t, []int{0, 2, 3}, f.undone)
}
