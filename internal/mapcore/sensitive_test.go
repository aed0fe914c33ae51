package mapcore_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
)

// The element runs of a sensitive owner are sensitive runs (their inputs
// come from it), inline and fanned out; an owner mapping over a definition
// with a sensitive input is a sensitive run itself.
func TestSensitiveRunsAndElements(t *testing.T) {
	t.Parallel()
	for _, fan := range []bool{false, true} {
		t.Run(fmt.Sprint("fanout=", fan), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fan)
			ctx := ctxT(t)
			element := func(name string, opts ...engine.InputOption) *engine.Definition {
				return engine.MustDefine(name, engine.Input[int]("item", append(opts, engine.Required())...),
					engine.Step("touch", engine.StepConfig[engine.Args, int]{
						Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
					}))
			}
			owner := func(name string, elem *engine.Definition, opts ...engine.InputOption) *engine.Definition {
				return engine.MustDefine(name, engine.Input[[]int]("items", append(opts, engine.Required())...),
					mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: fan}))
			}
			for _, c := range []struct {
				name  string
				owner *engine.Definition
			}{
				// The owner's input is sensitive; the element declares nothing.
				{"owner", owner(fmt.Sprint("sens-owner-", fan), element(fmt.Sprint("sens-owner-el-", fan)), engine.Sensitive())},
				// The element's input is sensitive: so is the owner, whose
				// input carries the values.
				{"element", owner(fmt.Sprint("sens-elem-", fan), element(fmt.Sprint("sens-elem-el-", fan), engine.Sensitive()))},
			} {
				runID := fmt.Sprint("sens-", c.name, "-", fan)
				res, err := f.engine.Run(ctx, c.owner, map[string]any{"items": items(3)}, engine.WithRunID(runID))
				require.NoError(t, err)
				if fan {
					res, err = f.engine.Wait(ctx, runID)
					require.NoError(t, err)
				}
				require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
				run, err := f.engine.Get(ctx, runID)
				require.NoError(t, err)
				require.True(t, run.Sensitive, c.name)
				mapID := mapcore.MapID(runID, "each")
				for i := range 3 {
					el, err := engine.Element(f.engine, ctx, mapcore.ElementID(mapID, i))
					require.NoError(t, err)
					require.True(t, el.Sensitive, "%s: element %d", c.name, i)
				}
			}
			plainEl := element(fmt.Sprint("plain-el-", fan))
			plain := owner(fmt.Sprint("plain-owner-", fan), plainEl)
			runID := fmt.Sprint("plain-", fan)
			_, err := f.engine.Run(ctx, plain, map[string]any{"items": items(1)}, engine.WithRunID(runID))
			require.NoError(t, err)
			if fan {
				_, err = f.engine.Wait(ctx, runID)
				require.NoError(t, err)
			}
			el, err := engine.Element(f.engine, ctx, mapcore.ElementID(mapcore.MapID(runID, "each"), 0))
			require.NoError(t, err)
			require.False(t, el.Sensitive)
		})
	}
}
