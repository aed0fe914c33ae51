package engine_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
)

// TestHardeningRunIDReusedWithOtherInputs: the same id with the same inputs
// is idempotent; with other inputs it is refused, naming the inputs, instead
// of silently answering with the first run's result.
func TestHardeningRunIDReusedWithOtherInputs(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	def := engine.MustDefine("reuse",
		engine.Input[string]("item", engine.Required()),
		engine.Input[int]("qty", engine.Default(1)),
		simple(e.trail, "a", nil))
	ctx := ctxTimeout(t)
	res, err := e.engine.Run(ctx, def, map[string]any{"item": "book"}, engine.WithRunID("order-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)

	again, err := e.engine.Run(ctx, def, map[string]any{"item": "book", "qty": 1}, engine.WithRunID("order-1"))
	require.NoError(t, err, "the same inputs (the default spelled out) are the same run")
	require.Equal(t, engine.StatusCompleted, again.Status)
	require.Equal(t, 1, e.trail.count("run:a"))

	_, err = e.engine.Run(ctx, def, map[string]any{"item": "pen"}, engine.WithRunID("order-1"))
	require.ErrorIs(t, err, engine.ErrRunIDReused)
	require.Contains(t, err.Error(), "item")
	require.NotContains(t, err.Error(), "qty")
	require.Equal(t, 1, e.trail.count("run:a"), "nothing ran for the refused start")
}

// holdHook blocks the pipeline that removes run id from the active index
// (the terminal index update) until released, and reports that it holds it.
type holdHook struct {
	active, id string
	held       chan struct{}
	release    chan struct{}
	once       atomic.Bool
}

func (h *holdHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			a := c.Args()
			if len(a) == 3 && strings.EqualFold(a[0].(string), "zrem") && a[1] == h.active && a[2] == h.id && h.once.CompareAndSwap(false, true) {
				close(h.held)
				<-h.release
			}
		}
		return next(ctx, cmds)
	}
}

// TestHardeningTerminalIndexRace: a finished run leaves the active index only
// while it still holds its lock. An Undo that starts right after the terminal
// write must wait for the index update; otherwise it re-indexes the run, the
// late removal drops the entry, and a rolling-back run is hidden from the
// sweeper for good.
func TestHardeningTerminalIndexRace(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hook := &holdHook{active: keys.New(e.prefix).Active(), id: "raced", held: make(chan struct{}), release: make(chan struct{})}
	e.rdb.AddHook(hook)
	undoing := make(chan struct{}, 1)
	finish := make(chan struct{})
	def := engine.MustDefine("raced", engine.Step("a", engine.StepConfig[engine.Args, string]{
		Run: func(context.Context, engine.Args) (string, error) { return "a", nil },
		Undo: func(context.Context, engine.Args, string) error {
			undoing <- struct{}{}
			<-finish
			return nil
		},
	}))
	require.NoError(t, e.engine.Register(def))
	ran := make(chan error, 1)
	go func() { _, err := e.engine.Run(ctxTimeout(t), def, nil, engine.WithRunID("raced")); ran <- err }()
	<-hook.held // terminal write done, its index removal not yet

	undone := make(chan error, 1)
	go func() { _, err := e.engine.Undo(ctxTimeout(t), "raced"); undone <- err }()
	// Give an Undo that does not wait for the lock every chance to start in
	// the window (it would reach the step's Undo within milliseconds).
	select {
	case <-undoing:
		close(hook.release)
		<-ran
	case <-time.After(300 * time.Millisecond):
		close(hook.release)
		require.NoError(t, <-ran)
		<-undoing
	}
	// The Undo is now in the step's Undo: the run is rolling back and must be
	// in the active index.
	run, err := e.engine.Get(ctxTimeout(t), "raced")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, run.Status)
	_, err = e.rdb.ZScore(ctxTimeout(t), keys.New(e.prefix).Active(), "raced").Result()
	require.NoError(t, err, "a rolling-back run must stay where the sweeper looks")
	close(finish)
	require.NoError(t, <-undone)
}

// TestHardeningStoppedElementCompensatesItsInterruptedStep: an element whose
// delivery died mid-step is settled "stopped" when its map has failed; the
// map's rollback then rolls back the element run itself, calling the
// interrupted step's Compensate, not only undoing its ledger.
func TestHardeningStoppedElementCompensatesItsInterruptedStep(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var compensated atomic.Value
	def := engine.MustDefine("elem-cut",
		simple(e.trail, "a", nil),
		engine.Step("cut", engine.StepConfig[engine.Args, string]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				e.trail.add("run:cut")
				ctx.Value(cutKey{}).(context.CancelFunc)()
				<-ctx.Done()
				return "", ctx.Err()
			},
			Compensate: func(_ context.Context, _ engine.Args, err error) error {
				e.trail.add("compensate:cut")
				compensated.Store(err)
				return nil
			},
		}))
	require.NoError(t, e.engine.Register(def))
	ctx, cancel := context.WithCancel(ctxTimeout(t))
	defer cancel()
	_, err := engine.ExecuteElement(e.engine, context.WithValue(ctx, cutKey{}, context.CancelFunc(cancel)), def, "m~each.0", nil)
	require.Error(t, err, "the element's delivery ended mid-step")

	res, err := engine.UndoElement(e.engine, ctxTimeout(t), "m~each.0", time.Second)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Equal(t, []string{"run:a", "run:cut", "compensate:cut", "undo:a"}, e.trail.all())
	require.ErrorIs(t, compensated.Load().(error), engine.ErrStepInterrupted)
}

type cutKey struct{}

// TestHardeningAbortedBetweenStepsCompensatesNothingExtra: an in-process run
// whose context ends right after a step completed is saved aborted before
// its next step started; undoing it undoes what completed and neither
// compensates nor reports the step that never ran.
func TestHardeningAbortedBetweenStepsCompensatesNothingExtra(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithCancel(ctxTimeout(t))
	defer cancel()
	def := engine.MustDefine("aborted-between",
		engine.Step("a", engine.StepConfig[engine.Args, string]{
			Run: func(context.Context, engine.Args) (string, error) {
				e.trail.add("run:a")
				cancel() // the caller goes away once a is done
				return "a", nil
			},
			Undo: func(context.Context, engine.Args, string) error { e.trail.add("undo:a"); return nil },
		}),
		engine.Step("b", engine.StepConfig[engine.Args, string]{
			After: []string{"a"},
			Run:   func(context.Context, engine.Args) (string, error) { e.trail.add("run:b"); return "b", nil },
			Undo:  func(context.Context, engine.Args, string) error { e.trail.add("undo:b"); return nil },
		}))
	res, err := e.engine.Run(ctx, def, nil, engine.WithRunID("aborted-between"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusAborted, res.Status)
	undone, err := e.engine.Undo(ctxTimeout(t), "aborted-between")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, undone.Status)
	require.Empty(t, undone.Failure.RollbackFailures, "b never started: nothing to report")
	require.Equal(t, []string{"run:a", "undo:a"}, e.trail.all())
}
