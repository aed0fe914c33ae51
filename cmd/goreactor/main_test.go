package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/cli"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func envOf(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func redisURL() string {
	if url := os.Getenv("REDIS_URL"); url != "" {
		return url
	}
	return "redis://" + redistest.Addr() + "/0"
}

var discard = slog.New(slog.DiscardHandler)

// approval is the interrupt's payload.
type approval struct {
	By string `json:"by"`
	OK bool   `json:"ok"`
}

// approvalFlow reserves, waits for an approval (correlation: the order),
// then ships naming the approver.
func approvalFlow() *reactor.Definition {
	return reactor.MustDefine("approval",
		reactor.Input[string]("order", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) { return "reserved", nil },
		}),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			After: []string{"reserve"},
			Correlation: func(in reactor.Args) (string, error) {
				return reactor.Arg[string](in, "order")
			},
			Validate: func(a approval) error {
				if a.By == "" {
					return errors.New("an approval names who approves (by)")
				}
				return nil
			},
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep("approve", "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				by, err := reactor.Arg[string](in, "by")
				return "shipped, approved by " + by, err
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
}

// fixture is a worker in this process serving approvalFlow on a test's
// prefix and queue, and the engine that enqueues its runs.
type fixture struct {
	t             *testing.T
	rdb           redis.UniversalClient
	prefix, queue string
	engine        *reactor.Engine
	def           *reactor.Definition
	stop          func() // stops the worker (once)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, rdb: redistest.Client(t), prefix: redistest.Prefix(t), queue: redistest.Queue(t), def: approvalFlow()}
	client := worker.NewClient(f.rdb, f.queue)
	t.Cleanup(func() { _ = client.Close() })
	e, err := reactor.NewEngine(t.Context(), reactor.Config{Client: f.rdb, Prefix: f.prefix, Logger: discard, Enqueuer: client})
	require.NoError(t, err)
	require.NoError(t, e.Register(f.def))
	f.engine = e
	w := worker.New(e, f.rdb, worker.Config{Queues: map[string]int{f.queue: 1}, ShutdownTimeout: 5 * time.Second, Logger: discard})
	require.NoError(t, w.Start(context.Background()))
	f.stop = sync.OnceFunc(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			t.Errorf("worker stop: %v", err)
		}
	})
	t.Cleanup(f.stop)
	return f
}

// paused enqueues an approval for order and waits until it is paused.
func (f *fixture) paused(order string) string {
	f.t.Helper()
	res, err := f.engine.Enqueue(f.t.Context(), f.def, map[string]any{"order": order})
	require.NoError(f.t, err)
	require.EventuallyWithT(f.t, func(c *assert.CollectT) {
		r, err := f.engine.Get(context.Background(), res.RunID)
		require.NoError(c, err)
		require.Equal(c, reactor.StatusPaused, r.Status)
	}, 10*time.Second, 5*time.Millisecond)
	return res.RunID
}

type result struct {
	code           int
	stdout, stderr string
}

// cli runs the command on the fixture's Redis, prefix and queue.
func (f *fixture) cli(stdin string, args ...string) result {
	f.t.Helper()
	args = append(args, "-redis", redisURL(), "-prefix", f.prefix, "-queue", f.queue)
	return runCLI(f.t, stdin, envOf(map[string]string{"USER": "ann"}), args...)
}

func runCLI(t *testing.T, stdin string, getenv func(string) string, args ...string) result {
	t.Helper()
	var out, errs strings.Builder
	code := run(t.Context(), args, getenv, strings.NewReader(stdin), &out, &errs)
	return result{code: code, stdout: out.String(), stderr: errs.String()}
}

func (f *fixture) final(id string) *reactor.Result {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(f.t.Context(), 15*time.Second)
	defer cancel()
	res, err := f.engine.Wait(ctx, id)
	require.NoError(f.t, err)
	return res
}

func TestContinueByRunIDFromAFile(t *testing.T) {
	f := newFixture(t)
	id := f.paused("o-1")
	file := filepath.Join(t.TempDir(), "approval.json")
	require.NoError(t, os.WriteFile(file, []byte(`{"by": "ann", "ok": true}`), 0o600))

	r := f.cli("", "continue", id, "approve", "--payload", "@"+file, "--by", "ops:ann")
	require.Equal(t, 0, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "recorded: run "+id+", step approve, payload 1 of 1")
	assert.Contains(t, r.stdout, "the worker validates it")
	assert.Contains(t, r.stdout, "taken: run "+id+" went on past approve")

	res := f.final(id)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Err())
	got, err := reactor.ValueOf[string](res)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by ann", got)
	entries, err := f.engine.Audit(t.Context(), id)
	require.NoError(t, err)
	sender := ""
	for _, en := range entries {
		if en.Kind == reactor.AuditContinued {
			sender = en.Operator
		}
	}
	assert.Equal(t, "ops:ann", sender)

	// A second payload is told when the first came; nothing changes.
	r = f.cli("", "continue", id, "approve", "--payload", `{"by":"bob"}`)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "already continued: run "+id+", step approve took its payloads; the first came at 20")
}

func TestContinueByCorrelationFromStdin(t *testing.T) {
	f := newFixture(t)
	id := f.paused("o-2")
	// Flags before the arguments work too; --by defaults to $USER.
	r := f.cli(`{"by":"cy","ok":true}`, "continue", "--correlation", "o-2", "--payload", "-")
	require.Equal(t, 0, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "recorded: run "+id+", step approve")
	res := f.final(id)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Err())
	entries, err := f.engine.Audit(t.Context(), id)
	require.NoError(t, err)
	for _, en := range entries {
		if en.Kind == reactor.AuditContinued {
			assert.Equal(t, "ann", en.Operator, "the default sender is $USER")
		}
	}

	r = f.cli("", "continue", "--correlation", "o-404", "--payload", `{"by":"cy"}`)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no such correlation")
}

func TestRefusedPayloadIsReported(t *testing.T) {
	f := newFixture(t)
	id := f.paused("o-3")
	r := f.cli("", "continue", id, "approve", "--payload", `{"ok":true}`, "--wait", "10s")
	require.Equal(t, 1, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "recorded: run "+id)
	assert.Contains(t, r.stderr, "refused by the worker")
	assert.Contains(t, r.stderr, "names who approves")
	run, err := f.engine.Get(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusPaused, run.Status)

	// show has the refusal on record.
	r = f.cli("", "show", id)
	require.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, r.stdout, "step        approve")
	assert.Contains(t, r.stdout, "correlation o-3")
	assert.Contains(t, r.stdout, "received    0 of 1")
	assert.Contains(t, r.stdout, "names who approves")
	r = f.cli("", "show", id, "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var shown cli.Interrupt
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown), r.stdout)
	assert.Equal(t, id, shown.RunID)
	assert.Equal(t, "o-3", shown.Correlation)
	assert.Contains(t, shown.Refused, "names who approves")
	assert.Empty(t, shown.Payloads)
	assert.Empty(t, shown.PayloadType, "the command has no definitions")

	// A corrected payload goes through, past the earlier refusal.
	r = f.cli("", "continue", id, "approve", "--payload", `{"by":"dee"}`)
	require.Equal(t, 0, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "taken: run "+id)
	require.Equal(t, reactor.StatusCompleted, f.final(id).Status)
}

func TestListPaused(t *testing.T) {
	f := newFixture(t)
	a := f.paused("o-10")
	b := f.paused("o-11")

	r := f.cli("", "list", "paused")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 3, r.stdout)
	assert.True(t, strings.HasPrefix(lines[0], "RUN "), lines[0])
	assert.Regexp(t, "^"+a+` +approval +approve +o-10 +20\S+ +- +0/1$`, lines[1], "longest paused first")
	assert.Regexp(t, "^"+b+` +approval +approve +o-11 `, lines[2])

	r = f.cli("", "list", "paused", "--json", "--reactor", "approval", "--limit", "1")
	require.Equal(t, 0, r.code, r.stderr)
	var runs []cli.Paused
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &runs), r.stdout)
	require.Len(t, runs, 1)
	assert.Equal(t, a, runs[0].RunID)
	assert.Equal(t, "approve", runs[0].Step)
	assert.Equal(t, "o-10", runs[0].Correlation)
	assert.Equal(t, 1, runs[0].Accepts)
	assert.False(t, runs[0].Since.IsZero())
	assert.True(t, runs[0].Deadline.IsZero())

	r = f.cli("", "list", "paused", "--reactor", "other", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	assert.Equal(t, "[]\n", r.stdout)

	// A run that went on leaves the listing.
	require.Equal(t, 0, f.cli("", "continue", a, "approve", "--payload", `{"by":"ann"}`).code)
	r = f.cli("", "list", "paused", "--json")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &runs), r.stdout)
	require.Len(t, runs, 1)
	assert.Equal(t, b, runs[0].RunID)
}

func TestNotPausedThere(t *testing.T) {
	f := newFixture(t)
	id := f.paused("o-20")
	r := f.cli("", "continue", id, "ship", "--payload", `{"by":"ann"}`)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "not paused: run "+id+" is paused, and it waits at step approve")
	r = f.cli("", "continue", "no-such-run", "approve", "--payload", `{"by":"ann"}`)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "no such run")

	require.NoError(t, f.engine.Cancel(t.Context(), id))
	require.Equal(t, reactor.StatusCancelled, f.final(id).Status)
	r = f.cli("", "continue", id, "approve", "--payload", `{"by":"ann"}`)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "not paused: run "+id+" is cancelled (finished)")
	r = f.cli("", "show", id)
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "not paused")
}

// A payload no worker takes within --wait is recorded: exit 3, and the run
// goes on once a worker gets the wake-up.
func TestWaitWithoutAWorker(t *testing.T) {
	f := newFixture(t)
	id := f.paused("o-30")
	f.stop()
	r := f.cli("", "continue", id, "approve", "--payload", `{"by":"ann"}`, "--wait", "300ms")
	assert.Equal(t, 3, r.code, "stdout %s\nstderr %s", r.stdout, r.stderr)
	assert.Contains(t, r.stdout, "recorded: run "+id)
	assert.Contains(t, r.stderr, "has not taken the payload yet within --wait 300ms")
	// --wait 0 does not wait: a second sender is told it came too late.
	r = f.cli("", "continue", id, "approve", "--payload", `{"by":"bob"}`, "--wait", "0")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "already continued")
}

func TestBadCommandLines(t *testing.T) {
	noRedis := envOf(map[string]string{"REDIS_URL": "redis://127.0.0.1:1/0"})
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"continue"},
		{"continue", "r1", "approve"},
		{"continue", "r1", "--payload", "{}"},
		{"continue", "r1", "approve", "extra", "--payload", "{}"},
		{"continue", "r1", "approve", "--payload", "{"},
		{"continue", "r1", "approve", "--payload", "@/no/such/file.json"},
		{"continue", "r1", "approve", "--correlation", "c", "--payload", "{}"},
		{"continue", "r1", "approve", "--payload", "{}", "--wait", "-1s"},
		{"continue", "r1", "approve", "--payload", "{}", "--wait", "soon"},
		{"continue", "r1", "approve", "--payload", "{}", "--nope"},
		{"continue", "r1", "approve", "--payload", "{}", "-redis", "r:1"},
		{"continue", "r1", "approve", "--payload", "{}", "-queue", "a:x"},
		{"list"},
		{"list", "running"},
		{"list", "paused", "--limit", "0"},
		{"show"},
		{"show", "a", "b"},
	} {
		r := runCLI(t, "", noRedis, args...)
		assert.Equal(t, 2, r.code, "%q: stdout %s\nstderr %s", args, r.stdout, r.stderr)
		assert.NotEmpty(t, r.stderr, "%q says nothing", args)
	}
	r := runCLI(t, "", noRedis, "continue", "r1", "approve", "--payload", "-")
	assert.Equal(t, 2, r.code, "empty stdin is not JSON")
	assert.Contains(t, r.stderr, "the payload on stdin is not valid JSON")

	r = runCLI(t, "", envOf(map[string]string{"GOREACTOR_QUEUE_SHARDS": "many"}), "list", "paused")
	assert.Equal(t, 2, r.code, "a malformed environment variable")

	// A Redis that does not answer is a failure, not a usage error.
	r = runCLI(t, "", noRedis, "list", "paused")
	assert.Equal(t, 1, r.code)
	assert.Contains(t, r.stderr, "does not answer")

	r = runCLI(t, "", noRedis, "version")
	assert.Equal(t, 0, r.code)
	assert.Equal(t, version.Line()+"\n", r.stdout)
	r = runCLI(t, "", noRedis, "continue", "-h")
	assert.Equal(t, 0, r.code)
	assert.Contains(t, r.stderr, "-payload")
}

func TestExplain(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		err  error
		want string
	}{
		{&reactor.AlreadyContinuedError{RunID: "r", Step: "s", At: at}, "already continued: run r, step s took its payloads; the first came at 2026-12-03T10:00:00.000Z"},
		{&reactor.ContinueError{RunID: "r", Step: "s", Status: reactor.StatusPaused, Reason: "its interrupt timed out at X", Err: reactor.ErrInterruptTimedOut},
			"timed out: run r, step s: its interrupt timed out at X"},
		{&reactor.ContinueError{RunID: "r", Step: "s", Status: reactor.StatusCompleted, Reason: "the run has finished", Err: reactor.ErrAlreadyFinished},
			"not paused: run r is completed (finished)"},
		{fmt.Errorf("%w: %q", reactor.ErrNoCorrelation, "c"), `no such correlation: no paused run waits for correlation id: "c"`},
		{&reactor.PayloadError{RunID: "r", Step: "s", Err: errors.New("bad")}, "payload refused by run r, step s: bad"},
	} {
		assert.Equal(t, c.want, cli.Explain(c.err))
	}
}

func TestCommandQuotes(t *testing.T) {
	assert.Equal(t, `goreactor continue run-1 review/approve --payload '{"by":"ann"}' --by ops:ann`,
		cli.Command(cli.Target{RunID: "run-1", Step: "review/approve"}, json.RawMessage(`{"by":"ann"}`), "ops:ann"))
	assert.Equal(t, `goreactor continue --correlation o-1 --payload '{"n":"it'\''s"}'`,
		cli.Command(cli.Target{Correlation: "o-1"}, json.RawMessage(`{"n":"it's"}`), ""))
}
