package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// Allowed answers, from one read, what Check answers operation by
// operation: for a completed run, a failed one and an unknown id.
func TestAllowedIsCheckOfEveryOperation(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	ok := engine.MustDefine("allowed-ok", simple(env.trail, "a", nil))
	bad := engine.MustDefine("allowed-bad", simple(env.trail, "a", nil), simple(env.trail, "b", engine.Permanent(errors.New("no")), "a"))
	done, err := env.engine.Run(ctx, ok, nil)
	require.NoError(t, err)
	failed, err := env.engine.Run(ctx, bad, nil)
	require.NoError(t, err)
	ops := []engine.Op{engine.OpUndo, engine.OpCancel, engine.OpRetry, engine.OpRollback, engine.OpUndoSteps}
	for _, id := range []string{done.RunID, failed.RunID} {
		run, allowed, err := env.engine.Allowed(ctx, id)
		require.NoError(t, err)
		require.Equal(t, id, run.ID)
		require.Len(t, allowed, len(ops))
		for _, op := range ops {
			_, want := env.engine.Check(ctx, id, op)
			if want == nil {
				require.NoError(t, allowed[op], "%s %s", id, op)
				continue
			}
			require.EqualError(t, allowed[op], want.Error(), "%s %s", id, op)
			var se *engine.StatusError
			require.ErrorAs(t, allowed[op], &se)
		}
	}
	_, allowed, _ := env.engine.Allowed(ctx, done.RunID)
	require.NoError(t, allowed[engine.OpUndo], "a completed run can be undone")
	require.Error(t, allowed[engine.OpCancel])
	_, _, err = env.engine.Allowed(context.Background(), "allowed-nobody")
	require.ErrorIs(t, err, engine.ErrNotFound)
}
