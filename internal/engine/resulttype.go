package engine

import (
	"fmt"
	"reflect"
	"strings"
)

// ResultType returns the Go type of what a run of d returns, when Define can
// tell: Returns naming a step's whole result (its Out type, or a construct's
// result type), or an input. It is nil when d returns nothing or a value
// whose type is not known before it runs (a path into a result, a constant).
func (d *Definition) ResultType() reflect.Type {
	if d.returns == nil || len(d.returns.path) > 0 {
		return nil
	}
	r := *d.returns
	switch r.kind {
	case refStep:
		return d.byName[r.name].resultType()
	case refInput:
		for _, in := range d.inputs {
			if in.name == r.name {
				return in.typ
			}
		}
	}
	return nil
}

// resultType is the type of step s's result, when known.
func (s *stepDef) resultType() reflect.Type {
	switch {
	case s == nil:
		return nil
	case s.kind == kindPlain, s.kind == kindInterrupt:
		return s.outType
	case s.kind == kindCompose:
		return s.child.ResultType()
	case s.construct != nil:
		if t, ok := s.construct.(interface{ ResultType() reflect.Type }); ok {
			return t.ResultType()
		}
	}
	return nil
}

// BindingChecker is implemented by a Construct whose result a later step
// binds with FromStep: Define calls CheckBinding with the Go type of the In
// field the whole result is bound to, so a mismatch (a map whose elements
// return strings read as mapstep.Results[int]) fails at Define instead of
// decoding wrong values at run time.
type BindingChecker interface {
	CheckBinding(field reflect.Type) error
}

// checkConstructBindings asks each construct step whose whole result a
// plain step binds whether the field's type fits.
func (d *Definition) checkConstructBindings() error {
	for _, s := range d.steps {
		if s.kind != kindPlain || s.inType == nil {
			continue
		}
		for _, name := range s.argNames {
			r := s.args[name]
			if r.kind != refStep || len(r.path) > 0 {
				continue
			}
			src := d.byName[r.name]
			if src == nil || src.construct == nil {
				continue
			}
			bc, ok := src.construct.(BindingChecker)
			if !ok {
				continue
			}
			ft, ok := fieldType(s.inType, name)
			if !ok {
				continue
			}
			if err := bc.CheckBinding(ft); err != nil {
				return &DefinitionError{Reactor: d.name, Step: s.name,
					Reason: fmt.Sprintf("binding %q takes the result of step %q: %v", name, r.name, err)}
			}
		}
	}
	return nil
}

// fieldType finds the type of the field of struct type t (or pointer to
// one) that decodes map key name: its msgpack tag, else its json tag, else
// its Go name, looking into embedded structs. ok is false when t is not a
// struct or has no such field (Define reports unknown bindings elsewhere).
func fieldType(t reflect.Type, name string) (reflect.Type, bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil, false
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue
		}
		tag, hasTag := f.Tag.Lookup("msgpack")
		if !hasTag {
			tag = f.Tag.Get("json")
		}
		key, _, _ := strings.Cut(tag, ",")
		if key == "-" {
			continue
		}
		if f.Anonymous && key == "" {
			if ft, ok := fieldType(f.Type, name); ok {
				return ft, true
			}
			continue
		}
		if key == "" {
			key = f.Name
		}
		if key == name {
			return f.Type, true
		}
	}
	return nil, false
}
