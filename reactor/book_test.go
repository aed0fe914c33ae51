package reactor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// A re-triggered rollback reads what every earlier generation left in
// place: a composed child's entry kept out of its (shorter) undo window
// still holds the resource, so the parent's older entry on it stays
// blocked in the next generation instead of being undone over the newer
// change (issue 21, case 1).
func TestRetriggeredRollbackNeverUndoesUnderAnEntryKeptOutOfWindow(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	child := reactor.MustDefine("book-child", reactor.UndoWindow(time.Minute), resourceStep(tr, "inner", "r:x", nil))
	def := reactor.MustDefine("book-parent", reactor.UndoWindow(24*time.Hour), resourceStep(tr, "outer", "r:x", nil),
		reactor.Compose("sub", child, reactor.ComposeConfig{After: []string{"outer"}}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("book-window"))
	require.NoError(t, err)
	reactor.SetServerClockSkew(env.engine, time.Hour)
	res, err := env.engine.Undo(ctx, "book-window")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status)
	rep, err := env.engine.RollbackStatus(ctx, "book-window")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/inner=out_of_window", "outer=blocked"}, reportOf(rep))
	require.Equal(t, "sub/inner#1", rep.Entries[1].BlockedBy)

	for gen := 2; gen <= 3; gen++ {
		res, err = env.engine.RetryRollback(ctx, "book-window")
		require.NoError(t, err)
		require.Empty(t, undos(tr), "generation %d undid nothing under the kept change", gen)
		rep, err = env.engine.RollbackStatus(ctx, "book-window")
		require.NoError(t, err)
		require.Equal(t, gen, rep.Generation)
		require.Equal(t, []string{"sub/inner=out_of_window", "outer=blocked"}, reportOf(rep))
		require.Equal(t, reactor.RollbackNeedsHuman, rep.Summary.Outcome)
	}
	_, err = env.engine.Check(ctx, "book-window", reactor.OpRetry)
	require.ErrorIs(t, err, reactor.ErrNotRetryable, "two effects are still in place")
}

// A summary never says reverted while an effect stays in place: entries a
// person left applied, beside one compensated entry, are kept_in_place
// (issue 21, case 4).
func TestSummaryWithLeftAppliedEntriesIsKeptInPlace(t *testing.T) {
	t.Parallel()
	s := reactor.SummarizeRollback([]reactor.RollbackEntry{
		{Step: "c", Status: reactor.RollbackLeftApplied},
		{Step: "b", Status: reactor.RollbackLeftApplied},
		{Step: "a", Status: reactor.RollbackCompensated},
	})
	require.Equal(t, reactor.RollbackKeptInPlace, s.Outcome)
	require.Equal(t, []string{"c", "b"}, s.LeftApplied)
	require.Empty(t, s.Kept, "left applied by a person is not the same as nothing to undo it")
	s = reactor.SummarizeRollback([]reactor.RollbackEntry{{Step: "a", Status: reactor.RollbackPending}})
	require.Equal(t, reactor.RollbackInProgress, s.Outcome)
}
