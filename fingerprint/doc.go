// Package fingerprint gives a state a canonical encoding and a digest of it,
// for goreactor's guarded undo.
//
// A step records an effect as {resource, before, after}. At rollback the
// engine probes the resource and compares fingerprints: at after it
// restores, at before there is nothing to do, and anything else is a
// conflict (someone else wrote) that it must not overwrite. Two different
// states that fingerprint alike therefore authorise a silent clobber, and one
// state that fingerprints two ways (read through another code path, or
// decoded from Redis into other Go types) makes every undo report a conflict.
// So the encoding is injective on the values it accepts, independent of the
// Go types that carry a value, and refuses what it cannot encode without
// ambiguity.
//
// # Encoding
//
// Every value opens with a one-byte tag; every variable-length part is
// length-prefixed or ends in a byte it cannot contain, so no encoding is a
// prefix of another and ["ab","c"] cannot encode like ["a","bc"]:
//
//	nil    n
//	bool   T | F
//	int    i<decimal>;                 int8..int64, uint..uint64 alike, by value
//	float  f<shortest decimal>;        float32 and float64, by value as float64
//	string s<byte count>:<bytes>
//	bytes  x<byte count>:<lowercase hex>
//	list   l<count>[<value>...]
//	map    m<count>{<key><value>...}   keys in ascending order of their encodings
//	time   t<RFC 3339 UTC, nanoseconds>;
//
// So {"id": "o1", "qty": [1, 2.5]} encodes as
// m2{s2:ids2:o1s3:qtyl2[i1;f2.5;]}. The encoding is text and readable as it
// stands; Format indents it and quotes strings, for reading two side by side.
// Of is "sha256:" and the hex SHA-256 of the encoding: the prefix keeps a
// future algorithm from comparing equal to this one.
//
// # The rules, and why
//
// The reference is goreactor's codec (msgpack, internal/codec): a value and
// the same state stored and read back into other Go types (a struct read
// back as map[string]any, an int64 read back as int8) must encode alike.
//
//   - Integers of every width are one type: msgpack writes and reads them by
//     the smallest width that holds them. The range is int64's minimum to
//     uint64's maximum. uintptr is refused (an address, not state).
//   - Floats are one type and differ from integers: 1 and 1.0 are apart, as
//     the codec keeps them. NaN and the infinities are refused. -0 encodes as
//     0: they compare equal, and a Lua script or an arithmetic path can turn
//     one into the other without anyone changing the state.
//   - Strings and bytes ([]byte, [N]byte) are apart, as the codec keeps them.
//   - nil, a nil pointer, a nil interface, a nil slice and a nil map all
//     encode as nil, and an empty slice or map as an empty list or map: the
//     codec stores nil and empty apart and reads them back apart. A map entry
//     holding nil differs from an absent key.
//   - Structs are maps of their stored fields, keyed as the codec keys them
//     (the msgpack tag, else the json tag, else the Go name; "-" leaves a
//     field out), with omitempty honoured as the codec honours it (the
//     field's IsZero if it has one, else zero length, false, zero or nil), so
//     a struct and the map[string]any read back from Redis encode alike.
//     Embedded structs (by value, untagged) are flattened, as both msgpack
//     and encoding/json do; an embedded pointer, non-struct or tagged field,
//     or two fields under one key, is refused, since there the two disagree.
//     A struct with an unexported field is refused, because the codec drops
//     it silently and a change to it would not change the fingerprint (tag
//     it `msgpack:"-"` if it is not state; zero-size fields are ignored).
//   - time.Time encodes its instant (UTC, to the nanosecond); the location
//     and the monotonic reading are ignored, as the codec ignores them.
//     Years outside 1..9999 are refused.
//   - A type with MarshalBinary or MarshalText encodes as the bytes it
//     marshals to, since the codec stores exactly those, as bytes (so a
//     *big.Int is the bytes of its digits, and a probe reads it back as
//     []byte). A type with its own msgpack
//     encoding (EncodeMsgpack, MarshalMsgpack) is refused. A value declared
//     as error encodes as its message, as the codec stores it.
//   - Pointers and interfaces are followed. A cycle (a pointer, map or slice
//     met again inside itself) is refused; a value shared by two branches is
//     encoded twice.
//   - Map keys sort by their encodings; two keys that encode alike
//     (int8(1) and int64(1) in a map[any]any) are refused as ambiguous.
//   - Functions, channels, unsafe pointers and complex numbers are refused.
//
// A refusal is an *Error carrying the path to the value ($.items[2].price)
// and the reason. Strictness is the point: a fingerprint that quietly loses
// part of a value fails by approving a write.
package fingerprint
