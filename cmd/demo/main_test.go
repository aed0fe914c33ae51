package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/goreactor/goreactor/internal/redisurl"
	"github.com/goreactor/goreactor/internal/version"
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
	if err := run(redisurl.Target{}); err != nil {
		t.Fatal(err)
	}
}

// TestHardeningRedisURLNotAnswering: a REDIS_URL that does not answer makes
// the demo exit non-zero naming the URL, instead of running on the local or
// an embedded Redis. The test binary runs main itself as the subprocess.
func TestHardeningRedisURLNotAnswering(t *testing.T) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(mainStatus(nil, os.Stdout, os.Stderr))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://" + ln.Addr().String() + "/0"
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHardeningRedisURLNotAnswering$")
	cmd.Env = append(os.Environ(), runMainEnv+"=1", "REDIS_URL="+url, "GOREACTOR_EMBEDDED=")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("demo with REDIS_URL=%s: %v, want a non-zero exit; output:\n%s", url, err, out)
	}
	if !strings.Contains(string(out), url) || !strings.Contains(string(out), "does not answer") {
		t.Fatalf("output does not name %s as not answering:\n%s", url, out)
	}
}

// -version prints the version and exits 0 without running the demo; a bad
// command line exits 2.
func TestVersionFlag(t *testing.T) {
	var out, errs strings.Builder
	if code := mainStatus([]string{"-version"}, &out, &errs); code != 0 || out.String() != version.Line()+"\n" {
		t.Fatalf("-version: exit %d, output %q (stderr %q), want 0 and %q", code, out.String(), errs.String(), version.Line()+"\n")
	}
	if code := mainStatus([]string{"-nope"}, &out, &errs); code != 2 {
		t.Fatalf("-nope: exit %d, want 2", code)
	}
	if code := mainStatus([]string{"extra"}, &out, &errs); code != 2 {
		t.Fatalf("extra: exit %d, want 2", code)
	}
}

// runMainEnv makes the test binary run the demo's main.
const runMainEnv = "GOREACTOR_DEMO_TEST_RUN_MAIN"
