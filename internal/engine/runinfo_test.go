package engine_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// infos records the RunInfo of every call, in order.
type infos struct {
	mu  sync.Mutex
	got []engine.RunInfo
}

func (r *infos) record(ctx context.Context) {
	info, ok := engine.RunInfoFrom(ctx)
	if !ok {
		panic("no RunInfo in a step's context")
	}
	r.mu.Lock()
	r.got = append(r.got, info)
	r.mu.Unlock()
}

func (r *infos) all() []engine.RunInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]engine.RunInfo(nil), r.got...)
}

func TestRunInfoOutsideAStep(t *testing.T) {
	t.Parallel()
	_, ok := engine.RunInfoFrom(context.Background())
	require.False(t, ok)
}

// A step, a composed child's step, a retried attempt, an undo and a
// compensate each see where they run; middleware sees the same.
func TestRunInfoInStepsAndMiddleware(t *testing.T) {
	t.Parallel()
	var steps, mw infos
	env := newEnv(t, func(c *engine.Config) {
		c.Middleware = []engine.Middleware{func(ctx context.Context, _ engine.Call, next func(context.Context) error) error {
			mw.record(ctx)
			return next(ctx)
		}}
	})
	flaky := 0
	child := engine.MustDefine("info-child",
		engine.Step("reserve", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				steps.record(ctx)
				return "r", nil
			},
			Undo: func(ctx context.Context, _ engine.Args, _ string) error { steps.record(ctx); return nil },
		}),
	)
	def := engine.MustDefine("info-parent",
		engine.Step("first", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				steps.record(ctx)
				if flaky++; flaky == 1 {
					return "", errors.New("once")
				}
				return "f", nil
			},
			Retry: engine.Retry{MaxAttempts: 2},
		}),
		engine.Compose("book", child, engine.ComposeConfig{After: []string{"first"}}),
		engine.Step("last", engine.StepConfig[engine.Args, string]{
			After: []string{"book"},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				steps.record(ctx)
				return "", engine.Permanent(errors.New("no"))
			},
			Compensate: func(ctx context.Context, _ engine.Args, _ error) error { steps.record(ctx); return nil },
		}),
	)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx := engine.WithTraceID(ctxTimeout(t), trace)
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("info-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)

	want := []engine.RunInfo{
		{RunID: "info-1", Reactor: "info-parent", Step: "first", Kind: engine.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "first", Kind: engine.CallRun, Attempt: 2, TraceID: trace},
		{RunID: "info-1", Reactor: "info-child", Step: "book/reserve", Kind: engine.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "last", Kind: engine.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "last", Kind: engine.CallCompensate, TraceID: trace},
		{RunID: "info-1", Reactor: "info-child", Step: "book/reserve", Kind: engine.CallUndo, TraceID: trace},
	}
	require.Equal(t, want, steps.all())
	require.Equal(t, want, mw.all(), "middleware sees the call's RunInfo")

	run, err := env.engine.Get(ctx, "info-1")
	require.NoError(t, err)
	require.Equal(t, trace, run.TraceID)
}

// Without WithTraceID a run gets a W3C-shaped trace id of its own, stored
// with it; a run started from inside a step inherits the step's.
func TestTraceIDGeneratedAndInherited(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	var inner infos
	innerDef := engine.MustDefine("trace-inner",
		engine.Step("s", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) { inner.record(ctx); return "", nil },
		}),
	)
	var outer infos
	outerDef := engine.MustDefine("trace-outer",
		engine.Step("s", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				outer.record(ctx)
				res, err := env.engine.Run(ctx, innerDef, nil)
				if err != nil {
					return "", err
				}
				return res.RunID, nil
			},
		}),
	)
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, outerDef, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	tr := outer.all()[0].TraceID
	require.Regexp(t, "^[0-9a-f]{32}$", tr)
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, tr, run.TraceID, "the generated trace id is stored with the run")
	require.Equal(t, tr, inner.all()[0].TraceID, "a run started by a step inherits its trace")
	require.NotEqual(t, res.RunID, inner.all()[0].RunID)

	other, err := env.engine.Run(ctx, innerDef, nil)
	require.NoError(t, err)
	require.NotEqual(t, tr, inner.all()[1].TraceID, "an unrelated run has a trace of its own")
	require.Equal(t, engine.StatusCompleted, other.Status)
}

func TestWithTraceIDRejectsAMalformedID(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("trace-bad", simple(env.trail, "a", nil))
	for _, id := range []string{"", "abc", "00000000000000000000000000000000", "4BF92F3577B34DA6A3CE929D0E0E4736"} {
		_, err := env.engine.Run(engine.WithTraceID(ctxTimeout(t), id), def, nil, engine.WithRunID("trace-bad"))
		require.ErrorContains(t, err, "WithTraceID", "id %q", id)
	}
	_, err := env.engine.Get(ctxTimeout(t), "trace-bad")
	require.ErrorIs(t, err, engine.ErrNotFound, "nothing is stored for a rejected start")
	require.Empty(t, env.trail.all())
}

// The deadline is in RunInfo and on the Run's context, not on an Undo's.
func TestRunInfoCarriesTheDeadline(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	deadline := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	var runDL, undoDL time.Time
	var runHas, undoHas bool
	var info engine.RunInfo
	def := engine.MustDefine("info-deadline",
		engine.Step("a", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				info, _ = engine.RunInfoFrom(ctx)
				runDL, runHas = ctx.Deadline()
				return "", nil
			},
			Undo: func(ctx context.Context, _ engine.Args, _ string) error {
				undoDL, undoHas = ctx.Deadline()
				return nil
			},
		}),
		engine.Step("b", engine.StepConfig[engine.Args, string]{
			After: []string{"a"},
			Run: func(context.Context, engine.Args) (string, error) {
				return "", engine.Permanent(errors.New("b fails"))
			},
		}),
	)
	// No timeout on the caller's context: the run's deadline is the only one.
	res, err := env.engine.Run(t.Context(), def, nil, engine.WithDeadline(deadline))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.True(t, info.Deadline.Equal(deadline), "RunInfo.Deadline %s", info.Deadline)
	require.True(t, runHas)
	require.True(t, runDL.Equal(deadline), "a Run's context ends at the run's deadline (%s)", runDL)
	// The undo is bounded by UndoTimeout (30 s), not by the run's hour.
	require.True(t, undoHas)
	require.True(t, undoDL.Before(deadline.Add(-time.Minute)), "undo deadline %s", undoDL)
}
