package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// redisArgs name the tests' shared Redis to Run: -redis-cluster and its
// seeds when the tests share a cluster (GOREACTOR_TEST_CLUSTER), else
// -redis and its URL.
func redisArgs() []string {
	if seeds := redistest.ClusterAddrs(); seeds != nil {
		return []string{"-redis-cluster", strings.Join(seeds, ",")}
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		return []string{"-redis", url}
	}
	return []string{"-redis", "redis://" + redistest.Addr() + "/0"}
}

// redisEnv is redisArgs as the environment variable of a worker process:
// REDIS_CLUSTER_ADDRS or REDIS_URL.
func redisEnv() string {
	if seeds := redistest.ClusterAddrs(); seeds != nil {
		return "REDIS_CLUSTER_ADDRS=" + strings.Join(seeds, ",")
	}
	if url := os.Getenv("REDIS_URL"); url != "" {
		return "REDIS_URL=" + url
	}
	return "REDIS_URL=redis://" + redistest.Addr() + "/0"
}

// noEnv is an empty environment, so the developer's GOREACTOR_* variables
// do not reach a test.
func noEnv(string) string { return "" }

// A worker built from the public entry point runs a saga end to end: Run
// serves the definitions on the queue of its flags, its sweeper passes,
// Options.Engine reaches the engine, and cancelling the context stops it
// with nil. Every log line is JSON.
func TestRunServesASagaEndToEnd(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	tr := &trail{}
	def := reactor.MustDefine("order",
		step(tr, "reserve", nil),
		step(tr, "charge", nil, "reserve"),
		reactor.Returns(reactor.FromStep("charge")),
	)
	events := &recorder{}
	logs := newLogWatch()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ran := make(chan error, 1)
	go func() {
		ran <- worker.Run(ctx, worker.Options{
			Definitions: []*reactor.Definition{def},
			Args:        append(redisArgs(), "-prefix", prefix, "-queue", queue+":2", "-sweep-interval", "50ms", "-shutdown-timeout", "5s"),
			Getenv:      noEnv,
			Stderr:      logs,
			Engine:      func(c *reactor.Config) { c.Hooks = append(c.Hooks, events.hook("worker")) },
		})
	}()

	// The API side: an engine of its own on the same prefix and queue.
	api, err := reactor.NewEngine(t.Context(), reactor.Config{Client: rdb, Prefix: prefix, Logger: discard, Enqueuer: worker.NewClient(rdb, queue)})
	require.NoError(t, err)
	wctx, wcancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer wcancel()
	res, err := api.Enqueue(wctx, def, nil)
	require.NoError(t, err)
	res, err = api.Wait(wctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "failure: %v", res.Failure)
	v, err := reactor.ValueOf[string](res)
	require.NoError(t, err)
	require.Equal(t, "charge-done", v)
	require.Equal(t, []string{"run:reserve", "run:charge"}, tr.all())
	require.Equal(t, []string{"reserve", "charge"}, events.steps("worker", reactor.EventStepCompleted), "Options.Engine's hook")

	started := logs.await(t, `"event":"worker.started"`)
	require.Contains(t, started, `"enqueue_queue":"`+queue+`"`)
	require.Contains(t, started, `"reactors":["order"]`)
	logs.await(t, `"event":"reactor.sweep.pass"`)

	cancel()
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	logs.await(t, `"event":"worker.stopped"`)
	for _, line := range logs.all() {
		require.True(t, json.Valid([]byte(line)), "not JSON: %s", line)
	}
}

// Run's refusals: no definitions, a malformed setting (a *UsageError),
// -h (flag.ErrHelp), a Redis that does not answer (naming it), an
// Options.Engine that changes what the flags decide.
func TestRunRefuses(t *testing.T) {
	t.Parallel()
	def := reactor.MustDefine("noop", reactor.Step("s", reactor.StepConfig[reactor.Args, int]{
		Run: func(context.Context, reactor.Args) (int, error) { return 1, nil },
	}))
	run := func(opts worker.Options) error {
		if opts.Definitions == nil {
			opts.Definitions = []*reactor.Definition{def}
		}
		opts.Getenv, opts.Stderr = noEnv, &strings.Builder{}
		return worker.Run(t.Context(), opts)
	}

	err := run(worker.Options{Definitions: []*reactor.Definition{}})
	require.ErrorContains(t, err, "no definitions")

	err = run(worker.Options{Args: []string{"-concurrency", "0"}})
	var usage *worker.UsageError
	require.ErrorAs(t, err, &usage)
	require.ErrorContains(t, err, "-concurrency 0: must be at least 1")

	require.ErrorIs(t, run(worker.Options{Args: []string{"-help"}}), flag.ErrHelp)

	// -version: its line on Stdout and nil, before the environment or Redis.
	var out strings.Builder
	require.NoError(t, worker.Run(t.Context(), worker.Options{Definitions: []*reactor.Definition{def}, Args: []string{"-version"},
		Getenv: func(k string) string {
			return map[string]string{"GOREACTOR_CONCURRENCY": "many", "REDIS_URL": "redis://127.0.0.1:1/0"}[k]
		},
		Stdout: &out, Stderr: &strings.Builder{}}))
	require.Equal(t, version.Line()+"\n", out.String())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "redis://" + ln.Addr().String() + "/0"
	require.NoError(t, ln.Close())
	err = run(worker.Options{Args: []string{"-redis", dead}})
	require.ErrorContains(t, err, dead)
	require.ErrorContains(t, err, "does not answer PING")
	require.False(t, errors.As(err, &usage), "a Redis that does not answer is not a usage error")

	err = run(worker.Options{
		Args:   append(redisArgs(), "-prefix", redistest.Prefix(t), "-queue", redistest.Queue(t)),
		Engine: func(c *reactor.Config) { c.Prefix = "elsewhere" },
	})
	require.ErrorContains(t, err, "Options.Engine changed")
}

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
		i := strings.IndexByte(string(l.partial), '\n')
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
	return append([]string(nil), l.lines...)
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
