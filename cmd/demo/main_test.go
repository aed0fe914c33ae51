package main

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestDemoEmbedded runs the whole demo on the embedded Redis, as CI does;
// CI also runs it against a real Redis.
func TestDemoEmbedded(t *testing.T) {
	t.Setenv("GOREACTOR_EMBEDDED", "1")
	if err := run(); err != nil {
		t.Fatal(err)
	}
}
