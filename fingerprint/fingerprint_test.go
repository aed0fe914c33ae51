package fingerprint

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func mustEncode(t *testing.T, v any) string {
	t.Helper()
	enc, err := Encode(v)
	require.NoError(t, err, "value %#v", v)
	return string(enc)
}

func TestEncodingGrammar(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		v    any
		want string
	}{
		{"nil", nil, "n"},
		{"true", true, "T"},
		{"false", false, "F"},
		{"int", -7, "i-7;"},
		{"max uint64", uint64(math.MaxUint64), "i18446744073709551615;"},
		{"min int64", int64(math.MinInt64), "i-9223372036854775808;"},
		{"float", 2.5, "f2.5;"},
		{"integral float", 1.0, "f1;"},
		{"big float", 1e21, "f1e+21;"},
		{"negative zero", math.Copysign(0, -1), "f0;"},
		{"string", "héllo", "s6:héllo"},
		{"empty string", "", "s0:"},
		{"bytes", []byte("ab"), "x2:6162"},
		{"byte array", [2]byte{'a', 'b'}, "x2:6162"},
		{"list", []any{1, "a"}, "l2[i1;s1:a]"},
		{"map", map[string]any{"id": "o1", "qty": []any{1, 2.5}}, "m2{s2:ids2:o1s3:qtyl2[i1;f2.5;]}"},
		{"time", time.Date(2026, 12, 1, 14, 4, 5, 120, time.UTC), "t2026-12-01T14:04:05.00000012Z;"},
		{"zero time", time.Time{}, "t0001-01-01T00:00:00Z;"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, mustEncode(t, c.v))
		})
	}
}

// Values that must all encode differently from one another.
func TestNearCollisionsDiffer(t *testing.T) {
	t.Parallel()
	groups := []struct {
		name   string
		values []any
	}{
		{"split strings", []any{[]string{"ab", "c"}, []string{"a", "bc"}, []string{"abc"}, []string{"a", "b", "c"}}},
		{"one of each type", []any{1, 1.0, "1", true, []byte("1"), nil, []any{1}, map[string]any{"1": nil},
			time.Unix(1, 0), []any{"1"}, []any{true}}},
		{"nil vs absent key", []any{map[string]any{"a": nil}, map[string]any{}, map[string]any{"b": nil}}},
		{"nil vs empty", []any{[]any(nil), []any{}, map[string]any{}, "", []byte{}, 0, false}},
		{"nested lists", []any{[]any{[]any{1}, []any{2}}, []any{[]any{1, 2}}, []any{1, 2}, []any{[]any{1}, 2}}},
		{"delimiters in strings", []any{
			[]string{"a;", "b"}, []string{"a", ";b"}, []string{"s1:a"}, []string{"s1:", "a"},
			[]string{"]", ""}, []string{"", "]"}, map[string]any{"a": "s1:b"}, map[string]any{"as1:b": ""},
			map[string]any{"a}": "{"}, map[string]any{"a": "}{"}, "l1[n]", []any{nil}, "m0{}", map[string]any{},
			"i1;", "f1;", "x1:31", "n",
		}},
		{"maps vs lists of pairs", []any{map[string]any{"a": "b"}, []any{"a", "b"}, []any{[]any{"a", "b"}}}},
		{"float precision", []any{float32(0.1), 0.1, 1.0, 1.0000000000000002}},
		{"signs", []any{-1, uint64(math.MaxUint64), int64(math.MaxInt64), int64(math.MinInt64)}},
		{"instants", []any{time.Unix(0, 0), time.Unix(0, 1), time.Unix(1, 0)}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			seen := map[string]int{}
			for i, v := range g.values {
				enc := mustEncode(t, v)
				if j, dup := seen[enc]; dup {
					t.Fatalf("values %d (%#v) and %d (%#v) both encode as %s", j, g.values[j], i, v, enc)
				}
				seen[enc] = i
			}
		})
	}
}

type myInt int16

type flags uint8

// Values that must all encode alike.
func TestSameStateEncodesAlike(t *testing.T) {
	t.Parallel()
	x := 7
	instant := time.Date(2026, 3, 1, 12, 0, 0, 5, time.UTC)
	groups := []struct {
		name   string
		values []any
	}{
		{"int widths", []any{int8(7), int16(7), int32(7), int64(7), 7, uint8(7), uint16(7), uint32(7), uint64(7),
			uint(7), myInt(7), flags(7), &x}},
		{"negative widths", []any{int8(-1), int16(-1), int32(-1), int64(-1), -1}},
		{"float widths", []any{float32(1.5), 1.5}},
		{"signed zero", []any{0.0, math.Copysign(0, -1), float32(math.Copysign(0, -1))}},
		{"nil", []any{nil, (*int)(nil), []int(nil), map[string]int(nil), []byte(nil), any(nil)}},
		{"bytes", []any{[]byte{1, 2}, [2]byte{1, 2}, [2]uint8{1, 2}}},
		{"list element types", []any{[]any{1, 2}, []int{1, 2}, [2]int8{1, 2}, []uint64{1, 2}}},
		{"map value types", []any{map[string]any{"a": 1}, map[string]int{"a": 1}, map[any]any{"a": uint8(1)}}},
		{"map key types", []any{map[int]string{1: "a", 2: "b"}, map[any]any{int8(1): "a", uint64(2): "b"}}},
		{"instant in zones", []any{instant, instant.In(time.FixedZone("X", 3600)), instant.Local(), &instant}},
		{"monotonic reading", func() []any { now := time.Now(); return []any{now, now.Round(0)} }()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel()
			want := mustEncode(t, g.values[0])
			for i, v := range g.values[1:] {
				require.Equal(t, want, mustEncode(t, v), "value %d: %#v", i+1, v)
			}
		})
	}
}

func TestMapOrderDoesNotMatter(t *testing.T) {
	t.Parallel()
	forward, backward := map[string]any{}, map[string]any{}
	for i := range 200 {
		forward[fmt.Sprint("k", i)] = i
		backward[fmt.Sprint("k", 199-i)] = 199 - i
	}
	want := mustEncode(t, forward)
	for range 50 { // Go randomises iteration order on every range
		require.Equal(t, want, mustEncode(t, forward))
		require.Equal(t, want, mustEncode(t, backward))
	}
}

type base struct {
	Tenant string `json:"tenant"`
}

type order struct {
	base
	ID       string    `json:"id"`
	Quantity int       `msgpack:"qty" json:"quantity"`
	Notes    []string  // Go name
	Coupon   string    `json:"coupon,omitempty"`
	Shipped  time.Time `msgpack:"shipped,omitempty"`
	Internal string    `msgpack:"-"`
	Skipped  string    `json:"-"`
	Err      error     `json:"err,omitempty"`
	_        struct{}
}

func TestStructEncodesLikeItsMap(t *testing.T) {
	t.Parallel()
	shipped := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name string
		s    order
		m    map[string]any
	}{
		{"omitempty fields absent",
			order{base: base{"t1"}, ID: "o1", Quantity: 3, Internal: "x", Skipped: "y"},
			map[string]any{"tenant": "t1", "id": "o1", "qty": int8(3), "Notes": nil}},
		{"omitempty fields present",
			order{ID: "o1", Notes: []string{"a"}, Coupon: "C", Shipped: shipped, Err: errors.New("boom")},
			map[string]any{"tenant": "", "id": "o1", "qty": 0, "Notes": []any{"a"}, "coupon": "C",
				"shipped": shipped, "err": "boom"}},
		{"empty list is not nil",
			order{Notes: []string{}},
			map[string]any{"tenant": "", "id": "", "qty": 0, "Notes": []any{}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, mustEncode(t, c.m), mustEncode(t, c.s))
			require.Equal(t, mustEncode(t, c.m), mustEncode(t, &c.s))
		})
	}
}

func TestMarshalersEncodeAsTheCodecStoresThem(t *testing.T) {
	t.Parallel()
	n, _ := new(big.Int).SetString("123456789012345678901234567890", 10)
	require.Equal(t, mustEncode(t, []byte("123456789012345678901234567890")), mustEncode(t, n))
	require.Equal(t, mustEncode(t, map[string]any{"N": []byte("5")}), mustEncode(t, struct{ N big.Int }{*big.NewInt(5)}))
	require.Equal(t, "n", mustEncode(t, (*big.Int)(nil)))
}

func TestSharedValueIsNotACycle(t *testing.T) {
	t.Parallel()
	shared := []int{1}
	m := map[string]int{"a": 1}
	p := &struct{ A int }{1}
	require.Equal(t, "l6[l1[i1;]l1[i1;]m1{s1:ai1;}m1{s1:ai1;}m1{s1:Ai1;}m1{s1:Ai1;}]",
		mustEncode(t, []any{shared, shared, m, m, p, p}))
}

type link struct {
	Name string
	Next *link
}

type secretive struct {
	Visible string
	secret  string
}

type wrapper struct {
	Inner secretive `json:"inner"`
}

type embedsPointer struct {
	*base
}

type embedsTagged struct {
	base `json:"base"`
}

type clash struct {
	A string `json:"x"`
	B string `msgpack:"x"`
}

type selfEncoding struct{ A int }

func (selfEncoding) EncodeMsgpack(any) error { return nil }

type item struct {
	Price float64 `json:"price"`
}

type cart struct {
	Items []item `json:"items"`
}

func TestRefused(t *testing.T) {
	t.Parallel()
	loop := &link{Name: "a"}
	loop.Next = &link{Name: "b", Next: loop}
	selfMap := map[string]any{"ok": 1}
	selfMap["self"] = selfMap
	selfSlice := []any{1, nil}
	selfSlice[1] = selfSlice
	deepMap := map[string]any{}
	deepMap["list"] = []any{map[string]any{"back": deepMap}}
	var ch chan int
	cases := []struct {
		name   string
		v      any
		path   string
		reason string
	}{
		{"NaN", map[string]any{"price": math.NaN()}, "$.price", "NaN"},
		{"+Inf", []any{0, 1, math.Inf(1)}, "$[2]", "+Inf"},
		{"-Inf in a struct", cart{Items: []item{{1}, {2}, {math.Inf(-1)}}}, "$.items[2].price", "-Inf"},
		{"float32 NaN", []float32{float32(math.NaN())}, "$[0]", "NaN"},
		{"func", map[string]any{"f": func() {}}, "$.f", "functions"},
		{"chan", map[string]any{"odd key": ch}, `$["odd key"]`, "channels"},
		{"unsafe pointer", []any{unsafe.Pointer(&ch)}, "$[0]", "unsafe"},
		{"uintptr", []any{uintptr(1)}, "$[0]", "uintptr"},
		{"complex", map[int]any{3: complex(1, 2)}, "$[3]", "complex"},
		{"cycle via pointer", loop, "$.Next.Next", "cycle"},
		{"cycle via map", selfMap, "$.self", "cycle"},
		{"cycle via slice", selfSlice, "$[1]", "cycle"},
		{"cycle via map and slice", deepMap, "$.list[0].back", "cycle"},
		{"unexported field", secretive{Visible: "v", secret: "s"}, "$.secret", "unexported field secret"},
		{"nested unexported field", []wrapper{{}}, "$[0].inner.secret", "unexported field secret"},
		{"ambiguous keys", map[any]any{int8(1): "a", int64(1): "b"}, "$[1]", "encode alike"},
		{"ambiguous float keys", map[any]any{float32(0.5): "a", 0.5: "b"}, "$[0.5]", "encode alike"},
		{"bad key", map[any]any{"ok": 1, math.NaN(): 2}, "${key}", "NaN"},
		{"year 10000", map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, "$.at", "year 10000"},
		{"year 0", map[string]any{"at": time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC)}, "$.at", "year 0"},
		{"negative year", []time.Time{time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC)}, "$[0]", "year -5"},
		{"embedded pointer", embedsPointer{}, "$.base", "embedded pointer"},
		{"embedded with a tag", embedsTagged{}, "$.base", "embedded field with a tag"},
		{"two fields, one key", clash{}, "$", `both stored under the key "x"`},
		{"own msgpack encoding", selfEncoding{}, "$", "EncodeMsgpack"},
		{"typed nil error", struct{ Err error }{Err: (*Error)(nil)}, "$.Err", "typed nil error"},
		{"error in an any", []any{errors.New("x")}, "$[0].s", "unexported field s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := Encode(c.v)
			var fe *Error
			require.ErrorAs(t, err, &fe)
			require.Equal(t, c.path, fe.Path)
			require.Contains(t, fe.Reason, c.reason)
			require.True(t, strings.HasPrefix(err.Error(), "fingerprint: "+c.path), err.Error())

			_, err = Of(c.v)
			require.ErrorAs(t, err, &fe)
			_, err = Equal(c.v, 1)
			require.ErrorAs(t, err, &fe)
		})
	}
}

func TestOfAndEqual(t *testing.T) {
	t.Parallel()
	fp, err := Of(map[string]any{"a": 1})
	require.NoError(t, err)
	require.Regexp(t, `^sha256:[0-9a-f]{64}$`, fp)
	fp2, err := Of(map[string]int8{"a": 1})
	require.NoError(t, err)
	require.Equal(t, fp, fp2)

	eq, err := Equal([]int{1}, []int16{1})
	require.NoError(t, err)
	require.True(t, eq)
	eq, err = Equal(1, 1.0)
	require.NoError(t, err)
	require.False(t, eq)
}

func TestFormat(t *testing.T) {
	t.Parallel()
	enc, err := Encode(map[string]any{
		"b": []any{1, 1.0, "x\ny", []byte{0xff}, nil, true},
		"a": map[string]any{},
		"t": time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC),
	})
	require.NoError(t, err)
	got, err := Format(enc)
	require.NoError(t, err)
	require.Equal(t, `{
  "a": {},
  "b": [
    1,
    1.0,
    "x\ny",
    bytes(ff),
    nil,
    true,
  ],
  "t": time(2026-01-02T03:04:05.000000006Z),
}`, got)
}

func TestFormatRefusesMalformed(t *testing.T) {
	t.Parallel()
	for _, enc := range []string{
		"", "nn", "q", "i01;", "i-0;", "i+1;", "i18446744073709551616;", "i-9223372036854775809;", "i1",
		"f1.0;", "f-0;", "fNaN;", "f+Inf;", "f1e400;", "s3:ab", "s01:a", "s-1:", "x1:AB", "x1:a", "x1:zz",
		"l1[]", "l0[n]", "l2[n]", "l1[n", "m1{s1:a}", "m2{s1:bns1:an}", "m2{s1:ans1:an}", "m0{",
		"t2026-01-01T00:00:00+01:00;", "t2026-01-01T00:00:00.10Z;", "t2026-01-01;", "l99999999999999999[",
	} {
		_, err := Format([]byte(enc))
		require.ErrorIs(t, err, ErrMalformed, "%q", enc)
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				_, err := Encode(order{ID: "o1", Notes: []string{"a"}})
				require.NoError(t, err)
				_, err = Encode(secretive{})
				require.Error(t, err)
			}
		})
	}
	wg.Wait()
}
