package fingerprint_test

import (
	"errors"
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/goreactor/goreactor/fingerprint"
	"github.com/goreactor/goreactor/internal/codec"
	"github.com/stretchr/testify/require"
)

type address struct {
	Street string `json:"street"`
	Zip    string `json:"zip,omitempty"`
}

type audit struct {
	By string `json:"by"`
}

type account struct {
	audit
	ID       string            `json:"id"`
	Balance  int64             `msgpack:"balance"`
	Rate     float32           `json:"rate"`
	Limit    uint64            `json:"limit"`
	Tags     []string          `json:"tags"`
	Empty    []string          `json:"empty"`
	Address  *address          `json:"address,omitempty"`
	Home     address           `json:"home"`
	Opened   time.Time         `json:"opened"`
	Closed   time.Time         `json:"closed,omitempty"`
	Raw      []byte            `json:"raw"`
	Meta     map[string]any    `json:"meta"`
	Counts   map[string]uint16 `json:"counts"`
	Note     string            `json:"note,omitempty"`
	Internal string            `msgpack:"-"`
}

// The property that matters: a state written by goreactor's codec and read
// back, into the same type or into plain maps, fingerprints as it did.
func TestCodecRoundTripFingerprintsAlike(t *testing.T) {
	t.Parallel()
	opened := time.Date(2025, 6, 1, 9, 30, 0, 123456789, time.FixedZone("CEST", 7200))
	cases := []struct {
		name string
		v    any
	}{
		{"struct", account{
			audit: audit{By: "ops"}, ID: "a1", Balance: -1 << 40, Rate: 0.25, Limit: math.MaxUint64,
			Tags: []string{"x", "y;]"}, Empty: []string{}, Home: address{Street: "Main"}, Opened: opened,
			Raw: []byte{0, 1, 2}, Meta: map[string]any{"n": int8(-3), "f": 1.5, "nil": nil, "l": []any{}},
			Counts: map[string]uint16{"a": 300}, Internal: "not state",
		}},
		{"struct with pointers and zero values", account{Address: &address{Zip: "123"}}},
		{"map", map[string]any{"a": []any{1, uint32(70000), -2.5, "s", []byte("b"), nil, true}, "t": opened}},
		{"list of maps", []map[string]any{{"a": 1}, {}, nil}},
		{"marshalers and errors", struct {
			N   *big.Int
			Err error
			Nil error
		}{N: big.NewInt(-5), Err: errors.New("boom")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			want, err := fingerprint.Encode(c.v)
			require.NoError(t, err)

			stored, err := codec.Marshal(c.v)
			require.NoError(t, err)
			var generic any
			require.NoError(t, codec.Unmarshal(stored, &generic))
			got, err := fingerprint.Encode(generic)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got), "read back as %#v", generic)

			if _, ok := c.v.(account); ok {
				var back account
				require.NoError(t, codec.Unmarshal(stored, &back))
				got, err := fingerprint.Encode(back)
				require.NoError(t, err)
				require.Equal(t, string(want), string(got))
			}
		})
	}
}

// The codec reads a map with non-string keys back only into map[any]any.
func TestCodecRoundTripIntegerKeys(t *testing.T) {
	t.Parallel()
	in := map[int]string{1: "a", 300: "b", -70000: "c"}
	want, err := fingerprint.Encode(in)
	require.NoError(t, err)
	stored, err := codec.Marshal(in)
	require.NoError(t, err)
	var back map[any]any
	require.NoError(t, codec.Unmarshal(stored, &back))
	got, err := fingerprint.Encode(back)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}
