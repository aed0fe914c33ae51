package worker_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// refusals is an Observer that counts the definition refusals by reactor.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) ObserveTask(string, string) {}
func (r *refusals) ObserveOwnerResume(string)  {}
func (r *refusals) ObserveDefinitionMismatch(reactor string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reactor]++
}

func (r *refusals) of(reactor string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reactor]
}

// warnings is a slog handler keeping the Warn records' messages.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) count(prefix string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// A worker that lacks a run's definition refuses the run's task: it is
// snoozed (never archived, however long it waits), counted, noted on the
// run, and warned about once; a worker that has the definition then runs
// it. The same holds for a fan-out map's element tasks, noted on the owner.
func TestAWorkerRefusesARunOfADefinitionItLacks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	var ran atomic.Int32
	line := func(version int) *reactor.Definition {
		parts := []reactor.Part{reactor.Input[int]("item"), reactor.Step("pick", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { ran.Add(1); return 1, nil },
		})}
		if version > 1 {
			parts = append(parts, reactor.Version(version), reactor.Step("pack", reactor.StepConfig[reactor.Args, int]{
				After: []string{"pick"},
				Run:   func(context.Context, reactor.Args) (int, error) { return 2, nil },
			}))
		}
		return reactor.MustDefine("deploy-line", parts...)
	}
	order := func(version int) *reactor.Definition {
		parts := []reactor.Part{reactor.Input[[]int]("items"), step(tr, "reserve", nil),
			mapstep.Map("lines", mapstep.Config{Element: line(version), Items: reactor.FromInput("items"), FanOut: true, After: []string{"reserve"}})}
		if version > 1 {
			parts = append(parts, reactor.Version(version))
		}
		return reactor.MustDefine("deploy-order", parts...)
	}
	v1, v2 := order(1), order(2)

	// The new deploy's worker, with v2 only.
	obs := &refusals{}
	warned := &warnings{}
	next := f.engine("next")
	require.NoError(t, next.Register(v2))
	f.startWorker(next, func(c *worker.Config) {
		c.Metrics, c.Logger, c.DefinitionSnooze = obs, slog.New(warned), 10*time.Millisecond
	})

	// A v1 run enqueued by an old client: refused, again and again.
	old := f.engine("old")
	_, err := old.Enqueue(ctx, v1, map[string]any{"items": []int{1, 2}}, reactor.WithRunID("deploy-run"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return obs.of("deploy-order") >= 3 }, 10*time.Second, 5*time.Millisecond)
	require.Empty(t, tr.all(), "nothing of the run executed under v2")
	info := f.awaitTaskState(startTask("deploy-run"), asynq.TaskStateRetry)
	require.Zero(t, info.Retried, "a refusal is a snooze, not a failure")
	require.Equal(t, 1, warned.count("refusing a task"), "one Warn however many refusals")
	dw, err := old.DefinitionWait(ctx, "deploy-run")
	require.NoError(t, err)
	require.NotNil(t, dw)
	require.Equal(t, v1.Fingerprint(), dw.Want.Fingerprint)

	// The owner runs in a process that has v1 up to its fan-out; its
	// element tasks reach the v2-only worker, which refuses them too and
	// notes the owner waiting.
	_, err = old.Run(ctx, v1, map[string]any{"items": []int{1, 2}}, reactor.WithRunID("deploy-map"), reactor.NoWait())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return obs.of("deploy-line") >= 2 }, 10*time.Second, 5*time.Millisecond)
	require.Zero(t, ran.Load(), "no element ran under the element's v2")
	require.Equal(t, 2, warned.count("refusing a task"), "one more Warn, for the element definition")
	dw, err = old.DefinitionWait(ctx, "deploy-map")
	require.NoError(t, err)
	require.NotNil(t, dw, "an element's refusal is noted on its map's owner")
	require.Equal(t, "deploy-line", dw.Reactor)
	require.Equal(t, line(1).Fingerprint(), dw.Want.Fingerprint)

	// A worker of the old deploy finishes both, under v1.
	f.startWorker(old, func(c *worker.Config) { c.DefinitionSnooze = 10 * time.Millisecond })
	for _, id := range []string{"deploy-run", "deploy-map"} {
		res, err := old.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, res.Status, id)
	}
	require.Equal(t, int32(4), ran.Load(), "every element ran once, under v1")
}

// A worker's first pick-up of an enqueued run is the run's start, not a
// resume (its log says "started"); a later delivery resumes it.
func TestAnEnqueuedRunStartsOnItsFirstPickUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := reactor.MustDefine("first-pickup", step(tr, "a", nil))
	client := f.engine("client")
	w := f.engine("worker")
	require.NoError(t, w.Register(def))
	f.startWorker(w)
	_, err := client.Enqueue(ctx, def, nil, reactor.WithRunID("first-pickup-1"))
	require.NoError(t, err)
	res, err := client.Wait(ctx, "first-pickup-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	require.Equal(t, []string{""}, f.events.steps("worker", reactor.EventRunStarted))
	require.Empty(t, f.events.steps("worker", reactor.EventRunResumed))
	require.Empty(t, f.events.steps("client", reactor.EventRunStarted), "enqueuing runs nothing")
}

// A run of a reactor no worker registered: the client's Wait says so when
// it gives up, instead of a bare timeout.
func TestWaitSaysNoWorkerHasTheReactor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := reactor.MustDefine("nobody-has-it", step(&trail{}, "a", nil))
	client := f.engine("client")
	f.startWorker(f.engine("worker")) // registers nothing
	_, err := client.Enqueue(ctx, def, nil, reactor.WithRunID("unknown-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		dw, err := client.DefinitionWait(ctx, "unknown-1")
		require.NoError(t, err)
		return dw != nil
	}, 10*time.Second, 5*time.Millisecond)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = client.Wait(wctx, "unknown-1")
	var dwe *reactor.DefinitionWaitError
	require.ErrorAs(t, err, &dwe)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, `waiting for a worker that has reactor "nobody-has-it" registered`)
}
