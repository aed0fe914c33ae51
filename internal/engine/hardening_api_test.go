package engine_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

type hardeningReserveIn struct {
	Item string `json:"item"`
	Qty  int    `msgpack:"qty"`
}

// TestHardeningBindingNamesNoField: a binding whose name matches no field of
// the step's In type is refused by Define, naming the step, the binding and
// the fields In has, instead of running the step with zero values.
func TestHardeningBindingNamesNoField(t *testing.T) {
	t.Parallel()
	run := func(context.Context, hardeningReserveIn) (string, error) { return "", nil }
	inputs := []engine.Part{engine.Input[string]("item"), engine.Input[int]("qty")}
	for _, tc := range []struct {
		name    string
		step    engine.Part
		binding string   // "" when Define must accept
		fields  []string // the names the error must offer
	}{
		{name: "typo", binding: "itme", fields: []string{"item", "qty"},
			step: engine.Step("reserve", engine.StepConfig[hardeningReserveIn, string]{Run: run,
				Args: engine.Bindings{"itme": engine.FromInput("item"), "qty": engine.FromInput("qty")}})},
		{name: "Go name of a tagged field", binding: "Item", fields: []string{"item", "qty"},
			step: engine.Step("reserve", engine.StepConfig[hardeningReserveIn, string]{Run: run,
				Args: engine.Bindings{"Item": engine.FromInput("item")}})},
		{name: "pointer In", binding: "quantity", fields: []string{"item", "qty"},
			step: engine.Step("reserve", engine.StepConfig[*hardeningReserveIn, string]{
				Run:  func(context.Context, *hardeningReserveIn) (string, error) { return "", nil },
				Args: engine.Bindings{"quantity": engine.FromInput("qty")}})},
		{name: "exact names", step: engine.Step("reserve", engine.StepConfig[hardeningReserveIn, string]{Run: run,
			Args: engine.Bindings{"item": engine.FromInput("item"), "qty": engine.FromInput("qty")}})},
		{name: "Args takes anything", step: engine.Step("reserve", engine.StepConfig[engine.Args, string]{
			Run:  func(context.Context, engine.Args) (string, error) { return "", nil },
			Args: engine.Bindings{"itme": engine.FromInput("item")}})},
		{name: "a map takes anything", step: engine.Step("reserve", engine.StepConfig[map[string]any, string]{
			Run:  func(context.Context, map[string]any) (string, error) { return "", nil },
			Args: engine.Bindings{"itme": engine.FromInput("item")}})},
		{name: "any takes anything", step: engine.Step("reserve", engine.StepConfig[any, string]{
			Run:  func(context.Context, any) (string, error) { return "", nil },
			Args: engine.Bindings{"itme": engine.FromInput("item")}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := engine.Define("checkout", append(inputs, tc.step)...)
			if tc.binding == "" {
				require.NoError(t, err)
				return
			}
			var de *engine.DefinitionError
			require.ErrorAs(t, err, &de)
			require.Equal(t, "reserve", de.Step)
			require.Equal(t, tc.binding, de.Binding)
			require.Equal(t, tc.fields, de.Fields)
			for _, s := range append([]string{`"reserve"`, `"` + tc.binding + `"`}, tc.fields...) {
				require.Contains(t, err.Error(), s)
			}
		})
	}
}

// TestHardeningComposeBindingNamesNoInput: a compose binding that names no
// input of the child is refused by Define (the child would refuse it on
// every run).
func TestHardeningComposeBindingNamesNoInput(t *testing.T) {
	t.Parallel()
	child := engine.MustDefine("child", engine.Input[string]("item"), engine.Input[int]("qty"),
		engine.Step("s", engine.StepConfig[engine.Args, string]{Run: func(context.Context, engine.Args) (string, error) { return "", nil }}))
	_, err := engine.Define("parent", engine.Input[string]("item"),
		engine.Compose("book", child, engine.ComposeConfig{Args: engine.Bindings{"item": engine.FromInput("item"), "quantity": engine.Const(1)}}))
	var de *engine.DefinitionError
	require.ErrorAs(t, err, &de)
	require.Equal(t, "book", de.Step)
	require.Equal(t, "quantity", de.Binding)
	require.Equal(t, []string{"item", "qty"}, de.Fields)
	require.Contains(t, err.Error(), `"child"`)
}

type reservationV1 struct {
	ID  string `json:"id"`
	Qty int    `json:"qty"`
}

type reservationV2 struct {
	Ref string `json:"ref"` // renamed from "id" by a deploy
	Qty int    `json:"qty"`
}

type reserveInV2 struct {
	SKU string `json:"sku"` // renamed from "item" by a deploy
	Qty int    `json:"qty"`
}

// TestHardeningUndoDroppedFields: a run completes, a deploy renames a field
// of the step's Result (or In) type, and the run is undone: the Undo is not
// called with the empty value, and the entry's rollback failure names the
// stored field the type no longer has.
func TestHardeningUndoDroppedFields(t *testing.T) {
	t.Parallel()
	v1 := engine.MustDefine("reserve",
		engine.Input[string]("item"),
		engine.Step("reserve", engine.StepConfig[hardeningReserveIn, reservationV1]{
			Args: engine.Bindings{"item": engine.FromInput("item"), "qty": engine.Const(2)},
			Run: func(_ context.Context, in hardeningReserveIn) (reservationV1, error) {
				return reservationV1{ID: "r-" + in.Item, Qty: in.Qty}, nil
			},
			Undo: func(context.Context, hardeningReserveIn, reservationV1) error { return nil },
		}),
	)
	for _, tc := range []struct {
		name    string
		v2      func(undone *[]string, compat engine.Part) *engine.Definition
		dropped string
		what    string
	}{
		{name: "result field renamed", dropped: "id", what: "result", v2: func(undone *[]string, compat engine.Part) *engine.Definition {
			return engine.MustDefine("reserve", compatible(compat,
				engine.Input[string]("item"),
				engine.Step("reserve", engine.StepConfig[hardeningReserveIn, reservationV2]{
					Args: engine.Bindings{"item": engine.FromInput("item"), "qty": engine.Const(2)},
					Run:  func(context.Context, hardeningReserveIn) (reservationV2, error) { return reservationV2{}, nil },
					Undo: func(_ context.Context, _ hardeningReserveIn, r reservationV2) error {
						*undone = append(*undone, r.Ref)
						return nil
					},
				}),
			)...)
		}},
		{name: "argument field renamed", dropped: "item", what: "arguments", v2: func(undone *[]string, compat engine.Part) *engine.Definition {
			return engine.MustDefine("reserve", compatible(compat,
				engine.Input[string]("item"),
				engine.Step("reserve", engine.StepConfig[reserveInV2, reservationV1]{
					Args: engine.Bindings{"sku": engine.FromInput("item"), "qty": engine.Const(2)},
					Run:  func(context.Context, reserveInV2) (reservationV1, error) { return reservationV1{}, nil },
					Undo: func(_ context.Context, in reserveInV2, _ reservationV1) error {
						*undone = append(*undone, in.SKU)
						return nil
					},
				}),
			)...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := ctxTimeout(t)
			before := newEnv(t)
			res, err := before.engine.Run(ctx, v1, map[string]any{"item": "lamp"}, engine.WithRunID("order-1"))
			require.NoError(t, err)
			require.Equal(t, engine.StatusCompleted, res.Status)

			// The deploy: a new process, same Redis and prefix, v2 registered.
			// As it stands, v2 refuses the run: it started under another shape.
			var undone []string
			after := newEnv(t, func(c *engine.Config) { c.Prefix = before.prefix })
			require.NoError(t, after.engine.Register(tc.v2(&undone, nil)))
			_, err = after.engine.Undo(ctx, "order-1")
			require.ErrorIs(t, err, engine.ErrDefinitionMismatch)
			// Declared compatible with v1 (wrongly: a field was renamed), it
			// takes the run, and the undo still catches what the new type lost.
			after = newEnv(t, func(c *engine.Config) { c.Prefix = before.prefix })
			require.NoError(t, after.engine.Register(tc.v2(&undone, engine.Compatible(v1.Fingerprint()))))
			res, err = after.engine.Undo(ctx, "order-1")
			require.NoError(t, err)
			require.Empty(t, undone, "the Undo ran with the value the renamed field lost")
			require.NotNil(t, res.Failure)
			require.Len(t, res.Failure.RollbackFailures, 1, "%v", res.Failure)
			rf := res.Failure.RollbackFailures[0]
			require.Equal(t, "reserve", rf.Step)
			require.Equal(t, engine.ActionUndo, rf.Kind)
			require.Equal(t, "reactor.fields_dropped", rf.Reason)
			require.Contains(t, rf.Message, "["+tc.dropped+"]")
			require.Contains(t, rf.Message, tc.what)

			// Read back from Redis, the failure still says what was dropped.
			got, err := after.engine.Get(ctx, "order-1")
			require.NoError(t, err)
			require.NotNil(t, got.Failure)
			require.Len(t, got.Failure.RollbackFailures, 1)
			require.True(t, strings.Contains(got.Failure.RollbackFailures[0].Message, tc.dropped))
		})
	}
}

// compatible is parts, with compat first when it is not nil.
func compatible(compat engine.Part, parts ...engine.Part) []engine.Part {
	if compat == nil {
		return parts
	}
	return append([]engine.Part{compat}, parts...)
}

func TestDefinitionInputs(t *testing.T) {
	t.Parallel()
	d := engine.MustDefine("in", engine.Input[string]("b"), engine.Input[int]("a"))
	require.Equal(t, []string{"b", "a"}, d.Inputs())
}
