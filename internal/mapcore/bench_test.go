package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// What a fan-out element costs on top of asynq: element throughput of a
// fan-out map against bare asynq no-op tasks on the same server
// configuration (run both in one binary so their ratio is within one run:
// go test -run '^$' -bench 'FanOut|BareAsynq' -benchtime 2000x ./mapstep/;
// BenchmarkFanOutElementTraced is the same with a tracer provider set),
// and the Redis round trips goreactor adds per element
// (TestRoundTripsPerElement).

// benchConcurrency is the asynq server concurrency of both benchmarks.
const benchConcurrency = 20

// benchOwner is a map over its input and nothing else: a zero-latency
// element, one batch (B = the map's size, so back pressure never waits).
func benchOwner(h *eoHarness, name string, batch int) *engine.Definition {
	elem := engine.MustDefine(name+"-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("id", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, in eoIn) (int, error) { return in.N, nil },
		}),
		engine.Returns(engine.FromStep("id")))
	return engine.MustDefine(name,
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: true, BatchSize: batch}),
		engine.Returns(engine.FromStep("each")))
}

// BenchmarkFanOutElement: one fan-out map of b.N elements, timed from the
// owner's start to its completion (dispatch, every element, the owner's
// resume). ns/op is per element.
func BenchmarkFanOutElement(b *testing.B) { fanOutElement(b, nil) }

// BenchmarkFanOutElementTraced is BenchmarkFanOutElement with a tracer
// provider that records every span (into a no-op exporter): the cost of
// tracing.
func BenchmarkFanOutElementTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	fanOutElement(b, tp)
}

func fanOutElement(b *testing.B, tp trace.TracerProvider) {
	b.ReportAllocs()
	ctx := eoCtx(b, 10*time.Minute)
	h := newEOHarness(b, eoOptions{concurrency: benchConcurrency, tracer: tp})
	def := benchOwner(h, "bench-fan", max(b.N, 1))
	owner := "bench-" + engine.NewRunID()
	finished := h.done(owner)
	in := map[string]any{"items": eoSeq(0, b.N)}
	b.ResetTimer()
	start := time.Now()
	res, err := h.engine.Run(ctx, def, in, engine.WithRunID(owner))
	if err != nil {
		b.Fatal(err)
	}
	if res.Outcome() == engine.OutcomeDispatched {
		eoAwait(b, ctx, finished, "the owner")
	}
	took := time.Since(start)
	b.StopTimer()
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(b, err)
	require.Equal(b, engine.StatusCompleted, res.Status, "%v", res.Failure)
	b.ReportMetric(float64(b.N)/took.Seconds(), "elements/s")
}

// BenchmarkBareAsynq: b.N no-op asynq tasks, enqueued one by one as a map
// dispatches them (with a task id and the same options), on a server with
// the same configuration, timed from the first enqueue to the last task
// done.
func BenchmarkBareAsynq(b *testing.B) {
	b.ReportAllocs()
	ctx := eoCtx(b, 10*time.Minute)
	rdb := redistest.Client(b)
	queue := redistest.Queue(b)
	var n atomic.Int64
	done := make(chan struct{})
	want := int64(b.N)
	srv := asynq.NewServerFromRedisClient(rdb, eoServerConfig(queue, benchConcurrency))
	require.NoError(b, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if n.Add(1) == want {
			close(done)
		}
		return nil
	})))
	b.Cleanup(srv.Shutdown)
	client := asynq.NewClientFromRedisClient(rdb)
	b.Cleanup(func() { _ = client.Close() })
	id := engine.NewRunID()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		_, err := client.EnqueueContext(ctx, asynq.NewTask("bench:noop", []byte{0x93, 0xa1, 'm', byte(i % 128), 0xc0}),
			asynq.TaskID(fmt.Sprintf("el:%s:%d", id, i)), asynq.Queue(queue), asynq.MaxRetry(worker.DefaultMaxRetry), asynq.Timeout(worker.DefaultTaskTimeout))
		if err != nil {
			b.Fatal(err)
		}
	}
	eoAwait(b, ctx, done, "every task")
	took := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/took.Seconds(), "elements/s")
}

// TestRoundTripsPerElement counts the Redis round trips of a fan-out map:
// the engine and the asynq server and client use separate go-redis clients,
// each with a counting hook, so goreactor's own round trips (engine client)
// are told apart from asynq's (its client). Per element is the slope
// between a 100- and a 400-element map, so the owner's fixed cost (start,
// resume, adoption) drops out. Bare asynq no-op tasks are counted the same
// way, for comparison with asynq's share of a map.
func TestRoundTripsPerElement(t *testing.T) {
	t.Parallel()
	ctx := eoCtx(t, 60*time.Second)
	const small, large = 100, 400

	engineCount, asynqCount := &eoCounter{}, &eoCounter{}
	engineRdb, asynqRdb := redistest.Client(t), redistest.Client(t)
	engineRdb.AddHook(engineCount)
	asynqRdb.AddHook(asynqCount)
	h := newEOHarness(t, eoOptions{concurrency: benchConcurrency, engineRdb: engineRdb, asynqRdb: asynqRdb})
	def := benchOwner(h, "rt", mapcore.DefaultBatchSize)

	type tally struct {
		engine, asynq int64
		byCmd         map[string]int64
	}
	measure := func(n int) tally {
		owner := fmt.Sprintf("rt-%d-%s", n, engine.NewRunID())
		mapID := mapcore.MapID(owner, "each")
		finished := h.done(owner)
		engineCount.reset()
		asynqCount.reset()
		res, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n)}, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, finished, "the owner")
		h.rec.await(t, ctx, "the resume task", func(r *eoRecorder) bool { return r.ok[resumeTaskID(owner, mapID)] == 1 })
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
		return tally{engine: engineCount.total(), asynq: asynqCount.total(), byCmd: engineCount.snapshot()}
	}
	a, bb := measure(small), measure(large)
	perElem := float64(bb.engine-a.engine) / (large - small)
	asynqPerElem := float64(bb.asynq-a.asynq) / (large - small)
	fixed := float64(a.engine) - perElem*small

	// Bare asynq, counted the same way.
	bareRdb := redistest.Client(t)
	bareCount := &eoCounter{}
	bareRdb.AddHook(bareCount)
	bare := func(n int) int64 {
		queue := redistest.Queue(t)
		var got atomic.Int64
		done := make(chan struct{})
		srv := asynq.NewServerFromRedisClient(bareRdb, eoServerConfig(queue, benchConcurrency))
		require.NoError(t, srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			if got.Add(1) == int64(n) {
				close(done)
			}
			return nil
		})))
		defer srv.Shutdown()
		client := asynq.NewClientFromRedisClient(bareRdb)
		id := engine.NewRunID()
		bareCount.reset()
		for i := range n {
			_, err := client.EnqueueContext(ctx, asynq.NewTask("bench:noop", nil),
				asynq.TaskID(fmt.Sprintf("t:%s:%d", id, i)), asynq.Queue(queue), asynq.MaxRetry(worker.DefaultMaxRetry), asynq.Timeout(worker.DefaultTaskTimeout))
			require.NoError(t, err)
		}
		eoAwait(t, ctx, done, "every bare task")
		return bareCount.total()
	}
	bareSmall, bareLarge := bare(small), bare(large)
	barePerTask := float64(bareLarge-bareSmall) / (large - small)

	t.Logf("goreactor round trips per element: %.2f (fixed per map: %.0f; %d-element map: %d, %d-element map: %d)",
		perElem, fixed, small, a.engine, large, bb.engine)
	t.Logf("asynq round trips per element of the map: %.2f; bare asynq per no-op task: %.2f", asynqPerElem, barePerTask)
	t.Logf("goreactor round trips of the %d-element map by command: %s", large, formatCounts(bb.byCmd, large))
	// 2: the element's create (which takes its lock and checks the map), its terminal
	// write (which settles the map). Was 5 before the element path moved
	// into its map's slot (issue 23).
	require.LessOrEqual(t, perElem, 2.1, "goreactor's round trips per element")
}

// eoCounter is a go-redis hook counting round trips: one per command, one
// per pipeline, except the connection handshake (HELLO, CLIENT SETINFO).
type eoCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	byCmd map[string]int64
}

func (c *eoCounter) count(name string) {
	c.n.Add(1)
	c.mu.Lock()
	if c.byCmd == nil {
		c.byCmd = map[string]int64{}
	}
	c.byCmd[name]++
	c.mu.Unlock()
}

func (c *eoCounter) reset() {
	c.mu.Lock()
	c.n.Store(0)
	c.byCmd = nil
	c.mu.Unlock()
}

func (c *eoCounter) total() int64 { return c.n.Load() }

func (c *eoCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.byCmd)
}

func (c *eoCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *eoCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "hello" {
			c.count(name)
		}
		return next(ctx, cmd)
	}
}

func (c *eoCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "client" && cmds[0].Name() != "hello" {
			names := make([]string, len(cmds))
			for i, cmd := range cmds {
				names[i] = cmd.Name()
			}
			c.count("pipeline(" + strings.Join(names, ",") + ")")
		}
		return next(ctx, cmds)
	}
}

// formatCounts lists round trips by command, per element of an n-element map.
func formatCounts(m map[string]int64, n int) string {
	names := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return int(m[b] - m[a]) })
	var parts []string
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s=%d (%.2f/el)", name, m[name], float64(m[name])/float64(n)))
	}
	return strings.Join(parts, " ")
}

// TestRollbackRoundTripsPerElement counts what goreactor adds per element
// when a fan-out map rolls back: its elements have one undoable step, and a
// step after the map fails. The forward cost is measured on the same map
// completing, and subtracted. Traced (a tracer provider recording every
// span), the bound is the same: tracing costs no round trip.
func TestRollbackRoundTripsPerElement(t *testing.T) {
	t.Parallel()
	t.Run("untraced", func(t *testing.T) { t.Parallel(); rollbackRoundTripsPerElement(t, nil) })
	t.Run("traced", func(t *testing.T) {
		t.Parallel()
		exp := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		rollbackRoundTripsPerElement(t, tp)
		require.NotEmpty(t, exp.GetSpans(), "the tracer provider saw the runs")
	})
}

func rollbackRoundTripsPerElement(t *testing.T, tp trace.TracerProvider) {
	ctx := eoCtx(t, 90*time.Second)
	const small, large = 100, 300
	count := &eoCounter{}
	engineRdb := redistest.Client(t)
	engineRdb.AddHook(count)
	h := newEOHarness(t, eoOptions{concurrency: benchConcurrency, engineRdb: engineRdb, tracer: tp})
	elem := engine.MustDefine("rrt-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("id", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, in eoIn) (int, error) { return in.N, nil },
			Undo: func(context.Context, eoIn, int) error { return nil },
		}),
		engine.Returns(engine.FromStep("id")))
	def := engine.MustDefine("rrt",
		engine.Input[[]int]("items", engine.Required()),
		engine.Input[bool]("fail", engine.Default(false)),
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.FromInput("items"), FanOut: true}),
		engine.Step("after", engine.StepConfig[struct {
			Fail bool `json:"fail"`
		}, int]{
			Args:  engine.Bindings{"fail": engine.FromInput("fail")},
			After: []string{"each"},
			Run: func(_ context.Context, in struct {
				Fail bool `json:"fail"`
			}) (int, error) {
				if in.Fail {
					return 0, engine.Permanent(errors.New("after the map"))
				}
				return 0, nil
			},
		}))
	measure := func(n int, fail bool) int64 {
		owner := fmt.Sprintf("rrt-%d-%v-%s", n, fail, engine.NewRunID())
		finished := h.done(owner)
		count.reset()
		_, err := h.engine.Run(ctx, def, map[string]any{"items": eoSeq(0, n), "fail": fail}, engine.WithRunID(owner))
		require.NoError(t, err)
		eoAwait(t, ctx, finished, "the owner")
		res, err := h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		want := engine.StatusCompleted
		if fail {
			want = engine.StatusFailed
		}
		require.Equal(t, want, res.Status, "%v", res.Failure)
		return count.total()
	}
	fwd := float64(measure(large, false)-measure(small, false)) / (large - small)
	both := float64(measure(large, true)-measure(small, true)) / (large - small)
	t.Logf("goreactor round trips per element: forward %.2f, rollback %.2f (one undone entry per element)", fwd, both-fwd)
	// 2 with one undone entry: the element's load (which takes its lock and checks the
	// rollback), its terminal undo write (which records the outcome); one
	// more per further entry. Was 6 before issue 23.
	require.LessOrEqual(t, both-fwd, 2.1, "rollback round trips per element: 2 plus one per undone entry")
}
