package inspect

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
)

// fastStatus reads the status of every outcome shape mapstep's codec
// writes, and declines what it cannot read, so the decoder takes over.
func TestFastStatus(t *testing.T) {
	type full struct {
		Status  string          `msgpack:"s"`
		Value   codec.Raw       `msgpack:"v,omitempty"`
		Failure *engine.Failure `msgpack:"f,omitempty"`
		Reason  string          `msgpack:"r,omitempty"`
	}
	for _, o := range []full{
		{Status: "ok", Value: codec.Raw{0x01}},
		{Status: "ok"},
		{Status: "failed", Failure: &engine.Failure{Step: "a", Message: "no"}},
		{Status: "halted", Reason: "enough"},
		{Status: "skipped"},
		{Status: "stopped"},
	} {
		b, err := codec.Marshal(o)
		require.NoError(t, err)
		got, ok := fastStatus(string(b))
		require.True(t, ok, o.Status)
		require.Equal(t, o.Status, got)
	}
	for _, v := range []string{"", "\x80", "\x81\xa1t\xa2ok", "\x81\xa1s\x01", "\x81\xa1s\xa5ok"} {
		_, ok := fastStatus(v)
		require.False(t, ok, "%q", v)
	}
}
