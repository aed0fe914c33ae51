package engine

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/typename"
)

// checkBindings refuses a binding of step that names no field of its In
// type: the step would run with that field's zero value and nothing would
// say so. Names match exactly as the codec decodes them (codec.Fields).
func checkBindings(reactor, step string, in reflect.Type, b Bindings) error {
	fields, ok := codec.Fields(in)
	if !ok {
		return nil // Args, a map, an interface: any name is an argument
	}
	known := make(map[string]bool, len(fields))
	for _, f := range fields {
		known[f] = true
	}
	for _, name := range bindingNames(b) {
		if known[name] {
			continue
		}
		return &DefinitionError{Reactor: reactor, Step: step, Binding: name, Fields: fields,
			Reason: fmt.Sprintf("binding %q names no field of its In type %s, which decodes %s; bind one of those names (exactly as the msgpack tag, else json tag, else Go field name spells it) or fix the tag",
				name, in, listOrNone(fields, "no fields"))}
	}
	return nil
}

// checkChildBindings refuses a compose binding that names no input of the
// child: the child would refuse it on every run.
func checkChildBindings(reactor string, s *stepDef) error {
	known := map[string]bool{}
	var names []string
	for _, in := range s.child.inputs {
		known[in.name] = true
		names = append(names, in.name)
	}
	for _, name := range bindingNames(s.args) {
		if known[name] {
			continue
		}
		return &DefinitionError{Reactor: reactor, Step: s.name, Binding: name, Fields: names,
			Reason: fmt.Sprintf("binding %q names no input of child %q, whose inputs are %s; bind one of them",
				name, s.child.name, listOrNone(names, "none"))}
	}
	return nil
}

// checkStored refuses to hand an Undo or Compensate a value decoded from
// stored arguments or a stored result that hold fields t no longer has (a
// deploy renamed or removed them since the step ran): the function would
// see zero values where the run had data. It is Permanent: the entry's
// rollback fails with the error, it is not retried.
func checkStored(step, what string, raw Raw, t reflect.Type) error {
	dropped := codec.Dropped(raw, t)
	if len(dropped) == 0 {
		return nil
	}
	accepted, _ := codec.Fields(t)
	return Permanent(&DroppedFieldsError{Step: step, What: what, Type: typename.Of(t), Fields: dropped, Accepted: accepted})
}

// bindingNames returns b's names, sorted: the first bad one reported is
// stable. (Not rollback.go's sortedKeys: this file should not depend on it.)
func bindingNames(b Bindings) []string {
	names := make([]string, 0, len(b))
	for k := range b {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// listOrNone formats names for an error message.
func listOrNone(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return "[" + strings.Join(names, " ") + "]"
}

var (
	customEncoderType = reflect.TypeFor[msgpack.CustomEncoder]()
	marshalerType     = reflect.TypeFor[msgpack.Marshaler]()
)

// checkStepPath refuses a FromStep reference r whose path cannot be found
// in the referenced step's result, when Define knows the result's type: a
// struct field the type does not have (under the names the codec encodes),
// an index into a list that is not a number, a step into a string or a
// number. It walks nested structs, pointers to them, slices and arrays.
// Where the type stops saying what the encoding holds (a map, an
// interface, Raw, a type that encodes itself, a construct or compose step
// whose result type is not known) the rest of the path is accepted, and
// checked when the run reads it. binding is the step's binding r is, ""
// for the definition's Returns.
func (d *Definition) checkStepPath(step, binding string, r Ref) error {
	if r.kind != refStep || len(r.path) == 0 {
		return nil
	}
	what := "Returns"
	if binding != "" {
		what = fmt.Sprintf("binding %q", binding)
	}
	t := d.byName[r.name].resultType()
	if t == nil {
		return nil
	}
	// where says, for the message, what the type at the current point of
	// the path is.
	where := fmt.Sprintf("%s returns %s", r.name, shortType(t))
	for i, seg := range r.path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if pt := reflect.PointerTo(t); t.Implements(customEncoderType) || pt.Implements(customEncoderType) ||
			t.Implements(marshalerType) || pt.Implements(marshalerType) {
			return nil
		}
		refuse := func(reason string, fields []string) error {
			at := ""
			if len(r.path) > 1 {
				at = fmt.Sprintf(" at %v", r.path[:i+1])
			}
			return &DefinitionError{Reactor: d.name, Step: step, Binding: binding, Fields: fields,
				Reason: fmt.Sprintf("%s reads %s of step %q's result%s (%s%s)", what, reason, r.name, at, where, describeFields(t, fields))}
		}
		switch t.Kind() {
		case reflect.Struct:
			fields, ok := codec.Fields(t)
			if !ok {
				return nil
			}
			if !slices.Contains(fields, seg) {
				return refuse(fmt.Sprintf("field %q", seg), fields)
			}
			ft, ok := fieldType(t, seg)
			if !ok {
				return nil // an alias name: the codec knows it, fieldType does not
			}
			where = fmt.Sprintf("%s, whose field %q is a %s", where, seg, shortType(ft))
			t = ft
		case reflect.Slice, reflect.Array:
			if t.Elem().Kind() == reflect.Uint8 {
				return nil // bytes (Raw among them): not a list once encoded
			}
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 || (t.Kind() == reflect.Array && n >= t.Len()) {
				return refuse(fmt.Sprintf("index %q", seg), nil)
			}
			where = fmt.Sprintf("%s, whose elements are %s", where, shortType(t.Elem()))
			t = t.Elem()
		case reflect.Bool, reflect.String,
			reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
			reflect.Float32, reflect.Float64:
			return refuse(fmt.Sprintf("field %q", seg), nil)
		default:
			return nil // a map, an interface: any key may be there
		}
	}
	return nil
}

// describeFields ends checkStepPath's account of type t: its fields, or
// what it is when it has none to offer.
func describeFields(t reflect.Type, fields []string) string {
	switch t.Kind() {
	case reflect.Struct:
		if len(fields) == 0 {
			return ": no fields"
		}
		return ": fields " + strings.Join(fields, ", ")
	case reflect.Slice, reflect.Array:
		return ": a list, read by index"
	}
	return ", which has no fields"
}

// shortType names t as its author wrote it in their package: Reservation,
// *Reservation, []Line, not the package-qualified name.
func shortType(t reflect.Type) string {
	switch {
	case t.Name() != "":
		return t.Name()
	case t.Kind() == reflect.Pointer:
		return "*" + shortType(t.Elem())
	case t.Kind() == reflect.Slice:
		return "[]" + shortType(t.Elem())
	}
	return t.String()
}
