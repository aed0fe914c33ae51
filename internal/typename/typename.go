// Package typename names Go types the way users know them: a type of
// goreactor's engine core (internal/engine, internal/mapcore) by the public
// package that re-exports it (reactor, mapstep).
//
// Definition fingerprints hash type names, so this is also what keeps a
// fingerprint the same across goreactor releases that move the core: a run
// stored before the move resumes after it.
package typename

import (
	"reflect"
	"strings"
)

const module = "github.com/goreactor/goreactor/"

// public maps an internal package's import path to the facade's, and the
// short qualifiers reflect prints for them.
var public = []struct{ path, pub, name, pubName string }{
	{module + "internal/engine", module + "reactor", "engine", "reactor"},
	{module + "internal/mapcore", module + "mapstep", "mapcore", "mapstep"},
}

// Of returns t.String() with goreactor's internal packages named by their
// facades: "mapstep.Results[github.com/goreactor/goreactor/reactor.Args]"
// for what reflect prints as mapcore.Results[...internal/engine.Args].
// Short qualifiers ("engine.") are rewritten only when t is built from a
// type of that internal package, so a user's own package named engine
// keeps its name.
func Of(t reflect.Type) string {
	if t == nil {
		return "<nil>"
	}
	s := t.String()
	if !strings.Contains(s, "engine") && !strings.Contains(s, "mapcore") {
		return s
	}
	uses := map[string]bool{}
	collect(t, uses, map[reflect.Type]bool{})
	for _, p := range public {
		s = strings.ReplaceAll(s, p.path+".", p.pub+".")
		if uses[p.path] {
			s = requalify(s, p.name, p.pubName)
		}
	}
	return s
}

// collect records the package paths of the named types t is built from
// (outside generic type arguments, which reflect prints with full paths).
func collect(t reflect.Type, uses map[string]bool, seen map[reflect.Type]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	if t.Name() != "" {
		uses[t.PkgPath()] = true
		return
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array, reflect.Chan:
		collect(t.Elem(), uses, seen)
	case reflect.Map:
		collect(t.Key(), uses, seen)
		collect(t.Elem(), uses, seen)
	case reflect.Func:
		for i := range t.NumIn() {
			collect(t.In(i), uses, seen)
		}
		for i := range t.NumOut() {
			collect(t.Out(i), uses, seen)
		}
	case reflect.Struct:
		for i := range t.NumField() {
			collect(t.Field(i).Type, uses, seen)
		}
	}
}

// requalify replaces the qualifier name. with pub. where it starts a
// qualified identifier outside brackets (inside them reflect uses full
// import paths, handled before).
func requalify(s, name, pub string) string {
	var b strings.Builder
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '[':
			depth++
		case c == ']':
			depth--
		case depth == 0 && strings.HasPrefix(s[i:], name+".") && (i == 0 || !isIdent(s[i-1])):
			b.WriteString(pub)
			i += len(name) - 1
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isIdent(c byte) bool {
	return c == '_' || c == '.' || c == '/' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
