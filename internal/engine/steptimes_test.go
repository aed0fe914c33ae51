package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// A run's view carries each step's start and finish, the step running now
// with its start and attempt, and the composed child in progress: what the
// dashboard's timeline reads, without the definition.
func TestStepTimesAndChildren(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t)
	entered, release := make(chan struct{}), make(chan struct{})
	child := engine.MustDefine("times-child", engine.Step("wait", engine.StepConfig[engine.Args, string]{
		Run: func(context.Context, engine.Args) (string, error) {
			close(entered)
			<-release
			return "ok", nil
		},
	}))
	def := engine.MustDefine("times", simple(e.trail, "a", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"a"}}))
	done := make(chan error, 1)
	go func() {
		_, err := e.engine.Run(ctx, def, nil, engine.WithRunID("times-1"))
		done <- err
	}()
	<-entered
	// The checkpoint before the child's step carries the child.
	var run *engine.Run
	require.Eventually(t, func() bool {
		var err error
		run, err = e.engine.Get(ctx, "times-1")
		return err == nil && run.Children["sub"] != nil
	}, 5*time.Second, 10*time.Millisecond)
	require.Len(t, run.Steps, 1)
	a := run.Steps[0]
	require.Equal(t, "a", a.Name)
	require.False(t, a.StartedAt.IsZero())
	require.False(t, a.FinishedAt.Before(a.StartedAt))
	require.False(t, run.Started["sub"].Before(a.FinishedAt), "sub started when a finished")
	c := run.Children["sub"]
	require.Equal(t, "times-1/sub", c.ID)
	require.Equal(t, "times-child", c.Reactor)
	require.Equal(t, engine.StatusRunning, c.Status)
	require.NotNil(t, c.Current)
	require.Equal(t, "wait", c.Current.Step)
	require.Equal(t, 1, c.Current.Attempt)
	require.False(t, c.Started["wait"].IsZero())

	close(release)
	require.NoError(t, <-done)
	run, err := e.engine.Get(ctx, "times-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Len(t, run.Steps, 2)
	for _, s := range run.Steps {
		require.False(t, s.StartedAt.IsZero(), s.Name)
		require.False(t, s.FinishedAt.Before(s.StartedAt), s.Name)
	}
	require.Empty(t, run.Started)
	require.Nil(t, run.Current)
	require.Empty(t, run.Children)
}
