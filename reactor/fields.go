package reactor

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/goreactor/goreactor/internal/codec"
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
	return Permanent(&DroppedFieldsError{Step: step, What: what, Type: t.String(), Fields: dropped, Accepted: accepted})
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
