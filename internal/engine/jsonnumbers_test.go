package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// decodeJSON decodes body as an HTTP front end would, with or without
// UseNumber.
func decodeJSON(t *testing.T, body string, useNumber bool) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	if useNumber {
		dec.UseNumber()
	}
	var m map[string]any
	require.NoError(t, dec.Decode(&m))
	return m
}

// Numbers from encoding/json reach integer and float inputs, top-level and
// inside structs, maps and lists, when they convert exactly.
func TestInputsFromJSONNumbers(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	type Line struct {
		SKU string `json:"sku"`
		Qty int    `json:"qty"`
	}
	type Order struct {
		Qty    int            `json:"qty"`
		Small  int8           `json:"small"`
		Count  uint32         `json:"count"`
		Price  float64        `json:"price"`
		Ratio  float32        `json:"ratio"`
		Line   Line           `json:"line"`
		Ptr    *Line          `json:"ptr"`
		Lines  []Line         `json:"lines"`
		Stock  map[string]int `json:"stock"`
		Any    any            `json:"any"`
		Weight float64        `json:"weight"`
	}
	def := engine.MustDefine("json_numbers",
		engine.Input[int]("qty", engine.Required()),
		engine.Input[int8]("small"),
		engine.Input[uint32]("count"),
		engine.Input[float64]("price"),
		engine.Input[float32]("ratio"),
		engine.Input[Line]("line"),
		engine.Input[*Line]("ptr"),
		engine.Input[[]Line]("lines"),
		engine.Input[map[string]int]("stock"),
		engine.Input[any]("any"),
		engine.Input[float64]("weight"),
		engine.Step("echo", engine.StepConfig[Order, Order]{
			Args: engine.Bindings{
				"qty": engine.FromInput("qty"), "small": engine.FromInput("small"),
				"count": engine.FromInput("count"), "price": engine.FromInput("price"),
				"ratio": engine.FromInput("ratio"), "line": engine.FromInput("line"),
				"ptr": engine.FromInput("ptr"), "lines": engine.FromInput("lines"),
				"stock": engine.FromInput("stock"), "any": engine.FromInput("any"),
				"weight": engine.FromInput("weight"),
			},
			Run: func(_ context.Context, in Order) (Order, error) { return in, nil },
		}),
		engine.Returns(engine.FromStep("echo")),
	)
	body := `{"qty": 2, "small": -128, "count": 4294967295, "price": 2.5, "ratio": 0.5,
		"line": {"sku": "b-1", "qty": 3}, "ptr": {"sku": "b-2", "qty": 4e0},
		"lines": [{"sku": "b-3", "qty": 5}, {"sku": "b-4", "qty": 6.0}],
		"stock": {"b-1": 7}, "any": 8, "weight": 9}`
	for _, useNumber := range []bool{false, true} {
		res, err := env.engine.Run(ctxTimeout(t), def, decodeJSON(t, body, useNumber))
		require.NoError(t, err, "UseNumber %t", useNumber)
		require.Equal(t, engine.OutcomeSuccess, res.Outcome(), "UseNumber %t: %v", useNumber, res.Err())
		got, err := engine.ValueOf[Order](res)
		require.NoError(t, err)
		require.Equal(t, 2, got.Qty)
		require.Equal(t, int8(-128), got.Small)
		require.Equal(t, uint32(4294967295), got.Count)
		require.Equal(t, 2.5, got.Price)
		require.Equal(t, float32(0.5), got.Ratio)
		require.Equal(t, Line{SKU: "b-1", Qty: 3}, got.Line)
		require.Equal(t, &Line{SKU: "b-2", Qty: 4}, got.Ptr)
		require.Equal(t, []Line{{"b-3", 5}, {"b-4", 6}}, got.Lines)
		require.Equal(t, map[string]int{"b-1": 7}, got.Stock)
		require.Equal(t, 9.0, got.Weight)
		require.NotNil(t, got.Any) // an interface takes the value as it came
	}

	// The exact forms: a Go float64 and a json.Number, given directly.
	for _, v := range []any{float64(2), json.Number("2"), json.Number("2.0"), json.Number("0.2e1"), float32(2)} {
		res, err := env.engine.Run(ctxTimeout(t), def, map[string]any{"qty": v})
		require.NoError(t, err, "%T %v", v, v)
		got, err := engine.ValueOf[Order](res)
		require.NoError(t, err)
		require.Equal(t, 2, got.Qty, "%T %v", v, v)
	}
}

// Numbers that do not convert exactly are refused before anything is
// stored, with an *InputError naming the input and why.
func TestInputsFromJSONNumbersRefused(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	type Line struct {
		Qty int `json:"qty"`
	}
	def := engine.MustDefine("json_refused",
		engine.Input[int]("qty"),
		engine.Input[int8]("small"),
		engine.Input[uint]("count"),
		engine.Input[int64]("id"),
		engine.Input[float32]("ratio"),
		engine.Input[Line]("line"),
		engine.Input[[]Line]("lines"),
		engine.Input[string]("card", engine.Sensitive()),
		engine.Input[int]("pin", engine.Sensitive()),
		engine.Input[map[string]int]("stock"),
		engine.Input[map[string]int]("codes", engine.Sensitive()),
		engine.Step("noop", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 0, nil },
		}),
	)
	for _, tc := range []struct {
		inputs map[string]any
		want   string
	}{
		{map[string]any{"qty": 2.5}, `input "qty": want int, got float 2.5: not a whole number`},
		{map[string]any{"qty": json.Number("2.5")}, `input "qty": want int, got number "2.5": not a whole number`},
		{map[string]any{"qty": 1e20}, `input "qty": want int, got float 1e+20: out of range for int (-9223372036854775808 to 9223372036854775807)`},
		{map[string]any{"qty": 1e300}, `input "qty": want int, got float 1e+300: out of range for int`},
		{map[string]any{"qty": json.Number("1e999999999")}, `input "qty": want int, got number "1e999999999": out of range for int`},
		{map[string]any{"qty": json.Number("1e-999999999")}, `input "qty": want int, got number "1e-999999999": not a whole number`},
		{map[string]any{"qty": json.Number("two")}, `input "qty": want int, got number "two": not a number`},
		{map[string]any{"small": 1e20}, `input "small": want int8, got float 1e+20: out of range for int8 (-128 to 127)`},
		{map[string]any{"small": 128.0}, `input "small": want int8, got float 128: out of range for int8 (-128 to 127)`},
		{map[string]any{"small": json.Number("-129")}, `input "small": want int8, got number "-129": out of range for int8 (-128 to 127)`},
		{map[string]any{"count": -1.0}, `input "count": want uint, got float -1: out of range for uint (0 to 18446744073709551615)`},
		{map[string]any{"count": json.Number("-1")}, `input "count": want uint, got number "-1": out of range for uint`},
		{map[string]any{"id": 9007199254740993.0}, `input "id": want int64, got float 9.007199254740992e+15: 2^53 or more`},
		{map[string]any{"ratio": 1e39}, `input "ratio": want float32, got float 1e+39: out of range for float32`},
		{map[string]any{"ratio": json.Number("1e39")}, `input "ratio": want float32, got number "1e39": out of range for float32`},
		{map[string]any{"line": map[string]any{"qty": 2.5}}, `input "line": field "qty": want int, got float 2.5: not a whole number`},
		{map[string]any{"lines": []any{map[string]any{"qty": 1.0}, map[string]any{"qty": json.Number("1.5")}}},
			`input "lines": field "1.qty": want int, got number "1.5": not a whole number`},
		{map[string]any{"pin": json.Number("12.5")}, `input "pin": want int, got number (value not shown: sensitive input): not a whole number`},
		{map[string]any{"stock": map[string]any{"b-1": 1.5}}, `input "stock": field "b-1": want int, got float 1.5: not a whole number`},
		{map[string]any{"codes": map[string]any{"alice@example.com": 1.5}}, `input "codes": field "(a key)": want int, got float (value not shown: sensitive input): not a whole number`},
	} {
		_, err := env.engine.Run(ctxTimeout(t), def, tc.inputs)
		var ie *engine.InputError
		require.ErrorAs(t, err, &ie, "%v", tc.inputs)
		require.Contains(t, err.Error(), tc.want)
		require.NotContains(t, err.Error(), "msgpack")
	}
	// A large integer given as a json.Number is exact, and taken.
	_, err := env.engine.Run(ctxTimeout(t), def, map[string]any{"id": json.Number("9007199254740993")})
	require.NoError(t, err)
}
