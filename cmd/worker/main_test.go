package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goreactor/goreactor/examples"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// runMain is set in the environment of the subprocesses the tests start:
// the test binary then is the worker binary (main), not a test run.
const runMain = "GOREACTOR_TEST_RUN_WORKER_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMain) == "1" {
		main()
		return
	}
	redistest.Main(m)
}

// command returns the worker binary (this test binary running main) with
// args and an environment of env alone, apart from what a process needs
// (the developer's REDIS_URL, REDIS_CLUSTER_ADDRS and GOREACTOR_* do not
// reach it).
func command(t *testing.T, args []string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REDIS_URL=") && !strings.HasPrefix(kv, "REDIS_CLUSTER_ADDRS=") && !strings.HasPrefix(kv, "GOREACTOR_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(env, runMain+"=1")...)
	return cmd
}

// exitCode runs cmd to its end and returns its exit status and output.
func exitCode(t *testing.T, cmd *exec.Cmd) (int, string) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

func redisURL() string {
	if url := os.Getenv("REDIS_URL"); url != "" {
		return url
	}
	return "redis://" + redistest.Addr() + "/0"
}

// The exit statuses: 0 for -h (with every flag in the usage), 2 for a
// malformed flag or environment variable, 1 for a Redis that does not
// answer, named in a JSON line.
func TestExitStatus(t *testing.T) {
	t.Parallel()
	code, out := exitCode(t, command(t, []string{"-h"}))
	if code != 0 || !strings.Contains(out, "-sweep-interval") || !strings.Contains(out, "GOREACTOR_QUEUE") ||
		!strings.Contains(out, "-redis-cluster") || !strings.Contains(out, "REDIS_CLUSTER_ADDRS") {
		t.Errorf("-h: exit %d, output:\n%s", code, out)
	}
	// -version: its line alone, whatever the environment holds, no Redis.
	code, out = exitCode(t, command(t, []string{"-version"}, "GOREACTOR_CONCURRENCY=many", "REDIS_URL=redis://127.0.0.1:1/0"))
	if code != 0 || out != version.Line()+"\n" {
		t.Errorf("-version: exit %d, output %q, want 0 and %q", code, out, version.Line()+"\n")
	}
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{args: []string{"-concurrency", "0"}, want: "-concurrency 0: must be at least 1"},
		{args: []string{"-queue", "a:x"}, want: "priority"},
		{env: []string{"GOREACTOR_LOCK_EXPIRY=long"}, want: `GOREACTOR_LOCK_EXPIRY="long": not a duration`},
		{args: []string{"-redis-cluster", "127.0.0.1:1"}, env: []string{"REDIS_URL=redis://:pw@127.0.0.1:1/0"},
			want: "REDIS_URL redis://:xxxxx@127.0.0.1:1/0 and -redis-cluster 127.0.0.1:1 are both set: which one wins is ambiguous"},
	} {
		if code, out := exitCode(t, command(t, tc.args, tc.env...)); code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v %v: exit %d, want 2 and %q; output:\n%s", tc.args, tc.env, code, tc.want, out)
		}
	}
}

// TestHardeningRedisURLNotAnswering: a REDIS_URL that does not answer exits
// 1 with a message naming the URL.
func TestHardeningRedisURLNotAnswering(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "redis://" + ln.Addr().String() + "/0"
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	code, out := exitCode(t, command(t, nil, "REDIS_URL="+url))
	if code != 1 || !strings.Contains(out, url) || !strings.Contains(out, `"event":"worker.exit"`) {
		t.Fatalf("exit %d, want 1 and a worker.exit line naming %s; output:\n%s", code, url, out)
	}
}

// TestServe runs the worker binary with its sweeper, hands it a Checkout the
// way an API process would, and stops it with SIGTERM: it exits 0 after a
// graceful stop, serves every example reactor, and writes only JSON lines.
func TestServe(t *testing.T) {
	t.Parallel()
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	cmd := command(t, []string{"-prefix", prefix, "-queue", queue + ":2", "-sweep-interval", "50ms"}, "REDIS_URL="+redisURL())
	logs := newLogWatch()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	rdb := redistest.Client(t)
	e, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard, Enqueuer: worker.NewClient(rdb, queue)})
	if err != nil {
		t.Fatal(err)
	}
	if err := examples.Register(e); err != nil {
		t.Fatal(err)
	}
	order := "w-" + reactor.NewRunID()[:8]
	res, err := e.Enqueue(t.Context(), examples.Checkout, map[string]any{"order": order, "item": "book"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	if res, err = e.Wait(wctx, res.RunID); err != nil {
		t.Fatal(err)
	}
	if res.Status != reactor.StatusCompleted {
		t.Errorf("status %s, failure %v", res.Status, res.Failure)
	}

	// main serves what examples.Register registers.
	var started struct{ Reactors []string }
	if err := json.Unmarshal([]byte(logs.await(t, `"event":"worker.started"`)), &started); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(started.Reactors, e.Names()) {
		t.Errorf("the worker serves %v; examples.Register registers %v", started.Reactors, e.Names())
	}
	logs.await(t, `"event":"reactor.sweep.pass"`) // the in-process sweeper runs

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the worker did not exit after SIGTERM")
	}
	logs.await(t, `"event":"worker.stopped"`)
	for _, line := range logs.all() {
		if !json.Valid([]byte(line)) {
			t.Errorf("not a JSON line: %s", line)
		}
	}
}

// The README's "Deploying" section shows this file's program as the model
// of a user's worker: the snippet is main.go from its package clause on,
// so it compiles because this package does.
func TestReadmeWorkerIsThisFile(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, deploying, ok := strings.Cut(string(readme), "\n### Deploying\n")
	if !ok {
		t.Fatal(`README.md has no "### Deploying" section`)
	}
	_, snippet, ok := strings.Cut(deploying, "```go\n")
	if !ok {
		t.Fatal("README.md's Deploying section has no go snippet")
	}
	snippet, _, _ = strings.Cut(snippet, "```")
	_, program, _ := strings.Cut(string(src), "\npackage main\n")
	if want := "package main\n" + program; unindent(snippet) != want {
		t.Errorf("README.md's Deploying snippet:\n%s\nis not cmd/worker/main.go from its package clause:\n%s", unindent(snippet), want)
	}
}

// unindent removes the indentation of the first line from every line (a
// snippet inside a Markdown list item is indented).
func unindent(s string) string {
	indent := s[:len(s)-len(strings.TrimLeft(s, " "))]
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, indent)
	}
	return strings.Join(lines, "\n")
}

var discard = slog.New(slog.DiscardHandler)

// logWatch is an io.Writer of log lines that a test can wait on: await
// returns as soon as a matching line is written, without polling.
type logWatch struct {
	mu      sync.Mutex
	partial []byte
	lines   []string
	grew    chan struct{} // closed and replaced when a line is complete
}

func newLogWatch() *logWatch { return &logWatch{grew: make(chan struct{})} }

func (l *logWatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	added := false
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		added = true
	}
	if added {
		close(l.grew)
		l.grew = make(chan struct{})
	}
	return len(p), nil
}

func (l *logWatch) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// await returns the first line containing substr, waiting up to 20 s for it.
func (l *logWatch) await(t *testing.T, substr string) string {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		l.mu.Lock()
		for _, line := range l.lines {
			if strings.Contains(line, substr) {
				l.mu.Unlock()
				return line
			}
		}
		grew := l.grew
		l.mu.Unlock()
		select {
		case <-grew:
		case <-timeout:
			t.Fatalf("no log line with %s:\n%s", substr, strings.Join(l.all(), "\n"))
		}
	}
}
