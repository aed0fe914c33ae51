package mapcore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
)

type typedIn struct {
	Doubled mapcore.Results[int] `json:"doubled"`
}

// A step takes a map's result as a typed field and reads its values
// directly, in index order, inline and fanned out alike; a partial map's
// failed elements are left out of Values and counted by Failed.
func TestTypedResults(t *testing.T) {
	t.Parallel()
	for _, fanOut := range []bool{false, true} {
		name := map[bool]string{false: "inline", true: "fanout"}[fanOut]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fanOut)
			elem := f.element("typed-elem-"+name, 3)
			owner := engine.MustDefine("typed-owner-"+name,
				engine.Input[[]int]("items", engine.Required()),
				mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fanOut, Partial: true, BatchSize: 2}),
				engine.Step("collect", engine.StepConfig[typedIn, []int]{
					Args: engine.Bindings{"doubled": engine.FromStep("each")},
					Run: func(ctx context.Context, in typedIn) ([]int, error) {
						if in.Doubled.Len() != 6 || in.Doubled.Failed() != 1 {
							return nil, engine.Permanent(errTyped)
						}
						return in.Doubled.Values(ctx)
					},
				}),
				engine.Returns(engine.FromStep("collect")))
			require.NoError(t, f.engine.Register(owner))
			start := f.engine.Run // inline: in this process
			if fanOut {
				start = f.engine.Enqueue // fan-out: on the fixture's worker
			}
			res, err := start(ctxT(t), owner, map[string]any{"items": items(6)})
			require.NoError(t, err)
			res, err = f.engine.Wait(ctxT(t), res.RunID)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
			got, err := engine.ValueOf[[]int](res)
			require.NoError(t, err)
			require.Equal(t, []int{0, 2, 4, 8, 10}, got, "element 3 failed and has no value")
		})
	}
}

var errTyped = errors.New("the typed result has the wrong size")

// Define refuses a typed result whose element type is not what the element
// reactor returns, and a field that cannot hold a map's result, naming the
// step, the binding and both types.
func TestTypedResultsMismatchFailsAtDefine(t *testing.T) {
	t.Parallel()
	f := &fixture{ran: map[int]int{}}
	elem := f.element("typed-mismatch-elem") // returns int
	_, err := engine.Define("typed-mismatch",
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items")}),
		engine.Step("collect", engine.StepConfig[struct {
			Doubled mapcore.Results[string] `json:"doubled"`
		}, int]{
			Args: engine.Bindings{"doubled": engine.FromStep("each")},
			Run: func(context.Context, struct {
				Doubled mapcore.Results[string] `json:"doubled"`
			}) (int, error) {
				return 0, nil
			},
		}))
	var de *engine.DefinitionError
	require.ErrorAs(t, err, &de)
	require.Equal(t, "collect", de.Step)
	require.Contains(t, err.Error(), `"doubled"`)
	require.Contains(t, err.Error(), "mapstep.Results[int]")
	require.Contains(t, err.Error(), "mapstep.Results[string]")

	_, err = engine.Define("typed-wrong-field",
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items")}),
		engine.Step("collect", engine.StepConfig[struct {
			N int `json:"n"`
		}, int]{
			Args: engine.Bindings{"n": engine.FromStep("each")},
			Run: func(context.Context, struct {
				N int `json:"n"`
			}) (int, error) {
				return 0, nil
			},
		}))
	require.ErrorAs(t, err, &de)
	require.Contains(t, err.Error(), "mapstep.Results[T]")

	// The untyped Result and an open In stay accepted.
	_, err = engine.Define("typed-untyped",
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items")}),
		engine.Step("collect", engine.StepConfig[struct {
			R mapcore.Result `json:"r"`
		}, int]{
			Args: engine.Bindings{"r": engine.FromStep("each")},
			Run: func(context.Context, struct {
				R mapcore.Result `json:"r"`
			}) (int, error) {
				return 0, nil
			},
		}))
	require.NoError(t, err)
}

// TestHardeningLateElementTaskOfAFinishedMap: a duplicate element task that
// arrives after the owner finished (its map's keys carry the retention) runs
// nothing and creates nothing: an element run created now would outlive the
// tree's retention.
func TestHardeningLateElementTaskOfAFinishedMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, false)
	elem := f.element("late-elem")
	owner := sumOwner("late-owner", elem, false, false)
	res, err := f.engine.Run(ctxT(t), owner, map[string]any{"items": items(3)}, engine.WithRunID("late"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	mapID := mapcore.MapID("late", "each")
	rdb := redistest.Client(t)
	k := keys.New(f.prefix)
	require.NoError(t, rdb.Del(ctxT(t), k.ElemState(mapcore.ElementID(mapID, 1))).Err()) // as if it never ran
	ran := f.ranOf(1)

	in, err := codec.Marshal(1)
	require.NoError(t, err)
	require.NoError(t, mapcore.ProcessElement(ctxT(t), f.engine, maptask.ElementTask{MapID: mapID, Index: 1, Input: in}))
	require.Equal(t, ran, f.ranOf(1), "nothing ran")
	n, err := rdb.Exists(ctxT(t), k.ElemState(mapcore.ElementID(mapID, 1))).Result()
	require.NoError(t, err)
	require.Zero(t, n, "no element run created after its owner finished")
}
