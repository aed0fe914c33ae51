package engine

import (
	"bytes"
	"fmt"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/goreactor/goreactor/internal/codec"
)

// Args are a step's arguments, still encoded. Use it as a step's In type when
// the arguments are dynamic; Arg decodes one of them.
type Args map[string]Raw

// Arg decodes argument name of a into T.
func Arg[T any](a Args, name string) (T, error) {
	var v T
	raw, ok := a[name]
	if !ok {
		return v, fmt.Errorf("reactor: no argument %q", name)
	}
	err := codec.Unmarshal(raw, &v)
	return v, err
}

// resolveArgs builds the encoded argument map of step s from the run state:
// the snapshot stored with its ledger entry and the value its Run decodes.
func resolveArgs(d *Definition, s *stepDef, st *runState) (Raw, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := enc.EncodeMapLen(len(s.argNames)); err != nil {
		return nil, err
	}
	for _, name := range s.argNames {
		v, err := resolveRef(d, s.args[name], st)
		if err != nil {
			return nil, fmt.Errorf("argument %q: %w", name, err)
		}
		if err := enc.EncodeString(name); err != nil {
			return nil, err
		}
		buf.Write(v)
	}
	return buf.Bytes(), nil
}

func resolveRef(d *Definition, r Ref, st *runState) (Raw, error) {
	var base Raw
	switch r.kind {
	case refConst:
		return r.value, nil
	case refInput:
		base = st.Inputs[r.name]
	case refStep:
		rec := st.Steps[r.name]
		if rec == nil {
			return nil, fmt.Errorf("step %q has not completed", r.name)
		}
		base = rec.Value
	}
	if len(base) == 0 {
		base = codec.Nil
	}
	if len(r.path) == 0 {
		return base, nil
	}
	return walkPath(base, r.path)
}

// walkPath descends into an encoded value by map keys and slice indexes and
// re-encodes what it finds there.
func walkPath(raw Raw, path []string) (Raw, error) {
	var v any
	if err := codec.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	for i, p := range path {
		switch c := v.(type) {
		case map[string]any:
			next, ok := c[p]
			if !ok {
				return nil, fmt.Errorf("no field %q at %v", p, path[:i])
			}
			v = next
		case []any:
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n >= len(c) {
				return nil, fmt.Errorf("no index %q at %v (length %d)", p, path[:i], len(c))
			}
			v = c[n]
		default:
			return nil, fmt.Errorf("cannot descend into %T at %v", v, path[:i])
		}
	}
	return codec.Marshal(v)
}
