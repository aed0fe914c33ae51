package mapcore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
)

// UndoSteps can name a fan-out map step of a completed run: the map rolls
// back through its element rollback jobs (the owner hands off and is
// resumed by them), the steps not named stay applied, and the run ends
// completed again, with the map's entry off its stack and a report of the
// generation. Naming the map again is unresolved: it was compensated.
func TestUndoStepsOfAFanOutMap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	elem := f.element("tg-el")
	var keptUndone int
	owner := engine.MustDefine("tg-owner",
		engine.Input[[]int]("items", engine.Required()),
		engine.Step("hold", engine.StepConfig[engine.Args, string]{
			Run:  func(context.Context, engine.Args) (string, error) { return "held", nil },
			Undo: func(context.Context, engine.Args, string) error { keptUndone++; return nil },
		}),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: true, BatchSize: 3,
			After: []string{"hold"}}),
	)
	require.NoError(t, f.engine.Register(owner, elem))
	res, err := f.engine.Run(ctx, owner, map[string]any{"items": items(10)}, engine.WithRunID("tg"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)

	out, err := f.engine.UndoSteps(ctx, "tg", []string{"each"})
	require.NoError(t, err)
	final := out.Result
	if final.Status == engine.StatusRollingBack {
		final, err = f.engine.Wait(ctx, "tg")
		require.NoError(t, err)
	}
	require.Equal(t, engine.StatusCompleted, final.Status, "back to the status it had")
	f.mu.Lock()
	undone := slices.Clone(f.undone)
	f.mu.Unlock()
	slices.Sort(undone)
	require.Equal(t, items(10), undone, "every element undone once")
	require.Zero(t, keptUndone, "the step not named stays applied")
	run, err := f.engine.Get(ctx, "tg")
	require.NoError(t, err)
	require.Len(t, run.Ledger, 1)
	require.Equal(t, "hold", run.Ledger[0].Step)
	rep, err := f.engine.RollbackReport(ctx, "tg")
	require.NoError(t, err)
	require.Equal(t, 1, rep.Generation)
	require.Len(t, rep.Entries, 1)
	require.Equal(t, "each", rep.Entries[0].Step)
	require.Equal(t, engine.RollbackCompensated, rep.Entries[0].Status)

	again, err := f.engine.UndoSteps(ctx, "tg", []string{"each"})
	require.NoError(t, err)
	require.Equal(t, []engine.UnresolvedStep{{Step: "each", Reason: engine.ReasonAlreadyCompensated}}, again.Unresolved)

	// The rest goes with a whole undo, in the next generation.
	und, err := f.engine.Undo(ctx, "tg")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, und.Status)
	require.Equal(t, 1, keptUndone)
	rep, err = f.engine.RollbackReport(ctx, "tg")
	require.NoError(t, err)
	require.Equal(t, 2, rep.Generation)
}
