package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// An engine with no workers (no Enqueuer) runs a Task step in place, its
// attempts one after another; a later failure undoes it with the
// arguments and result it ran with, and its own failure compensates it.
func TestTaskStepRunsInPlaceWithoutWorkers(t *testing.T) {
	env := newEnv(t)
	ctx := ctxTimeout(t)
	tr := env.trail
	tries := 0
	task := func(name string, fail bool) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, string]{
			Args:  engine.Bindings{"order": engine.FromInput("order")},
			Task:  true,
			Retry: engine.Retry{MaxAttempts: 3},
			Run: func(ctx context.Context, a engine.Args) (string, error) {
				tr.add("run:" + name)
				if fail {
					return "", engine.Permanent(errors.New(name + " declined"))
				}
				if tries++; tries == 1 {
					return "", errors.New("flaky")
				}
				o, err := engine.Arg[string](a, "order")
				return name + "-" + o, err
			},
			Undo: func(_ context.Context, a engine.Args, out string) error {
				o, _ := engine.Arg[string](a, "order")
				tr.add("undo:" + name + ":" + out + ":" + o)
				return nil
			},
			Compensate: func(context.Context, engine.Args, error) error {
				tr.add("compensate:" + name)
				return nil
			},
		})
	}
	def := engine.MustDefine("inplace", engine.Input[string]("order"), task("label", false),
		engine.Step("ship", engine.StepConfig[engine.Args, string]{After: []string{"label"},
			Run: func(context.Context, engine.Args) (string, error) { return "", nil }}),
		task("charge", true))
	res, err := env.engine.Run(ctx, def, map[string]any{"order": "7"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	assert.Equal(t, "charge", res.Failure.Step)
	assert.Equal(t, []string{"run:label", "run:label", "run:charge", "compensate:charge", "undo:label:label-7:7"}, tr.all())
	assert.Empty(t, res.Failure.RollbackFailures)
}

func TestTaskStepDefinitionErrors(t *testing.T) {
	run := func(context.Context, engine.Args) (string, error) { return "", nil }
	for _, tc := range []struct {
		name string
		cfg  engine.StepConfig[engine.Args, string]
		want string
	}{
		{"guard", engine.StepConfig[engine.Args, string]{Task: true, Run: run, Guard: engine.Guarded(engine.GuardConfig[string]{
			Probe: func(context.Context, string) (string, error) { return "", nil },
			Restore: func(context.Context, string, string, string) (engine.RestoreResult, error) {
				return engine.RestoreWritten, nil
			},
		})}, "Guard"},
		{"resource", engine.StepConfig[engine.Args, string]{Task: true, Run: run, Undo: func(context.Context, engine.Args, string) error { return nil },
			Resource: func(engine.Args, string) string { return "r" }}, "Resource"},
		{"limits", engine.StepConfig[engine.Args, string]{Task: true, Run: run,
			Limits: []engine.Limit{{Name: "l", Concurrency: 1}}}, "Limits"},
		{"handoff", engine.StepConfig[engine.Args, string]{Task: true, Run: run, HandOff: engine.HandOffBefore}, "HandOff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := engine.Define("bad", engine.Step("s", tc.cfg))
			var de *engine.DefinitionError
			require.ErrorAs(t, err, &de)
			assert.Equal(t, "s", de.Step)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	d, err := engine.Define("ok", engine.Step("s", engine.StepConfig[engine.Args, string]{Task: true, TaskQueue: "labels", Run: run}))
	require.NoError(t, err)
	plain, err := engine.Define("ok", engine.Step("s", engine.StepConfig[engine.Args, string]{Run: run}))
	require.NoError(t, err)
	assert.NotEqual(t, plain.Fingerprint(), d.Fingerprint(), "running as a task changes the definition's shape")
}
