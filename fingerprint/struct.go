package fingerprint

import (
	"encoding"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// special is how a type is encoded when it is not encoded by its kind.
type special uint8

const (
	specialNone special = iota
	specialTime
	specialBinary // encoded as the bytes of MarshalBinary, as the codec does
	specialText   // encoded as the bytes of MarshalText, as the codec does
	specialRefused
)

type typeInfo struct {
	special special
	reason  string // for specialRefused
}

var (
	infoCache sync.Map // reflect.Type -> *typeInfo
	planCache sync.Map // reflect.Type -> *structPlan

	binaryMarshalerType = reflect.TypeFor[encoding.BinaryMarshaler]()
	textMarshalerType   = reflect.TypeFor[encoding.TextMarshaler]()
	zeroerType          = reflect.TypeFor[interface{ IsZero() bool }]()
)

// infoOf classifies a type that is neither a pointer nor an interface, in
// the order goreactor's codec (msgpack/v5) picks an encoder: time first (it
// is a registered extension), then the type's own msgpack methods, then
// encoding.BinaryMarshaler, then encoding.TextMarshaler, on the value's
// method set before the pointer's.
func infoOf(t reflect.Type) *typeInfo {
	if v, ok := infoCache.Load(t); ok {
		return v.(*typeInfo)
	}
	info := classify(t)
	infoCache.Store(t, info)
	return info
}

func classify(t reflect.Type) *typeInfo {
	if t == timeType {
		return &typeInfo{special: specialTime}
	}
	pt := reflect.PointerTo(t)
	for _, name := range []string{"EncodeMsgpack", "MarshalMsgpack"} {
		if _, ok := pt.MethodByName(name); ok {
			return &typeInfo{special: specialRefused, reason: fmt.Sprintf(
				"the type encodes itself for msgpack (%s), which Encode cannot read; fingerprint a plain value (a map or struct of basic types) instead", name)}
		}
	}
	switch {
	case t.Implements(binaryMarshalerType):
		return &typeInfo{special: specialBinary}
	case t.Implements(textMarshalerType):
		return &typeInfo{special: specialText}
	case pt.Implements(binaryMarshalerType):
		return &typeInfo{special: specialBinary}
	case pt.Implements(textMarshalerType):
		return &typeInfo{special: specialText}
	}
	return &typeInfo{}
}

// structPlan is how a struct type is encoded: as a map of its fields, in
// the order of their key encodings, or refused.
type structPlan struct {
	fields []planField
	omits  bool // some field is omitempty

	err      string // the reason the type is refused, if it is
	errField string // the Go field the reason is about, if any
}

type planField struct {
	name      string // the key the codec stores the field under
	key       []byte // the encoding of name
	index     []int
	omitEmpty bool
	goName    string // dotted through embedded structs, for messages
}

func (f *planField) omitted(strct reflect.Value) bool {
	return f.omitEmpty && isEmpty(strct.FieldByIndex(f.index))
}

func planOf(t reflect.Type) *structPlan {
	if v, ok := planCache.Load(t); ok {
		return v.(*structPlan)
	}
	p := buildPlan(t)
	planCache.Store(t, p)
	return p
}

type planError struct{ field, reason string }

func buildPlan(t reflect.Type) *structPlan {
	var fields []planField
	if err := collect(t, nil, "", &fields); err != nil {
		return &structPlan{err: err.reason, errField: err.field}
	}
	byName := make(map[string]string, len(fields))
	p := &structPlan{}
	for i := range fields {
		f := &fields[i]
		if other, dup := byName[f.name]; dup {
			return &structPlan{err: fmt.Sprintf(
				"fields %s and %s are both stored under the key %q, so one hides the other; rename one (a msgpack or json tag)", other, f.goName, f.name)}
		}
		byName[f.name] = f.goName
		e := encoder{}
		_ = e.str(f.name)
		f.key = e.buf
		p.omits = p.omits || f.omitEmpty
	}
	slices.SortFunc(fields, func(a, b planField) int { return strings.Compare(string(a.key), string(b.key)) })
	p.fields = fields
	return p
}

// collect appends the fields of t that the codec stores, naming them as it
// does: the msgpack tag, else the json tag, else the Go name. It refuses
// what the codec would silently drop or where its rules and encoding/json's
// part ways.
func collect(t reflect.Type, index []int, prefix string, out *[]planField) *planError {
	for i := range t.NumField() {
		f := t.Field(i)
		goName := prefix + f.Name
		tag := f.Tag.Get("msgpack")
		if tag == "" {
			tag = f.Tag.Get("json")
		}
		name, opts, bad := parseTag(tag)
		if name == "-" {
			continue // the codec leaves it out, and says so in the source
		}
		if f.Name == "_msgpack" {
			return &planError{goName, "a _msgpack field changes how the codec lays the struct out (as an array, or omitting empty fields); fingerprint a plain struct"}
		}
		if bad != "" {
			return &planError{goName, bad}
		}
		if opts["intern"] {
			return &planError{goName, "the intern option changes the codec's encoding of the field; drop it"}
		}
		if f.Anonymous {
			ft := f.Type
			switch {
			case tag != "":
				return &planError{goName, "an embedded field with a tag is inlined by the codec but nested by encoding/json; give it a field name, or drop the tag"}
			case ft.Kind() == reflect.Pointer:
				return &planError{goName, "an embedded pointer is refused: the codec stores a nil one as nil fields, an absent one for omitempty; embed the struct by value or give it a field name"}
			case ft.Kind() != reflect.Struct:
				return &planError{goName, "an embedded field of a non-struct type is refused; give it a field name"}
			case infoOf(ft).special != specialNone:
				return &planError{goName, "an embedded time or marshaler type is refused: the codec does not inline it; give it a field name"}
			}
			if err := collect(ft, append(slices.Clone(index), i), goName+".", out); err != nil {
				return err
			}
			continue
		}
		if !f.IsExported() {
			if f.Type.Size() == 0 {
				continue // holds nothing, so nothing is lost
			}
			return &planError{goName, fmt.Sprintf(
				"unexported field %s is left out by the codec, so a change to it would not change the fingerprint; export it, or tag it `msgpack:\"-\"` to say it is not state", f.Name)}
		}
		if name == "" {
			name = f.Name
		}
		*out = append(*out, planField{
			name:      name,
			index:     append(slices.Clone(index), i),
			omitEmpty: opts["omitempty"],
			goName:    goName,
		})
	}
	return nil
}

// parseTag splits a struct tag value into the name and options, as the
// codec's tag parser does for the tags it reads the same way; bad is set for
// tags its parser reads specially (quotes, escapes, brackets, a colon in the
// name), where a plain split could disagree with it.
func parseTag(tag string) (name string, opts map[string]bool, bad string) {
	if tag == "" {
		return "", nil, ""
	}
	if strings.ContainsAny(tag, `'\(`) {
		return "", nil, fmt.Sprintf("tag %q uses quotes, escapes or brackets, which the codec parses specially; simplify it", tag)
	}
	parts := strings.Split(tag, ",")
	name = strings.TrimSpace(parts[0])
	if strings.Contains(name, ":") {
		return "", nil, fmt.Sprintf("tag %q has a colon in its name, which the codec reads as an option; simplify it", tag)
	}
	for _, o := range parts[1:] {
		o = strings.TrimSpace(o)
		if k, _, ok := strings.Cut(o, ":"); ok {
			o = k
		}
		if opts == nil {
			opts = map[string]bool{}
		}
		opts[o] = true
	}
	return name, opts, ""
}

// isEmpty is the codec's test for omitempty: IsZero if the type has it, a
// zero length, false, zero, nil, or a struct all of whose fields are omitted.
func isEmpty(v reflect.Value) bool {
	for v.Kind() == reflect.Interface {
		if v.IsNil() {
			return true
		}
		v = v.Elem()
	}
	if v.Type().Implements(zeroerType) {
		if nilable(v.Kind()) && v.IsNil() {
			return true
		}
		return v.Interface().(interface{ IsZero() bool }).IsZero()
	}
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Struct:
		p := planOf(v.Type())
		if p.err != "" {
			return false // encode it, so that it is refused
		}
		for i := range p.fields {
			if !p.fields[i].omitted(v) {
				return false
			}
		}
		return true
	case reflect.Bool:
		return !v.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int() == 0
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return v.Uint() == 0
	case reflect.Float32, reflect.Float64:
		return v.Float() == 0
	case reflect.Pointer:
		return v.IsNil()
	}
	return false
}
