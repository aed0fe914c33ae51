package reactor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// infos records the RunInfo of every call, in order.
type infos struct {
	mu  sync.Mutex
	got []reactor.RunInfo
}

func (r *infos) record(ctx context.Context) {
	info, ok := reactor.RunInfoFrom(ctx)
	if !ok {
		panic("no RunInfo in a step's context")
	}
	r.mu.Lock()
	r.got = append(r.got, info)
	r.mu.Unlock()
}

func (r *infos) all() []reactor.RunInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]reactor.RunInfo(nil), r.got...)
}

func TestRunInfoOutsideAStep(t *testing.T) {
	t.Parallel()
	_, ok := reactor.RunInfoFrom(context.Background())
	require.False(t, ok)
}

// A step, a composed child's step, a retried attempt, an undo and a
// compensate each see where they run; middleware sees the same.
func TestRunInfoInStepsAndMiddleware(t *testing.T) {
	t.Parallel()
	var steps, mw infos
	env := newEnv(t, func(c *reactor.Config) {
		c.Middleware = []reactor.Middleware{func(ctx context.Context, _ reactor.Call, next func(context.Context) error) error {
			mw.record(ctx)
			return next(ctx)
		}}
	})
	flaky := 0
	child := reactor.MustDefine("info-child",
		reactor.Step("reserve", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				steps.record(ctx)
				return "r", nil
			},
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error { steps.record(ctx); return nil },
		}),
	)
	def := reactor.MustDefine("info-parent",
		reactor.Step("first", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				steps.record(ctx)
				if flaky++; flaky == 1 {
					return "", errors.New("once")
				}
				return "f", nil
			},
			Retry: reactor.Retry{MaxAttempts: 2},
		}),
		reactor.Compose("book", child, reactor.ComposeConfig{After: []string{"first"}}),
		reactor.Step("last", reactor.StepConfig[reactor.Args, string]{
			After: []string{"book"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				steps.record(ctx)
				return "", reactor.Permanent(errors.New("no"))
			},
			Compensate: func(ctx context.Context, _ reactor.Args, _ error) error { steps.record(ctx); return nil },
		}),
	)
	const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx := reactor.WithTraceID(ctxTimeout(t), trace)
	res, err := env.engine.Run(ctx, def, nil, reactor.WithRunID("info-1"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)

	want := []reactor.RunInfo{
		{RunID: "info-1", Reactor: "info-parent", Step: "first", Kind: reactor.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "first", Kind: reactor.CallRun, Attempt: 2, TraceID: trace},
		{RunID: "info-1", Reactor: "info-child", Step: "book/reserve", Kind: reactor.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "last", Kind: reactor.CallRun, Attempt: 1, TraceID: trace},
		{RunID: "info-1", Reactor: "info-parent", Step: "last", Kind: reactor.CallCompensate, TraceID: trace},
		{RunID: "info-1", Reactor: "info-child", Step: "book/reserve", Kind: reactor.CallUndo, TraceID: trace},
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
	innerDef := reactor.MustDefine("trace-inner",
		reactor.Step("s", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) { inner.record(ctx); return "", nil },
		}),
	)
	var outer infos
	outerDef := reactor.MustDefine("trace-outer",
		reactor.Step("s", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
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
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)
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
	require.Equal(t, reactor.StatusCompleted, other.Status)
}

func TestWithTraceIDRejectsAMalformedID(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := reactor.MustDefine("trace-bad", simple(env.trail, "a", nil))
	for _, id := range []string{"", "abc", "00000000000000000000000000000000", "4BF92F3577B34DA6A3CE929D0E0E4736"} {
		_, err := env.engine.Run(reactor.WithTraceID(ctxTimeout(t), id), def, nil, reactor.WithRunID("trace-bad"))
		require.ErrorContains(t, err, "WithTraceID", "id %q", id)
	}
	_, err := env.engine.Get(ctxTimeout(t), "trace-bad")
	require.ErrorIs(t, err, reactor.ErrNotFound, "nothing is stored for a rejected start")
	require.Empty(t, env.trail.all())
}

// The deadline is in RunInfo and on the Run's context, not on an Undo's.
func TestRunInfoCarriesTheDeadline(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	deadline := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	var runDL, undoDL time.Time
	var runHas, undoHas bool
	var info reactor.RunInfo
	def := reactor.MustDefine("info-deadline",
		reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				info, _ = reactor.RunInfoFrom(ctx)
				runDL, runHas = ctx.Deadline()
				return "", nil
			},
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error {
				undoDL, undoHas = ctx.Deadline()
				return nil
			},
		}),
		reactor.Step("b", reactor.StepConfig[reactor.Args, string]{
			After: []string{"a"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("b fails"))
			},
		}),
	)
	// No timeout on the caller's context: the run's deadline is the only one.
	res, err := env.engine.Run(t.Context(), def, nil, reactor.WithDeadline(deadline))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.True(t, info.Deadline.Equal(deadline), "RunInfo.Deadline %s", info.Deadline)
	require.True(t, runHas)
	require.True(t, runDL.Equal(deadline), "a Run's context ends at the run's deadline (%s)", runDL)
	// The undo is bounded by UndoTimeout (30 s), not by the run's hour.
	require.True(t, undoHas)
	require.True(t, undoDL.Before(deadline.Add(-time.Minute)), "undo deadline %s", undoDL)
}
