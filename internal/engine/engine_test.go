package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

type reserveIn struct {
	Item string `json:"item"`
	Qty  int    `json:"qty"`
}

type reservation struct {
	ID  string `json:"id"`
	Qty int    `json:"qty"`
}

func TestTypedStepsAndDependencyOrder(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	// Declared in reverse: the executor must follow the references.
	def := engine.MustDefine("order",
		engine.Input[string]("item", engine.Required()),
		engine.Input[int]("qty", engine.Default(2), engine.Validate(func(q int) error {
			if q <= 0 {
				return errors.New("must be positive")
			}
			return nil
		})),
		engine.Step("notify", engine.StepConfig[struct {
			ReservationID string `json:"rid"`
			Charged       int    `json:"charged"`
		}, string]{
			Args: engine.Bindings{"rid": engine.FromStep("reserve", "id"), "charged": engine.FromStep("charge")},
			Run: func(ctx context.Context, in struct {
				ReservationID string `json:"rid"`
				Charged       int    `json:"charged"`
			}) (string, error) {
				tr.add("run:notify")
				return fmt.Sprintf("%s/%d", in.ReservationID, in.Charged), nil
			},
		}),
		engine.Step("charge", engine.StepConfig[reservation, int]{
			Args: engine.Bindings{"id": engine.FromStep("reserve", "id"), "qty": engine.FromStep("reserve", "qty")},
			Run: func(ctx context.Context, r reservation) (int, error) {
				tr.add("run:charge")
				return r.Qty * 10, nil
			},
		}),
		engine.Step("reserve", engine.StepConfig[reserveIn, reservation]{
			Args: engine.Bindings{"item": engine.FromInput("item"), "qty": engine.FromInput("qty")},
			Run: func(ctx context.Context, in reserveIn) (reservation, error) {
				tr.add("run:reserve")
				return reservation{ID: "r-" + in.Item, Qty: in.Qty}, nil
			},
		}),
		engine.Returns(engine.FromStep("notify")),
	)
	require.Equal(t, []string{"reserve", "charge", "notify"}, def.Steps())

	res, err := env.engine.Run(ctxTimeout(t), def, map[string]any{"item": "book"})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.Equal(t, engine.OutcomeSuccess, res.Outcome())
	v, err := engine.ValueOf[string](res)
	require.NoError(t, err)
	require.Equal(t, "r-book/20", v)
	require.Equal(t, []string{"run:reserve", "run:charge", "run:notify"}, tr.all())

	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	require.Equal(t, []string{"reserve", "charge", "notify"}, run.Completed)
	require.Empty(t, run.Ledger, "steps without Undo must not allocate ledger entries")
}

func TestInputsAreCheckedBeforeAnythingIsStored(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("inputs",
		engine.Input[string]("name", engine.Required()),
		engine.Input[int]("n", engine.Validate(func(n int) error {
			if n > 10 {
				return errors.New("at most 10")
			}
			return nil
		})),
		simple(env.trail, "a", nil),
	)
	ctx := ctxTimeout(t)
	for name, in := range map[string]map[string]any{
		"missing":   {},
		"wrongType": {"name": 5},
		"invalid":   {"name": "x", "n": 11},
		"unknown":   {"name": "x", "nme": "typo"},
	} {
		_, err := env.engine.Run(ctx, def, in, engine.WithRunID("bad-"+name))
		var ie *engine.InputError
		require.ErrorAs(t, err, &ie, name)
		_, err = env.engine.Get(ctx, "bad-"+name)
		require.ErrorIs(t, err, engine.ErrNotFound, name)
	}
	require.Empty(t, env.trail.all())
}

func TestFailureUndoesCompletedStepsNewestFirst(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	boom := errors.New("card declined")
	def := engine.MustDefine("saga",
		simple(tr, "a", nil),
		simple(tr, "b", nil, "a"),
		engine.Step("no_undo", engine.StepConfig[engine.Args, int]{After: []string{"b"},
			Run: func(context.Context, engine.Args) (int, error) { tr.add("run:no_undo"); return 1, nil }}),
		simple(tr, "c", nil, "no_undo"),
		engine.Step("d", engine.StepConfig[engine.Args, int]{
			After: []string{"c"},
			Run:   func(context.Context, engine.Args) (int, error) { tr.add("run:d"); return 0, boom },
			Compensate: func(_ context.Context, _ engine.Args, err error) error {
				tr.add("compensate:d:" + err.Error())
				return nil
			},
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []string{
		"run:a", "run:b", "run:no_undo", "run:c", "run:d",
		"compensate:d:card declined", "undo:c", "undo:b", "undo:a",
	}, tr.all())
	require.Equal(t, "d", res.Failure.Step)
	require.ErrorIs(t, res.Err(), boom, "the live failure unwraps to the step's error")
	require.Empty(t, res.Failure.RollbackFailures)

	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Empty(t, run.Ledger, "every entry pops once undone")
	var statuses []string
	for _, r := range run.Rollbacks {
		statuses = append(statuses, fmt.Sprintf("%s:%s:%s", r.Kind, r.Step, r.Status))
	}
	require.Equal(t, []string{
		"compensate:d:compensated", "undo:c:compensated", "undo:no_undo:no_compensation_registered",
		"undo:b:compensated", "undo:a:compensated",
	}, statuses, "a step without Undo is reported kept, in its turn")
}

func TestUndoFailuresAreCollectedAndRollbackContinues(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	undoErr := errors.New("refund service down")
	def := engine.MustDefine("collect",
		simple(tr, "a", nil),
		engine.Step("b", engine.StepConfig[engine.Args, int]{
			After: []string{"a"},
			Run:   func(context.Context, engine.Args) (int, error) { tr.add("run:b"); return 1, nil },
			Undo:  func(context.Context, engine.Args, int) error { tr.add("undo:b"); return undoErr },
		}),
		engine.Step("slow_undo", engine.StepConfig[engine.Args, int]{
			After:       []string{"b"},
			UndoTimeout: 50 * time.Millisecond,
			Run:         func(context.Context, engine.Args) (int, error) { return 1, nil },
			Undo: func(ctx context.Context, _ engine.Args, _ int) error {
				<-ctx.Done() // hangs until its timeout
				tr.add("undo:slow_undo")
				return ctx.Err()
			},
		}),
		engine.Step("c", engine.StepConfig[engine.Args, int]{
			After:      []string{"slow_undo"},
			Run:        func(context.Context, engine.Args) (int, error) { return 0, errors.New("boom") },
			Compensate: func(context.Context, engine.Args, error) error { return errors.New("cleanup failed") },
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "boom", res.Failure.Message)
	require.Equal(t, []engine.RollbackFailure{
		{Step: "c", Kind: engine.ActionCompensate, Message: "cleanup failed"},
		{Step: "slow_undo", Kind: engine.ActionUndo, Reason: "reactor.deadline_exceeded", Message: context.DeadlineExceeded.Error()},
		{Step: "b", Kind: engine.ActionUndo, Message: "refund service down"},
	}, res.Failure.RollbackFailures)
	require.Equal(t, []string{"run:a", "run:b", "undo:slow_undo", "undo:b", "undo:a"}, tr.all(), "a is undone after b's undo failed")

	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, res.Failure.RollbackFailures, run.Failure.RollbackFailures, "rollback failures survive the round trip")
	st := map[string]engine.RollbackStatus{}
	for _, r := range run.Rollbacks {
		st[string(r.Kind)+":"+r.Step] = r.Status
	}
	require.Equal(t, map[string]engine.RollbackStatus{
		"compensate:c":   engine.RollbackFailed,
		"undo:slow_undo": engine.RollbackFailed,
		"undo:b":         engine.RollbackFailed,
		"undo:a":         engine.RollbackCompensated,
	}, st)
}

func TestFailingStepWithoutCompensateIsRecordedNotFailed(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("nocomp", simple(env.trail, "a", errors.New("x")))
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Empty(t, res.Failure.RollbackFailures)
	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Rollbacks, 1)
	require.Equal(t, engine.RollbackNoCompensation, run.Rollbacks[0].Status)
}

func TestRetriesWithEachBackoff(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		backoff engine.Backoff
		want    []time.Duration
	}{
		{"fixed", engine.Fixed(7 * time.Millisecond), []time.Duration{7, 7, 7, 7}},
		{"linear", engine.Linear(5*time.Millisecond, 12*time.Millisecond), []time.Duration{5, 10, 12, 12}},
		{"exponential", engine.Exponential(2*time.Millisecond, 10*time.Millisecond), []time.Duration{2, 4, 8, 10}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newEnv(t)
			var delays []time.Duration
			engine.SetSleep(env.engine, func(ctx context.Context, d time.Duration) error {
				delays = append(delays, d)
				return nil
			})
			attempts := 0
			def := engine.MustDefine("retry-"+tc.name, engine.Step("flaky", engine.StepConfig[engine.Args, int]{
				Retry: engine.Retry{MaxAttempts: 5, Backoff: tc.backoff},
				Run: func(context.Context, engine.Args) (int, error) {
					attempts++
					if attempts < 5 {
						return 0, errors.New("transient")
					}
					return attempts, nil
				},
			}))
			res, err := env.engine.Run(ctxTimeout(t), def, nil)
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Status)
			require.Equal(t, 5, attempts)
			var want []time.Duration
			for _, w := range tc.want {
				want = append(want, w*time.Millisecond)
			}
			require.Equal(t, want, delays)
		})
	}
}

func TestRetriesExhaustAndPermanentStopsRetrying(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	engine.SetSleep(env.engine, func(context.Context, time.Duration) error { return nil })
	var transient, permanent int
	def := engine.MustDefine("exhaust",
		engine.Step("t", engine.StepConfig[engine.Args, int]{
			Retry: engine.Retry{MaxAttempts: 3, Backoff: engine.Fixed(time.Hour)},
			Run:   func(context.Context, engine.Args) (int, error) { transient++; return 0, errors.New("still down") },
		}))
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, 3, transient)
	require.True(t, res.Failure.Retryable)

	def2 := engine.MustDefine("permanent",
		engine.Step("p", engine.StepConfig[engine.Args, int]{
			Retry: engine.Retry{MaxAttempts: 5},
			Run: func(context.Context, engine.Args) (int, error) {
				permanent++
				return 0, engine.Permanent(errors.New("invalid card"))
			},
		}))
	res, err = env.engine.Run(ctxTimeout(t), def2, nil)
	require.NoError(t, err)
	require.Equal(t, 1, permanent)
	require.False(t, res.Failure.Retryable)
}

func TestStepTimeoutFailsTheAttempt(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def := engine.MustDefine("timeout", engine.Step("slow", engine.StepConfig[engine.Args, int]{
		Timeout: 20 * time.Millisecond,
		Run: func(ctx context.Context, _ engine.Args) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		},
	}))
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	var te *engine.TimeoutError
	require.ErrorAs(t, res.Err(), &te)
	require.Equal(t, "slow", te.Step)

	// And after a round trip through Redis.
	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	var te2 *engine.TimeoutError
	require.ErrorAs(t, run.Failure, &te2)
	require.Equal(t, "20ms", te2.Timeout)
}

func TestHaltStopsWithoutRollback(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	def := engine.MustDefine("halt",
		simple(tr, "a", nil),
		simple(tr, "b", engine.Halt("out of stock, nothing to do"), "a"),
		simple(tr, "c", nil, "b"),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusHalted, res.Status)
	require.Equal(t, engine.OutcomeHalt, res.Outcome())
	require.Equal(t, "out of stock, nothing to do", res.Reason)
	require.Equal(t, []string{"run:a", "run:b"}, tr.all())

	run, err := env.engine.Get(ctxTimeout(t), res.RunID)
	require.NoError(t, err)
	require.Len(t, run.Ledger, 1, "a halted run keeps its ledger for a later Undo")
}

func TestSkippedStepIsNeverUndone(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	tr := env.trail
	def := engine.MustDefine("skip",
		simple(tr, "a", nil),
		simple(tr, "b", engine.Skip("feature off"), "a"),
		engine.Step("c", engine.StepConfig[struct {
			B string `json:"b"`
		}, int]{
			Args: engine.Bindings{"b": engine.FromStep("b")},
			Run: func(_ context.Context, in struct {
				B string `json:"b"`
			}) (int, error) {
				tr.add("run:c:" + in.B)
				return 0, errors.New("fail after skip")
			},
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, []string{"run:a", "run:b", "run:c:", "undo:a"}, tr.all())
}

func TestDefinitionErrorsNameTheStep(t *testing.T) {
	t.Parallel()
	noop := func(context.Context, engine.Args) (int, error) { return 0, nil }
	cases := map[string]struct {
		parts []engine.Part
		step  string
		want  string
	}{
		"cycle": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, After: []string{"c"}}),
			engine.Step("b", engine.StepConfig[engine.Args, int]{Run: noop, Args: engine.Bindings{"x": engine.FromStep("a")}}),
			engine.Step("c", engine.StepConfig[engine.Args, int]{Run: noop, After: []string{"b"}}),
			engine.Step("free", engine.StepConfig[engine.Args, int]{Run: noop}),
		}, "a", "cycle"},
		"unknown step": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, Args: engine.Bindings{"x": engine.FromStep("nope")}}),
		}, "a", `unknown step "nope"`},
		"unknown input": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, Args: engine.Bindings{"x": engine.FromInput("nope")}}),
		}, "a", `unknown input "nope"`},
		"unknown after": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, After: []string{"ghost"}}),
		}, "a", `unknown step "ghost"`},
		"duplicate": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop}),
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop}),
		}, "a", "declared twice"},
		"no run": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{}),
		}, "a", "Run is required"},
		"self": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, Args: engine.Bindings{"x": engine.FromStep("a")}}),
		}, "a", "itself"},
		"empty ref": {[]engine.Part{
			engine.Step("a", engine.StepConfig[engine.Args, int]{Run: noop, Args: engine.Bindings{"x": {}}}),
		}, "a", "empty Ref"},
	}
	for name, tc := range cases {
		_, err := engine.Define("bad", tc.parts...)
		var de *engine.DefinitionError
		require.ErrorAs(t, err, &de, name)
		require.Equal(t, tc.step, de.Step, name)
		require.Contains(t, de.Error(), tc.want, name)
	}
	_, err := engine.Define("bad", engine.Input[int]("n", engine.Default("five")))
	require.ErrorContains(t, err, "default is a string")
}

func TestValidateOfTheWrongTypeIsADefinitionError(t *testing.T) {
	t.Parallel()
	_, err := engine.Define("v", engine.Input[int]("qty", engine.Validate(func(int64) error { return nil })))
	var de *engine.DefinitionError
	require.ErrorAs(t, err, &de)
	require.Contains(t, err.Error(), "Validate takes a int64, input is a int")
}
