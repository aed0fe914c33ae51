package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// processingEnqueuer is a worker in a goroutine: every wake-up is executed
// with Process, unless hold is set, in which case it is only recorded.
type processingEnqueuer struct {
	e    func() *engine.Engine
	hold bool
	mu   sync.Mutex
	got  []string
	wg   sync.WaitGroup
}

func (q *processingEnqueuer) Enqueue(ctx context.Context, w engine.Wake) error {
	q.mu.Lock()
	q.got = append(q.got, w.ID)
	q.mu.Unlock()
	if !q.hold {
		q.wg.Go(func() { _, _ = engine.Process(q.e(), context.WithoutCancel(ctx), w.RunID) })
	}
	return nil
}

func handOffDef(tr *trail) *engine.Definition {
	return engine.MustDefine("handed",
		engine.Step("here", engine.StepConfig[engine.Args, string]{
			HandOff: engine.HandOffAfter,
			Run:     func(context.Context, engine.Args) (string, error) { tr.add("here"); return "h", nil },
		}),
		engine.Step("there", engine.StepConfig[engine.Args, string]{
			After: []string{"here"},
			Run:   func(context.Context, engine.Args) (string, error) { tr.add("there"); return "t", nil },
		}),
	)
}

// Run runs to the end: after a hand-off it waits for the workers.
func TestRunWaitsAfterAHandOff(t *testing.T) {
	t.Parallel()
	q := &processingEnqueuer{}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	q.e = func() *engine.Engine { return env.engine }
	t.Cleanup(q.wg.Wait)
	def := handOffDef(env.trail)

	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithRunID("to-the-end"))
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeSuccess, res.Outcome())
	require.Equal(t, []string{"here", "there"}, env.trail.all())
	require.Len(t, q.got, 1, "the rest ran on the worker")
}

// NoWait is the fire-and-forget form: Run returns at the hand-off.
func TestRunNoWaitReturnsAtTheHandOff(t *testing.T) {
	t.Parallel()
	q := &processingEnqueuer{hold: true}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	q.e = func() *engine.Engine { return env.engine }
	def := handOffDef(env.trail)

	res, err := env.engine.Run(ctxTimeout(t), def, nil, engine.WithRunID("fire"), engine.NoWait())
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	require.Equal(t, "fire", res.RunID)
	require.Equal(t, []string{"here"}, env.trail.all())

	// Waiting Run whose context ends while the workers have the run: the
	// dispatched Result comes back with the error, so the caller has the id.
	ctx, cancel := context.WithTimeout(ctxTimeout(t), 300*time.Millisecond)
	defer cancel()
	res, err = env.engine.Run(ctx, def, nil, engine.WithRunID("held"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NotNil(t, res)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	require.Equal(t, "held", res.RunID)
}
