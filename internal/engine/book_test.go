package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
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
	child := engine.MustDefine("book-child", engine.UndoWindow(time.Minute), resourceStep(tr, "inner", "r:x", nil))
	def := engine.MustDefine("book-parent", engine.UndoWindow(24*time.Hour), resourceStep(tr, "outer", "r:x", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"outer"}}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("book-window"))
	require.NoError(t, err)
	engine.SetServerClockSkew(env.engine, time.Hour)
	res, err := env.engine.Undo(ctx, "book-window")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	rep, err := env.engine.RollbackReport(ctx, "book-window")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/inner=out_of_window", "outer=blocked"}, reportOf(rep))
	require.Equal(t, "sub/inner#1", rep.Entries[1].BlockedBy)

	for gen := 2; gen <= 3; gen++ {
		res, err = env.engine.RetryRollback(ctx, "book-window")
		require.NoError(t, err)
		require.Equal(t, engine.StatusCancelled, res.Status)
		require.Empty(t, undos(tr), "generation %d undid nothing under the kept change", gen)
		rep, err = env.engine.RollbackReport(ctx, "book-window")
		require.NoError(t, err)
		require.Equal(t, gen, rep.Generation)
		require.Equal(t, []string{"sub/inner=out_of_window", "outer=blocked"}, reportOf(rep))
		require.Equal(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
	}
	_, err = env.engine.Check(ctx, "book-window", engine.OpRetry)
	require.ErrorIs(t, err, engine.ErrNotRetryable, "two effects are still in place")
}

// A summary never says reverted while an effect stays in place: entries a
// person left applied, beside one compensated entry, are kept_in_place
// (issue 21, case 4).
func TestSummaryWithLeftAppliedEntriesIsKeptInPlace(t *testing.T) {
	t.Parallel()
	s := engine.SummarizeRollback([]engine.RollbackEntry{
		{Step: "c", Status: engine.RollbackLeftApplied},
		{Step: "b", Status: engine.RollbackLeftApplied},
		{Step: "a", Status: engine.RollbackCompensated},
	})
	require.Equal(t, engine.RollbackKeptInPlace, s.Outcome)
	require.Equal(t, []string{"c", "b"}, s.LeftApplied)
	require.Empty(t, s.Kept, "left applied by a person is not the same as nothing to undo it")
	s = engine.SummarizeRollback([]engine.RollbackEntry{{Step: "a", Status: engine.RollbackPending}})
	require.Equal(t, engine.RollbackInProgress, s.Outcome)
}

// The step a run stopped at is reported as it happened: a step that
// failed after three attempts says failed on attempt 3, a halting step
// says halted, and while the rollback is under way the run already carries
// the failure it will end with and its report says in_progress (issue 21,
// case 6).
func TestStoppedStepsAreReportedAsTheyHappened(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	engine.SetSleep(env.engine, func(context.Context, time.Duration) error { return nil })
	inUndo, release := make(chan struct{}), make(chan struct{})
	def := engine.MustDefine("stop-failed",
		engine.Step("a", engine.StepConfig[engine.Args, string]{
			Run: func(context.Context, engine.Args) (string, error) { return "a", nil },
			Undo: func(context.Context, engine.Args, string) error {
				close(inUndo)
				<-release
				return nil
			},
		}),
		engine.Step("t", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Retry: engine.Retry{MaxAttempts: 3, Backoff: engine.Fixed(time.Hour)},
			Run:   func(context.Context, engine.Args) (int, error) { return 0, errors.New("still down") },
		}))
	require.NoError(t, env.engine.Register(def))
	done := make(chan *engine.Result, 1)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("stop-failed"))
		if err != nil {
			res = nil
		}
		done <- res
	}()
	<-inUndo
	run, err := env.engine.Get(ctx, "stop-failed")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, run.Status)
	require.NotNil(t, run.Failure, "the failure it will end with is known while it rolls back")
	require.Equal(t, "t", run.Failure.Step)
	require.Equal(t, &engine.StepStop{Step: "t", Attempt: 3, How: engine.StopFailed}, run.Stopped)
	rep, err := env.engine.RollbackReport(ctx, "stop-failed")
	require.NoError(t, err)
	require.Equal(t, engine.RollbackInProgress, rep.Summary.Outcome, "not nothing_to_do while under way")
	close(release)
	res := <-done
	require.NotNil(t, res)
	require.Equal(t, engine.StatusFailed, res.Status)

	halting := engine.MustDefine("stop-halted",
		engine.Step("h", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 0, engine.Halt("out of stock") },
		}))
	res, err = env.engine.Run(ctx, halting, nil, engine.WithRunID("stop-halted"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusHalted, res.Status)
	run, err = env.engine.Get(ctx, "stop-halted")
	require.NoError(t, err)
	require.Equal(t, &engine.StepStop{Step: "h", Attempt: 1, How: engine.StopHalted}, run.Stopped)
}

// A guarded undo cut short after its Restore wrote, before the save that
// records it, is counted: the redo is attempt 2 and finds the resource
// already back (issue 21, case 6).
func TestACutShortGuardedAttemptIsCounted(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	kv := newKV(env)
	ctx := ctxTimeout(t)
	key := env.prefix + ":cut:1"
	require.NoError(t, env.rdb.Set(ctx, key, "before", 0).Err())
	runCtx, cut := context.WithCancel(ctx)
	g := engine.Guarded(engine.GuardConfig[string]{
		Probe: func(ctx context.Context, k string) (string, error) { return kv.get(ctx, k), nil },
		Restore: func(ctx context.Context, k, before, _ string) (engine.RestoreResult, error) {
			err := env.rdb.Set(ctx, k, before, 0).Err()
			cut() // the process goes away before the save that records it
			return engine.RestoreWritten, err
		},
	})
	def := engine.MustDefine("cut-guarded", kv.setStep("set", key, "after", g),
		engine.Step("fail", engine.StepConfig[engine.Args, string]{
			After: []string{"set"},
			Run: func(context.Context, engine.Args) (string, error) {
				return "", engine.Permanent(errors.New("declined"))
			},
		}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(runCtx, def, nil, engine.WithRunID("cut-guarded"))
	require.Error(t, err, "the rollback was cut short")
	res, err := env.engine.Resume(ctx, "cut-guarded")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	rep, err := env.engine.RollbackReport(ctx, "cut-guarded")
	require.NoError(t, err)
	require.Len(t, rep.Entries, 2)
	set := rep.Entries[1]
	require.Equal(t, "set", set.Step)
	require.Equal(t, engine.RollbackCompensated, set.Status)
	require.Equal(t, engine.ReasonAlreadyReverted, set.Reason)
	require.Equal(t, 2, set.Attempts, "the attempt cut short is counted")
	require.Equal(t, "before", kv.get(ctx, key))
}

// Restore receives the effect's after state as well as its before state,
// so a store that compares and writes atomically compares with what the
// step left.
func TestRestoreReceivesBeforeAndAfter(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	kv := newKV(env)
	ctx := ctxTimeout(t)
	key := env.prefix + ":cas:1"
	require.NoError(t, env.rdb.Set(ctx, key, "v0", 0).Err())
	var got [2]string
	g := engine.Guarded(engine.GuardConfig[string]{
		Probe: func(ctx context.Context, k string) (string, error) { return kv.get(ctx, k), nil },
		Restore: func(ctx context.Context, k, before, after string) (engine.RestoreResult, error) {
			got = [2]string{before, after}
			return casRestore(ctx, env.rdb, k, before, after)
		},
	})
	def := engine.MustDefine("cas-after", kv.setStep("set", key, "v1", g))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	_, err = env.engine.Undo(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, [2]string{"v0", "v1"}, got)
	require.Equal(t, "v0", kv.get(ctx, key), "the atomic compare with after passed and wrote before")
	rep, err := env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.RollbackReverted, rep.Summary.Outcome)
}
