package reactor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// An option that makes no sense for the call, or has an invalid value, is
// an error naming it, and nothing is stored.
func TestRunOptionsRejected(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := reactor.MustDefine("opts-bad", simple(env.trail, "a", nil))
	cases := []struct {
		opt  reactor.RunOption
		want string
	}{
		{reactor.WithDelay(time.Second), "WithDelay applies to Enqueue only"},
		{reactor.WithStartAt(time.Now().Add(time.Minute)), "WithStartAt applies to Enqueue only"},
		{reactor.WithQueue(" "), "WithQueue"},
		{reactor.WithTimeout(0), "WithTimeout"},
		{reactor.WithDeadline(time.Time{}), "WithDeadline"},
	}
	for _, c := range cases {
		_, err := env.engine.Run(ctxTimeout(t), def, nil, reactor.WithRunID("opts-bad"), c.opt)
		require.ErrorContains(t, err, c.want)
	}
	_, err := env.engine.Get(ctxTimeout(t), "opts-bad")
	require.ErrorIs(t, err, reactor.ErrNotFound)
	require.Empty(t, env.trail.all())
}

// deadlineSaga: a (undoable) then b, which blocks until its context ends
// and records what it saw.
func deadlineSaga(env *env, name string) *reactor.Definition {
	tr := env.trail
	return reactor.MustDefine(name,
		simple(tr, "a", nil),
		reactor.Step("b", reactor.StepConfig[reactor.Args, string]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				tr.add("run:b")
				<-ctx.Done()
				return "", ctx.Err()
			},
			Compensate: func(ctx context.Context, _ reactor.Args, cause error) error {
				if !errors.Is(cause, reactor.ErrDeadlineExceeded) {
					return errors.New("compensate saw " + cause.Error())
				}
				tr.add("compensate:b")
				return nil
			},
			Retry: reactor.Retry{MaxAttempts: 3},
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
	res, err := env.engine.Run(ctxTimeout(t), def, nil, reactor.WithRunID("dl-slow"), reactor.WithTimeout(200*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, reactor.ErrDeadlineExceeded)
	require.Equal(t, "b", res.Failure.Step)
	require.False(t, res.Failure.Retryable)
	require.Equal(t, []string{"run:a", "run:b", "compensate:b", "undo:a"}, env.trail.all(), "b ran once, then the rollback")

	run, err := env.engine.Get(ctxTimeout(t), "dl-slow")
	require.NoError(t, err)
	require.Equal(t, "reactor.run_deadline_exceeded", run.Failure.Code)
	require.ErrorIs(t, run.Failure, reactor.ErrDeadlineExceeded, "the failure read back keeps its sentinel")
	require.False(t, run.Deadline.IsZero())
}

// A deadline that passes while a step succeeds fails the run at the next
// checkpoint: the next step never runs, the completed one is undone.
func TestDeadlineFailsTheRunBeforeItsNextStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	def := reactor.MustDefine("deadline-between",
		reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				tr.add("run:a")
				<-ctx.Done() // the run's deadline; then succeed anyway
				return "a-done", nil
			},
			Undo: func(context.Context, reactor.Args, string) error { tr.add("undo:a"); return nil },
		}),
		simple(tr, "b", nil, "a"),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil, reactor.WithTimeout(100*time.Millisecond))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, reactor.ErrDeadlineExceeded)
	require.Empty(t, res.Failure.Step, "no step failed")
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all())
}

// A deadline already past when the run starts fails it before its first
// step.
func TestDeadlinePassedBeforeTheFirstStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := deadlineSaga(env, "deadline-past")
	res, err := env.engine.Run(ctxTimeout(t), def, nil, reactor.WithDeadline(time.Now().Add(-time.Second)))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, reactor.ErrDeadlineExceeded)
	require.Empty(t, env.trail.all())
}

// A retry whose backoff would end past the deadline is not waited for.
func TestDeadlineCutsARetryShort(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	reactor.SetSleep(env.engine, func(context.Context, time.Duration) error {
		t.Error("slept for a retry that would start past the deadline")
		return nil
	})
	tr := env.trail
	def := reactor.MustDefine("deadline-retry",
		simple(tr, "a", nil),
		reactor.Step("b", reactor.StepConfig[reactor.Args, string]{
			After: []string{"a"},
			Run: func(context.Context, reactor.Args) (string, error) {
				tr.add("run:b")
				return "", errors.New("flaky")
			},
			Retry: reactor.Retry{MaxAttempts: 5, Backoff: reactor.Exponential(time.Hour, time.Hour)},
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil, reactor.WithTimeout(time.Minute))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.ErrorIs(t, res.Failure, reactor.ErrDeadlineExceeded)
	require.Contains(t, res.Failure.Message, "flaky", "the step's last error is kept in the message")
	require.Equal(t, []string{"run:a", "run:b", "undo:a"}, tr.all())
}
