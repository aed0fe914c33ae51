package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
)

// retried is a step that fails its first fails attempts (each with an error
// naming the attempt), then returns name+"-ok"; its argument is the run's
// input "order".
func retried(name string, fails, max int, after ...string) engine.Part {
	var mu sync.Mutex
	n := 0
	return engine.Step(name, engine.StepConfig[engine.Args, string]{After: after,
		Args:  engine.Bindings{"order": engine.FromInput("order")},
		Retry: engine.Retry{MaxAttempts: max},
		Run: func(context.Context, engine.Args) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			n++
			if n <= fails {
				return "", fmt.Errorf("%s: attempt %d: gateway timeout", name, n)
			}
			return name + "-ok", nil
		},
	})
}

// A step that fails twice and then succeeds keeps its three attempts, in
// order, with the two errors, and the arguments it ran with; the step that
// fails for good keeps its attempt, not retryable, in Run.Attempted.
func TestAttemptLogOfARetriedStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t)
	def := engine.MustDefine("attempts", engine.Input[string]("order"), retried("charge", 2, 3),
		engine.Step("ship", engine.StepConfig[engine.Args, string]{After: []string{"charge"},
			Args: engine.Bindings{"paid": engine.FromStep("charge")},
			Run: func(context.Context, engine.Args) (string, error) {
				return "", engine.Permanent(errors.New("no courier"))
			},
		}))
	res, err := e.engine.Run(ctx, def, map[string]any{"order": "o-1"}, engine.WithRunID("att-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)

	run, err := e.engine.Get(ctx, "att-1")
	require.NoError(t, err)
	require.Len(t, run.Steps, 1)
	charge := run.Steps[0]
	require.Equal(t, 3, charge.Attempts)
	log := charge.AttemptLog
	require.Len(t, log.Attempts, 3)
	require.Zero(t, log.Dropped)
	for i, a := range log.Attempts {
		require.Equal(t, i+1, a.Attempt)
		require.False(t, a.EndedAt.Before(a.StartedAt), "attempt %d ends after it starts", a.Attempt)
		if i > 0 {
			require.False(t, a.StartedAt.Before(log.Attempts[i-1].EndedAt), "attempt %d starts after %d ended", a.Attempt, a.Attempt-1)
		}
	}
	require.Equal(t, "charge: attempt 1: gateway timeout", log.Attempts[0].Error)
	require.Equal(t, "charge: attempt 2: gateway timeout", log.Attempts[1].Error)
	require.True(t, log.Attempts[0].Retryable)
	require.True(t, log.Attempts[1].Retryable)
	require.Empty(t, log.Attempts[2].Error, "the third attempt succeeded")
	require.False(t, log.Attempts[0].StartedAt.Before(charge.StartedAt))
	require.False(t, charge.FinishedAt.Before(log.Attempts[2].EndedAt))
	order, err := engine.Arg[string](decodeArgs(t, log.Args), "order")
	require.NoError(t, err)
	require.Equal(t, "o-1", order)

	ship, ok := run.Attempted["ship"]
	require.True(t, ok, "the failed step's log is on the run")
	require.Len(t, ship.Attempts, 1)
	require.Equal(t, "no courier", ship.Attempts[0].Error)
	require.False(t, ship.Attempts[0].Retryable, "a Permanent error")
	paid, err := engine.Arg[string](decodeArgs(t, ship.Args), "paid")
	require.NoError(t, err)
	require.Equal(t, "charge-ok", paid)
}

func decodeArgs(t *testing.T, raw engine.Raw) engine.Args {
	t.Helper()
	require.NotEmpty(t, raw)
	var a engine.Args
	require.NoError(t, codec.Unmarshal(raw, &a))
	return a
}

// A step that completes on its first attempt keeps no log of its own, and
// its view shows the one attempt from the step's times; an undoable step's
// arguments come from its ledger entry.
func TestAttemptLogOfAFirstAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t)
	def := engine.MustDefine("first", engine.Input[string]("order"), retried("reserve", 0, 1),
		engine.Step("charge", engine.StepConfig[engine.Args, string]{After: []string{"reserve"},
			Args: engine.Bindings{"order": engine.FromInput("order")},
			Run:  func(context.Context, engine.Args) (string, error) { return "ch", nil },
			Undo: func(context.Context, engine.Args, string) error { return nil },
		}))
	_, err := e.engine.Run(ctx, def, map[string]any{"order": "o-2"}, engine.WithRunID("first-1"))
	require.NoError(t, err)
	run, err := e.engine.Get(ctx, "first-1")
	require.NoError(t, err)
	require.Len(t, run.Steps, 2)
	for _, s := range run.Steps {
		require.Len(t, s.AttemptLog.Attempts, 1, s.Name)
		a := s.AttemptLog.Attempts[0]
		require.Equal(t, 1, a.Attempt)
		require.Empty(t, a.Error)
		order, err := engine.Arg[string](decodeArgs(t, s.AttemptLog.Args), "order")
		require.NoError(t, err)
		require.Equal(t, "o-2", order, s.Name)
	}
	require.Empty(t, run.Attempted)
}

// The log keeps the latest 20 attempts and counts the others; a long error
// is cut to 2 KB; a repeated error reads the same after its first copy is
// dropped.
func TestAttemptLogIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t)
	n := 0
	long := strings.Repeat("é", 3000) // 6,000 bytes
	def := engine.MustDefine("bounded", engine.Step("poll", engine.StepConfig[engine.Args, string]{
		Retry: engine.Retry{MaxAttempts: 26},
		Run: func(context.Context, engine.Args) (string, error) {
			n++
			switch {
			case n == 26:
				return "done", nil
			case n == 25:
				return "", errors.New(long)
			case n <= 10:
				return "", errors.New("not yet") // 1-10 the same: dropped 1-5 carried 6 on
			}
			return "", fmt.Errorf("not yet (%d)", n)
		},
	}))
	_, err := e.engine.Run(ctx, def, nil, engine.WithRunID("bounded-1"))
	require.NoError(t, err)
	run, err := e.engine.Get(ctx, "bounded-1")
	require.NoError(t, err)
	log := run.Steps[0].AttemptLog
	require.Equal(t, 26, run.Steps[0].Attempts)
	require.Len(t, log.Attempts, 20)
	require.Equal(t, 6, log.Dropped)
	require.Equal(t, 7, log.Attempts[0].Attempt)
	require.Equal(t, "not yet", log.Attempts[0].Error, "attempt 7 repeated attempt 1's error, which is gone")
	require.Equal(t, "not yet", log.Attempts[3].Error)
	require.Equal(t, "not yet (11)", log.Attempts[4].Error)
	cut := log.Attempts[18].Error
	require.Equal(t, 25, log.Attempts[18].Attempt)
	require.LessOrEqual(t, len(cut), 2048)
	require.True(t, strings.HasSuffix(cut, "(truncated)"), cut[len(cut)-20:])
	require.True(t, strings.HasPrefix(cut, "éé"))
	require.Equal(t, 26, log.Attempts[19].Attempt)
	require.Empty(t, log.Attempts[19].Error)
}

// What the attempt log costs: a run of three steps that each took three
// attempts, before logs (305 bytes, the state StateOfThreeRetriedSteps
// decodes) and with them.
func TestAttemptLogSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t)
	def := engine.MustDefine("fixture", engine.Input[string]("order"), retried("reserve", 2, 3), retried("charge", 2, 3, "reserve"),
		retried("ship", 2, 3, "charge"))
	_, err := e.engine.Run(ctx, def, map[string]any{"order": "o-1"}, engine.WithRunID("fx-1"))
	require.NoError(t, err)
	data, err := e.rdb.HGet(ctx, e.prefix+":{run:fx-1}:ctx", "d").Bytes()
	require.NoError(t, err)
	t.Logf("state of 3 steps x 3 attempts: %d bytes (%d before attempt logs)", len(data), 305)
	require.Less(t, len(data), 305+3*200, "each step's log of three attempts stays under 200 bytes")
}
