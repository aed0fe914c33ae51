package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// logCapture is a slog handler keeping every record, with its attributes
// flattened to strings, for tests to look at levels and fields.
type logCapture struct {
	mu      sync.Mutex
	records []capturedRecord
	attrs   []slog.Attr
	root    *logCapture
}

type capturedRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func newLogCapture() *logCapture { c := &logCapture{}; c.root = c; return c }

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := capturedRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range c.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { rec.attrs[a.Key] = a.Value.String(); return true })
	c.root.mu.Lock()
	c.root.records = append(c.root.records, rec)
	c.root.mu.Unlock()
	return nil
}

func (c *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	return &logCapture{attrs: append(slices.Clone(c.attrs), as...), root: c.root}
}

func (c *logCapture) WithGroup(string) slog.Handler { return c }

// matching returns the records for which keep is true.
func (c *logCapture) matching(keep func(capturedRecord) bool) []capturedRecord {
	c.root.mu.Lock()
	defer c.root.mu.Unlock()
	var out []capturedRecord
	for _, r := range c.root.records {
		if keep(r) {
			out = append(out, r)
		}
	}
	return out
}

// TestHardeningUnknownReactorWarnsOnce: a run of a reactor the receiving
// worker has not registered is logged once (a Warn naming the reactor and
// what the worker has), not on every retry, and keeps being retried for the
// rolling deploy that will bring the definition. Meanwhile Wait's error does
// not claim the queue is unserved: a worker polls it.
func TestHardeningUnknownReactorWarnsOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var tr trail
	newer := reactor.MustDefine("checkout-v2", step(&tr, "a", nil))
	api := f.engine("api")
	require.NoError(t, api.Register(newer))

	old := f.engine("old-worker")
	require.NoError(t, old.Register(reactor.MustDefine("checkout-v1", step(&tr, "a", nil)), reactor.MustDefine("refund", step(&tr, "r", nil))))
	logs := newLogCapture()
	f.startWorker(old, func(c *worker.Config) { c.Logger = slog.New(logs) })

	ctx := ctxTimeout(t)
	res, err := api.Enqueue(ctx, newer, nil, reactor.WithRunID("order-7"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, res.Status)

	// Two deliveries have failed (asynq counts them) and a third is due.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := f.taskInfo(startTask("order-7"))
		require.NoError(c, err)
		require.NotNil(c, info)
		require.GreaterOrEqual(c, info.Retried, 2)
	}, 15*time.Second, 10*time.Millisecond)

	warns := logs.matching(func(r capturedRecord) bool { return r.attrs["event"] == "worker.unknown_reactor" })
	require.Len(t, warns, 1, "one line per run, not one per delivery: %v", warns)
	require.Equal(t, slog.LevelWarn, warns[0].level)
	require.Equal(t, "checkout-v2", warns[0].attrs["reactor"])
	require.Equal(t, "order-7", warns[0].attrs["run"])
	require.Equal(t, "[checkout-v1 refund]", warns[0].attrs["registered"])

	info, err := f.taskInfo(startTask("order-7"))
	require.NoError(t, err)
	require.NotEqual(t, asynq.TaskStateArchived, info.State, "the run is still retried")
	run, err := api.Get(ctx, "order-7")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusPending, run.Status)

	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = api.Wait(wctx, "order-7")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ns *reactor.NotServedError
	require.False(t, errors.As(err, &ns), "a worker serves the queue: %v", err)
}

// TestHardeningWaitNotServed: Wait on a run that stays pending because no
// worker serves its queue says so when its context ends.
func TestHardeningWaitNotServed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var tr trail
	def := reactor.MustDefine("unserved", step(&tr, "a", nil))
	e := f.engine("api")
	require.NoError(t, e.Register(def))
	ctx := ctxTimeout(t)
	_, err := e.Enqueue(ctx, def, nil, reactor.WithRunID("order-8"))
	require.NoError(t, err)

	served, err := f.client.Served(ctx)
	require.NoError(t, err)
	require.False(t, served)

	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = e.Wait(wctx, "order-8")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var ns *reactor.NotServedError
	require.ErrorAs(t, err, &ns)
	require.Equal(t, f.queue, ns.Queue)
	require.Contains(t, err.Error(), "no worker serves queue "+f.queue)
	require.Contains(t, err.Error(), "order-8")

	// Once a worker serves the queue, the run completes.
	f.startWorker(e)
	require.Eventually(t, func() bool { ok, err := f.client.Served(ctx); return err == nil && ok }, 10*time.Second, 5*time.Millisecond)
	res, err := e.Wait(ctx, "order-8")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)

	// A run started WithQueue waits on its own queue: the worker serves the
	// Client's queue, not that one, and Wait says so, naming it.
	other := redistest.Queue(t)
	_, err = e.Enqueue(ctx, def, nil, reactor.WithRunID("order-9"), reactor.WithQueue(other))
	require.NoError(t, err)
	wctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = e.Wait(wctx, "order-9")
	require.ErrorAs(t, err, &ns)
	require.Equal(t, other, ns.Queue)
}

// TestHardeningElementEventsLogAtDebug: a fan-out map of 20 elements, 5 of
// which fail and whose undos fail, logs nothing about single elements above
// Debug (the map reports its elements on the owner). The map is Partial so
// that every element runs, whatever order the workers take them in.
func TestHardeningElementEventsLogAtDebug(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	bad := func(n int) bool { return n%4 == 0 } // 0, 4, 8, 12, 16
	type itemIn struct {
		N int `json:"n"`
	}
	element := reactor.MustDefine("loglevel-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[itemIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in itemIn) (int, error) { return in.N, nil },
			Undo: func(_ context.Context, in itemIn, _ int) error {
				if bad(in.N) {
					return fmt.Errorf("release of item %d failed", in.N)
				}
				return nil
			},
		}),
		reactor.Step("charge", reactor.StepConfig[itemIn, int]{
			Args:  reactor.Bindings{"n": reactor.FromInput("item")},
			After: []string{"reserve"},
			Run: func(_ context.Context, in itemIn) (int, error) {
				if bad(in.N) {
					return 0, reactor.Permanent(fmt.Errorf("item %d declined", in.N))
				}
				return in.N, nil
			},
		}),
	)
	owner := reactor.MustDefine("loglevel-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, Partial: true}),
	)
	logs := newLogCapture()
	e := f.engine("worker", func(c *reactor.Config) { c.Logger = slog.New(logs) })
	require.NoError(t, e.Register(owner))
	f.startWorker(e, func(c *worker.Config) { c.Logger = slog.New(logs) })

	ctx := ctxTimeout(t)
	items := make([]int, 20)
	for i := range items {
		items[i] = i
	}
	_, err := e.Enqueue(ctx, owner, map[string]any{"items": items}, reactor.WithRunID("fan-20"))
	require.NoError(t, err)
	res, err := e.Wait(ctx, "fan-20")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status, "%v", res.Failure)

	marked := 0
	for _, ev := range f.events.all("worker") {
		if ev.Reactor == "loglevel-el" && ev.Element {
			marked++
		}
	}
	require.NotZero(t, marked, "no element run's event has Event.Element set: the executor's emit sites must "+
		"emit through execution.emit (x.emit, not x.e.emit, in reactor/executor.go, rollback.go, construct.go)")

	elementLines := logs.matching(func(r capturedRecord) bool {
		return r.attrs["reactor"] == "loglevel-el" || strings.HasPrefix(r.attrs["run"], "fan-20/") ||
			strings.Contains(r.attrs["run"], ".") && r.attrs["run"] != "fan-20"
	})
	undoFailed := 0
	for _, r := range elementLines {
		require.LessOrEqual(t, r.level, slog.LevelDebug, "a per-element line above Debug: %s %v", r.msg, r.attrs)
		if r.attrs["event"] == string(reactor.EventStepUndoFailed) {
			undoFailed++
		}
	}
	require.Equal(t, 5, undoFailed, "the five undo failures are still logged, at Debug")
}

// all returns the events engine emitted, in order.
func (r *recorder) all(engine string) []reactor.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []reactor.Event
	for _, e := range r.events {
		if e.engine == engine {
			out = append(out, e.ev)
		}
	}
	return out
}
