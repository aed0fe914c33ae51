package codec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

type order struct {
	ID    string `json:"id"`
	Qty   int    `msgpack:"quantity"`
	Notes []string
}

func TestRoundTripHonoursTags(t *testing.T) {
	in := order{ID: "o1", Qty: 3, Notes: []string{"a"}}
	b, err := Marshal(in)
	require.NoError(t, err)

	var generic map[string]any
	require.NoError(t, Unmarshal(b, &generic))
	require.Contains(t, generic, "id")
	require.Contains(t, generic, "quantity")

	var out order
	require.NoError(t, Unmarshal(b, &out))
	require.Equal(t, in, out)
}

func TestNilDecodesToZero(t *testing.T) {
	var out order
	require.NoError(t, Unmarshal(Nil, &out))
	require.Equal(t, order{}, out)
}
