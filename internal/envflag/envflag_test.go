package envflag

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultsValuesAndErrors(t *testing.T) {
	vars := map[string]string{"S": "x", "N": "7", "D": "2s", "BADN": "seven", "BADD": "soon"}
	e := New(func(k string) string { return vars[k] })
	if got := e.String("S", "d"); got != "x" {
		t.Errorf("String set: %q", got)
	}
	if got := e.String("UNSET", "d"); got != "d" {
		t.Errorf("String unset: %q", got)
	}
	if got := e.Int("N", 1); got != 7 {
		t.Errorf("Int set: %d", got)
	}
	if got := e.Duration("D", time.Second); got != 2*time.Second {
		t.Errorf("Duration set: %s", got)
	}
	if e.Err() != nil {
		t.Fatalf("no error yet: %v", e.Err())
	}
	if got := e.Int("BADN", 3); got != 3 {
		t.Errorf("Int malformed keeps the default: %d", got)
	}
	if got := e.Duration("BADD", time.Minute); got != time.Minute {
		t.Errorf("Duration malformed keeps the default: %s", got)
	}
	err := e.Err()
	if err == nil || !strings.Contains(err.Error(), `BADN="seven"`) || !strings.Contains(err.Error(), `BADD="soon"`) {
		t.Fatalf("errors name both variables: %v", err)
	}
}
