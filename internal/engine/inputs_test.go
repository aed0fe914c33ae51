package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// Input and argument type errors say which value, what was wanted and what
// arrived, in the user's terms, not msgpack's.
func TestInputTypeErrorsSpeakUserTerms(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	type Line struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	def := engine.MustDefine("order",
		engine.Input[int]("qty"),
		engine.Input[Line]("line"),
		engine.Step("noop", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 0, nil },
		}),
	)
	for _, tc := range []struct {
		inputs map[string]any
		want   string
	}{
		{map[string]any{"qty": "three"}, `reactor: order: input "qty": want int, got string "three"`},
		{map[string]any{"qty": 1.5}, `reactor: order: input "qty": want int, got float 1.5: not a whole number`},
		{map[string]any{"qty": []int{1, 2}}, `reactor: order: input "qty": want int, got list of 2`},
		{map[string]any{"line": map[string]any{"sku": "b-1", "qty": "two"}},
			`reactor: order: input "line": field "qty": want int, got string "two"`},
		{map[string]any{"line": "b-1"}, `reactor: order: input "line": want engine_test.Line, got string "b-1"`},
	} {
		_, err := env.engine.Run(ctxTimeout(t), def, tc.inputs)
		var ie *engine.InputError
		require.ErrorAs(t, err, &ie)
		require.EqualError(t, err, tc.want)
		require.NotContains(t, err.Error(), "msgpack")
	}
}

func TestArgumentTypeErrorsSpeakUserTerms(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	type ReserveIn struct {
		Qty int `json:"qty"`
	}
	def := engine.MustDefine("reserve",
		engine.Input[string]("qty"),
		engine.Step("reserve", engine.StepConfig[ReserveIn, int]{
			Args: engine.Bindings{"qty": engine.FromInput("qty")},
			Run:  func(_ context.Context, in ReserveIn) (int, error) { return in.Qty, nil },
		}),
	)
	res, err := env.engine.Run(ctxTimeout(t), def, map[string]any{"qty": "three"})
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeFailure, res.Outcome())
	require.Equal(t, "reserve", res.Failure.Step)
	require.Contains(t, res.Failure.Message, `reactor: step "reserve": argument "qty": want int, got string "three"`)
	require.NotContains(t, res.Failure.Message, "msgpack")
	var ae *engine.ArgumentError
	if errors.As(res.Err(), &ae) { // typed while in memory; the stored Failure keeps the message
		require.Equal(t, "qty", ae.Argument)
	}
}
