package engine_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

type pathAddress struct {
	City string `json:"city"`
	Zip  string `msgpack:"zip"`
}

type pathReservation struct {
	ID      string            `json:"id"`
	Total   int               `json:"total"`
	Ship    *pathAddress      `json:"ship"`
	Lines   []pathAddress     `json:"lines"`
	Extra   map[string]any    `json:"extra"`
	Any     any               `json:"any"`
	Raw     engine.Raw        `json:"raw"`
	Tags    map[string]string `json:"tags"`
	Skipped string            `json:"-"`
}

// pathDef defines reserve (returning a pathReservation) and a step charge
// reading it at path, or Returns reading it there when ret is set.
func pathDef(ret bool, path ...string) (*engine.Definition, error) {
	reserve := engine.Step("reserve", engine.StepConfig[engine.Args, pathReservation]{
		Run: func(context.Context, engine.Args) (pathReservation, error) {
			return pathReservation{ID: "r-1", Total: 7, Ship: &pathAddress{City: "Ghent"}}, nil
		},
	})
	if ret {
		return engine.Define("path_ret", reserve, engine.Returns(engine.FromStep("reserve", path...)))
	}
	return engine.Define("path", reserve,
		engine.Step("charge", engine.StepConfig[engine.Args, any]{
			Args: engine.Bindings{"total": engine.FromStep("reserve", path...)},
			Run:  func(_ context.Context, in engine.Args) (any, error) { return in["total"], nil },
		}),
		engine.Returns(engine.FromStep("charge")),
	)
}

// A FromStep path into a result whose type Define knows is checked there:
// a name the type has no field for is refused, with the fields it has.
func TestDefineFromStepPathRefused(t *testing.T) {
	t.Parallel()
	const fields = "fields any, extra, id, lines, raw, ship, tags, total"
	for _, tc := range []struct {
		path   []string
		ret    bool
		want   string
		fields []string
	}{
		{[]string{"totl"}, false,
			`reactor: definition "path": step "charge": binding "total" reads field "totl" of step "reserve"'s result (reserve returns pathReservation: ` + fields + `)`,
			[]string{"any", "extra", "id", "lines", "raw", "ship", "tags", "total"}},
		{[]string{"Total"}, false, `binding "total" reads field "Total" of step "reserve"'s result`, nil},
		{[]string{"Skipped"}, false, `reads field "Skipped"`, nil},
		{[]string{"ship", "cty"}, false,
			`binding "total" reads field "cty" of step "reserve"'s result at [ship cty] (reserve returns pathReservation, whose field "ship" is a *pathAddress: fields city, zip)`,
			[]string{"city", "zip"}},
		{[]string{"lines", "first"}, false, `reads index "first" of step "reserve"'s result at [lines first] (reserve returns pathReservation, whose field "lines" is a []pathAddress: a list, read by index)`, nil},
		{[]string{"lines", "0", "town"}, false, `reads field "town" of step "reserve"'s result at [lines 0 town] (reserve returns pathReservation, whose field "lines" is a []pathAddress, whose elements are pathAddress: fields city, zip)`, nil},
		{[]string{"id", "x"}, false, `reads field "x" of step "reserve"'s result at [id x] (reserve returns pathReservation, whose field "id" is a string, which has no fields)`, nil},
		{[]string{"totl"}, true, `reactor: definition "path_ret": Returns reads field "totl" of step "reserve"'s result (reserve returns pathReservation: ` + fields + `)`, nil},
	} {
		_, err := pathDef(tc.ret, tc.path...)
		var de *engine.DefinitionError
		require.ErrorAs(t, err, &de, "%v", tc.path)
		require.Contains(t, err.Error(), tc.want)
		if !tc.ret {
			require.Equal(t, "charge", de.Step)
			require.Equal(t, "total", de.Binding)
		}
		if tc.fields != nil {
			require.Equal(t, tc.fields, de.Fields)
		}
		require.Panics(t, func() {
			engine.MustDefine("path_must", engine.Step("reserve", engine.StepConfig[engine.Args, pathReservation]{
				Run: func(context.Context, engine.Args) (pathReservation, error) { return pathReservation{}, nil },
			}), engine.Returns(engine.FromStep("reserve", tc.path...)))
		})
	}
}

// Correct paths pass, and so do paths past a map, an interface or Raw, and
// into steps whose result type Define does not know.
func TestDefineFromStepPathAccepted(t *testing.T) {
	t.Parallel()
	for _, path := range [][]string{
		{"total"}, {"ship", "city"}, {"ship", "zip"}, {"lines", "0", "city"},
		{"extra", "anything", "deeper"}, {"tags", "k"}, {"any", "whatever"}, {"raw", "x"},
	} {
		_, err := pathDef(false, path...)
		require.NoError(t, err, "%v", path)
		_, err = pathDef(true, path...)
		require.NoError(t, err, "%v", path)
	}

	// A result of type any or a map, and a compose whose child returns a
	// path (its type is not known): any path.
	anyStep := engine.Step("reserve", engine.StepConfig[engine.Args, any]{
		Run: func(context.Context, engine.Args) (any, error) { return map[string]any{"x": 1}, nil },
	})
	_, err := engine.Define("path_any", anyStep, engine.Returns(engine.FromStep("reserve", "x", "y")))
	require.NoError(t, err)
	mapStep := engine.Step("reserve", engine.StepConfig[engine.Args, map[string]int]{
		Run: func(context.Context, engine.Args) (map[string]int, error) { return map[string]int{"x": 1}, nil },
	})
	_, err = engine.Define("path_map", mapStep, engine.Returns(engine.FromStep("reserve", "x")))
	require.NoError(t, err)
	child := engine.MustDefine("path_child",
		engine.Step("reserve", engine.StepConfig[engine.Args, pathReservation]{
			Run: func(context.Context, engine.Args) (pathReservation, error) { return pathReservation{}, nil },
		}),
		engine.Returns(engine.FromStep("reserve", "ship")),
	)
	_, err = engine.Define("path_compose",
		engine.Compose("sub", child, engine.ComposeConfig{}),
		engine.Returns(engine.FromStep("sub", "cty")))
	require.NoError(t, err)

	// A compose whose child returns a whole step result is checked against
	// that type.
	whole := engine.MustDefine("path_child_whole",
		engine.Step("reserve", engine.StepConfig[engine.Args, pathReservation]{
			Run: func(context.Context, engine.Args) (pathReservation, error) { return pathReservation{}, nil },
		}),
		engine.Returns(engine.FromStep("reserve")),
	)
	_, err = engine.Define("path_compose_whole",
		engine.Compose("sub", whole, engine.ComposeConfig{}),
		engine.Returns(engine.FromStep("sub", "totl")))
	require.ErrorContains(t, err, `Returns reads field "totl" of step "sub"'s result (sub returns pathReservation: fields`)
}

// A correct nested path reads the value at run time.
func TestFromStepNestedPathRuns(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	def, err := pathDef(false, "ship", "city")
	require.NoError(t, err)
	res, err := env.engine.Run(ctxTimeout(t), def, nil)
	require.NoError(t, err)
	got, err := engine.ValueOf[string](res)
	require.NoError(t, err)
	require.Equal(t, "Ghent", got)
}
