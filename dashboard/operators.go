package dashboard

import (
	"bufio"
	"crypto/subtle"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
)

// maxReason bounds an action's reason, as the engine's audit does.
const maxReason = 1000

// operator tells who made request r, and whether they may act: the name
// an Operators token maps to; else, with OperatorHeader set, that header's
// value; "" for a holder of the shared Token. Every token is compared in
// constant time, whichever matches.
func (h *Handler) operator(r *http.Request) (name string, ok bool) {
	got, hasBearer := bearer(r)
	if hasBearer && got != "" {
		if h.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(h.cfg.Token)) == 1 {
			ok = true
		}
		for tok, who := range h.cfg.Operators {
			if subtle.ConstantTimeCompare([]byte(got), []byte(tok)) == 1 {
				name, ok = who, true
			}
		}
	}
	if hdr := h.cfg.OperatorHeader; hdr != "" {
		// The proxy in front authenticated the person; with tokens
		// configured as well, one of them is required too.
		if who := strings.TrimSpace(r.Header.Get(hdr)); name == "" && who != "" && (ok || !h.tokensConfigured()) {
			name, ok = who, true
		}
	}
	return name, ok
}

// tokensConfigured reports whether a token is needed to act.
func (h *Handler) tokensConfigured() bool { return h.cfg.Token != "" || len(h.cfg.Operators) > 0 }

// actionsEnabled reports whether anything lets a request act.
func (h *Handler) actionsEnabled() bool { return h.tokensConfigured() || h.cfg.OperatorHeader != "" }

// reasonBody is the body of an action: why the operator asks.
type reasonBody struct {
	Reason string `json:"reason"`
}

// checkReason is the error for a missing or oversized reason, "" for a
// good one.
func checkReason(reason string) string {
	switch {
	case strings.TrimSpace(reason) == "":
		return `a reason is required: send {"reason": "why you ask"}; it is kept in the run's audit with your name`
	case len(reason) > maxReason:
		return fmt.Sprintf("the reason is %d bytes, over the maximum of %d", len(reason), maxReason)
	}
	return ""
}

// ParseOperators reads an operators file: one operator per line, a name
// then its token, separated by white space ("alice 3f9c..."); blank lines
// and lines starting with # are skipped. Names are unique, and so are
// tokens; a token is at least 16 bytes.
func ParseOperators(rd io.Reader) (map[string]string, error) {
	out := map[string]string{}
	names := map[string]bool{}
	sc := bufio.NewScanner(rd)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.FieldsFunc(line, unicode.IsSpace)
		switch {
		case len(f) != 2:
			return nil, fmt.Errorf("operators file line %d: want \"<name> <token>\"", n)
		case len(f[1]) < 16:
			return nil, fmt.Errorf("operators file line %d: %s's token is %d bytes; use at least 16 (openssl rand -hex 16)", n, f[0], len(f[1]))
		case names[f[0]]:
			return nil, fmt.Errorf("operators file line %d: %s is named twice", n, f[0])
		case out[f[1]] != "":
			return nil, fmt.Errorf("operators file line %d: %s's token is %s's too", n, f[0], out[f[1]])
		}
		names[f[0]], out[f[1]] = true, f[0]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("operators file: %w", err)
	}
	return out, nil
}
