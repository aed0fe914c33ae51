package fingerprint

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// Format renders an encoding as indented text, one map entry or list
// element a line, so that two encodings can be compared side by side (or
// with diff) to see where two states part. It checks that enc is exactly an
// encoding Encode could have produced, and fails with an error wrapping
// ErrMalformed otherwise.
//
// Integers print in decimal, floats always with a point or an exponent
// (1.0), strings quoted as Go quotes them, bytes as bytes(<hex>), times as
// time(<RFC 3339>), nil as nil.
func Format(enc []byte) (string, error) {
	return render(enc, true)
}

// formatCompact renders an encoding on one line, for paths and messages.
func formatCompact(enc []byte) (string, error) {
	return render(enc, false)
}

func render(enc []byte, indent bool) (string, error) {
	p := parser{data: enc}
	n, err := p.node()
	if err != nil {
		return "", err
	}
	if p.pos != len(enc) {
		return "", p.errorf("%d bytes after the value", len(enc)-p.pos)
	}
	var b strings.Builder
	n.write(&b, indent, 0)
	return b.String(), nil
}

// node is a parsed value, kept as the text Format prints.
type node struct {
	text  string // a scalar, rendered
	open  string // "[" or "{" for a list or map
	items []node // list elements, or keys and values alternating
}

func (n *node) write(b *strings.Builder, indent bool, depth int) {
	if n.open == "" {
		b.WriteString(n.text)
		return
	}
	closer := "]"
	step := 1
	if n.open == "{" {
		closer = "}"
		step = 2
	}
	b.WriteString(n.open)
	if len(n.items) == 0 {
		b.WriteString(closer)
		return
	}
	for i := 0; i < len(n.items); i += step {
		if indent {
			b.WriteString("\n")
			b.WriteString(strings.Repeat("  ", depth+1))
		} else if i > 0 {
			b.WriteString(" ")
		}
		n.items[i].write(b, indent, depth+1)
		if step == 2 {
			b.WriteString(": ")
			n.items[i+1].write(b, indent, depth+1)
		}
		if indent {
			b.WriteString(",")
		} else if i+step < len(n.items) {
			b.WriteString(",")
		}
	}
	if indent {
		b.WriteString("\n")
		b.WriteString(strings.Repeat("  ", depth))
	}
	b.WriteString(closer)
}

// parser reads an encoding strictly: every length must be canonical and
// agree with the data, every number must be written the way Encode writes
// it, and map keys must ascend, so that only Encode's own output parses.
type parser struct {
	data []byte
	pos  int
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w at byte %d: %s", ErrMalformed, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) node() (node, error) {
	if p.pos >= len(p.data) {
		return node{}, p.errorf("unexpected end")
	}
	tag := p.data[p.pos]
	p.pos++
	switch tag {
	case tagNil:
		return node{text: "nil"}, nil
	case tagTrue:
		return node{text: "true"}, nil
	case tagFalse:
		return node{text: "false"}, nil
	case tagInt:
		s, err := p.until(';')
		if err != nil {
			return node{}, err
		}
		if !canonicalInt(s) {
			return node{}, p.errorf("integer %q is not canonical or out of range", s)
		}
		return node{text: s}, nil
	case tagFloat:
		s, err := p.until(';')
		if err != nil {
			return node{}, err
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) || (f == 0 && math.Signbit(f)) ||
			strconv.FormatFloat(f, 'g', -1, 64) != s {
			return node{}, p.errorf("float %q is not canonical", s)
		}
		if !strings.ContainsAny(s, ".e") {
			s += ".0"
		}
		return node{text: s}, nil
	case tagString:
		s, err := p.lengthPrefixed()
		if err != nil {
			return node{}, err
		}
		return node{text: strconv.Quote(string(s))}, nil
	case tagBytes:
		n, err := p.length(':')
		if err != nil {
			return node{}, err
		}
		if n > (len(p.data)-p.pos)/2 {
			return node{}, p.errorf("%d bytes announced, fewer left", n)
		}
		h := p.data[p.pos : p.pos+2*n]
		if _, err := hex.DecodeString(string(h)); err != nil || bytes.ContainsAny(h, "ABCDEF") {
			return node{}, p.errorf("bytes are not lowercase hex")
		}
		p.pos += 2 * n
		return node{text: "bytes(" + string(h) + ")"}, nil
	case tagTime:
		s, err := p.until(';')
		if err != nil {
			return node{}, err
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil || t.Location() != time.UTC || t.Year() < 1 || t.Year() > 9999 || t.Format(time.RFC3339Nano) != s {
			return node{}, p.errorf("time %q is not canonical", s)
		}
		return node{text: "time(" + s + ")"}, nil
	case tagList:
		n, err := p.length('[')
		if err != nil {
			return node{}, err
		}
		out := node{open: "[", items: make([]node, 0, min(n, 64))}
		for range n {
			item, err := p.node()
			if err != nil {
				return node{}, err
			}
			out.items = append(out.items, item)
		}
		if err := p.expect(']'); err != nil {
			return node{}, err
		}
		return out, nil
	case tagMap:
		n, err := p.length('{')
		if err != nil {
			return node{}, err
		}
		out := node{open: "{", items: make([]node, 0, min(2*n, 64))}
		var prev []byte
		for i := range n {
			start := p.pos
			key, err := p.node()
			if err != nil {
				return node{}, err
			}
			if i > 0 && bytes.Compare(prev, p.data[start:p.pos]) >= 0 {
				return node{}, p.errorf("map keys not in ascending order of their encodings")
			}
			prev = p.data[start:p.pos]
			val, err := p.node()
			if err != nil {
				return node{}, err
			}
			out.items = append(out.items, key, val)
		}
		if err := p.expect('}'); err != nil {
			return node{}, err
		}
		return out, nil
	}
	p.pos--
	return node{}, p.errorf("unknown tag %q", tag)
}

func (p *parser) expect(c byte) error {
	if p.pos >= len(p.data) || p.data[p.pos] != c {
		return p.errorf("expected %q", c)
	}
	p.pos++
	return nil
}

// until returns the text up to the terminator c and moves past it.
func (p *parser) until(c byte) (string, error) {
	i := bytes.IndexByte(p.data[p.pos:], c)
	if i < 0 {
		return "", p.errorf("no %q terminator", c)
	}
	s := string(p.data[p.pos : p.pos+i])
	p.pos += i + 1
	return s, nil
}

// length reads a canonical decimal count followed by sep.
func (p *parser) length(sep byte) (int, error) {
	start := p.pos
	for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
		p.pos++
	}
	digits := string(p.data[start:p.pos])
	if digits == "" || (len(digits) > 1 && digits[0] == '0') || len(digits) > 15 {
		return 0, p.errorf("bad length %q", digits)
	}
	n, _ := strconv.Atoi(digits)
	if err := p.expect(sep); err != nil {
		return 0, err
	}
	// Every element takes at least one byte, so no honest count exceeds what is left.
	if n > len(p.data)-p.pos {
		return 0, p.errorf("length %d exceeds the %d bytes left", n, len(p.data)-p.pos)
	}
	return n, nil
}

// lengthPrefixed reads <count>:<bytes>.
func (p *parser) lengthPrefixed() ([]byte, error) {
	n, err := p.length(':')
	if err != nil {
		return nil, err
	}
	s := p.data[p.pos : p.pos+n]
	p.pos += n
	return s, nil
}

var (
	minInt  = big.NewInt(math.MinInt64)
	maxUint = new(big.Int).SetUint64(math.MaxUint64)
)

// canonicalInt reports whether s is a decimal Encode writes: no plus sign,
// no leading zeros, no -0, and within int64's minimum and uint64's maximum.
func canonicalInt(s string) bool {
	n, ok := new(big.Int).SetString(s, 10)
	return ok && n.String() == s && n.Cmp(minInt) >= 0 && n.Cmp(maxUint) <= 0
}
