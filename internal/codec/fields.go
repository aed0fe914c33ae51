package codec

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// fieldSet is what a type accepts from an encoded map: names, or anything.
type fieldSet struct {
	names []string // sorted
	known map[string]bool
	open  bool // no fixed set: a map, an interface, a type that decodes itself
}

var fieldCache sync.Map // reflect.Type -> *fieldSet

// openProbe is a key no Go field can be named (and no sane tag uses): a type
// that accepts it accepts any key.
const openProbe = "\x00goreactor:any-key"

// Fields returns the map keys that Unmarshal decodes into a value of type t,
// sorted. Keys match exactly as msgpack/v5 matches them: the msgpack tag,
// else the json tag, else the Go field name, case included; `-` fields and
// unexported ones are left out; embedded structs are inlined where msgpack
// inlines them; `alias:` names count. ok is false when t takes any key: t is
// not a struct or a pointer to one (a map, an interface, Args), or it decodes
// itself.
//
// The answer comes from msgpack's own decoder, not a copy of its rules: every
// name t's fields and tags could give is decoded into t with unknown fields
// disallowed, and the ones it does not refuse are t's fields.
func Fields(t reflect.Type) (names []string, ok bool) {
	fs := fieldsOf(t)
	if fs.open {
		return nil, false
	}
	return slices.Clone(fs.names), true
}

// Dropped returns the keys of the encoded map raw, sorted, that a value of
// type t would silently drop on decoding: keys t has no field for, whose
// stored value is not nil (a nil loses nothing). It returns nil when raw is
// not a map or t takes any key.
func Dropped(raw Raw, t reflect.Type) []string {
	fs := fieldsOf(t)
	if fs.open || len(raw) == 0 {
		return nil
	}
	var m map[string]Raw
	if err := Unmarshal(raw, &m); err != nil {
		return nil
	}
	var out []string
	for k, v := range m {
		if !fs.known[k] && len(v) > 0 && !bytes.Equal(v, Nil) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func fieldsOf(t reflect.Type) *fieldSet {
	if v, ok := fieldCache.Load(t); ok {
		return v.(*fieldSet)
	}
	fs := computeFields(t)
	fieldCache.Store(t, fs)
	return fs
}

func computeFields(t reflect.Type) *fieldSet {
	st := t
	for st != nil && st.Kind() == reflect.Pointer {
		st = st.Elem()
	}
	if st == nil || st.Kind() != reflect.Struct {
		return &fieldSet{open: true}
	}
	if accepts(st, openProbe) {
		return &fieldSet{open: true}
	}
	cands := map[string]bool{}
	candidates(st, cands, map[reflect.Type]bool{})
	fs := &fieldSet{known: map[string]bool{}}
	for name := range cands {
		if accepts(st, name) {
			fs.known[name] = true
			fs.names = append(fs.names, name)
		}
	}
	slices.Sort(fs.names)
	return fs
}

// candidates collects every name t's fields could be decoded under: a
// superset (Go names, every token of their msgpack and json tags, the
// fields of embedded structs), which accepts then narrows down.
func candidates(t reflect.Type, out map[string]bool, seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	for i := range t.NumField() {
		f := t.Field(i)
		out[f.Name] = true
		for _, key := range []string{"msgpack", "json"} {
			for part := range strings.SplitSeq(f.Tag.Get(key), ",") {
				for tok := range strings.SplitSeq(part, ":") {
					if tok = strings.Trim(strings.TrimSpace(tok), "'"); tok != "" && tok != "-" {
						out[tok] = true
					}
				}
			}
		}
		if f.Anonymous {
			et := f.Type
			for et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				candidates(et, out, seen)
			}
		}
	}
}

// accepts reports whether decoding {name: nil} into a new t succeeds with
// unknown fields disallowed, or fails for another reason than an unknown
// field (a field whose own decoder refuses nil is still a field).
func accepts(t reflect.Type, name string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = true // msgpack's own trouble with the field, not an unknown name
		}
	}()
	probe, err := Marshal(map[string]any{name: nil})
	if err != nil {
		return true
	}
	dec := msgpack.NewDecoder(bytes.NewReader(probe))
	dec.SetCustomStructTag("json")
	dec.DisallowUnknownFields(true)
	err = dec.Decode(reflect.New(t).Interface())
	return err == nil || err.Error() != fmt.Sprintf("msgpack: unknown field %q", name)
}
