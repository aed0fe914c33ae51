package reactor_test

import (
	"context"
	"errors"
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
	rep, err := env.engine.RollbackReport(ctx, "book-window")
	require.NoError(t, err)
	require.Equal(t, []string{"sub/inner=out_of_window", "outer=blocked"}, reportOf(rep))
	require.Equal(t, "sub/inner#1", rep.Entries[1].BlockedBy)

	for gen := 2; gen <= 3; gen++ {
		res, err = env.engine.RetryRollback(ctx, "book-window")
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCancelled, res.Status)
		require.Empty(t, undos(tr), "generation %d undid nothing under the kept change", gen)
		rep, err = env.engine.RollbackReport(ctx, "book-window")
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

// The step a run stopped at is reported as it happened: a step that
// failed after three attempts says failed on attempt 3, a halting step
// says halted, and while the rollback is under way the run already carries
// the failure it will end with and its report says in_progress (issue 21,
// case 6).
func TestStoppedStepsAreReportedAsTheyHappened(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	reactor.SetSleep(env.engine, func(context.Context, time.Duration) error { return nil })
	inUndo, release := make(chan struct{}), make(chan struct{})
	def := reactor.MustDefine("stop-failed",
		reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) { return "a", nil },
			Undo: func(context.Context, reactor.Args, string) error {
				close(inUndo)
				<-release
				return nil
			},
		}),
		reactor.Step("t", reactor.StepConfig[reactor.Args, int]{
			After: []string{"a"},
			Retry: reactor.Retry{MaxAttempts: 3, Backoff: reactor.Fixed(time.Hour)},
			Run:   func(context.Context, reactor.Args) (int, error) { return 0, errors.New("still down") },
		}))
	require.NoError(t, env.engine.Register(def))
	done := make(chan *reactor.Result, 1)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("stop-failed"))
		if err != nil {
			res = nil
		}
		done <- res
	}()
	<-inUndo
	run, err := env.engine.Get(ctx, "stop-failed")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRollingBack, run.Status)
	require.NotNil(t, run.Failure, "the failure it will end with is known while it rolls back")
	require.Equal(t, "t", run.Failure.Step)
	require.Equal(t, &reactor.StepStop{Step: "t", Attempt: 3, How: reactor.StopFailed}, run.Stopped)
	rep, err := env.engine.RollbackReport(ctx, "stop-failed")
	require.NoError(t, err)
	require.Equal(t, reactor.RollbackInProgress, rep.Summary.Outcome, "not nothing_to_do while under way")
	close(release)
	res := <-done
	require.NotNil(t, res)
	require.Equal(t, reactor.StatusFailed, res.Status)

	halting := reactor.MustDefine("stop-halted",
		reactor.Step("h", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { return 0, reactor.Halt("out of stock") },
		}))
	res, err = env.engine.Run(ctx, halting, nil, reactor.WithRunID("stop-halted"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusHalted, res.Status)
	run, err = env.engine.Get(ctx, "stop-halted")
	require.NoError(t, err)
	require.Equal(t, &reactor.StepStop{Step: "h", Attempt: 1, How: reactor.StopHalted}, run.Stopped)
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
	g := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: func(ctx context.Context, k string) (string, error) { return kv.get(ctx, k), nil },
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			err := env.rdb.Set(ctx, k, before, 0).Err()
			cut() // the process goes away before the save that records it
			return reactor.RestoreWritten, err
		},
	})
	def := reactor.MustDefine("cut-guarded", kv.setStep("set", key, "after", g),
		reactor.Step("fail", reactor.StepConfig[reactor.Args, string]{
			After: []string{"set"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("declined"))
			},
		}))
	require.NoError(t, env.engine.Register(def))
	_, err := env.engine.Run(runCtx, def, nil, reactor.WithRunID("cut-guarded"))
	require.Error(t, err, "the rollback was cut short")
	res, err := env.engine.Resume(ctx, "cut-guarded")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	rep, err := env.engine.RollbackReport(ctx, "cut-guarded")
	require.NoError(t, err)
	require.Len(t, rep.Entries, 2)
	set := rep.Entries[1]
	require.Equal(t, "set", set.Step)
	require.Equal(t, reactor.RollbackCompensated, set.Status)
	require.Equal(t, reactor.ReasonAlreadyReverted, set.Reason)
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
	g := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: func(ctx context.Context, k string) (string, error) { return kv.get(ctx, k), nil },
		Restore: func(ctx context.Context, k, before, after string) (reactor.RestoreResult, error) {
			got = [2]string{before, after}
			return casRestore(ctx, env.rdb, k, before, after)
		},
	})
	def := reactor.MustDefine("cas-after", kv.setStep("set", key, "v1", g))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	_, err = env.engine.Undo(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, [2]string{"v0", "v1"}, got)
	require.Equal(t, "v0", kv.get(ctx, key), "the atomic compare with after passed and wrote before")
	rep, err := env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.RollbackReverted, rep.Summary.Outcome)
}
