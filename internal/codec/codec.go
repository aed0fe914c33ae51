// Package codec is goreactor's msgpack encoding of run state and user values.
//
// User structs may carry msgpack or json tags: a json tag is honoured when a
// field has no msgpack tag, so types shared with an HTTP API need no second set
// of tags.
package codec

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Raw is an encoded msgpack value.
type Raw = msgpack.RawMessage

// Marshal encodes v.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(&buf)
	enc.SetCustomStructTag("json")
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes data into v (a pointer).
func Unmarshal(data []byte, v any) error {
	dec := msgpack.GetDecoder()
	defer msgpack.PutDecoder(dec)
	dec.Reset(bytes.NewReader(data))
	dec.SetCustomStructTag("json")
	return dec.Decode(v)
}

// Nil is the encoding of a nil value.
var Nil = Raw{0xc0}
