package engine

import "github.com/vmihailenco/msgpack/v5"

// Raw is a value as goreactor stores it: msgpack, encoded with map keys
// sorted and struct fields named by their msgpack tag, else their json tag.
// Results, inputs and ledger snapshots are Raw; ValueOf and Arg decode them
// into your types.
type Raw = msgpack.RawMessage
