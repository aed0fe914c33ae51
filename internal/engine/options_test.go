package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// An option that makes no sense for the call, or has an invalid value, is
// an error naming it, and nothing is stored.
func TestRunOptionsRejected(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("opts-bad", simple(env.trail, "a", nil))
	cases := []struct {
		opt  engine.RunOption
		want string
	}{
		{engine.WithDelay(time.Second), "WithDelay applies to Enqueue only"},
		{engine.WithStartAt(time.Now().Add(time.Minute)), "WithStartAt applies to Enqueue only"},
		{engine.WithQueue(" "), "WithQueue"},
		{engine.WithTimeout(0), "WithTimeout"},
		{engine.WithDeadline(time.Time{}), "WithDeadline"},
	}
	for _, c := range cases {
		_, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithRunID("opts-bad"), c.opt)
		require.ErrorContains(t, err, c.want)
	}
	_, err := env.engine.Get(ctxTimeout(t), "opts-bad")
	require.ErrorIs(t, err, engine.ErrNotFound)
	require.Empty(t, env.trail.all())
}

// deadlineSaga: a (undoable) then b, which blocks until its context ends
// and records what it saw.
func deadlineSaga(env *env, name string) *engine.Definition {
	tr := env.trail
	return engine.MustDefine(name,
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, string]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				tr.add("run:b")
				<-ctx.Done()
				return "", ctx.Err()
			},
			Compensate: func(ctx context.Context, _ engine.Args, cause error) error {
				if !errors.Is(cause, engine.ErrDeadlineExceeded) {
					return errors.New("compensate saw " + cause.Error())
				}
				tr.add("compensate:b")
				return nil
			},
			Retry: engine.Retry{MaxAttempts: 3},
		}),
	)
}

// A run whose second step outlives the run's deadline fails with
// ErrDeadlineExceeded (not retried), compensates that step and undoes the
// first, and the failure reads back from Redis with its code.
func TestDeadlineFailsAndRollsBackASlowStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := deadlineSaga(env, "deadline-slow")
	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithRunID("dl-slow"), engine.WithTimeout(200*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, engine.ErrDeadlineExceeded)
	require.Equal(t, "b", res.Failure.Step)
	require.False(t, res.Failure.Retryable)
	require.Equal(t, []string{"run:a", "run:b", "compensate:b", "undo:a"}, env.trail.all(), "b ran once, then the rollback")

	run, err := env.engine.Get(ctxTimeout(t), "dl-slow")
	require.NoError(t, err)
	require.Equal(t, "reactor.run_deadline_exceeded", run.Failure.Code)
	require.ErrorIs(t, run.Failure, engine.ErrDeadlineExceeded, "the failure read back keeps its sentinel")
	require.False(t, run.Deadline.IsZero())
}

// A deadline that passes while a step succeeds fails the run at the next
// checkpoint: the next step never runs, the completed one is undone.
func TestDeadlineFailsTheRunBeforeItsNextStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	def := engine.MustDefine("deadline-between",
		engine.Step("a", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				tr.add("run:a")
				<-ctx.Done() // the run's deadline; then succeed anyway
				return "a-done", nil
			},
			Undo: func(context.Context, engine.Args, string) error { tr.add("undo:a"); return nil },
		}),
		simple(tr, "b", nil, "a"),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, engine.ErrDeadlineExceeded)
	require.Empty(t, res.Failure.Step, "no step failed")
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all())
}

// A deadline already past when the run starts fails it before its first
// step.
func TestDeadlinePassedBeforeTheFirstStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := deadlineSaga(env, "deadline-past")
	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithDeadline(time.Now().Add(-time.Second)))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, engine.ErrDeadlineExceeded)
	require.Empty(t, env.trail.all())
}

// A retry whose backoff would end past the deadline is not waited for.
func TestDeadlineCutsARetryShort(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	engine.SetSleep(env.engine, func(context.Context, time.Duration) error {
		t.Error("slept for a retry that would start past the deadline")
		return nil
	})
	tr := env.trail
	def := engine.MustDefine("deadline-retry",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, string]{
			After: []string{"a"},
			Run: func(context.Context, engine.Args) (string, error) {
				tr.add("run:b")
				return "", errors.New("flaky")
			},
			Retry: engine.Retry{MaxAttempts: 5, Backoff: engine.Exponential(time.Hour, time.Hour)},
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithTimeout(time.Minute))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, engine.ErrDeadlineExceeded)
	require.Contains(t, res.Failure.Message, "flaky", "the step's last error is kept in the message")
	require.Equal(t, []string{"run:a", "run:b", "undo:a"}, tr.all())
}
