package codec

import (
	"fmt"
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// RegisterFast gives the struct types of samples (values or pointers) an
// encoder that writes exactly the bytes msgpack's own struct encoder writes
// (the same map, fields in declaration order, the same omitempty rule) but
// decides emptiness from each field's kind instead of boxing every field in
// an interface: msgpack's check allocates for each omitempty field that is
// not pointer-shaped, which made it most of a run state's encoding cost.
//
// Only for goreactor's own unexported state types, whose fields carry plain
// tags: a type with an embedded field, or a tag option other than
// omitempty, panics here. Decoding is msgpack's own.
func RegisterFast(samples ...any) {
	for _, s := range samples {
		t := reflect.TypeOf(s)
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		fs := fastFieldsOf(t)
		msgpack.Register(reflect.New(t).Elem().Interface(), func(e *msgpack.Encoder, v reflect.Value) error {
			return fs.encode(e, v)
		}, nil)
	}
}

type fastField struct {
	name      string
	index     int
	omitEmpty bool
	empty     func(reflect.Value) bool
}

type fastFields struct {
	typ    reflect.Type
	fields []fastField
}

var fastCache sync.Map // reflect.Type -> *fastFields

func fastFieldsOf(t reflect.Type) *fastFields {
	if fs, ok := fastCache.Load(t); ok {
		return fs.(*fastFields)
	}
	if t.Kind() != reflect.Struct {
		panic(fmt.Sprintf("codec: RegisterFast: %s is not a struct", t))
	}
	fs := &fastFields{typ: t}
	// Stored before its fields are built: a type that contains itself
	// (through a map or a pointer) finds its entry.
	fastCache.Store(t, fs)
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("msgpack")
		if tag == "" {
			tag = f.Tag.Get("json") // codec's fallback tag (Marshal)
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous || f.Name == "_msgpack" {
			panic(fmt.Sprintf("codec: RegisterFast: %s.%s: embedded fields and struct options are not supported", t, f.Name))
		}
		if !f.IsExported() {
			continue
		}
		ff := fastField{name: name, index: i}
		if ff.name == "" {
			ff.name = f.Name
		}
		for o := range strings.SplitSeq(opts, ",") {
			switch o {
			case "":
			case "omitempty":
				ff.omitEmpty = true
			default:
				panic(fmt.Sprintf("codec: RegisterFast: %s.%s: tag option %q is not supported", t, f.Name, o))
			}
		}
		if ff.omitEmpty {
			ff.empty = emptyFunc(f.Type)
		}
		fs.fields = append(fs.fields, ff)
	}
	return fs
}

func (fs *fastFields) encode(e *msgpack.Encoder, v reflect.Value) error {
	var buf [64]bool
	keep := buf[:0]
	if len(fs.fields) > len(buf) {
		keep = make([]bool, 0, len(fs.fields))
	}
	n := 0
	for _, f := range fs.fields {
		k := !f.omitEmpty || !f.empty(v.Field(f.index))
		keep = append(keep, k)
		if k {
			n++
		}
	}
	if err := e.EncodeMapLen(n); err != nil {
		return err
	}
	for i, f := range fs.fields {
		if !keep[i] {
			continue
		}
		if err := e.EncodeString(f.name); err != nil {
			return err
		}
		if err := e.EncodeValue(v.Field(f.index)); err != nil {
			return err
		}
	}
	return nil
}

// isZeroer is the interface msgpack consults before a field's kind.
type isZeroer interface{ IsZero() bool }

var isZeroerType = reflect.TypeFor[isZeroer]()

// emptyFunc returns msgpack's omitempty test for values of type t, decided
// once per type where msgpack decides it per value.
func emptyFunc(t reflect.Type) func(reflect.Value) bool {
	k := t.Kind()
	nilable := k == reflect.Pointer || k == reflect.Map || k == reflect.Slice ||
		k == reflect.Interface || k == reflect.Chan || k == reflect.Func
	switch {
	case k == reflect.Interface:
		return func(v reflect.Value) bool { return slowEmpty(v) }
	case t.Implements(isZeroerType):
		return func(v reflect.Value) bool {
			return nilable && v.IsNil() || v.Interface().(isZeroer).IsZero()
		}
	}
	switch k {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return func(v reflect.Value) bool { return v.Len() == 0 }
	case reflect.Struct:
		fs := fastFieldsOf(t) // now: an unsupported type panics at registration
		return func(v reflect.Value) bool {
			for _, f := range fs.fields {
				if !f.omitEmpty || !f.empty(v.Field(f.index)) {
					return false
				}
			}
			return true
		}
	case reflect.Bool:
		return func(v reflect.Value) bool { return !v.Bool() }
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return func(v reflect.Value) bool { return v.Int() == 0 }
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return func(v reflect.Value) bool { return v.Uint() == 0 }
	case reflect.Float32, reflect.Float64:
		return func(v reflect.Value) bool { return v.Float() == 0 }
	case reflect.Pointer:
		return func(v reflect.Value) bool { return v.IsNil() }
	default:
		return func(reflect.Value) bool { return false }
	}
}

// slowEmpty is msgpack's test for an interface-typed field: its dynamic
// value's, decided per value.
func slowEmpty(v reflect.Value) bool {
	for v.Kind() == reflect.Interface {
		if v.IsNil() {
			return true
		}
		v = v.Elem()
	}
	return emptyFunc(v.Type())(v)
}
