package engine

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/typename"
)

// prepareInputs encodes and validates a run's inputs: required inputs must be
// present, defaults fill the rest, every value must decode into its declared
// type and pass its validators. Unknown inputs are rejected so that a typo
// does not silently become a missing input.
// Numbers decoded from JSON are converted first where the input's type
// wants a number (fitNumbers, jsonnumbers.go).
func (d *Definition) prepareInputs(given map[string]any) (map[string]Raw, error) {
	declared := make(map[string]*inputDef, len(d.inputs))
	for _, in := range d.inputs {
		declared[in.name] = in
	}
	raw := make(map[string]Raw, len(given))
	for k, v := range given {
		if in := declared[k]; in != nil {
			fit, nerr := fitNumbers(v, in.typ, nil)
			if nerr != nil {
				return nil, &InputError{Reactor: d.name, Input: k, Reason: nerr.message(in.sensitive)}
			}
			v = fit
		}
		b, err := codec.Marshal(v)
		if err != nil {
			return nil, &InputError{Reactor: d.name, Input: k, Reason: "cannot be encoded: " + err.Error()}
		}
		raw[k] = b
	}
	return d.checkInputs(raw)
}

func (d *Definition) checkInputs(raw map[string]Raw) (map[string]Raw, error) {
	known := make(map[string]bool, len(d.inputs))
	out := make(map[string]Raw, len(d.inputs))
	for _, in := range d.inputs {
		known[in.name] = true
		v, ok := raw[in.name]
		if !ok {
			switch {
			case in.def != nil:
				v = in.def
			case in.required:
				return nil, &InputError{Reactor: d.name, Input: in.name, Reason: "is required"}
			default:
				continue
			}
		}
		if err := in.check(v); err != nil {
			return nil, &InputError{Reactor: d.name, Input: in.name, Reason: err.Error()}
		}
		out[in.name] = v
	}
	for k := range raw {
		if !known[k] {
			return nil, &InputError{Reactor: d.name, Input: k, Reason: "is not declared by the reactor"}
		}
	}
	return out, nil
}

// mismatch says, in the user's terms, why raw does not decode into t: what
// was wanted and what arrived ("want int, got string \"three\""), and for a
// struct the field at fault. It is for messages only; the decode error it
// replaces names msgpack codes.
type mismatch struct {
	field     string // the struct field (map key) at fault, if found
	want, got string
}

func (m mismatch) String() string {
	if m.field != "" {
		return fmt.Sprintf("field %q: want %s, got %s", m.field, m.want, m.got)
	}
	return fmt.Sprintf("want %s, got %s", m.want, m.got)
}

func explainDecode(raw Raw, t reflect.Type) mismatch {
	st := t
	for st.Kind() == reflect.Pointer {
		st = st.Elem()
	}
	var entries map[string]Raw
	if st.Kind() == reflect.Struct && codec.Unmarshal(raw, &entries) == nil {
		// Decode one entry at a time: the first that fails names the field.
		for _, k := range slices.Sorted(maps.Keys(entries)) {
			one, err := codec.Marshal(map[string]Raw{k: entries[k]})
			if err != nil {
				break
			}
			if codec.Unmarshal(one, reflect.New(st).Interface()) == nil {
				continue
			}
			want := "another type"
			if f, ok := fieldNamed(st, k); ok {
				want = typename.Of(f.Type)
			}
			return mismatch{field: k, want: want, got: describeEncoded(entries[k])}
		}
	}
	return mismatch{want: t.String(), got: describeEncoded(raw)}
}

// fieldNamed finds the field of struct t that key k decodes into, by the
// codec's naming rules (msgpack tag, else json tag, else the Go name);
// embedded structs are searched too.
func fieldNamed(t reflect.Type, k string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Name
		tag, ok := f.Tag.Lookup("msgpack")
		if !ok {
			tag, ok = f.Tag.Lookup("json")
		}
		if ok {
			if n, _, _ := strings.Cut(tag, ","); n != "" {
				name = n
			}
		}
		if name == k {
			return f, true
		}
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if g, ok := fieldNamed(f.Type, k); ok {
				return g, true
			}
		}
	}
	return reflect.StructField{}, false
}

// describeEncoded renders an encoded value as its kind and a short form of
// it: `string "three"`, `int 3`, `list of 2`, `map with keys [a b]`.
func describeEncoded(raw Raw) string {
	var v any
	if err := codec.Unmarshal(raw, &v); err != nil {
		return "an undecodable value"
	}
	switch x := v.(type) {
	case nil:
		return "nil"
	case string:
		if len(x) > 40 {
			return fmt.Sprintf("string %q...", x[:40])
		}
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("bool %t", x)
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return fmt.Sprintf("int %d", x)
	case float32, float64:
		return fmt.Sprintf("float %v", x)
	case []byte:
		return fmt.Sprintf("bytes (%d)", len(x))
	case []any:
		return fmt.Sprintf("list of %d", len(x))
	case map[string]any:
		keys := slices.Sorted(maps.Keys(x))
		if len(keys) > 5 {
			keys = append(keys[:5], "...")
		}
		return fmt.Sprintf("map with keys [%s]", strings.Join(keys, " "))
	default:
		return fmt.Sprintf("%T", v)
	}
}
