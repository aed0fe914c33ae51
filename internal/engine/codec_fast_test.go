package engine

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/goreactor/goreactor/internal/codec"
)

// The plain twins of the types state.go registers with codec.RegisterFast:
// the same fields and tags, encoded by msgpack's own struct encoder.
type (
	plainRunState      runState
	plainStepRec       stepRec
	plainIntentRec     intentRec
	plainEntryRec      entryRec
	plainElementRec    elementRec
	plainRollbackRetry rollbackRetry
	plainRetryEntry    retryEntry
	plainHumanRec      humanRec
	plainTargetedRec   targetedRec
	plainEffectRec     effectRec
	plainAuditRec      auditRec
	plainAttemptRec    attemptRec
	plainAttemptLog    attemptLog
)

// The fast encoder writes exactly msgpack's bytes for every registered type,
// over random values with random fields left zero (omitempty), and a new
// field of any kind is covered without touching this test. Seeded; the seed
// is in the failure.
func TestFastEncoderWritesMsgpacksBytes(t *testing.T) {
	pairs := []struct{ fast, plain any }{
		{&runState{}, &plainRunState{}}, {&stepRec{}, &plainStepRec{}}, {&intentRec{}, &plainIntentRec{}},
		{&entryRec{}, &plainEntryRec{}}, {&elementRec{}, &plainElementRec{}},
		{&rollbackRetry{}, &plainRollbackRetry{}}, {&retryEntry{}, &plainRetryEntry{}},
		{&humanRec{}, &plainHumanRec{}}, {&targetedRec{}, &plainTargetedRec{}},
		{&effectRec{}, &plainEffectRec{}}, {&auditRec{}, &plainAuditRec{}},
		{&attemptRec{}, &plainAttemptRec{}}, {&attemptLog{}, &plainAttemptLog{}},
	}
	seed := rand.Uint64()
	r := rand.New(rand.NewPCG(seed, 1))
	for _, p := range pairs {
		ft := reflect.TypeOf(p.fast).Elem()
		pt := reflect.TypeOf(p.plain).Elem()
		for i := range 300 {
			v := reflect.New(ft)
			fill(r, v.Elem(), 0, i%3 == 0)
			fast, err := codec.Marshal(v.Interface())
			if err != nil {
				t.Fatalf("seed %d: %s: %v", seed, ft, err)
			}
			plain, err := codec.Marshal(v.Convert(reflect.PointerTo(pt)).Interface())
			if err != nil {
				t.Fatalf("seed %d: %s: %v", seed, pt, err)
			}
			if !bytes.Equal(fast, plain) {
				t.Fatalf("seed %d: %s value %d: fast encoding differs from msgpack's\nfast  %x\nplain %x", seed, ft, i, fast, plain)
			}
			back := reflect.New(ft)
			if err := codec.Unmarshal(fast, back.Interface()); err != nil {
				t.Fatalf("seed %d: %s: decode: %v", seed, ft, err)
			}
		}
	}
}

// fill gives v random contents: every settable field, each left zero with
// probability 1/3 (all zero when zeros), recursing to depth 3.
func fill(r *rand.Rand, v reflect.Value, depth int, zeros bool) {
	if depth > 3 || (depth > 0 && (zeros || r.IntN(3) == 0)) {
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); f.CanSet() {
				fill(r, f, depth+1, zeros)
			}
		}
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		fill(r, p.Elem(), depth+1, false)
		v.Set(p)
	case reflect.Map:
		// One entry: msgpack writes a map of other than string keys and
		// values in Go's random order, and the struct encoder is what is
		// compared here.
		m := reflect.MakeMap(v.Type())
		for range 1 {
			k := reflect.New(v.Type().Key()).Elem()
			fill(r, k, depth+1, false)
			e := reflect.New(v.Type().Elem()).Elem()
			fill(r, e, depth+1, false)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 { // Raw: an encoded value
			v.SetBytes([]byte{byte(r.IntN(100))})
			return
		}
		s := reflect.MakeSlice(v.Type(), r.IntN(3)+1, 3)
		for i := range s.Len() {
			fill(r, s.Index(i), depth+1, false)
		}
		v.Set(s)
	case reflect.String:
		v.SetString([]string{"", "a", "step", "rolled_back"}[r.IntN(4)])
	case reflect.Bool:
		v.SetBool(r.IntN(2) == 1)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(r.IntN(5)) * int64([]int{1, 300, 1 << 40}[r.IntN(3)]))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(r.IntN(300)))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(r.IntN(5)) / 2)
	case reflect.Interface:
		if v.NumMethod() == 0 {
			v.Set(reflect.ValueOf(r.IntN(3)))
		}
	}
}
