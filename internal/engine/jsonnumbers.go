package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// Numbers from JSON. A map decoded by encoding/json holds every number as a
// float64, or as a json.Number (a string) when the decoder had UseNumber;
// neither decodes into an integer as it is. Before a run's inputs are
// encoded, fitNumbers converts such numbers where the declared input type
// wants a number, walking into struct fields, map values and list elements
// as far as the given value is a map[string]any or an []any:
//
//   - an integer type takes a float64 (or float32) that is a whole number in
//     the type's range and smaller in magnitude than 2^53: from there on a
//     float64 no longer tells neighbouring integers apart, so the JSON text
//     may have been rounded on the way in (decode with UseNumber for larger
//     values);
//   - an integer type takes a json.Number that is a whole number in the
//     type's range, written in any JSON form ("2", "2.0", "2e3");
//   - a float type takes a json.Number in the type's range, and float32
//     takes a float64 in its range (rounded to the nearest float32, as
//     encoding/json does);
//   - anything else is refused with a reason: not a whole number, out of
//     range, not a number.
//
// Other values, and values under a type that decodes itself (a
// DecodeMsgpack method), an interface or Raw, are left as they are.

// maxExactFloat is 2^53: a float64 below it in magnitude that is a whole
// number was decoded from exactly that integer; 2^53 itself may have been
// 2^53+1.
const maxExactFloat = 1 << 53

var (
	customDecoderType = reflect.TypeFor[msgpack.CustomDecoder]()
	unmarshalerType   = reflect.TypeFor[msgpack.Unmarshaler]()
)

// numberError says why a number given for a numeric type was refused.
type numberError struct {
	// path leads to the value: struct fields, list indexes, and map keys,
	// marked with mapKeyMark (a key is data, and not shown for a
	// sensitive input).
	path []string
	want reflect.Type
	got  string // as describeEncoded puts it: `float 2.5`, `number "2.5"`
	why  string
}

func (e *numberError) message(sensitive bool) string {
	got := e.got
	if sensitive {
		got = redactKind(got)
	}
	m := fmt.Sprintf("want %s, got %s: %s", e.want, got, e.why)
	if len(e.path) > 0 {
		path := make([]string, len(e.path))
		for i, p := range e.path {
			key, isKey := strings.CutPrefix(p, mapKeyMark)
			if isKey && sensitive {
				key = "(a key)"
			}
			path[i] = key
		}
		m = fmt.Sprintf("field %q: %s", strings.Join(path, "."), m)
	}
	return m
}

// mapKeyMark starts a map key's segment in numberError's path.
const mapKeyMark = "\x00"

// fitNumbers returns v with the JSON numbers in it converted for type t,
// or the first number that does not fit.
func fitNumbers(v any, t reflect.Type, path []string) (any, *numberError) {
	if v == nil || t == nil {
		return v, nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if pt := reflect.PointerTo(t); pt.Implements(customDecoderType) || pt.Implements(unmarshalerType) {
		return v, nil
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		switch x := v.(type) {
		case float64:
			return intFromFloat(x, t, path)
		case float32:
			return intFromFloat(float64(x), t, path)
		case json.Number:
			return intFromNumber(x, t, path)
		}
	case reflect.Float32, reflect.Float64:
		switch x := v.(type) {
		case json.Number:
			return floatFromNumber(x, t, path)
		case float64:
			if t.Kind() == reflect.Float32 {
				return float32FromFloat(x, t, path)
			}
		}
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return v, nil
		}
		out := make(map[string]any, len(m))
		for k, e := range m {
			if ft, ok := fieldType(t, k); ok {
				var err *numberError
				if e, err = fitNumbers(e, ft, append(slices.Clip(path), k)); err != nil {
					return nil, err
				}
			}
			out[k] = e
		}
		return out, nil
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return v, nil
		}
		out := make(map[string]any, len(m))
		for k, e := range m {
			var err *numberError
			if out[k], err = fitNumbers(e, t.Elem(), append(slices.Clip(path), mapKeyMark+k)); err != nil {
				return nil, err
			}
		}
		return out, nil
	case reflect.Slice, reflect.Array:
		l, ok := v.([]any)
		if !ok {
			return v, nil
		}
		out := make([]any, len(l))
		for i, e := range l {
			var err *numberError
			if out[i], err = fitNumbers(e, t.Elem(), append(slices.Clip(path), strconv.Itoa(i))); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	return v, nil
}

func isSigned(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return true
	}
	return false
}

// intRange describes t's range for a message: "-128 to 127".
func intRange(t reflect.Type) string {
	if isSigned(t) {
		b := t.Bits()
		return fmt.Sprintf("%d to %d", int64(-1)<<(b-1), int64(uint64(1)<<(b-1)-1))
	}
	return fmt.Sprintf("0 to %d", uint64(math.MaxUint64)>>(64-t.Bits()))
}

func intFromFloat(x float64, t reflect.Type, path []string) (any, *numberError) {
	refuse := func(why string) (any, *numberError) {
		return nil, &numberError{path: path, want: t, got: fmt.Sprintf("float %v", x), why: why}
	}
	switch {
	case math.IsNaN(x):
		return refuse("not a number")
	case math.IsInf(x, 0):
		return refuse(fmt.Sprintf("out of range for %s (%s)", t, intRange(t)))
	case x != math.Trunc(x):
		return refuse("not a whole number")
	}
	b := t.Bits()
	if isSigned(t) {
		limit := math.Ldexp(1, b-1)
		if x < -limit || x >= limit {
			return refuse(fmt.Sprintf("out of range for %s (%s)", t, intRange(t)))
		}
	} else if x < 0 || x >= math.Ldexp(1, b) {
		return refuse(fmt.Sprintf("out of range for %s (%s)", t, intRange(t)))
	}
	if math.Abs(x) >= maxExactFloat {
		return refuse("2^53 or more, where a float64 no longer tells neighbouring integers apart and the JSON text may have been rounded; decode the JSON with UseNumber")
	}
	if isSigned(t) {
		return int64(x), nil
	}
	return uint64(x), nil
}

func intFromNumber(n json.Number, t reflect.Type, path []string) (any, *numberError) {
	refuse := func(why string) (any, *numberError) {
		return nil, &numberError{path: path, want: t, got: fmt.Sprintf("number %q", string(n)), why: why}
	}
	outOfRange := func() (any, *numberError) {
		return refuse(fmt.Sprintf("out of range for %s (%s)", t, intRange(t)))
	}
	neg, digits, scale, ok := parseJSONNumber(string(n))
	switch {
	case !ok:
		return refuse("not a number")
	case digits == "":
		if isSigned(t) {
			return int64(0), nil
		}
		return uint64(0), nil
	case scale < 0:
		return refuse("not a whole number")
	case len(digits)+scale > 20: // more digits than any 64-bit integer has
		return outOfRange()
	}
	s := digits + strings.Repeat("0", scale)
	if isSigned(t) {
		if neg {
			s = "-" + s
		}
		i, err := strconv.ParseInt(s, 10, t.Bits())
		if err != nil {
			return outOfRange()
		}
		return i, nil
	}
	if neg {
		return outOfRange()
	}
	u, err := strconv.ParseUint(s, 10, t.Bits())
	if err != nil {
		return outOfRange()
	}
	return u, nil
}

func floatFromNumber(n json.Number, t reflect.Type, path []string) (any, *numberError) {
	refuse := func(why string) (any, *numberError) {
		return nil, &numberError{path: path, want: t, got: fmt.Sprintf("number %q", string(n)), why: why}
	}
	if _, _, _, ok := parseJSONNumber(string(n)); !ok {
		return refuse("not a number")
	}
	f, err := strconv.ParseFloat(string(n), t.Bits())
	if err != nil {
		return refuse(fmt.Sprintf("out of range for %s", t))
	}
	if t.Kind() == reflect.Float32 {
		return float32(f), nil
	}
	return f, nil
}

func float32FromFloat(x float64, t reflect.Type, path []string) (any, *numberError) {
	if math.Abs(x) > math.MaxFloat32 && !math.IsInf(x, 0) {
		return nil, &numberError{path: path, want: t, got: fmt.Sprintf("float %v", x), why: fmt.Sprintf("out of range for %s", t)}
	}
	return float32(x), nil
}

// parseJSONNumber reads s, a number in JSON's syntax, as its sign, its
// significant digits with no leading or trailing zeros ("" for zero), and
// the power of ten they are scaled by: "-2.50e3" is (true, "25", 2).
// Nothing is computed from the exponent but that count, so a number like
// "1e999999999" costs no more than any other. ok is false when s is not a
// JSON number.
func parseJSONNumber(s string) (neg bool, digits string, scale int, ok bool) {
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	intPart := leadingDigits(s)
	if intPart == "" || (len(intPart) > 1 && intPart[0] == '0') {
		return false, "", 0, false
	}
	s = s[len(intPart):]
	var frac string
	if strings.HasPrefix(s, ".") {
		frac = leadingDigits(s[1:])
		if frac == "" {
			return false, "", 0, false
		}
		s = s[1+len(frac):]
	}
	exp := 0
	if s != "" {
		if s[0] != 'e' && s[0] != 'E' {
			return false, "", 0, false
		}
		s = s[1:]
		expNeg := false
		if s != "" && (s[0] == '+' || s[0] == '-') {
			expNeg, s = s[0] == '-', s[1:]
		}
		e := leadingDigits(s)
		if e == "" || e != s {
			return false, "", 0, false
		}
		// Past a few digits the exponent's size is all that matters: the
		// value is out of any range, or not whole.
		e = strings.TrimLeft(e, "0")
		if len(e) > 6 {
			e = "1000000"
		}
		exp, _ = strconv.Atoi("0" + e)
		if expNeg {
			exp = -exp
		}
	}
	digits = strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return neg, "", 0, true
	}
	scale = exp - len(frac)
	trimmed := strings.TrimRight(digits, "0")
	scale += len(digits) - len(trimmed)
	return neg, trimmed, scale, true
}

func leadingDigits(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}
