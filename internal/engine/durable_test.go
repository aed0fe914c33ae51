package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

func TestComposeFoldsChildEntriesAndRollsBackIntoTheChild(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	child := engine.MustDefine("book_trip",
		engine.Input[string]("city", engine.Required()),
		engine.Step("flight", engine.StepConfig[struct {
			City string `json:"city"`
		}, string]{
			Args: engine.Bindings{"city": engine.FromInput("city")},
			Run: func(_ context.Context, in struct {
				City string `json:"city"`
			}) (string, error) {
				tr.add("run:flight:" + in.City)
				return "FL-" + in.City, nil
			},
			Undo: func(_ context.Context, in struct {
				City string `json:"city"`
			}, out string) error {
				tr.add("undo:flight:" + out)
				return nil
			},
		}),
		simple(tr, "hotel", nil, "flight"),
		engine.Returns(engine.FromStep("flight")),
	)
	def := engine.MustDefine("trip",
		simple(tr, "pay", nil),
		engine.Compose("book", child, engine.ComposeConfig{Args: engine.Bindings{"city": engine.Const("Oslo")}, After: []string{"pay"}}),
		engine.Step("confirm", engine.StepConfig[struct {
			Ticket string `json:"ticket"`
		}, int]{
			Args: engine.Bindings{"ticket": engine.FromStep("book")},
			Run: func(_ context.Context, in struct {
				Ticket string `json:"ticket"`
			}) (int, error) {
				tr.add("run:confirm:" + in.Ticket)
				return 0, errors.New("mail server down")
			},
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []string{
		"run:pay", "run:flight:Oslo", "run:hotel", "run:confirm:FL-Oslo",
		"undo:hotel", "undo:flight:FL-Oslo", "undo:pay",
	}, tr.all())
	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	var undone []string
	for _, r := range run.Rollbacks {
		if r.Kind == engine.ActionUndo {
			undone = append(undone, r.Step)
		}
	}
	require.Equal(t, []string{"book/hotel", "book/flight", "pay"}, undone)
}

func TestComposeChildFailureRollsBackChildThenParent(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	child := engine.MustDefine("child",
		simple(tr, "c1", nil),
		engine.Step("c2", engine.StepConfig[engine.Args, int]{
			After: []string{"c1"},
			Run: func(context.Context, engine.Args) (int, error) {
				tr.add("run:c2")
				return 0, errors.New("child broke")
			},
		}),
	)
	def := engine.MustDefine("parent",
		simple(tr, "p1", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"p1"}}),
		simple(tr, "p2", nil, "sub"),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "sub/c2", res.Failure.Step)
	require.Equal(t, "child broke", res.Failure.Message)
	require.Equal(t, []string{"run:p1", "run:c1", "run:c2", "undo:c1", "undo:p1"}, tr.all())
}

func TestComposeHaltedChildHaltsParent(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	child := engine.MustDefine("haltchild", simple(tr, "h", engine.Halt("enough")))
	def := engine.MustDefine("haltparent",
		engine.Compose("sub", child, engine.ComposeConfig{}),
		simple(tr, "after", nil, "sub"))
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusHalted, res.Status)
	require.Equal(t, "enough", res.Reason)
	require.Equal(t, []string{"run:h"}, tr.all())
}

func TestIdempotentStart(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	var runs atomic.Int32
	def := engine.MustDefine("once", engine.Step("a", engine.StepConfig[engine.Args, int32]{
		Run: func(context.Context, engine.Args) (int32, error) { return runs.Add(1), nil },
	}), engine.Returns(engine.FromStep("a")))
	ctx := ctxTimeout(t)
	first, err := env.engine.Run(ctx, def, nil, engine.WithRunID("order-1"))
	require.NoError(t, err)
	second, err := env.engine.Run(ctx, def, nil, engine.WithRunID("order-1"))
	require.NoError(t, err)
	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, first.Value, second.Value)
	require.Equal(t, "order-1", second.RunID)

	// The finished run is not left in the active index by the second start.
	n, err := env.rdb.ZScore(ctx, env.prefix+":idx:active", "order-1").Result()
	require.ErrorIs(t, err, redis.Nil, "score %v", n)

	_, err = env.engine.Run(ctx, def, nil, engine.WithRunID("bad{id}"))
	require.ErrorContains(t, err, "brace")
}

// A crash between steps leaves a checkpoint; starting the same id again
// resumes it without re-running completed steps.
func TestRestartAfterCrashResumesFromCheckpoint(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.LockExpiry = takeoverLockExpiry })
	tr := env.trail
	crash := true
	def := engine.MustDefine("crashy",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				tr.add("run:b")
				if crash {
					crash = false
					// Simulate the process dying: its lock passes to someone
					// else, and this execution writes nothing more.
					env.rdb.Set(context.Background(), env.prefix+":{run:crash-1}:lock", "someone-else", time.Second)
					<-ctx.Done()
					return 0, ctx.Err()
				}
				return 2, nil
			},
		}),
	)
	ctx := ctxTimeout(t)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("crash-1"))
	require.ErrorIs(t, err, engine.ErrLockLost)
	run, err := env.engine.Get(ctx, "crash-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, run.Status)
	require.Equal(t, []string{"a"}, run.Completed)

	require.NoError(t, env.rdb.Del(ctx, env.prefix+":{run:crash-1}:lock").Err())
	res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("crash-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.Equal(t, 1, tr.count("run:a"), "a completed before the crash and is not re-run")
	require.Equal(t, 2, tr.count("run:b"))
}

// A run whose lock was taken over runs no more user code, is not compensated
// by the process that lost it, and writes nothing.
func TestLostLockStopsUserCodeAndWritesNothing(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.LockExpiry = takeoverLockExpiry })
	tr := env.trail
	ctx := ctxTimeout(t)
	lockKey := env.prefix + ":{run:lost-1}:lock"
	def := engine.MustDefine("lost",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				tr.add("run:b")
				// Another process takes the run over.
				env.rdb.Set(context.Background(), lockKey, "usurper", time.Minute)
				<-ctx.Done() // the heartbeat notices and cancels the step
				return 0, errors.New("step saw its context end")
			},
			Compensate: func(context.Context, engine.Args, error) error { tr.add("compensate:b"); return nil },
		}),
		simple(tr, "c", nil, "b"),
	)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("lost-1"))
	require.ErrorIs(t, err, engine.ErrLockLost)
	require.Equal(t, []string{"run:a", "run:b"}, tr.all(), "no compensate, no undo, no later step")

	run, err := env.engine.Get(ctx, "lost-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, run.Status)
	require.Equal(t, []string{"a"}, run.Completed)
	require.Equal(t, "usurper", env.rdb.Get(ctx, lockKey).Val(), "the new owner's lock is untouched")
}

// A step that returns success after its lock was taken over: the fenced
// checkpoint refuses the write, and no later step runs.
func TestStaleWriterCannotOverwriteRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	ctx := ctxTimeout(t)
	stateKey := env.prefix + ":{run:stale-1}:ctx"
	def := engine.MustDefine("stale",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				tr.add("run:b")
				// A second writer bumps the version behind this one's back.
				env.rdb.HIncrBy(context.Background(), stateKey, "v", 1)
				return 1, nil
			},
		}),
		simple(tr, "c", nil, "b"),
	)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("stale-1"))
	require.ErrorIs(t, err, engine.ErrLockLost)
	require.Equal(t, []string{"run:a", "run:b"}, tr.all())
	run, err := env.engine.Get(ctx, "stale-1")
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, run.Completed, "b's result was never written")
}

func TestUndoACompletedRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	def := engine.MustDefine("undoable", simple(tr, "a", nil), simple(tr, "b", nil, "a"))
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	undone, err := env.engine.Undo(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, undone.Status)
	require.ErrorIs(t, undone.Err(), engine.ErrCancelled)
	require.Equal(t, []string{"run:a", "run:b", "undo:b", "undo:a"}, tr.all())

	_, err = env.engine.Undo(ctx, res.RunID)
	var se *engine.StatusError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, engine.ErrNotUndoable)
	require.Equal(t, engine.StatusCancelled, se.Status)

	err = env.engine.Cancel(ctx, res.RunID)
	require.ErrorIs(t, err, engine.ErrAlreadyFinished)

	_, err = env.engine.Undo(ctx, "nope")
	require.ErrorIs(t, err, engine.ErrNotFound)
}

// Undo and cancel of a run that is rolling back are refused; undo of a run
// whose lock stays held gives up after UndoLockWait with ErrRunLocked.
func TestUndoAndCancelGuards(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.UndoLockWait = 150 * time.Millisecond })
	ctx := ctxTimeout(t)
	inUndo := make(chan struct{})
	release := make(chan struct{})
	def := engine.MustDefine("guarded",
		engine.Step("a", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, engine.Args, int) error {
				close(inUndo)
				<-release
				return nil
			},
		}),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run:   func(context.Context, engine.Args) (int, error) { return 0, errors.New("fail") },
		}),
	)
	done := make(chan *engine.Result)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("guard-1"))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-inUndo
	run, err := env.engine.Get(ctx, "guard-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, run.Status)
	require.Equal(t, engine.TriggerFailure, run.Rollback.Trigger)
	require.Equal(t, "b", run.Rollback.Step)

	err = env.engine.Cancel(ctx, "guard-1")
	require.ErrorIs(t, err, engine.ErrRollbackInProgress)
	require.Contains(t, err.Error(), "rolling_back")

	began := time.Now()
	_, err = env.engine.Undo(ctx, "guard-1")
	require.ErrorIs(t, err, engine.ErrRunLocked, "the rolling-back run holds its lock")
	require.GreaterOrEqual(t, time.Since(began), 150*time.Millisecond)

	close(release)
	res := <-done
	require.Equal(t, engine.StatusFailed, res.Status)
}

// An unlocked run found rolling_back (its process died mid-rollback) is
// refused by Undo with ErrRollbackInProgress, and resuming it continues from
// the last undone entry.
func TestRollbackResumesAfterLastUndoneEntry(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.LockExpiry = takeoverLockExpiry })
	tr := env.trail
	ctx := ctxTimeout(t)
	lockKey := env.prefix + ":{run:rb-1}:lock"
	dieInUndoOf := "b"
	undo := func(name string) func(context.Context, engine.Args, int) error {
		return func(ctx context.Context, _ engine.Args, _ int) error {
			tr.add("undo:" + name)
			if name == dieInUndoOf {
				dieInUndoOf = ""
				env.rdb.Set(context.Background(), lockKey, "other", time.Minute)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}
	}
	step := func(name string, after ...string) engine.Part {
		return engine.Step(name, engine.StepConfig[engine.Args, int]{After: after,
			Run:  func(context.Context, engine.Args) (int, error) { tr.add("run:" + name); return 1, nil },
			Undo: undo(name)})
	}
	def := engine.MustDefine("rb",
		step("a"), step("b", "a"), step("c", "b"),
		engine.Step("d", engine.StepConfig[engine.Args, int]{After: []string{"c"},
			Run:        func(context.Context, engine.Args) (int, error) { return 0, errors.New("boom") },
			Compensate: func(context.Context, engine.Args, error) error { tr.add("compensate:d"); return nil }}),
	)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("rb-1"))
	require.ErrorIs(t, err, engine.ErrLockLost)

	run, err := env.engine.Get(ctx, "rb-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, run.Status)
	require.Len(t, run.Ledger, 2, "c was undone and popped; b is still on the stack")
	require.True(t, run.Rollback.Compensated)

	require.NoError(t, env.rdb.Del(ctx, lockKey).Err())
	_, err = env.engine.Undo(ctx, "rb-1")
	require.ErrorIs(t, err, engine.ErrRollbackInProgress)

	res, err := env.engine.Resume(ctx, "rb-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Message)
	require.Equal(t, []string{
		"run:a", "run:b", "run:c", "compensate:d", "undo:c", "undo:b", // the crash
		"undo:b", "undo:a", // the resume: b again (it was in flight), then a
	}, tr.all())
}

func TestCancelRunningInProcessRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	ctx := ctxTimeout(t)
	inB := make(chan struct{})
	cancelled := make(chan struct{})
	def := engine.MustDefine("cancelme",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(context.Context, engine.Args) (int, error) {
				tr.add("run:b")
				close(inB)
				<-cancelled
				return 1, nil
			},
			Undo: func(context.Context, engine.Args, int) error { tr.add("undo:b"); return nil },
		}),
		simple(tr, "c", nil, "b"),
	)
	done := make(chan *engine.Result)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("cancel-1"))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-inB
	require.NoError(t, env.engine.Cancel(ctx, "cancel-1"), "a held run is asked to cancel")
	close(cancelled)
	res := <-done
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Equal(t, []string{"run:a", "run:b", "undo:b", "undo:a"}, tr.all(), "c never runs")
}

func TestCancelUnheldRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t, func(c *engine.Config) { c.LockExpiry = takeoverLockExpiry })
	tr := env.trail
	ctx := ctxTimeout(t)
	lockKey := env.prefix + ":{run:orphan}:lock"
	def := engine.MustDefine("orphan",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				env.rdb.Set(context.Background(), lockKey, "dead-worker", time.Minute)
				<-ctx.Done()
				return 0, ctx.Err()
			}}),
	)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("orphan"))
	require.ErrorIs(t, err, engine.ErrLockLost)
	require.NoError(t, env.rdb.Del(ctx, lockKey).Err()) // the dead worker's lock expires
	require.NoError(t, env.engine.Cancel(ctx, "orphan"))
	run, err := env.engine.Get(ctx, "orphan")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all())
}

type stockError struct {
	SKU  string `msgpack:"sku"`
	Left int    `msgpack:"left"`
}

func (e *stockError) Error() string { return fmt.Sprintf("only %d of %s left", e.Left, e.SKU) }

var errFraud = errors.New("payment flagged as fraud")

func init() {
	engine.RegisterError[*stockError]("test.stock")
	engine.RegisterSentinel("test.fraud", errFraud)
}

func TestTypedErrorsSurviveRoundTrip(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	for name, stepErr := range map[string]error{
		"typed":    fmt.Errorf("reserve: %w", &stockError{SKU: "book", Left: 1}),
		"sentinel": fmt.Errorf("charge: %w", errFraud),
	} {
		def := engine.MustDefine("typed-"+name, engine.Step("s", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 0, stepErr },
		}))
		res, err := env.engine.Run(ctx, def, nil)
		require.NoError(t, err)
		run, err := env.engine.Get(ctx, res.RunID)
		require.NoError(t, err)
		stored := run.Failure
		require.Equal(t, stepErr.Error(), stored.Message)
		switch name {
		case "typed":
			require.Equal(t, "test.stock", stored.Code)
			var se *stockError
			require.ErrorAs(t, stored, &se)
			require.Equal(t, &stockError{SKU: "book", Left: 1}, se)
		case "sentinel":
			require.Equal(t, "test.fraud", stored.Code)
			require.ErrorIs(t, stored, errFraud)
		}
	}
}

// Round trips of an in-process run: one fenced write per step plus at most 5
// per run (lock, index, create, final index, release: the lock is released
// after the final index update, so nobody can re-index the run in between).
// A reactor without maps pays nothing for the retention of a run tree.
func TestRoundTripsPerRun(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	counter := &cmdCounter{}
	env.rdb.AddHook(counter)
	for _, n := range []int{1, 5, 20} {
		parts := []engine.Part{}
		for i := range n {
			var after []string
			if i > 0 {
				after = []string{fmt.Sprint("s", i-1)}
			}
			parts = append(parts, simple(env.trail, fmt.Sprint("s", i), nil, after...))
		}
		def := engine.MustDefine(fmt.Sprint("rt", n), parts...)
		counter.n.Store(0)
		res, err := env.engine.Run(ctxTimeout(t), def, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status)
		got := int(counter.n.Load())
		t.Logf("steps=%d round_trips=%d per_run_overhead=%d", n, got, got-n)
		require.LessOrEqual(t, got, n+5)
	}
}

type cmdCounter struct{ n atomic.Int64 }

func (c *cmdCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "hello" { // a new pooled connection's handshake is not the run's
			c.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *cmdCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "client" { // connection setup (CLIENT SETINFO)
			c.n.Add(1)
		}
		return next(ctx, cmds)
	}
}

func TestEventsAndMiddleware(t *testing.T) {
	t.Parallel()
	var events []string
	var calls []string
	env := newEnv(t, func(c *engine.Config) {
		c.Hooks = []engine.Hook{engine.HookFunc(func(_ context.Context, e engine.Event) {
			events = append(events, string(e.Kind)+" "+e.Step)
		})}
		c.Middleware = []engine.Middleware{func(ctx context.Context, call engine.Call, next func(context.Context) error) error {
			calls = append(calls, string(call.Kind)+":"+call.Step)
			return next(ctx)
		}}
	})
	def := engine.MustDefine("events", simple(env.trail, "a", nil), simple(env.trail, "b", errors.New("x"), "a"))
	_, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, []string{
		"reactor.run.started ",
		"reactor.step.started a", "reactor.step.completed a",
		"reactor.step.started b", "reactor.step.failed b",
		"reactor.rollback.started ",
		"reactor.step.undo a",
		"reactor.run.failed ",
	}, events)
	require.Equal(t, []string{"run:a", "run:b", "undo:a"}, calls)
}

// A halted composed child keeps what it completed, and undoing the parent
// undoes it.
func TestUndoOfHaltedParentUndoesHaltedChild(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	child := engine.MustDefine("halting-child", simple(tr, "c1", nil), simple(tr, "c2", engine.Halt("stop"), "c1"))
	def := engine.MustDefine("halting-parent", simple(tr, "p1", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"p1"}}))
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusHalted, res.Status)
	_, err = env.engine.Undo(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{"run:p1", "run:c1", "run:c2", "undo:c1", "undo:p1"}, tr.all())
}

// A run aborted inside a composed child: Undo undoes the child's completed
// steps too, newest first.
func TestUndoOfRunAbortedInsideChild(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	ctx, cancel := context.WithCancel(ctxTimeout(t))
	child := engine.MustDefine("abort-child", simple(tr, "c1", nil),
		engine.Step("c2", engine.StepConfig[engine.Args, int]{After: []string{"c1"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				cancel() // the caller gives up
				<-ctx.Done()
				return 0, ctx.Err()
			}}))
	def := engine.MustDefine("abort-parent", simple(tr, "p1", nil),
		engine.Compose("sub", child, engine.ComposeConfig{After: []string{"p1"}}))
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusAborted, res.Status)
	require.ErrorIs(t, res.Err(), engine.ErrAborted)
	_, err = env.engine.Undo(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{"run:p1", "run:c1", "undo:c1", "undo:p1"}, tr.all())
}

// A cancel request outlives a step much longer than the lock expiry.
func TestCancelRequestOutlivesLongStep(t *testing.T) {
	t.Parallel()
	// The lock's expiry leaves the heartbeat (every third of it) the slack
	// a loaded machine needs; the step outlives it three times over.
	const expiry = takeoverLockExpiry
	env := newEnv(t, func(c *engine.Config) { c.LockExpiry = expiry })
	tr := env.trail
	ctx := ctxTimeout(t)
	inB := make(chan struct{})
	def := engine.MustDefine("long-step", simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				close(inB)
				// Longer than any expiry tied to the lock's that the
				// request could have had.
				if err := sleepCtx(ctx, 3*expiry); err != nil {
					return 0, err
				}
				return 1, nil
			}}),
		simple(tr, "c", nil, "b"))
	type outcome struct {
		res *engine.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("long-1"))
		done <- outcome{res, err}
	}()
	select {
	case <-inB:
	case o := <-done:
		t.Fatalf("the run ended before step b began: %+v, %v", o.res, o.err)
	}
	require.NoError(t, env.engine.Cancel(ctx, "long-1"))
	// Nor any expiry at all: the request is a field of the live run's
	// state, which lasts until the run's terminal write deletes it.
	require.True(t, env.rdb.HExists(ctx, env.prefix+":{run:long-1}:ctx", "cx").Val(), "the cancel request is stored")
	require.Equal(t, time.Duration(-1), env.rdb.PTTL(ctx, env.prefix+":{run:long-1}:ctx").Val(),
		"the live run's state has an expiry")
	o := <-done
	require.NoError(t, o.err)
	require.Equal(t, engine.StatusCancelled, o.res.Status)
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all())
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// A cancel requested while the run is in its last step (no checkpoint
// follows it) is honoured by the terminal write: the run rolls back and
// ends cancelled instead of completing with the request lost.
func TestCancelDuringTheLastStep(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	ctx := ctxTimeout(t)
	inB := make(chan struct{})
	cancelled := make(chan struct{})
	def := engine.MustDefine("cancel-last",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(context.Context, engine.Args) (int, error) {
				tr.add("run:b")
				close(inB)
				<-cancelled
				return 1, nil
			},
			Undo: func(context.Context, engine.Args, int) error { tr.add("undo:b"); return nil },
		}),
	)
	done := make(chan *engine.Result)
	go func() {
		res, err := env.engine.Run(ctx, def, nil, engine.WithRunID("cancel-last-1"))
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	<-inB
	require.NoError(t, env.engine.Cancel(ctx, "cancel-last-1"), "a held run is asked to cancel")
	close(cancelled)
	res := <-done
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Equal(t, []string{"run:a", "run:b", "undo:b", "undo:a"}, tr.all(), "the last step completed, then everything was undone")
	run, err := env.engine.Get(ctx, "cancel-last-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, run.Status)
	stored, err := env.rdb.HExists(ctx, env.prefix+":{run:cancel-last-1}:ctx", "cx").Result()
	require.NoError(t, err)
	require.False(t, stored, "the request is consumed by the cancelled run's terminal write")
}

// A start under an id another reactor's run holds is refused and leaves
// no entry in the starting reactor's indexes (the dashboard's counts by
// reactor), live or finished, while the holder's own entries stay.
func TestRefusedStartOfAnotherReactorLeavesNoReactorEntries(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	held := make(chan struct{})
	release := make(chan struct{})
	owner := engine.MustDefine("holder", engine.Step("wait", engine.StepConfig[engine.Args, int]{
		Run: func(context.Context, engine.Args) (int, error) { close(held); <-release; return 1, nil },
	}))
	other := engine.MustDefine("intruder", simple(env.trail, "a", nil))
	done := make(chan error, 1)
	go func() {
		_, err := env.engine.Run(ctx, owner, nil, engine.WithRunID("shared-id"))
		done <- err
	}()
	<-held
	check := func(what string) {
		t.Helper()
		for _, key := range []string{env.prefix + ":idx:reactor:intruder", env.prefix + ":idx:rs:intruder:running"} {
			_, err := env.rdb.ZScore(ctx, key, "shared-id").Result()
			require.ErrorIs(t, err, redis.Nil, "%s: %s holds no entry", what, key)
		}
		_, err := env.rdb.ZScore(ctx, env.prefix+":idx:reactor:holder", "shared-id").Result()
		require.NoError(t, err, "%s: the holder keeps its entry", what)
	}
	_, err := env.engine.Run(ctx, other, nil, engine.WithRunID("shared-id"))
	require.Error(t, err)
	check("live holder")
	close(release)
	require.NoError(t, <-done)
	_, err = env.engine.Run(ctx, other, nil, engine.WithRunID("shared-id"))
	require.Error(t, err)
	check("finished holder")

	// The same through Enqueue (the pending entries of a queued start).
	queued := newEnv(t, func(c *engine.Config) { c.Enqueuer = &wakeLog{} })
	_, err = queued.engine.Run(ctx, owner2(), nil, engine.WithRunID("shared-q"))
	require.NoError(t, err)
	_, err = queued.engine.Enqueue(ctx, other, nil, engine.WithRunID("shared-q"))
	require.Error(t, err)
	for _, key := range []string{queued.prefix + ":idx:reactor:intruder", queued.prefix + ":idx:rs:intruder:pending"} {
		_, err := queued.rdb.ZScore(ctx, key, "shared-q").Result()
		require.ErrorIs(t, err, redis.Nil, "enqueue: %s holds no entry", key)
	}
}

func owner2() *engine.Definition {
	return engine.MustDefine("holder2", engine.Step("one", engine.StepConfig[engine.Args, int]{
		Run: func(context.Context, engine.Args) (int, error) { return 1, nil },
	}))
}

// A run resumed after a crash inside a step, whose first checkpoint finds a
// cancel request, rolls that step back as cut short (its Compensate gets
// ErrStepInterrupted): the dead execution may have had its effect, so the
// step is never discarded as never started.
func TestCancelFoundOnResumeCompensatesTheStepCutShort(t *testing.T) {
	t.Parallel()
	var env *env
	var armed atomic.Bool
	env = newEnv(t, func(c *engine.Config) {
		c.LockExpiry = takeoverLockExpiry
		c.Hooks = []engine.Hook{engine.HookFunc(func(_ context.Context, e engine.Event) {
			// The cancel comes in after the resume loaded the run, so the
			// first checkpoint (the one counting the interruption) finds it.
			if e.Kind == engine.EventRunResumed && armed.Load() {
				if err := engine.StoreCancelRequest(env.engine, e.RunID); err != nil {
					panic(err)
				}
			}
		})}
	})
	tr := env.trail
	crash := true
	var cause error
	def := engine.MustDefine("crash-cancel",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run: func(ctx context.Context, _ engine.Args) (int, error) {
				tr.add("run:b")
				if crash {
					crash = false
					env.rdb.Set(context.Background(), env.prefix+":{run:crash-cancel-1}:lock", "someone-else", time.Second)
					<-ctx.Done()
					return 0, ctx.Err()
				}
				return 2, nil
			},
			Compensate: func(_ context.Context, _ engine.Args, err error) error {
				cause = err
				tr.add("compensate:b")
				return nil
			},
		}),
	)
	ctx := ctxTimeout(t)
	_, err := env.engine.Run(ctx, def, nil, engine.WithRunID("crash-cancel-1"))
	require.ErrorIs(t, err, engine.ErrLockLost)
	require.NoError(t, env.rdb.Del(ctx, env.prefix+":{run:crash-cancel-1}:lock").Err())
	armed.Store(true)
	res, err := env.engine.Resume(ctx, "crash-cancel-1")
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, res.Status)
	require.Equal(t, 1, tr.count("run:b"), "not run again")
	require.Equal(t, 1, tr.count("compensate:b"), "the step cut short is compensated, not discarded")
	require.ErrorIs(t, cause, engine.ErrStepInterrupted)
	require.Equal(t, 1, tr.count("undo:a"))
	run, err := env.engine.Get(ctx, "crash-cancel-1")
	require.NoError(t, err)
	require.NotNil(t, run.Stopped)
	require.Equal(t, "b", run.Stopped.Step)
	require.Equal(t, engine.StopInterrupted, run.Stopped.How, "reported as cut short, not pending")
}
