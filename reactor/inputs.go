package reactor

import (
	"github.com/goreactor/goreactor/internal/codec"
)

// prepareInputs encodes and validates a run's inputs: required inputs must be
// present, defaults fill the rest, every value must decode into its declared
// type and pass its validators. Unknown inputs are rejected so that a typo
// does not silently become a missing input.
func (d *Definition) prepareInputs(given map[string]any) (map[string]codec.Raw, error) {
	raw := make(map[string]codec.Raw, len(given))
	for k, v := range given {
		b, err := codec.Marshal(v)
		if err != nil {
			return nil, &InputError{Reactor: d.name, Input: k, Reason: "cannot be encoded: " + err.Error()}
		}
		raw[k] = b
	}
	return d.checkInputs(raw)
}

func (d *Definition) checkInputs(raw map[string]codec.Raw) (map[string]codec.Raw, error) {
	known := make(map[string]bool, len(d.inputs))
	out := make(map[string]codec.Raw, len(d.inputs))
	for _, in := range d.inputs {
		known[in.name] = true
		v, ok := raw[in.name]
		if !ok {
			switch {
			case in.def != nil:
				v = in.def
			case in.required:
				return nil, &InputError{Reactor: d.name, Input: in.name, Reason: "is required"}
			default:
				continue
			}
		}
		if err := in.check(v); err != nil {
			return nil, &InputError{Reactor: d.name, Input: in.name, Reason: err.Error()}
		}
		out[in.name] = v
	}
	for k := range raw {
		if !known[k] {
			return nil, &InputError{Reactor: d.name, Input: k, Reason: "is not declared by the reactor"}
		}
	}
	return out, nil
}
