package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// undoCounter counts the undo (and compensate) calls per step; the steps named
// in failOnce fail their first call.
type undoCounter struct {
	mu       sync.Mutex
	calls    map[string]int
	failOnce map[string]bool
}

func newUndoCounter(failOnce ...string) *undoCounter {
	f := &undoCounter{calls: map[string]int{}, failOnce: map[string]bool{}}
	for _, s := range failOnce {
		f.failOnce[s] = true
	}
	return f
}

func (f *undoCounter) call(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	if f.failOnce[name] && f.calls[name] == 1 {
		return fmt.Errorf("%s: the service was down", name)
	}
	return nil
}

func (f *undoCounter) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *undoCounter) step(name string, fail bool, after ...string) engine.Part {
	return engine.Step(name, engine.StepConfig[engine.Args, string]{
		After: after,
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			if fail {
				return "", engine.Permanent(errors.New(name + " failed"))
			}
			return name + "-done", nil
		},
		Undo: func(ctx context.Context, _ engine.Args, out string) error {
			if out != name+"-done" {
				return errors.New("undo saw the wrong result: " + out)
			}
			return f.call("undo:" + name)
		},
		Compensate: func(ctx context.Context, _ engine.Args, cause error) error {
			if cause == nil {
				return errors.New("compensate without a cause")
			}
			return f.call("compensate:" + name)
		},
	})
}

func rollbackSteps(f *engine.Failure) []string {
	var out []string
	for _, rf := range f.RollbackFailures {
		out = append(out, string(rf.Kind)+":"+rf.Step)
	}
	return out
}

// A rollback that left a failed entry is re-triggered: only that entry is
// undone again (the compensated ones are not called again), the run ends
// failed with a clean rollback in generation 2, and the same call again is
// refused with ErrNothingToRetry.
func TestRetryRollbackRetriesOnlyTheFailedEntry(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	fl := newUndoCounter("undo:b")
	def := engine.MustDefine("retry-only-failed",
		fl.step("a", false), fl.step("b", false, "a"), fl.step("c", false, "b"), fl.step("d", true, "c"))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []string{"undo:b"}, rollbackSteps(res.Failure))
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 1, run.RollbackGeneration)
	_, err = env.engine.Check(ctx, res.RunID, engine.OpRollback)
	require.NoError(t, err)

	again, err := env.engine.RetryRollback(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, again.Status)
	require.Empty(t, again.Failure.RollbackFailures, "the retry undid everything")
	require.Equal(t, "d failed", again.Failure.Message, "the run keeps its failure")
	for name, n := range map[string]int{"undo:a": 1, "undo:b": 2, "undo:c": 1, "compensate:d": 1} {
		require.Equal(t, n, fl.count(name), name)
	}
	run, err = env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, run.RollbackGeneration)
	last := run.Rollbacks[len(run.Rollbacks)-1]
	require.Equal(t, "b", last.Step)
	require.Equal(t, engine.RollbackCompensated, last.Status)

	// The report of generation 2 accounts for every entry, each as its
	// newest generation left it, and the audit has the second start.
	rep, err := env.engine.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 2, rep.Generation)
	require.Equal(t, res.RunID+":rb:2", rep.RollbackID)
	var steps []string
	for _, e := range rep.Entries {
		steps = append(steps, e.Step+"="+string(e.Status))
	}
	require.Equal(t, []string{"d=compensated", "c=compensated", "b=compensated", "a=compensated"}, steps)
	require.Equal(t, engine.RollbackReverted, rep.Summary.Outcome)
	trail, err := env.engine.Audit(ctx, res.RunID)
	require.NoError(t, err)
	var starts []int
	for _, a := range trail {
		if a.Kind == engine.AuditRollbackStarted {
			starts = append(starts, a.Generation)
		}
	}
	require.Equal(t, []int{1, 2}, starts, "each generation's start is audited")

	_, err = env.engine.RetryRollback(ctx, res.RunID)
	var se *engine.StatusError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, engine.ErrNothingToRetry)
	require.Equal(t, string(engine.OpRollback), se.Op)
	_, err = env.engine.Check(ctx, res.RunID, engine.OpRollback)
	require.ErrorIs(t, err, engine.ErrNothingToRetry)
	require.Equal(t, 2, fl.count("undo:b"))
}

// Concurrent re-triggers run the retry once; FromGeneration refuses a
// request for a generation already retried.
func TestRetryRollbackConcurrentRunsOnce(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	fl := newUndoCounter("undo:a", "undo:b")
	def := engine.MustDefine("retry-concurrent", fl.step("a", false), fl.step("b", false, "a"), fl.step("c", true, "b"))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Len(t, res.Failure.RollbackFailures, 2)

	var ok, refused atomic.Int32
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := env.engine.RetryRollback(ctx, res.RunID, engine.FromGeneration(1))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, engine.ErrRollbackRetried), errors.Is(err, engine.ErrRunLocked):
				refused.Add(1)
			default:
				t.Errorf("unexpected error: %v", err)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 1, ok.Load())
	require.EqualValues(t, 3, refused.Load())
	require.Equal(t, 2, fl.count("undo:a"))
	require.Equal(t, 2, fl.count("undo:b"))
}

// Refusals name the reason: a completed run has no rollback to retry.
func TestRetryRollbackRefusesAWrongStatus(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	fl := newUndoCounter()
	def := engine.MustDefine("retry-refused", fl.step("a", false))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	_, err = env.engine.RetryRollback(ctx, res.RunID)
	var se *engine.StatusError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, engine.ErrNoRollbackToRetry)
	require.Equal(t, engine.StatusCompleted, se.Status)
	_, err = env.engine.RetryRollback(ctx, "no-such-run")
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// The failing step's own Compensate that failed is retried with the run's
// failure as its cause; a composed child's failed entry is retried inside
// its compose entry; an entry that fails again can be retried again.
func TestRetryRollbackCompensateAndComposedChild(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	fl := newUndoCounter("compensate:z", "undo:k1")
	fl.failOnce["undo:k1"] = true
	child := engine.MustDefine("retry-child", fl.step("k1", false), fl.step("k2", false, "k1"))
	def := engine.MustDefine("retry-parent",
		fl.step("a", false),
		engine.Compose("kid", child, engine.ComposeConfig{After: []string{"a"}}),
		fl.step("z", true, "kid"))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"compensate:z", "undo:kid/k1"}, rollbackSteps(res.Failure))

	again, err := env.engine.RetryRollback(ctx, res.RunID)
	require.NoError(t, err)
	require.Empty(t, again.Failure.RollbackFailures)
	for name, n := range map[string]int{"undo:a": 1, "undo:k1": 2, "undo:k2": 1, "compensate:z": 2} {
		require.Equal(t, n, fl.count(name), name)
	}
}

// A cancelled run (Undo) whose rollback failed ends cancelled again after
// the retry; an entry that fails on the retry too stays retriable.
func TestRetryRollbackOfAnUndoneRunFailsAgainThenSucceeds(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	var calls atomic.Int32
	def := engine.MustDefine("retry-undo",
		engine.Step("a", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) { return "ok", nil },
			Undo: func(ctx context.Context, _ engine.Args, _ string) error {
				if calls.Add(1) <= 2 {
					return errors.New("still down")
				}
				return nil
			},
		}))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	res, err = env.engine.Undo(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Len(t, res.Failure.RollbackFailures, 1)

	res, err = env.engine.RetryRollback(ctx, res.RunID, engine.FromGeneration(1))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Len(t, res.Failure.RollbackFailures, 1, "failed again")
	_, err = env.engine.RetryRollback(ctx, res.RunID, engine.FromGeneration(1))
	require.ErrorIs(t, err, engine.ErrRollbackRetried)

	res, err = env.engine.RetryRollback(ctx, res.RunID, engine.FromGeneration(2))
	require.NoError(t, err)
	require.Empty(t, res.Failure.RollbackFailures)
	require.EqualValues(t, 3, calls.Load())
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, 3, run.RollbackGeneration)
}
