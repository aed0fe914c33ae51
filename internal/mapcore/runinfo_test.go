package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
)

// An element's steps see which element of which map they run as, with the
// owner's trace id, inline and fanned out, forward and undoing.
func TestElementRunInfo(t *testing.T) {
	t.Parallel()
	for _, fan := range []bool{false, true} {
		t.Run(fmt.Sprint("fanout=", fan), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fan)
			var mu sync.Mutex
			seen := map[string]engine.RunInfo{}
			record := func(ctx context.Context) {
				info, ok := engine.RunInfoFrom(ctx)
				if !ok {
					panic("no RunInfo")
				}
				mu.Lock()
				seen[fmt.Sprintf("%s:%d", info.Kind, info.Element.Index)] = info
				mu.Unlock()
			}
			elem := engine.MustDefine(fmt.Sprint("info-el-", fan),
				engine.Input[int]("item", engine.Required()),
				engine.Step("touch", engine.StepConfig[engine.Args, int]{
					Run:  func(ctx context.Context, _ engine.Args) (int, error) { record(ctx); return 0, nil },
					Undo: func(ctx context.Context, _ engine.Args, _ int) error { record(ctx); return nil },
				}),
			)
			owner := engine.MustDefine(fmt.Sprint("info-owner-", fan),
				engine.Input[[]int]("items", engine.Required()),
				mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fan}),
				engine.Step("after", engine.StepConfig[engine.Args, int]{
					After: []string{"each"},
					Run: func(context.Context, engine.Args) (int, error) {
						return 0, engine.Permanent(errors.New("roll the map back"))
					},
				}),
			)
			const trace = "0af7651916cd43dd8448eb211c80319c"
			ctx := engine.WithTraceID(ctxT(t), trace)
			runID := fmt.Sprint("info-run-", fan)
			res, err := f.engine.Run(ctx, owner, map[string]any{"items": items(3)}, engine.WithRunID(runID))
			require.NoError(t, err)
			if fan {
				res, err = f.engine.Wait(ctx, runID)
				require.NoError(t, err)
			}
			require.Equal(t, engine.StatusFailed, res.Status)

			mapID := mapcore.MapID(runID, "each")
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, seen, 6, "3 runs and 3 undos: %v", seen)
			for i := range 3 {
				for _, kind := range []engine.CallKind{engine.CallRun, engine.CallUndo} {
					info := seen[fmt.Sprintf("%s:%d", kind, i)]
					require.Equal(t, mapcore.ElementID(mapID, i), info.RunID)
					require.Equal(t, elem.Name(), info.Reactor)
					require.Equal(t, "touch", info.Step)
					require.Equal(t, &engine.ElementInfo{Owner: runID, Step: "each", Index: i}, info.Element, "%s of %d", kind, i)
					require.Equal(t, trace, info.TraceID, "the element inherits its owner's trace")
				}
			}
			el, err := engine.Element(f.engine, ctx, mapcore.ElementID(mapID, 1))
			require.NoError(t, err)
			require.Equal(t, &engine.ElementInfo{Owner: runID, Step: "each", Index: 1}, el.Element)
			require.Equal(t, trace, el.TraceID)
		})
	}
}
