package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// The undo window is judged by the Redis server's clock; the tests move
// that clock (as a node whose clock is ahead or behind would) instead of
// waiting for time to pass.

func TestUndoWindowInsideAndOutside(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	def := engine.MustDefine("window-basic", engine.UndoWindow(time.Hour),
		resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", nil, "a"))
	require.NoError(t, env.engine.Register(def))
	require.Equal(t, time.Hour, def.UndoWindow())

	// Inside the window: undone.
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("w-in"))
	require.NoError(t, err)
	_, err = env.engine.Undo(ctx, "w-in")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:b", "undo:a"}, undos(tr))

	// Two hours later: kept, listed out_of_window, nothing called.
	_, err = env.engine.Run(ctx, def, nil, engine.WithRunID("w-out"))
	require.NoError(t, err)
	engine.SetServerClockSkew(env.engine, 2*time.Hour)
	res, err := env.engine.Undo(ctx, "w-out")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Len(t, undos(tr), 2, "no undo was called past the window")
	rep, err := env.engine.RollbackReport(ctx, "w-out")
	require.NoError(t, err)
	require.Equal(t, []string{"b=out_of_window", "a=out_of_window"}, reportOf(rep))
	require.Equal(t, []string{"b", "a"}, rep.Summary.OutOfWindow)
	require.Equal(t, engine.RollbackKeptInPlace, rep.Summary.Outcome, "effects kept by the window are in place: not reverted, not nothing to do")
	require.Equal(t, engine.ActionNone, rep.Entries[0].Action)
	require.Contains(t, auditKinds(t, env, "w-out"), "out_of_window:b")
	require.Empty(t, res.Failure.RollbackFailures, "a closed window is not a failure")

	// UndoSteps alike; the entry stays applied with its status.
	_, err = env.engine.Run(ctx, def, nil, engine.WithRunID("w-steps"))
	require.NoError(t, err)
	engine.SetServerClockSkew(env.engine, 0)
	// (the run's writes recorded the real clock; two hours on again)
	engine.SetServerClockSkew(env.engine, 2*time.Hour)
	out, err := env.engine.UndoSteps(ctx, "w-steps", []string{"b"})
	require.NoError(t, err)
	require.Equal(t, []string{"b=out_of_window"}, reportOf(out.Rollback))
	run, err := env.engine.Get(ctx, "w-steps")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, entrySteps(run.Ledger, ""))
	require.Equal(t, engine.RollbackOutOfWindow, run.Ledger[1].Status)
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
	b := engine.Step("b", engine.StepConfig[engine.Args, string]{
		After: []string{"a"},
		Run:   func(context.Context, engine.Args) (string, error) { return "", nil },
		Undo: func(context.Context, engine.Args, string) error {
			tr.add("undo:b")
			// The window closes while the rollback is under way, and the
			// caller goes away.
			engine.SetServerClockSkew(env.engine, 2*time.Hour)
			cut()
			return nil
		},
	})
	def := engine.MustDefine("window-cross", engine.UndoWindow(time.Hour), resourceStep(tr, "a", "r:a", &failA), b)
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("w-cross"))
	require.NoError(t, err)

	_, err = env.engine.Undo(undoCtx, "w-cross")
	require.Error(t, err, "interrupted after b's undo")
	run, err := env.engine.Get(ctx, "w-cross")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, run.Status)

	res, err := env.engine.Resume(ctx, "w-cross")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
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
	def := engine.MustDefine("window-backwards", engine.UndoWindow(time.Hour),
		resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "b", "r:b", nil, "a"))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("w-back"))
	require.NoError(t, err)
	before, err := env.engine.Get(ctx, "w-back")
	require.NoError(t, err)

	engine.SetServerClockSkew(env.engine, -2*time.Hour)
	_, err = env.engine.Undo(ctx, "w-back")
	require.ErrorIs(t, err, engine.ErrClockBackwards)
	var ce *engine.ClockError
	require.True(t, errors.As(err, &ce))
	require.True(t, ce.Now.Before(ce.Last))
	_, err = env.engine.UndoSteps(ctx, "w-back", []string{"a", "b"})
	require.ErrorIs(t, err, engine.ErrClockBackwards)
	require.Empty(t, undos(tr))
	after, err := env.engine.Get(ctx, "w-back")
	require.NoError(t, err)
	require.Equal(t, before.Version, after.Version, "nothing was written")
	require.Equal(t, engine.StatusCompleted, after.Status)

	engine.SetServerClockSkew(env.engine, 0)
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
	child := engine.MustDefine("window-child", engine.UndoWindow(time.Minute), resourceStep(tr, "inner", "r:i", nil))
	def := engine.MustDefine("window-parent", engine.UndoWindow(24*time.Hour), resourceStep(tr, "outer", "r:o", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"outer"}}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("w-def"))
	require.NoError(t, err)
	engine.SetServerClockSkew(env.engine, time.Hour)
	_, err = env.engine.Undo(ctx, "w-def")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:outer"}, undos(tr))
	rep, err := env.engine.RollbackReport(ctx, "w-def")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/inner=out_of_window", "outer=compensated"}, reportOf(rep))

	_, err = engine.Define("window-bad", engine.UndoWindow(0), resourceStep(tr, "x", "r", nil))
	var de *engine.DefinitionError
	require.ErrorAs(t, err, &de)
	require.ErrorContains(t, err, "UndoWindow must be positive")
	_, err = engine.Define("resource-no-undo", engine.Step("x", engine.StepConfig[engine.Args, string]{
		Run:      func(context.Context, engine.Args) (string, error) { return "", nil },
		Resource: func(engine.Args, string) string { return "r" },
	}))
	require.ErrorContains(t, err, "has no Undo")
}
