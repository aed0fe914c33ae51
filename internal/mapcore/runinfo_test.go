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
	"github.com/goreactor/goreactor/reactor"
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
			seen := map[string]reactor.RunInfo{}
			record := func(ctx context.Context) {
				info, ok := reactor.RunInfoFrom(ctx)
				if !ok {
					panic("no RunInfo")
				}
				mu.Lock()
				seen[fmt.Sprintf("%s:%d", info.Kind, info.Element.Index)] = info
				mu.Unlock()
			}
			elem := reactor.MustDefine(fmt.Sprint("info-el-", fan),
				reactor.Input[int]("item", reactor.Required()),
				reactor.Step("touch", reactor.StepConfig[reactor.Args, int]{
					Run:  func(ctx context.Context, _ reactor.Args) (int, error) { record(ctx); return 0, nil },
					Undo: func(ctx context.Context, _ reactor.Args, _ int) error { record(ctx); return nil },
				}),
			)
			owner := reactor.MustDefine(fmt.Sprint("info-owner-", fan),
				reactor.Input[[]int]("items", reactor.Required()),
				mapcore.Map("each", mapcore.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: fan}),
				reactor.Step("after", reactor.StepConfig[reactor.Args, int]{
					After: []string{"each"},
					Run: func(context.Context, reactor.Args) (int, error) {
						return 0, reactor.Permanent(errors.New("roll the map back"))
					},
				}),
			)
			const trace = "0af7651916cd43dd8448eb211c80319c"
			ctx := reactor.WithTraceID(ctxT(t), trace)
			runID := fmt.Sprint("info-run-", fan)
			res, err := f.engine.Run(ctx, owner, map[string]any{"items": items(3)}, reactor.WithRunID(runID))
			require.NoError(t, err)
			if fan {
				res, err = f.engine.Wait(ctx, runID)
				require.NoError(t, err)
			}
			require.Equal(t, reactor.StatusFailed, res.Status)

			mapID := mapcore.MapID(runID, "each")
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, seen, 6, "3 runs and 3 undos: %v", seen)
			for i := range 3 {
				for _, kind := range []reactor.CallKind{reactor.CallRun, reactor.CallUndo} {
					info := seen[fmt.Sprintf("%s:%d", kind, i)]
					require.Equal(t, mapcore.ElementID(mapID, i), info.RunID)
					require.Equal(t, elem.Name(), info.Reactor)
					require.Equal(t, "touch", info.Step)
					require.Equal(t, &reactor.ElementInfo{Owner: runID, Step: "each", Index: i}, info.Element, "%s of %d", kind, i)
					require.Equal(t, trace, info.TraceID, "the element inherits its owner's trace")
				}
			}
			el, err := engine.Element(f.engine, ctx, mapcore.ElementID(mapID, 1))
			require.NoError(t, err)
			require.Equal(t, &reactor.ElementInfo{Owner: runID, Step: "each", Index: 1}, el.Element)
			require.Equal(t, trace, el.TraceID)
		})
	}
}
