package fingerprint

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// FuzzEncodingIsInjective builds value trees from fuzz bytes and checks that
// Encode is a function of the state alone (one tree built with other Go
// types encodes alike), that it tells states apart exactly when an
// independent equality does, that it refuses only what is ambiguous, and
// that a test-only decoder parses every encoding back to the same state,
// which re-encodes to the same bytes, consuming exactly the encoding even
// with another one after it (a parseable, prefix-free encoding is
// injective).
func FuzzEncodingIsInjective(f *testing.F) {
	f.Add([]byte{}, []byte{}, uint64(0))
	f.Add([]byte{7, 2, 5, 2, 0, 1, 5, 1, 2}, []byte{7, 2, 5, 1, 0, 5, 2, 1, 2}, uint64(1)) // ["ab","c"] vs ["a","bc"]
	f.Add([]byte{2, 1}, []byte{4, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0}, uint64(2))                // 1 vs 1.0
	f.Add([]byte{8, 1, 5, 1, 0, 0}, []byte{8, 0}, uint64(3))                               // {"a": nil} vs {}
	f.Add([]byte{8, 2, 2, 1, 1, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0}, []byte{8, 1, 2, 1, 1, 1}, uint64(4))
	f.Add([]byte{7, 2, 7, 1, 2, 1, 7, 1, 2, 2}, []byte{7, 1, 7, 2, 2, 1, 2, 2}, uint64(5))    // [[1],[2]] vs [[1,2]]
	f.Add([]byte{4, 0x80, 0, 0, 0, 0, 0, 0, 0}, []byte{4, 0, 0, 0, 0, 0, 0, 0, 0}, uint64(6)) // -0 vs 0
	f.Add([]byte{6, 2, 0, 1}, []byte{5, 2, 0, 1}, uint64(7))                                  // bytes vs string
	f.Add([]byte{9, 1, 2, 3, 4, 5, 6, 7, 8}, []byte{9, 1, 2, 3, 4, 5, 6, 7, 9}, uint64(8))
	f.Fuzz(func(t *testing.T, x, y []byte, seed uint64) {
		a := generate(x, nil)
		a2 := generate(x, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
		b := generate(y, nil)

		ea, errA := Encode(a)
		ea2, errA2 := Encode(a2)
		eb, errB := Encode(b)
		for _, c := range []struct {
			v   any
			err error
		}{{a, errA}, {a2, errA2}, {b, errB}} {
			if amb := ambiguous(reflect.ValueOf(c.v)); amb != (c.err != nil) {
				t.Fatalf("value %#v: ambiguous=%v but Encode error=%v", c.v, amb, c.err)
			}
		}
		if errA != nil {
			return
		}
		if !bytes.Equal(ea, ea2) {
			t.Fatalf("one state, two encodings:\n%#v -> %s\n%#v -> %s", a, ea, a2, ea2)
		}
		checkDecodes(t, a, ea)
		if _, err := Format(ea); err != nil {
			t.Fatalf("Format(%s): %v", ea, err)
		}
		if errB != nil {
			return
		}
		if same := canonEqual(reflect.ValueOf(a), reflect.ValueOf(b)); same != bytes.Equal(ea, eb) {
			t.Fatalf("equal=%v but encodings equal=%v:\n%#v -> %s\n%#v -> %s", same, !same, a, ea, b, eb)
		}
		// Prefix-free: the decoder stops exactly at the end of the first encoding.
		d := decoder{data: append(append([]byte{}, ea...), eb...)}
		if _, err := d.value(); err != nil || d.pos != len(ea) {
			t.Fatalf("decoding %s%s stopped at %d (%v), want %d", ea, eb, d.pos, err, len(ea))
		}
	})
}

func checkDecodes(t *testing.T, v any, enc []byte) {
	t.Helper()
	d := decoder{data: enc}
	back, err := d.value()
	if err != nil || d.pos != len(enc) {
		t.Fatalf("decoding %s: %v (stopped at %d of %d)", enc, err, d.pos, len(enc))
	}
	re, err := Encode(back)
	if err != nil || !bytes.Equal(re, enc) {
		t.Fatalf("%s decodes to %#v, which encodes as %s (%v)", enc, back, re, err)
	}
	if !canonEqual(reflect.ValueOf(v), reflect.ValueOf(back)) {
		t.Fatalf("%#v encodes as %s, which decodes to the different %#v", v, enc, back)
	}
}

func TestDecoderRoundTrips(t *testing.T) {
	t.Parallel()
	for i := range 2000 {
		r := rand.New(rand.NewPCG(uint64(i), 1))
		in := make([]byte, r.IntN(64))
		for j := range in {
			in[j] = byte(r.Uint32())
		}
		v := generate(in, nil)
		if enc, err := Encode(v); err == nil {
			checkDecodes(t, v, enc)
		}
	}
}

// --- generator -------------------------------------------------------------

// source hands out fuzz bytes, then zeros.
type source struct {
	b []byte
	i int
}

func (s *source) byte() byte {
	if s.i >= len(s.b) {
		return 0
	}
	s.i++
	return s.b[s.i-1]
}

func (s *source) uint64() uint64 {
	var u uint64
	for range 8 {
		u = u<<8 | uint64(s.byte())
	}
	return u
}

// Characters that make near collisions likely: the encoding's own tags and
// delimiters, digits, and two letters.
const alphabet = "ab;:[]{}01snlmxfFTt\x00"

type (
	namedString string
	namedBytes  []byte
)

// generate builds a value from data. With alt nil every choice of Go type is
// fixed; with alt set, alt picks among Go types carrying the same state, so
// generate(data, nil) and generate(data, alt) are always one state.
func generate(data []byte, alt *rand.Rand) any {
	return gen(&source{b: data}, alt, 0)
}

func pick(alt *rand.Rand, options ...any) any {
	if alt == nil {
		return options[0]
	}
	return options[alt.IntN(len(options))]
}

func gen(s *source, alt *rand.Rand, depth int) any {
	op := s.byte() % 10
	if depth >= 4 && (op == 7 || op == 8) {
		op = 5
	}
	switch op {
	case 0:
		return pick(alt, nil, (*int)(nil), []any(nil), map[string]any(nil), []byte(nil))
	case 1:
		return s.byte()&1 == 1
	case 2:
		return anyInt(alt, big.NewInt(int64(int8(s.byte()))))
	case 3:
		u := s.uint64()
		if s.byte()&1 == 1 {
			return anyInt(alt, big.NewInt(int64(u)))
		}
		return anyInt(alt, new(big.Int).SetUint64(u))
	case 4:
		f := math.Float64frombits(s.uint64())
		if math.IsNaN(f) || math.IsInf(f, 0) {
			f = float64(int8(s.byte())) / 4
		}
		if float64(float32(f)) == f {
			return pick(alt, f, float32(f), &f)
		}
		return pick(alt, f, &f)
	case 5:
		str := string(genBytes(s))
		return pick(alt, str, namedString(str), &str)
	case 6:
		b := genBytes(s)
		arr := reflect.New(reflect.ArrayOf(len(b), reflect.TypeFor[byte]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(b))
		return pick(alt, b, namedBytes(b), arr.Interface())
	case 7:
		n := int(s.byte() % 4)
		list := make([]any, n)
		for i := range list {
			list[i] = gen(s, alt, depth+1)
		}
		arr := reflect.New(reflect.ArrayOf(n, reflect.TypeFor[any]())).Elem()
		reflect.Copy(arr, reflect.ValueOf(list))
		return pick(alt, list, arr.Interface(), &list)
	case 8:
		n := int(s.byte() % 4)
		m := map[any]any{}
		strKeys := map[string]any{}
		allStrings := true
		for range n {
			// Keys always get their fixed Go type, so that alt cannot merge
			// two keys Go tells apart (int8(1) and int64(1)) into one.
			k := genKey(s)
			v := gen(s, alt, depth+1)
			m[k] = v
			if str, ok := k.(string); ok {
				strKeys[str] = v
			} else {
				allStrings = false
			}
		}
		if allStrings && len(strKeys) == len(m) {
			return pick(alt, m, strKeys)
		}
		return m
	default:
		sec := int64(int32(uint32(s.uint64())))
		tm := time.Unix(sec, int64(s.byte())*3_900_000).UTC()
		return pick(alt, tm, tm.In(time.FixedZone("Z", int(sec%50_000))), tm.Local(), &tm)
	}
}

func genKey(s *source) any {
	switch s.byte() % 6 {
	case 0:
		return nil
	case 1:
		return s.byte()&1 == 1
	case 2:
		return int8(s.byte() % 4)
	case 3:
		return uint64(s.byte() % 4)
	case 4:
		return float64(s.byte()%4) / 2
	default:
		return string(genBytes(s))
	}
}

func genBytes(s *source) []byte {
	b := make([]byte, s.byte()%6)
	for i := range b {
		b[i] = alphabet[int(s.byte())%len(alphabet)]
	}
	return b
}

func anyInt(alt *rand.Rand, n *big.Int) any {
	opts := []any{}
	if n.IsInt64() {
		i := n.Int64()
		opts = append(opts, i)
		if i >= math.MinInt8 && i <= math.MaxInt8 {
			opts = append(opts, int8(i))
		}
		if i >= math.MinInt16 && i <= math.MaxInt16 {
			opts = append(opts, int16(i))
		}
		if i >= math.MinInt32 && i <= math.MaxInt32 {
			opts = append(opts, int32(i), int(i))
		}
	}
	if n.IsUint64() {
		u := n.Uint64()
		opts = append(opts, u)
		if u <= math.MaxUint8 {
			opts = append(opts, uint8(u))
		}
		if u <= math.MaxUint32 {
			opts = append(opts, uint32(u), uint(u))
		}
	}
	return pick(alt, opts...)
}

// --- the equality Encode must agree with, written without Encode -----------

// class names a value's canonical type and returns the value with pointers
// and interfaces followed.
func class(v reflect.Value) (string, reflect.Value) {
	for v.IsValid() && (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) {
		if v.IsNil() {
			return "nil", v
		}
		v = v.Elem()
	}
	if !v.IsValid() {
		return "nil", v
	}
	if v.Type() == reflect.TypeFor[time.Time]() {
		return "time", v
	}
	switch v.Kind() {
	case reflect.Bool:
		return "bool", v
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "int", v
	case reflect.Float32, reflect.Float64:
		return "float", v
	case reflect.String:
		return "string", v
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			return "nil", v
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return "bytes", v
		}
		return "list", v
	case reflect.Map:
		if v.IsNil() {
			return "nil", v
		}
		return "map", v
	}
	panic(fmt.Sprintf("class: unexpected %s", v.Type()))
}

func bigOf(v reflect.Value) *big.Int {
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return big.NewInt(v.Int())
	}
	return new(big.Int).SetUint64(v.Uint())
}

func bytesOf(v reflect.Value) []byte {
	b := make([]byte, v.Len())
	for i := range b {
		b[i] = byte(v.Index(i).Uint())
	}
	return b
}

func canonEqual(a, b reflect.Value) bool {
	ca, a := class(a)
	cb, b := class(b)
	if ca != cb {
		return false
	}
	switch ca {
	case "nil":
		return true
	case "bool":
		return a.Bool() == b.Bool()
	case "int":
		return bigOf(a).Cmp(bigOf(b)) == 0
	case "float":
		return a.Float() == b.Float() // -0 == 0
	case "string":
		return a.String() == b.String()
	case "bytes":
		return bytes.Equal(bytesOf(a), bytesOf(b))
	case "time":
		return a.Interface().(time.Time).Equal(b.Interface().(time.Time))
	case "list":
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !canonEqual(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case "map":
		if a.Len() != b.Len() {
			return false
		}
	next:
		for _, ka := range a.MapKeys() {
			for _, kb := range b.MapKeys() {
				if canonEqual(ka, kb) {
					if !canonEqual(a.MapIndex(ka), b.MapIndex(kb)) {
						return false
					}
					continue next
				}
			}
			return false
		}
		return true
	}
	panic(ca)
}

// ambiguous reports whether some map in v has two keys that are one state.
func ambiguous(v reflect.Value) bool {
	c, v := class(v)
	switch c {
	case "list":
		for i := range v.Len() {
			if ambiguous(v.Index(i)) {
				return true
			}
		}
	case "map":
		keys := v.MapKeys()
		for i, k := range keys {
			if ambiguous(k) || ambiguous(v.MapIndex(k)) {
				return true
			}
			for _, k2 := range keys[:i] {
				if canonEqual(k, k2) {
					return true
				}
			}
		}
	}
	return false
}

// --- a decoder written from the grammar, not from format.go ----------------

type decoder struct {
	data []byte
	pos  int
}

func (d *decoder) next() (byte, error) {
	if d.pos >= len(d.data) {
		return 0, fmt.Errorf("unexpected end")
	}
	d.pos++
	return d.data[d.pos-1], nil
}

func (d *decoder) upTo(end byte) (string, error) {
	start := d.pos
	for {
		c, err := d.next()
		if err != nil {
			return "", err
		}
		if c == end {
			return string(d.data[start : d.pos-1]), nil
		}
	}
}

func (d *decoder) count(end byte) (int, error) {
	s, err := d.upTo(end)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > len(d.data) {
		return 0, fmt.Errorf("bad count %q", s)
	}
	return n, nil
}

func (d *decoder) take(n int) ([]byte, error) {
	if n > len(d.data)-d.pos {
		return nil, fmt.Errorf("short")
	}
	d.pos += n
	return d.data[d.pos-n : d.pos], nil
}

func (d *decoder) value() (any, error) {
	tag, err := d.next()
	if err != nil {
		return nil, err
	}
	switch tag {
	case 'n':
		return nil, nil
	case 'T', 'F':
		return tag == 'T', nil
	case 'i':
		s, err := d.upTo(';')
		if err != nil {
			return nil, err
		}
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return i, nil
		}
		return strconv.ParseUint(s, 10, 64)
	case 'f':
		s, err := d.upTo(';')
		if err != nil {
			return nil, err
		}
		return strconv.ParseFloat(s, 64)
	case 's':
		n, err := d.count(':')
		if err != nil {
			return nil, err
		}
		b, err := d.take(n)
		return string(b), err
	case 'x':
		n, err := d.count(':')
		if err != nil {
			return nil, err
		}
		h, err := d.take(2 * n)
		if err != nil {
			return nil, err
		}
		return hex.DecodeString(string(h))
	case 't':
		s, err := d.upTo(';')
		if err != nil {
			return nil, err
		}
		return time.Parse(time.RFC3339Nano, s)
	case 'l':
		n, err := d.count('[')
		if err != nil {
			return nil, err
		}
		list := make([]any, n)
		for i := range list {
			if list[i], err = d.value(); err != nil {
				return nil, err
			}
		}
		if c, err := d.next(); err != nil || c != ']' {
			return nil, fmt.Errorf("list not closed")
		}
		return list, nil
	case 'm':
		n, err := d.count('{')
		if err != nil {
			return nil, err
		}
		m := make(map[any]any, n)
		for range n {
			k, err := d.value()
			if err != nil {
				return nil, err
			}
			if b, ok := k.([]byte); ok { // a Go map key needs a comparable type
				arr := reflect.New(reflect.ArrayOf(len(b), reflect.TypeFor[byte]())).Elem()
				reflect.Copy(arr, reflect.ValueOf(b))
				k = arr.Interface()
			}
			if k != nil && !reflect.TypeOf(k).Comparable() {
				return nil, fmt.Errorf("key %#v cannot key a Go map", k)
			}
			if m[k], err = d.value(); err != nil {
				return nil, err
			}
		}
		if c, err := d.next(); err != nil || c != '}' {
			return nil, fmt.Errorf("map not closed")
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown tag %q", tag)
}
