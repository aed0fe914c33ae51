package fingerprint

import (
	"bytes"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"time"
)

// The tags that open every encoded value. Each is one byte, none is a digit.
const (
	tagNil    = 'n'
	tagTrue   = 'T'
	tagFalse  = 'F'
	tagInt    = 'i' // i<decimal>;
	tagFloat  = 'f' // f<shortest decimal float64>;
	tagString = 's' // s<byte count>:<bytes>
	tagBytes  = 'x' // x<byte count>:<lowercase hex>
	tagList   = 'l' // l<count>[<value>...]
	tagMap    = 'm' // m<count>{<key><value>...}, keys ascending by encoding
	tagTime   = 't' // t<RFC 3339, UTC, nanoseconds>;
)

// Prefix opens every fingerprint Of returns, so that a fingerprint made by
// another algorithm never compares equal to one made by this one.
const Prefix = "sha256:"

// Encode returns the canonical encoding of v: equal states give equal bytes
// and different states give different bytes, whichever Go types carry them.
// See the package documentation for the rules. A value Encode cannot encode
// unambiguously is refused with an *Error naming its path.
func Encode(v any) ([]byte, error) {
	e := encoder{buf: make([]byte, 0, 128)}
	if err := e.value(reflect.ValueOf(v)); err != nil {
		return nil, err
	}
	return e.buf, nil
}

// Of returns the fingerprint of v: Prefix followed by the hex SHA-256 of
// Encode(v).
func Of(v any) (string, error) {
	enc, err := Encode(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(enc)
	out := make([]byte, 0, len(Prefix)+2*len(sum))
	out = append(out, Prefix...)
	return string(hex.AppendEncode(out, sum[:])), nil
}

// Equal reports whether a and b encode alike, that is whether they are the
// same state. It fails if either is refused.
func Equal(a, b any) (bool, error) {
	ea, err := Encode(a)
	if err != nil {
		return false, err
	}
	eb, err := Encode(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ea, eb), nil
}

type encoder struct {
	buf  []byte
	path []segment
	// visiting holds the pointers, maps and slices on the way from the root
	// to the value being encoded: meeting one again is a cycle. Shared
	// values met on two different ways are fine and encoded twice.
	visiting map[visit]struct{}
}

type visit struct {
	ptr uintptr
	typ reflect.Type
	len int
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	errorType = reflect.TypeFor[error]()
)

func (e *encoder) fail(v reflect.Value, format string, args ...any) error {
	err := &Error{Path: renderPath(e.path), Reason: fmt.Sprintf(format, args...)}
	if v.IsValid() {
		err.Type = v.Type().String()
	}
	return err
}

func (e *encoder) value(v reflect.Value) error {
	for {
		if !v.IsValid() {
			e.buf = append(e.buf, tagNil)
			return nil
		}
		switch v.Kind() {
		case reflect.Interface:
			if v.IsNil() {
				e.buf = append(e.buf, tagNil)
				return nil
			}
			if v.Type() == errorType {
				// The codec stores a value declared as error by its message.
				if el := v.Elem(); nilable(el.Kind()) && el.IsNil() {
					return e.fail(el, "a typed nil error has no message to store; use a nil error")
				}
				return e.str(v.Interface().(error).Error())
			}
			v = v.Elem()
			continue
		case reflect.Pointer:
			if v.IsNil() {
				e.buf = append(e.buf, tagNil)
				return nil
			}
			return e.enter(v, visit{ptr: v.Pointer(), typ: v.Type()}, func() error {
				return e.value(v.Elem())
			})
		}
		break
	}

	switch info := infoOf(v.Type()); info.special {
	case specialTime:
		return e.time(v)
	case specialRefused:
		return e.fail(v, "%s", info.reason)
	case specialBinary, specialText:
		if nilable(v.Kind()) && v.IsNil() {
			e.buf = append(e.buf, tagNil)
			return nil
		}
		return e.marshal(v, info.special)
	}

	switch v.Kind() {
	case reflect.Bool:
		if v.Bool() {
			e.buf = append(e.buf, tagTrue)
		} else {
			e.buf = append(e.buf, tagFalse)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		e.buf = append(e.buf, tagInt)
		e.buf = strconv.AppendInt(e.buf, v.Int(), 10)
		e.buf = append(e.buf, ';')
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		e.buf = append(e.buf, tagInt)
		e.buf = strconv.AppendUint(e.buf, v.Uint(), 10)
		e.buf = append(e.buf, ';')
	case reflect.Uintptr:
		return e.fail(v, "uintptr is an address, not state; store it as uint64 if it really is a number")
	case reflect.Float32, reflect.Float64:
		return e.float(v)
	case reflect.Complex64, reflect.Complex128:
		return e.fail(v, "complex numbers are refused (the codec cannot store them); store the real and imaginary parts")
	case reflect.String:
		return e.str(v.String())
	case reflect.Slice:
		if v.IsNil() {
			e.buf = append(e.buf, tagNil)
			return nil
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			e.bytes(v)
			return nil
		}
		if v.Len() == 0 {
			e.buf = append(e.buf, tagList, '0', '[', ']')
			return nil
		}
		return e.enter(v, visit{ptr: v.Pointer(), typ: v.Type(), len: v.Len()}, func() error {
			return e.list(v)
		})
	case reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			e.bytes(v)
			return nil
		}
		return e.list(v)
	case reflect.Map:
		if v.IsNil() {
			e.buf = append(e.buf, tagNil)
			return nil
		}
		return e.enter(v, visit{ptr: v.Pointer(), typ: v.Type()}, func() error {
			return e.mapValue(v)
		})
	case reflect.Struct:
		return e.structValue(v)
	case reflect.Func:
		return e.fail(v, "functions are not state")
	case reflect.Chan:
		return e.fail(v, "channels are not state")
	case reflect.UnsafePointer:
		return e.fail(v, "unsafe pointers are not state")
	default:
		return e.fail(v, "kind %s is not supported", v.Kind())
	}
	return nil
}

// enter encodes a pointer, map or slice through fn, refusing it if it is
// already being encoded further up.
func (e *encoder) enter(v reflect.Value, key visit, fn func() error) error {
	if e.visiting == nil {
		e.visiting = make(map[visit]struct{})
	}
	if _, ok := e.visiting[key]; ok {
		return e.fail(v, "cycle: this value contains itself")
	}
	e.visiting[key] = struct{}{}
	err := fn()
	delete(e.visiting, key)
	return err
}

func (e *encoder) float(v reflect.Value) error {
	f := v.Float()
	switch {
	case math.IsNaN(f):
		return e.fail(v, "NaN is refused: it is not equal to itself, so no state holding it can be compared")
	case math.IsInf(f, 0):
		return e.fail(v, "%v is refused: store a sentinel the application understands", f)
	case f == 0:
		f = 0 // -0 and +0 are one state (see the package doc)
	}
	e.buf = append(e.buf, tagFloat)
	e.buf = strconv.AppendFloat(e.buf, f, 'g', -1, 64)
	e.buf = append(e.buf, ';')
	return nil
}

func (e *encoder) str(s string) error {
	e.buf = append(e.buf, tagString)
	e.buf = strconv.AppendInt(e.buf, int64(len(s)), 10)
	e.buf = append(e.buf, ':')
	e.buf = append(e.buf, s...)
	return nil
}

func (e *encoder) rawBytes(b []byte) {
	e.buf = append(e.buf, tagBytes)
	e.buf = strconv.AppendInt(e.buf, int64(len(b)), 10)
	e.buf = append(e.buf, ':')
	e.buf = hex.AppendEncode(e.buf, b)
}

// bytes encodes a []byte-like slice or a byte array, named element types
// included, as the codec does.
func (e *encoder) bytes(v reflect.Value) {
	if v.Kind() == reflect.Slice && v.Type().Elem() == reflect.TypeFor[byte]() {
		e.rawBytes(v.Bytes())
		return
	}
	b := make([]byte, v.Len())
	for i := range b {
		b[i] = byte(v.Index(i).Uint())
	}
	e.rawBytes(b)
}

func (e *encoder) list(v reflect.Value) error {
	n := v.Len()
	e.buf = append(e.buf, tagList)
	e.buf = strconv.AppendInt(e.buf, int64(n), 10)
	e.buf = append(e.buf, '[')
	for i := range n {
		e.path = append(e.path, segment{kind: segIndex, index: i})
		if err := e.value(v.Index(i)); err != nil {
			return err
		}
		e.path = e.path[:len(e.path)-1]
	}
	e.buf = append(e.buf, ']')
	return nil
}

type entry struct{ keyStart, keyEnd, end int }

func (e *encoder) mapValue(v reflect.Value) error {
	n := v.Len()
	e.buf = append(e.buf, tagMap)
	e.buf = strconv.AppendInt(e.buf, int64(n), 10)
	e.buf = append(e.buf, '{')
	// Entries are encoded in iteration order, then put in key order.
	start := len(e.buf)
	entries := make([]entry, 0, n)
	it := v.MapRange()
	for it.Next() {
		ks := len(e.buf)
		e.path = append(e.path, segment{kind: segKey})
		if err := e.value(it.Key()); err != nil {
			return err
		}
		ke := len(e.buf)
		e.path[len(e.path)-1] = segment{kind: segValue, key: e.buf[ks:ke]}
		if err := e.value(it.Value()); err != nil {
			return err
		}
		e.path = e.path[:len(e.path)-1]
		entries = append(entries, entry{ks, ke, len(e.buf)})
	}
	buf := e.buf
	key := func(x entry) []byte { return buf[x.keyStart:x.keyEnd] }
	slices.SortFunc(entries, func(a, b entry) int { return bytes.Compare(key(a), key(b)) })
	for i := 1; i < len(entries); i++ {
		if bytes.Equal(key(entries[i-1]), key(entries[i])) {
			e.path = append(e.path, segment{kind: segValue, key: key(entries[i])})
			txt, _ := formatCompact(key(entries[i]))
			return e.fail(v, "two keys of this map encode alike (as %s): a reader of the stored state sees one key, so the map is ambiguous", txt)
		}
	}
	region := slices.Clone(buf[start:])
	e.buf = buf[:start]
	for _, x := range entries {
		e.buf = append(e.buf, region[x.keyStart-start:x.end-start]...)
	}
	e.buf = append(e.buf, '}')
	return nil
}

func (e *encoder) structValue(v reflect.Value) error {
	plan := planOf(v.Type())
	if plan.err != "" {
		if plan.errField != "" {
			e.path = append(e.path, segment{kind: segField, name: plan.errField})
		}
		return e.fail(v, "%s", plan.err)
	}
	n := len(plan.fields)
	if plan.omits {
		for i := range plan.fields {
			if plan.fields[i].omitted(v) {
				n--
			}
		}
	}
	e.buf = append(e.buf, tagMap)
	e.buf = strconv.AppendInt(e.buf, int64(n), 10)
	e.buf = append(e.buf, '{')
	for i := range plan.fields {
		f := &plan.fields[i]
		if plan.omits && f.omitted(v) {
			continue
		}
		e.buf = append(e.buf, f.key...)
		e.path = append(e.path, segment{kind: segField, name: f.name})
		if err := e.value(v.FieldByIndex(f.index)); err != nil {
			return err
		}
		e.path = e.path[:len(e.path)-1]
	}
	e.buf = append(e.buf, '}')
	return nil
}

// Years outside 1..9999 have no four-digit RFC 3339 form.
func (e *encoder) time(v reflect.Value) error {
	t := v.Interface().(time.Time).UTC()
	if y := t.Year(); y < 1 || y > 9999 {
		return e.fail(v, "year %d is outside 1..9999, the years a time is encoded for", y)
	}
	e.buf = append(e.buf, tagTime)
	e.buf = t.AppendFormat(e.buf, time.RFC3339Nano)
	e.buf = append(e.buf, ';')
	return nil
}

// marshal encodes v the way the codec stores it: as bytes, those of
// MarshalBinary or of MarshalText (msgpack writes both as bin, so a reader
// gets []byte back either way).
func (e *encoder) marshal(v reflect.Value, how special) error {
	if !v.CanAddr() {
		c := reflect.New(v.Type()).Elem()
		c.Set(v)
		v = c
	}
	var (
		out []byte
		err error
	)
	if how == specialBinary {
		out, err = marshalerOf[encoding.BinaryMarshaler](v).MarshalBinary()
	} else {
		out, err = marshalerOf[encoding.TextMarshaler](v).MarshalText()
	}
	if err != nil {
		return e.fail(v, "the codec stores this type through its marshaler, which failed: %v", err)
	}
	e.rawBytes(out)
	return nil
}

func marshalerOf[M any](v reflect.Value) M {
	if m, ok := v.Interface().(M); ok {
		return m
	}
	return v.Addr().Interface().(M)
}

func nilable(k reflect.Kind) bool {
	switch k {
	case reflect.Chan, reflect.Func, reflect.Interface, reflect.Map, reflect.Pointer, reflect.Slice:
		return true
	}
	return false
}
