package worker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// checkout is the three independent calls (reserve, authorize,
// score), then a step that consumes all three. Each call enters, notes
// itself, and waits at gate until release returns; fail names a call that
// fails permanently after entering.
type checkout struct {
	inFlight, most atomic.Int32
	mu             sync.Mutex
	entered        []string
	undone         []string
	compensated    []string
	gate           func(ctx context.Context, name string) error
	fail           string
}

func (c *checkout) def(conc int, extra ...reactor.Part) *reactor.Definition {
	call := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: []string{"open"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				n := c.inFlight.Add(1)
				defer c.inFlight.Add(-1)
				for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
				}
				c.mu.Lock()
				c.entered = append(c.entered, name)
				c.mu.Unlock()
				if c.gate != nil {
					if err := c.gate(ctx, name); err != nil {
						return "", err
					}
				}
				if name == c.fail {
					return "", reactor.Permanent(errors.New(name + " declined"))
				}
				return name + "-ok", nil
			},
			Undo: func(_ context.Context, _ reactor.Args, got string) error {
				c.mu.Lock()
				c.undone = append(c.undone, name)
				c.mu.Unlock()
				return nil
			},
			Compensate: func(context.Context, reactor.Args, error) error {
				c.mu.Lock()
				c.compensated = append(c.compensated, name)
				c.mu.Unlock()
				return nil
			},
		})
	}
	parts := []reactor.Part{
		reactor.Input[string]("order"),
		reactor.Step("open", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) { return "opened", nil },
			Undo: func(context.Context, reactor.Args, string) error {
				c.mu.Lock()
				c.undone = append(c.undone, "open")
				c.mu.Unlock()
				return nil
			},
		}),
		call("reserve"), call("authorize"), call("score"),
		reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"r": reactor.FromStep("reserve"), "a": reactor.FromStep("authorize"), "s": reactor.FromStep("score")},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				c.mu.Lock()
				c.entered = append(c.entered, "confirm")
				c.mu.Unlock()
				return "confirmed", nil
			},
		}),
	}
	if conc > 0 {
		parts = append(parts, reactor.MaxConcurrency(conc))
	}
	return reactor.MustDefine("checkout", append(parts, extra...)...)
}

// barrier returns a gate that holds every caller until n have arrived (or
// ctx ends): it passes only if n calls run at once.
func barrier(n int) func(ctx context.Context, name string) error {
	var mu sync.Mutex
	arrived := 0
	all := make(chan struct{})
	return func(ctx context.Context, _ string) error {
		mu.Lock()
		arrived++
		if arrived == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Second):
			return errors.New("the other calls never ran at the same time")
		}
	}
}

// With MaxConcurrency 3, the three independent calls of a checkout run at
// once on a worker (each waits until all three are in), then the step that
// consumes them; the run completes with every result recorded.
func TestConcurrentStepsRunAtOnce(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	c := &checkout{gate: barrier(3)}
	def := c.def(3)
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	awaitCompleted(ctx, t, e, res.RunID)
	assert.Equal(t, int32(3), c.most.Load(), "three calls in flight at once")
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.ElementsMatch(t, []string{"reserve", "authorize", "score"}, c.entered[:3])
	assert.Equal(t, "confirm", c.entered[3], "the consumer after all three")
	run, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	for _, s := range run.Steps {
		assert.Equal(t, 1, s.Attempts, "%s ran once", s.Name)
	}
}

// Without MaxConcurrency the steps run one at a time, as always.
func TestStepsRunOneAtATimeByDefault(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	c := &checkout{}
	def := c.def(0)
	e := f.engine("in-process")
	require.NoError(t, e.Register(def))
	res, err := e.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	assert.Equal(t, int32(1), c.most.Load())
	assert.Equal(t, []string{"reserve", "authorize", "score", "confirm"}, c.entered)
}

// A wave in which one call fails: the others completed at the same time,
// so the rollback finds them on the stack and undoes them (and what came
// before), and the failed call is compensated; the consumer never runs.
func TestConcurrentStepFailureRollsBackTheWave(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	c := &checkout{gate: barrier(3), fail: "authorize"}
	def := c.def(3)
	e := f.engine("in-process")
	require.NoError(t, e.Register(def))
	res, err := e.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "authorize", res.Failure.Step)
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.NotContains(t, c.entered, "confirm")
	assert.Equal(t, []string{"authorize"}, c.compensated)
	require.Len(t, c.undone, 3, "%v", c.undone)
	assert.ElementsMatch(t, []string{"reserve", "score"}, c.undone[:2], "the wave's completed calls first")
	assert.Equal(t, "open", c.undone[2], "then what came before them")
	assert.Empty(t, res.Failure.RollbackFailures)
}

func TestMaxConcurrencyDefinitionErrors(t *testing.T) {
	step := reactor.Step("s", reactor.StepConfig[reactor.Args, int]{Run: func(context.Context, reactor.Args) (int, error) { return 0, nil }})
	_, err := reactor.Define("bad", step, reactor.MaxConcurrency(0))
	assert.ErrorContains(t, err, "at least 1")
	_, err = reactor.Define("bad", step, reactor.MaxConcurrency(2), reactor.MaxConcurrency(3))
	assert.ErrorContains(t, err, "declared twice")
	_, err = reactor.Define("bad", step, reactor.MaxConcurrency(2), reactor.OnWaveFailure(reactor.WavePolicy(9)))
	assert.ErrorContains(t, err, "not a WavePolicy")
	d, err := reactor.Define("ok", step, reactor.MaxConcurrency(4))
	require.NoError(t, err)
	assert.Equal(t, 4, d.MaxConcurrency())
}

// The rollback of a checkout whose last step fails: the step that consumed
// the three calls is undone first, then the three at once (each undo waits
// until all three are in), then what came before them.
func TestConcurrentUndoOfIndependentSteps(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var mu sync.Mutex
	var undone []string
	note := func(s string) {
		mu.Lock()
		undone = append(undone, s)
		mu.Unlock()
	}
	var inUndo, most atomic.Int32
	gate := barrier(3)
	call := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: []string{"open"},
			Run:   func(context.Context, reactor.Args) (string, error) { return name, nil },
			Undo: func(ctx context.Context, _ reactor.Args, _ string) error {
				n := inUndo.Add(1)
				defer inUndo.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if err := gate(ctx, name); err != nil {
					return err
				}
				note(name)
				return nil
			},
		})
	}
	plain := func(name string, after []string, fail bool) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: after,
			Run: func(context.Context, reactor.Args) (string, error) {
				if fail {
					return "", reactor.Permanent(errors.New("the notice bounced"))
				}
				return name, nil
			},
			Undo: func(context.Context, reactor.Args, string) error { note(name); return nil },
		})
	}
	def := reactor.MustDefine("checkout-undo", reactor.MaxConcurrency(3),
		plain("open", nil, false), call("reserve"), call("authorize"), call("score"),
		plain("confirm", []string{"reserve", "authorize", "score"}, false),
		plain("notify", []string{"confirm"}, true),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.Empty(t, final.Failure.RollbackFailures)
	assert.Equal(t, int32(3), most.Load(), "the three undos at once")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, undone, 5, "%v", undone)
	assert.Equal(t, "confirm", undone[0], "the consumer first")
	assert.ElementsMatch(t, []string{"reserve", "authorize", "score"}, undone[1:4])
	assert.Equal(t, "open", undone[4])
}

// OnWaveFailure(CancelWave): when one call of the wave fails for good, the
// others' contexts are cancelled: they stop (each would otherwise wait for
// ever), the failed call is compensated as the rollback's trigger, the
// cancelled ones as steps cut short, and what came before is undone.
func TestConcurrentWaveCancelledOnFailure(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	c := &checkout{fail: "authorize"}
	c.gate = func(ctx context.Context, name string) error {
		if name == c.fail {
			return nil
		}
		<-ctx.Done() // only a cancel ends it
		return ctx.Err()
	}
	def := c.def(3, reactor.OnWaveFailure(reactor.CancelWave))
	e := f.engine("in-process")
	require.NoError(t, e.Register(def))
	res, err := e.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	require.Equal(t, "authorize", res.Failure.Step)
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.NotContains(t, c.entered, "confirm")
	assert.Equal(t, "authorize", c.compensated[0], "the failed call first, as the trigger")
	assert.ElementsMatch(t, []string{"authorize", "reserve", "score"}, c.compensated, "the cancelled calls as cut short")
	assert.Equal(t, []string{"open"}, c.undone, "nothing of the wave completed; what came before is undone")
	assert.Empty(t, res.Failure.RollbackFailures)
}
