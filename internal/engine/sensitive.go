package engine

import "strings"

// Sensitive inputs. An input declared Sensitive (a card number, a personal
// e-mail address) makes every run of its definition a sensitive run, and so
// every run of a definition that composes it or maps over it: their inputs
// carry the values on. A sensitive run is recorded as such when it is
// created (Run.Sensitive), and composed children and map element runs of a
// sensitive run are sensitive too. The engine stores and returns a
// sensitive run's values as any other (its API is for trusted code); what
// shows runs to people redacts them: the dashboard shows a sensitive run's
// inputs and the values of its guarded undo only to requests carrying its
// token, and an *InputError about a sensitive input names the kind of
// value that was wrong, never the value.

// Sensitive marks the input as sensitive: runs of the definition are
// sensitive runs (see Run.Sensitive), whose inputs and guarded-undo values
// the dashboard shows only to holders of its token. The engine logs no
// input values, and an *InputError about a sensitive input does not quote
// its value. A Validate function's error is the author's: it should not
// quote the value either.
func Sensitive() InputOption {
	return inputOptionFunc(func(in *inputDef) error { in.sensitive = true; return nil })
}

// hasSensitive reports whether a run of d is a sensitive run: one of d's
// inputs is Sensitive, or one of the definitions it composes or maps over
// (a construct's Definitions) has one. Those definitions were defined
// before d, so their own answer is settled.
func (d *Definition) hasSensitive() bool {
	for _, in := range d.inputs {
		if in.sensitive {
			return true
		}
	}
	for _, s := range d.steps {
		if s.child != nil && s.child.sensitive {
			return true
		}
		if n, ok := s.construct.(interface{ Definitions() []*Definition }); ok {
			for _, c := range n.Definitions() {
				if c != nil && c.sensitive {
					return true
				}
			}
		}
	}
	return false
}

// redactKind reduces describeEncoded's account of a value to its kind, for
// a sensitive input: `string "4111..."` becomes `string (value not shown:
// sensitive input)`.
func redactKind(got string) string {
	for _, k := range []string{"string", "bool", "int", "float", "number", "bytes", "list", "map"} {
		if got == k || strings.HasPrefix(got, k+" ") {
			return k + " (value not shown: sensitive input)"
		}
	}
	return got
}
