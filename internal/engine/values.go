package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/goreactor/goreactor/fingerprint"
)

// The values of guarded undo. A fingerprint tells a program whether two
// states are the same; it tells a person nothing ("restore to sha256:91c3…"
// cannot be acted on). So the states a conflict is about are kept too, as
// their fingerprint encodings (fingerprint.Encode), and reports render them
// with fingerprint.Format: the effect's before and after when it is
// recorded, what the probe read when the undo compares. For a sensitive run
// (Sensitive) they are kept the same; what shows a report to people
// decides whether they may read them (RollbackReport.Redacted).

// maxShownValue bounds the encoding of a state kept for a person to read:
// a larger state is still compared by its fingerprint, but its value is not
// kept (the report shows its fingerprint alone), so that one huge record
// cannot swell every write of the run.
const maxShownValue = 64 << 10

// RedactedValue replaces a state's value in a report redacted for a
// sensitive run (RollbackReport.Redacted). fingerprint.Format never renders
// a value that starts with a parenthesis, so it cannot be mistaken for one.
const RedactedValue = "(redacted: sensitive run)"

// fingerprintOf returns v's fingerprint and its encoding. The fingerprint
// is fingerprint.Of(v), which the package defines as Prefix and the hex
// SHA-256 of the encoding, computed here from the one encoding.
func fingerprintOf(v any) (string, []byte, error) {
	enc, err := fingerprint.Encode(v)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(enc)
	return fingerprint.Prefix + hex.EncodeToString(sum[:]), enc, nil
}

// shownEncoding is enc if it is small enough to keep for display, else nil.
func shownEncoding(enc []byte) []byte {
	if len(enc) > maxShownValue {
		return nil
	}
	return enc
}

// shownValue renders a kept encoding for a person (fingerprint.Format): ""
// when none was kept, or when it does not parse (it always should).
func shownValue(enc []byte) string {
	if len(enc) == 0 {
		return ""
	}
	s, err := fingerprint.Format(enc)
	if err != nil {
		return ""
	}
	return s
}

// writeState writes one state of an action item: its fingerprint with a
// note, then its value, if known, indented under it.
func writeState(b *strings.Builder, label, fp, note, value string) {
	fmt.Fprintf(b, "  %s %s%s\n", label, fp, note)
	if value == "" {
		return
	}
	const indent = "              " // under the fingerprint
	for line := range strings.SplitSeq(value, "\n") {
		b.WriteString(indent)
		b.WriteString(line)
		b.WriteString("\n")
	}
}

// Redacted returns a copy of the report with every state's value replaced
// with RedactedValue (a value not known stays ""), and ValuesRedacted set;
// the fingerprints stay. It is what a sensitive run's report looks like to
// someone who may not read its values: the dashboard shows it to requests
// without its token. The report itself is not changed.
func (r *RollbackReport) Redacted() *RollbackReport {
	if r == nil {
		return nil
	}
	out := *r
	out.ValuesRedacted = true
	hide := func(v *string) {
		if *v != "" {
			*v = RedactedValue
		}
	}
	out.Entries = make([]RollbackEntry, len(r.Entries))
	for i, e := range r.Entries {
		hide(&e.ExpectedValue)
		hide(&e.ObservedValue)
		hide(&e.RestoreToValue)
		out.Entries[i] = e
	}
	out.ActionRequired = make([]ActionItem, len(r.ActionRequired))
	for i, a := range r.ActionRequired {
		hide(&a.ExpectedValue)
		hide(&a.ObservedValue)
		hide(&a.RestoreToValue)
		out.ActionRequired[i] = a
	}
	return &out
}
