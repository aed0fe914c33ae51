package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// A step freed by a completion starts at once, beside the steps still in
// flight, instead of waiting for its wave to end: fast completes while
// slow runs, and fast's consumer then starts; slow waits until the
// consumer has run (so the run could not finish if it waited for slow).
// Each completion is recorded as it lands: when the consumer runs, the
// stored run already has fast completed and slow not.
func TestFreedStepStartsBesideTheStepsInFlight(t *testing.T) {
	env := newEnv(t)
	ctx := ctxTimeout(t)
	consumed := make(chan struct{})
	var storedFast, storedSlow bool
	def := engine.MustDefine("rolling", engine.MaxConcurrency(2),
		engine.Step("fast", engine.StepConfig[engine.Args, string]{
			Run: func(context.Context, engine.Args) (string, error) { return "fast", nil },
		}),
		engine.Step("slow", engine.StepConfig[engine.Args, string]{
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				select {
				case <-consumed:
					return "slow", nil
				case <-ctx.Done():
					return "", ctx.Err()
				case <-time.After(10 * time.Second):
					return "", engine.Permanent(errors.New("the consumer never ran while this step was in flight"))
				}
			},
		}),
		engine.Step("consume", engine.StepConfig[engine.Args, string]{
			Args: engine.Bindings{"f": engine.FromStep("fast")},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				info, _ := engine.RunInfoFrom(ctx)
				run, err := env.engine.Get(ctx, info.RunID)
				if err != nil {
					return "", err
				}
				for _, s := range run.Steps {
					storedFast = storedFast || s.Name == "fast"
					storedSlow = storedSlow || s.Name == "slow"
				}
				close(consumed)
				return "consumed", nil
			},
		}),
	)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Err())
	assert.True(t, storedFast, "fast's completion was on record before its consumer ran")
	assert.False(t, storedSlow, "slow was still in flight")
}
