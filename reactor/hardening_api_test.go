package reactor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
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
	inputs := []reactor.Part{reactor.Input[string]("item"), reactor.Input[int]("qty")}
	for _, tc := range []struct {
		name    string
		step    reactor.Part
		binding string   // "" when Define must accept
		fields  []string // the names the error must offer
	}{
		{name: "typo", binding: "itme", fields: []string{"item", "qty"},
			step: reactor.Step("reserve", reactor.StepConfig[hardeningReserveIn, string]{Run: run,
				Args: reactor.Bindings{"itme": reactor.FromInput("item"), "qty": reactor.FromInput("qty")}})},
		{name: "Go name of a tagged field", binding: "Item", fields: []string{"item", "qty"},
			step: reactor.Step("reserve", reactor.StepConfig[hardeningReserveIn, string]{Run: run,
				Args: reactor.Bindings{"Item": reactor.FromInput("item")}})},
		{name: "pointer In", binding: "quantity", fields: []string{"item", "qty"},
			step: reactor.Step("reserve", reactor.StepConfig[*hardeningReserveIn, string]{
				Run:  func(context.Context, *hardeningReserveIn) (string, error) { return "", nil },
				Args: reactor.Bindings{"quantity": reactor.FromInput("qty")}})},
		{name: "exact names", step: reactor.Step("reserve", reactor.StepConfig[hardeningReserveIn, string]{Run: run,
			Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.FromInput("qty")}})},
		{name: "Args takes anything", step: reactor.Step("reserve", reactor.StepConfig[reactor.Args, string]{
			Run:  func(context.Context, reactor.Args) (string, error) { return "", nil },
			Args: reactor.Bindings{"itme": reactor.FromInput("item")}})},
		{name: "a map takes anything", step: reactor.Step("reserve", reactor.StepConfig[map[string]any, string]{
			Run:  func(context.Context, map[string]any) (string, error) { return "", nil },
			Args: reactor.Bindings{"itme": reactor.FromInput("item")}})},
		{name: "any takes anything", step: reactor.Step("reserve", reactor.StepConfig[any, string]{
			Run:  func(context.Context, any) (string, error) { return "", nil },
			Args: reactor.Bindings{"itme": reactor.FromInput("item")}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reactor.Define("checkout", append(inputs, tc.step)...)
			if tc.binding == "" {
				require.NoError(t, err)
				return
			}
			var de *reactor.DefinitionError
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
	child := reactor.MustDefine("child", reactor.Input[string]("item"), reactor.Input[int]("qty"),
		reactor.Step("s", reactor.StepConfig[reactor.Args, string]{Run: func(context.Context, reactor.Args) (string, error) { return "", nil }}))
	_, err := reactor.Define("parent", reactor.Input[string]("item"),
		reactor.Compose("book", child, reactor.ComposeConfig{Args: reactor.Bindings{"item": reactor.FromInput("item"), "quantity": reactor.Const(1)}}))
	var de *reactor.DefinitionError
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
	v1 := reactor.MustDefine("reserve",
		reactor.Input[string]("item"),
		reactor.Step("reserve", reactor.StepConfig[hardeningReserveIn, reservationV1]{
			Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.Const(2)},
			Run: func(_ context.Context, in hardeningReserveIn) (reservationV1, error) {
				return reservationV1{ID: "r-" + in.Item, Qty: in.Qty}, nil
			},
			Undo: func(context.Context, hardeningReserveIn, reservationV1) error { return nil },
		}),
	)
	for _, tc := range []struct {
		name    string
		v2      func(undone *[]string, compat reactor.Part) *reactor.Definition
		dropped string
		what    string
	}{
		{name: "result field renamed", dropped: "id", what: "result", v2: func(undone *[]string, compat reactor.Part) *reactor.Definition {
			return reactor.MustDefine("reserve", compatible(compat,
				reactor.Input[string]("item"),
				reactor.Step("reserve", reactor.StepConfig[hardeningReserveIn, reservationV2]{
					Args: reactor.Bindings{"item": reactor.FromInput("item"), "qty": reactor.Const(2)},
					Run:  func(context.Context, hardeningReserveIn) (reservationV2, error) { return reservationV2{}, nil },
					Undo: func(_ context.Context, _ hardeningReserveIn, r reservationV2) error {
						*undone = append(*undone, r.Ref)
						return nil
					},
				}),
			)...)
		}},
		{name: "argument field renamed", dropped: "item", what: "arguments", v2: func(undone *[]string, compat reactor.Part) *reactor.Definition {
			return reactor.MustDefine("reserve", compatible(compat,
				reactor.Input[string]("item"),
				reactor.Step("reserve", reactor.StepConfig[reserveInV2, reservationV1]{
					Args: reactor.Bindings{"sku": reactor.FromInput("item"), "qty": reactor.Const(2)},
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
			res, err := before.engine.Run(ctx, v1, map[string]any{"item": "lamp"}, reactor.WithRunID("order-1"))
			require.NoError(t, err)
			require.Equal(t, reactor.StatusCompleted, res.Status)

			// The deploy: a new process, same Redis and prefix, v2 registered.
			// As it stands, v2 refuses the run: it started under another shape.
			var undone []string
			after := newEnv(t, func(c *reactor.Config) { c.Prefix = before.prefix })
			require.NoError(t, after.engine.Register(tc.v2(&undone, nil)))
			_, err = after.engine.Undo(ctx, "order-1")
			require.ErrorIs(t, err, reactor.ErrDefinitionMismatch)
			// Declared compatible with v1 (wrongly: a field was renamed), it
			// takes the run, and the undo still catches what the new type lost.
			after = newEnv(t, func(c *reactor.Config) { c.Prefix = before.prefix })
			require.NoError(t, after.engine.Register(tc.v2(&undone, reactor.Compatible(v1.Fingerprint()))))
			res, err = after.engine.Undo(ctx, "order-1")
			require.NoError(t, err)
			require.Empty(t, undone, "the Undo ran with the value the renamed field lost")
			require.NotNil(t, res.Failure)
			require.Len(t, res.Failure.RollbackFailures, 1, "%v", res.Failure)
			rf := res.Failure.RollbackFailures[0]
			require.Equal(t, "reserve", rf.Step)
			require.Equal(t, reactor.ActionUndo, rf.Kind)
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
func compatible(compat reactor.Part, parts ...reactor.Part) []reactor.Part {
	if compat == nil {
		return parts
	}
	return append([]reactor.Part{compat}, parts...)
}

func TestDefinitionInputs(t *testing.T) {
	t.Parallel()
	d := reactor.MustDefine("in", reactor.Input[string]("b"), reactor.Input[int]("a"))
	require.Equal(t, []string{"b", "a"}, d.Inputs())
}
