package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// A step whose Run panics, and an undo that panics during the rollback, are
// each logged once at Error with the panic's stack as an attribute; the
// run's failure stored in Redis carries the step's stack.
func TestPanicLoggedAtErrorWithStack(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	env := newEnv(t, func(c *engine.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	def := engine.MustDefine("panic-logs",
		engine.Step("a", engine.StepConfig[engine.Args, int]{
			Run:  func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, engine.Args, int) error { panicInUndo(); return nil },
		}),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run:   func(context.Context, engine.Args) (int, error) { panicInRun(); return 0, nil },
		}),
	)
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, run.Status)

	stacks := map[string]string{} // event/step -> stack
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), l)
		ev, _ := rec["event"].(string)
		stack, has := rec["stack"].(string)
		switch ev {
		case string(engine.EventStepFailed), string(engine.EventStepUndoFailed):
			require.Equal(t, "ERROR", rec["level"], l)
			require.True(t, has, "no stack attribute: %s", l)
			key := ev + "/" + rec["step"].(string)
			require.NotContains(t, stacks, key, "logged twice: %s", l)
			stacks[key] = stack
		default:
			require.False(t, has, "only the step's own event carries the stack: %s", l)
			require.NotEqual(t, "ERROR", rec["level"], l)
		}
	}
	require.Contains(t, stacks[string(engine.EventStepFailed)+"/b"], "panicInRun")
	require.Contains(t, stacks[string(engine.EventStepUndoFailed)+"/a"], "panicInUndo")

	// The stored failure, read back from Redis, unwraps to the PanicError.
	require.NotNil(t, run.Failure)
	require.Equal(t, "b", run.Failure.Step)
	var p *engine.PanicError
	require.True(t, errors.As(run.Failure, &p), "failure %v", run.Failure)
	require.Equal(t, "run went wrong", p.Value)
	require.Contains(t, p.Stack, "panicInRun")
}

func panicInRun()  { panic("run went wrong") }
func panicInUndo() { panic("undo went wrong") }

// Durations in the engine's logs read as durations ("5ms"), not as raw
// nanoseconds.
func TestLoggedDurationsAreText(t *testing.T) {
	t.Parallel()
	var buf syncBuffer
	env := newEnv(t, func(c *engine.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	calls := 0
	def := engine.MustDefine("log-durations", engine.Step("flaky", engine.StepConfig[engine.Args, int]{
		Retry: engine.Retry{MaxAttempts: 2, Backoff: engine.Fixed(5 * time.Millisecond)},
		Run: func(context.Context, engine.Args) (int, error) {
			if calls++; calls == 1 {
				return 0, errors.New("not yet")
			}
			return 1, nil
		},
	}))
	_, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	seen := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &rec), l)
		for _, k := range []string{"duration", "delay"} {
			if v, ok := rec[k]; ok {
				s, isText := v.(string)
				require.True(t, isText, "%s is %T in %s", k, v, l)
				_, perr := time.ParseDuration(s)
				require.NoError(t, perr, l)
				seen[k] = s
			}
		}
	}
	require.Equal(t, "5ms", seen["delay"], "the retry's backoff is logged as text")
	require.Contains(t, seen, "duration")
}
