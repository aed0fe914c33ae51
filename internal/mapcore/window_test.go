package mapcore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
)

// A map's elements judge their undo windows by the time the owner's
// rollback started, not when their rollback job runs: a rollback that
// started inside the windows undoes every element even when the windows
// close while it goes on, inline or fanned out; one that starts after they
// closed undoes none. The owner itself declares no window.
func TestElementUndoWindowsAreJudgedAtTheOwnersRollbackStart(t *testing.T) {
	t.Parallel()
	for _, fanOut := range []bool{false, true} {
		t.Run(fmt.Sprintf("fanOut=%v", fanOut), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, fanOut)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type in struct {
				N int `json:"n"`
			}
			el := engine.MustDefine("win-el", engine.UndoWindow(time.Hour),
				engine.Input[int]("item", engine.Required()),
				engine.Step("do", engine.StepConfig[in, int]{
					Args: engine.Bindings{"n": engine.FromInput("item")},
					Run:  func(_ context.Context, in in) (int, error) { return in.N, nil },
					Undo: func(_ context.Context, in in, _ int) error {
						f.mu.Lock()
						f.undone = append(f.undone, in.N)
						f.mu.Unlock()
						// The windows close while the map's rollback goes on.
						engine.SetClockSkew(f.engine, 2*time.Hour)
						return nil
					},
				}))
			owner := engine.MustDefine("win-owner",
				engine.Input[[]int]("items", engine.Required()),
				mapcore.Map("each", mapcore.Config{Element: el, Items: engine.FromInput("items"), FanOut: fanOut, BatchSize: 2}))
			require.NoError(t, f.engine.Register(owner, el))
			for _, id := range []string{"inside", "after"} {
				_, err := f.engine.Run(ctx, owner, map[string]any{"items": items(5)}, engine.WithRunID(id))
				require.NoError(t, err)
			}

			res, err := f.engine.Undo(ctx, "inside")
			require.NoError(t, err)
			if res.Status == engine.StatusRollingBack {
				res, err = f.engine.Wait(ctx, "inside")
				require.NoError(t, err)
			}
			require.Equal(t, engine.StatusCancelled, res.Status)
			f.mu.Lock()
			undone := slices.Clone(f.undone)
			f.undone = nil
			f.mu.Unlock()
			slices.Sort(undone)
			require.Equal(t, items(5), undone, "every element undone: the owner's rollback started inside their windows")

			// The clock is now two hours on: a rollback starting now finds
			// every element's window closed.
			res, err = f.engine.Undo(ctx, "after")
			require.NoError(t, err)
			if res.Status == engine.StatusRollingBack {
				res, err = f.engine.Wait(ctx, "after")
				require.NoError(t, err)
			}
			require.Equal(t, engine.StatusCancelled, res.Status)
			f.mu.Lock()
			require.Empty(t, f.undone, "past their windows: none undone")
			f.mu.Unlock()
			rep, err := f.engine.RollbackReport(ctx, mapcore.MapID("after", "each")+".3")
			require.NoError(t, err)
			require.Equal(t, engine.RollbackOutOfWindow, rep.Entries[0].Status)
			// The owner lists them: "roll back everything" never quietly
			// means less than it says.
			rep, err = f.engine.RollbackReport(ctx, "after")
			require.NoError(t, err)
			require.Equal(t, []string{"each[4]/do", "each[3]/do", "each[2]/do", "each[1]/do", "each[0]/do"}, rep.Summary.OutOfWindow)
			require.Empty(t, res.Failure.RollbackFailures, "kept out of window is not a failure")
			require.Len(t, res.OutOfWindow, 5)
		})
	}
}
