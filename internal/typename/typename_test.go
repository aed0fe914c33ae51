package typename_test

import (
	"reflect"
	"testing"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/typename"
)

// engine is also the name of a user's package here: its types keep it.
type engineLike struct{}

func TestOfNamesTheFacades(t *testing.T) {
	for _, tc := range []struct {
		typ  reflect.Type
		want string
	}{
		{reflect.TypeFor[engine.Args](), "reactor.Args"},
		{reflect.TypeFor[*engine.Result](), "*reactor.Result"},
		{reflect.TypeFor[[]engine.Args](), "[]reactor.Args"},
		{reflect.TypeFor[map[string]engine.Args](), "map[string]reactor.Args"},
		{reflect.TypeFor[mapcore.Results[int]](), "mapstep.Results[int]"},
		{reflect.TypeFor[mapcore.Results[engine.Args]](), "mapstep.Results[github.com/goreactor/goreactor/reactor.Args]"},
		{reflect.TypeFor[[]mapcore.Results[[]engine.Args]](), "[]mapstep.Results[[]github.com/goreactor/goreactor/reactor.Args]"},
		{reflect.TypeFor[struct{ A engine.Args }](), "struct { A reactor.Args }"},
		{reflect.TypeFor[engineLike](), "typename_test.engineLike"},
		{reflect.TypeFor[[]string](), "[]string"},
		{nil, "<nil>"},
	} {
		if got := typename.Of(tc.typ); got != tc.want {
			t.Errorf("Of(%v) = %q, want %q", tc.typ, got, tc.want)
		}
	}
}
