package codec

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

type inner struct {
	City string `json:"city"`
	Zip  string
}

type shadow struct {
	Name string `json:"name"`
}

type selfDecoding struct{ v string }

func (s *selfDecoding) UnmarshalMsgpack(b []byte) error { return Unmarshal(b, &s.v) }

type tricky struct {
	A        string `msgpack:"a" json:"not_a"` // msgpack wins
	B        string `json:"b,omitempty"`
	C        string `msgpack:",omitempty" json:"c"` // msgpack tag present: Go name
	Skipped  string `json:"-"`
	MSkipped string `msgpack:"-" json:"mskipped"`
	New      string `msgpack:"new,alias:old"`
	Lower    int    `json:"lower"`
	private  int    //lint:ignore U1000 an unexported field is not a key; it is here to prove it
	inner           // auto-inlined
	Named    shadow `json:"named"`
	*shadow         // inlined through the pointer
}

// TestFieldsMatchMsgpack lists the keys msgpack/v5 decodes for types that
// exercise its rules: tag precedence, `-`, omitempty, aliases, unexported and
// embedded fields, exact case.
func TestFieldsMatchMsgpack(t *testing.T) {
	for _, tc := range []struct {
		name string
		typ  reflect.Type
		want []string
		open bool
	}{
		{name: "tags", typ: reflect.TypeFor[tricky](),
			// An inlined struct's own name is a key too (msgpack decodes a
			// nested map under it); a json-tagged field's Go name is not.
			want: []string{"C", "Zip", "a", "b", "city", "inner", "lower", "name", "named", "new", "old", "shadow"}},
		{name: "pointer", typ: reflect.TypeFor[*inner](), want: []string{"Zip", "city"}},
		{name: "map", typ: reflect.TypeFor[map[string]any](), open: true},
		{name: "interface", typ: reflect.TypeFor[any](), open: true},
		{name: "string", typ: reflect.TypeFor[string](), open: true},
		{name: "self-decoding", typ: reflect.TypeFor[selfDecoding](), open: true},
		{name: "empty struct", typ: reflect.TypeFor[struct{}](), want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Fields(tc.typ)
			require.Equal(t, !tc.open, ok)
			if tc.open {
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}

func TestDroppedIgnoresNilAndKnown(t *testing.T) {
	raw, err := Marshal(map[string]any{"city": "x", "gone": "y", "also_gone": nil})
	require.NoError(t, err)
	require.Equal(t, []string{"gone"}, Dropped(raw, reflect.TypeFor[inner]()))
	require.Nil(t, Dropped(raw, reflect.TypeFor[map[string]string]()))
	notMap, err := Marshal("s")
	require.NoError(t, err)
	require.Nil(t, Dropped(notMap, reflect.TypeFor[inner]()))
}
