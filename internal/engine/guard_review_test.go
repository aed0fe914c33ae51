package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// Regressions found in review of targeted and guarded undo.

// An entry that conflicts again after a person resolved it waits for a
// person again, and that second conflict can be resolved.
func TestGuardedSecondConflictOfTheSameEntry(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	kv := newKV(env)
	key := env.prefix + ":again"
	require.NoError(t, env.rdb.Set(ctx, key, "v0", 0).Err())
	def := engine.MustDefine("guard-again", kv.setStep("g", key, "v1", kv.guard(engine.Retry{})))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("again"))
	require.NoError(t, err)
	require.NoError(t, env.rdb.Set(ctx, key, "other", 0).Err())
	out, err := env.engine.UndoSteps(ctx, "again", []string{"g"})
	require.NoError(t, err)
	id := out.Rollback.ActionRequired[0].ID

	// Naming it again while it waits: not attempted (blocked by itself).
	probes := kv.probes.Load()
	_, err = env.engine.UndoSteps(ctx, "again", []string{"g"})
	require.NoError(t, err)
	require.Equal(t, probes, kv.probes.Load(), "a conflict is never attempted again before it is resolved")

	// "Reverted", but to the wrong value: the next undo conflicts again.
	require.NoError(t, env.rdb.Set(ctx, key, "V0", 0).Err())
	require.NoError(t, env.engine.Resolve(ctx, "again", id, engine.ResolvedManuallyReverted, "set it back"))
	out, err = env.engine.UndoSteps(ctx, "again", []string{"g"})
	require.NoError(t, err)
	require.Len(t, out.Rollback.ActionRequired, 1, "it waits for a person again")
	waiting, err := env.engine.NeedsHuman(ctx, 100)
	require.NoError(t, err)
	require.Contains(t, waiting, "again")
	require.NoError(t, env.engine.Resolve(ctx, "again", id, engine.ResolvedLeftApplied, "leave it"))
	rep, err := env.engine.RollbackReport(ctx, "again")
	require.NoError(t, err)
	require.Empty(t, rep.ActionRequired)
}

// A guarded step cut short after its change is a rollback failure
// (its effect may stand), never kept silently.
func TestGuardedStepCutShortIsAFailure(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	kv := newKV(env)
	key := env.prefix + ":cut"
	runCtx, cut := context.WithCancel(ctx)
	def := engine.MustDefine("guard-cut", engine.Step("g", engine.StepConfig[engine.Args, string]{
		Guard: kv.guard(engine.Retry{}),
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			if err := env.rdb.Set(ctx, key, "v1", 0).Err(); err != nil {
				return "", err
			}
			if err := engine.RecordEffect(ctx, engine.Effect{Resource: key, Before: "v0", After: "v1"}); err != nil {
				return "", err
			}
			cut() // the caller goes away before the result is recorded
			<-ctx.Done()
			return "", ctx.Err()
		},
	}))
	require.NoError(t, env.engine.Register(def))
	res, err := env.engine.Run(runCtx, def, nil, engine.WithRunID("cut"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusAborted, res.Status)
	u, err := env.engine.Undo(ctx, "cut")
	require.NoError(t, err)
	require.Len(t, u.Failure.RollbackFailures, 1)
	require.Equal(t, "reactor.step_interrupted", u.Failure.RollbackFailures[0].Reason)
	rep, err := env.engine.RollbackReport(ctx, "cut")
	require.NoError(t, err)
	require.Equal(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
}

// UndoSteps refuses a run that stopped inside a composed child: the
// child's completed steps are not on the stack yet, so the resource order
// cannot be judged.
func TestUndoStepsRefusesARunStoppedMidStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	runCtx, cut := context.WithCancel(ctx)
	hang := engine.Step("pay", engine.StepConfig[engine.Args, string]{
		After: []string{"reserve"},
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			cut()
			<-ctx.Done()
			return "", ctx.Err()
		},
	})
	child := engine.MustDefine("mid-child", resourceStep(tr, "reserve", "R", nil), hang)
	def := engine.MustDefine("mid-owner", resourceStep(tr, "a", "R", nil),
		engine.Compose("book", child, engine.ComposeConfig{After: []string{"a"}}))
	require.NoError(t, env.engine.Register(def))
	res, err := env.engine.Run(runCtx, def, nil, engine.WithRunID("mid"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusAborted, res.Status)
	_, err = env.engine.UndoSteps(ctx, "mid", []string{"a"})
	require.ErrorIs(t, err, engine.ErrStoppedMidStep)
	require.Empty(t, undos(tr))
	_, err = env.engine.Undo(ctx, "mid")
	require.NoError(t, err)
	require.Equal(t, []string{"undo:reserve", "undo:a"}, undos(tr))
}

// A cancel request that lands while UndoSteps holds the run does not turn
// it into a whole undo.
func TestUndoStepsIsNotTurnedIntoAnUndoByACancelRequest(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	d := engine.Step("d", engine.StepConfig[engine.Args, string]{
		After: []string{"c"},
		Run:   func(context.Context, engine.Args) (string, error) { return "", nil },
		Undo: func(context.Context, engine.Args, string) error {
			tr.add("undo:d")
			return engine.StoreCancelRequest(env.engine, "racing")
		},
	})
	def := engine.MustDefine("racing", resourceStep(tr, "a", "r:a", nil), resourceStep(tr, "c", "r:c", nil, "a"), d)
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("racing"))
	require.NoError(t, err)
	out, err := env.engine.UndoSteps(ctx, "racing", []string{"d"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, out.Result.Status)
	require.Equal(t, []string{"undo:d"}, undos(tr))
	stored, err := env.rdb.HExists(ctx, env.prefix+":{run:racing}:ctx", "cx").Result()
	require.NoError(t, err)
	require.False(t, stored, "the terminal write dropped the request")
}
