package fingerprint

import (
	"errors"
	"strconv"
	"strings"
)

// Error is a value Encode refuses, with where it sits and why. Use it with
// errors.As.
type Error struct {
	// Path locates the refused value from the root, written $: struct fields
	// and identifier-like string keys as .name, list elements as [2], other
	// map keys as ["a b"] or [7], and a map key itself as {key}, as in
	// $.items[2].price.
	Path string
	// Type is the Go type of the refused value, when there is one.
	Type string
	// Reason says what is wrong and what to do instead.
	Reason string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("fingerprint: ")
	b.WriteString(e.Path)
	if e.Type != "" {
		b.WriteString(" (")
		b.WriteString(e.Type)
		b.WriteString(")")
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// ErrMalformed is wrapped by the error Format returns for bytes that are not
// an encoding Encode could have produced.
var ErrMalformed = errors.New("fingerprint: malformed encoding")

type segKind uint8

const (
	segField segKind = iota // a struct field or a string map key: name
	segIndex                // a list element: index
	segValue                // the value under a map key: key (its encoding)
	segKey                  // a map key itself
)

// segment is one step of the path to the value being encoded. The path is
// only rendered when something is refused, so a step holds its raw parts.
type segment struct {
	kind  segKind
	name  string
	index int
	key   []byte
}

func renderPath(path []segment) string {
	var b strings.Builder
	b.WriteString("$")
	for _, s := range path {
		switch s.kind {
		case segField:
			writeName(&b, s.name)
		case segIndex:
			b.WriteString("[")
			b.WriteString(strconv.Itoa(s.index))
			b.WriteString("]")
		case segValue:
			if str, ok := stringKey(s.key); ok {
				writeName(&b, str)
				continue
			}
			b.WriteString("[")
			if txt, err := formatCompact(s.key); err == nil {
				b.WriteString(txt)
			} else {
				b.WriteString("?")
			}
			b.WriteString("]")
		case segKey:
			b.WriteString("{key}")
		}
	}
	return b.String()
}

func writeName(b *strings.Builder, name string) {
	if isIdent(name) {
		b.WriteString(".")
		b.WriteString(name)
		return
	}
	b.WriteString("[")
	b.WriteString(strconv.Quote(name))
	b.WriteString("]")
}

func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z':
		case i > 0 && r >= '0' && r <= '9':
		default:
			return false
		}
	}
	return true
}

// stringKey returns the string a key encoding holds, if it is one.
func stringKey(enc []byte) (string, bool) {
	p := parser{data: enc}
	if len(enc) == 0 || enc[0] != tagString {
		return "", false
	}
	p.pos = 1
	s, err := p.lengthPrefixed()
	if err != nil || p.pos != len(enc) {
		return "", false
	}
	return string(s), true
}
