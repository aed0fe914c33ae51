package reactor_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// The undo window is judged by the Redis server's clock; the tests move
// that clock (as a node whose clock is ahead or behind would) instead of
// waiting for time to pass.

func TestUndoWindowInsideAndOutside(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	def := reactor.MustDefine("window-basic", reactor.UndoWindow(time.Hour),
		resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", nil, "a"))
	require.NoError(t, env.engine.Register(def))
	require.Equal(t, time.Hour, def.UndoWindow())

	// Inside the window: undone.
	_, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("w-in"))
	require.NoError(t, err)
	_, err = env.engine.Undo(ctx, "w-in")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:b", "undo:a"}, undos(tr))

	// Two hours later: kept, listed out_of_window, nothing called.
	_, err = env.engine.Run(ctx, def, nil, reactor.WithRunID("w-out"))
	require.NoError(t, err)
	reactor.SetServerClockSkew(env.engine, 2*time.Hour)
	res, err := env.engine.Undo(ctx, "w-out")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status)
	require.Len(t, undos(tr), 2, "no undo was called past the window")
	rep, err := env.engine.RollbackReport(ctx, "w-out")
	require.NoError(t, err)
	require.Equal(t, []string{"b=out_of_window", "a=out_of_window"}, reportOf(rep))
	require.Equal(t, []string{"b", "a"}, rep.Summary.OutOfWindow)
	require.Equal(t, reactor.RollbackKeptInPlace, rep.Summary.Outcome, "effects kept by the window are in place: not reverted, not nothing to do")
	require.Equal(t, reactor.ActionNone, rep.Entries[0].Action)
	require.Contains(t, auditKinds(t, env, "w-out"), "out_of_window:b")
	require.Empty(t, res.Failure.RollbackFailures, "a closed window is not a failure")

	// UndoSteps alike; the entry stays applied with its status.
	_, err = env.engine.Run(ctx, def, nil, reactor.WithRunID("w-steps"))
	require.NoError(t, err)
	reactor.SetServerClockSkew(env.engine, 0)
	// (the run's writes recorded the real clock; two hours on again)
	reactor.SetServerClockSkew(env.engine, 2*time.Hour)
	out, err := env.engine.UndoSteps(ctx, "w-steps", []string{"b"})
	require.NoError(t, err)
	require.Equal(t, []string{"b=out_of_window"}, reportOf(out.Rollback))
	run, err := env.engine.Get(ctx, "w-steps")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, entrySteps(run.Ledger, ""))
	require.Equal(t, reactor.RollbackOutOfWindow, run.Ledger[1].Status)
	require.Len(t, undos(tr), 2)
}

// A rollback that started inside the window finishes, even when it is
// interrupted and resumed after the window closed, and a re-triggered
// rollback keeps that verdict.
func TestUndoWindowRollbackStartedInsideFinishes(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	undoCtx, cut := context.WithCancel(ctx)
	var failA atomic.Int32
	failA.Store(1)
	b := reactor.Step("b", reactor.StepConfig[reactor.Args, string]{
		After: []string{"a"},
		Run:   func(context.Context, reactor.Args) (string, error) { return "", nil },
		Undo: func(context.Context, reactor.Args, string) error {
			tr.add("undo:b")
			// The window closes while the rollback is under way, and the
			// caller goes away.
			reactor.SetServerClockSkew(env.engine, 2*time.Hour)
			cut()
			return nil
		},
	})
	def := reactor.MustDefine("window-cross", reactor.UndoWindow(time.Hour), resourceStep(tr, "a", "r:a", &failA), b)
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("w-cross"))
	require.NoError(t, err)

	_, err = env.engine.Undo(undoCtx, "w-cross")
	require.Error(t, err, "interrupted after b's undo")
	run, err := env.engine.Get(ctx, "w-cross")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRollingBack, run.Status)

	res, err := env.engine.Resume(ctx, "w-cross")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status)
	// b's undo, cut short, runs again (undos run at least once); a's is
	// called although its window has closed: the rollback started inside.
	require.Equal(t, []string{"undo:b", "undo:b", "undo:a"}, undos(tr))
	require.Len(t, res.Failure.RollbackFailures, 1, "a's undo failed once")

	again, err := env.engine.RetryRollback(ctx, "w-cross")
	require.NoError(t, err)
	require.Empty(t, again.Failure.RollbackFailures)
	require.Equal(t, 2, tr.count("undo:a"), "the retry keeps the verdict of the rollback it retries")
	rep, err := env.engine.RollbackReport(ctx, "w-cross")
	require.NoError(t, err)
	require.Equal(t, []string{"b=compensated", "a=compensated"}, reportOf(rep))
}

// A clock reading earlier than one the run recorded refuses the undo and
// changes nothing; once the clock has caught up, the undo goes ahead.
func TestUndoWindowClockGoingBackwardsIsAnError(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	def := reactor.MustDefine("window-backwards", reactor.UndoWindow(time.Hour),
		resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", nil, "a"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("w-back"))
	require.NoError(t, err)
	before, err := env.engine.Get(ctx, "w-back")
	require.NoError(t, err)

	reactor.SetServerClockSkew(env.engine, -2*time.Hour)
	_, err = env.engine.Undo(ctx, "w-back")
	require.ErrorIs(t, err, reactor.ErrClockBackwards)
	var ce *reactor.ClockError
	require.True(t, errors.As(err, &ce))
	require.True(t, ce.Now.Before(ce.Last))
	_, err = env.engine.UndoSteps(ctx, "w-back", []string{"a", "b"})
	require.ErrorIs(t, err, reactor.ErrClockBackwards)
	require.Empty(t, undos(tr))
	after, err := env.engine.Get(ctx, "w-back")
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "nothing was written")
	require.Equal(t, reactor.StatusCompleted, after.Status)

	reactor.SetServerClockSkew(env.engine, 0)
	_, err = env.engine.Undo(ctx, "w-back")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:b", "undo:a"}, undos(tr))
}

// A composed child's steps follow the child definition's window, and a
// definition refuses a non-positive window.
func TestUndoWindowPerDefinition(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	child := reactor.MustDefine("window-child", reactor.UndoWindow(time.Minute), resourceStep(tr, "inner", "r:i", nil))
	def := reactor.MustDefine("window-parent", reactor.UndoWindow(24*time.Hour), resourceStep(tr, "outer", "r:o", nil),
		reactor.Compose("sub", child, reactor.ComposeConfig{After: []string{"outer"}}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("w-def"))
	require.NoError(t, err)
	reactor.SetServerClockSkew(env.engine, time.Hour)
	_, err = env.engine.Undo(ctx, "w-def")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:outer"}, undos(tr))
	rep, err := env.engine.RollbackReport(ctx, "w-def")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/inner=out_of_window", "outer=compensated"}, reportOf(rep))

	_, err = reactor.Define("window-bad", reactor.UndoWindow(0), resourceStep(tr, "x", "r", nil))
	var de *reactor.DefinitionError
	require.ErrorAs(t, err, &de)
	require.ErrorContains(t, err, "UndoWindow must be positive")
	_, err = reactor.Define("resource-no-undo", reactor.Step("x", reactor.StepConfig[reactor.Args, string]{
		Run:      func(context.Context, reactor.Args) (string, error) { return "", nil },
		Resource: func(reactor.Args, string) string { return "r" },
	}))
	require.ErrorContains(t, err, "has no Undo")
}
