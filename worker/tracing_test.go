package worker_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/reactor"
)

// spanWatch is a span processor that closes done once every span the test
// waits for has ended: the exporter is read after that, not after a sleep.
type spanWatch struct {
	mu    sync.Mutex
	ended map[string]int
	ready func(ended map[string]int, s sdktrace.ReadOnlySpan) bool
	done  chan struct{}
	once  sync.Once
}

func (w *spanWatch) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (w *spanWatch) OnEnd(s sdktrace.ReadOnlySpan) {
	w.mu.Lock()
	w.ended[s.Name()]++
	ok := w.ready(w.ended, s)
	w.mu.Unlock()
	if ok {
		w.once.Do(func() { close(w.done) })
	}
}
func (w *spanWatch) Shutdown(context.Context) error   { return nil }
func (w *spanWatch) ForceFlush(context.Context) error { return nil }

func attrOf(attrs []attribute.KeyValue, key string) string {
	for _, a := range attrs {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// TestTracingOneTraceAcrossAMapRollback: a run enqueued under a span, whose
// fan-out map of 20 elements succeeds and whose next step then fails, so
// that the map rolls back through 20 rollback jobs on a worker, is one
// trace: every span (the run's executions, its steps, the element tasks and
// runs, the rollback jobs) has the caller's trace id, which the run stores,
// and every span's parent is the caller's span or another span of the
// trace (the task hand-offs carry it). Enqueued without a span, the same
// holds of the trace id the run stores.
func TestTracingOneTraceAcrossAMapRollback(t *testing.T) {
	t.Parallel()
	t.Run("enqueued under a span", func(t *testing.T) { t.Parallel(); oneTraceAcrossAMapRollback(t, true) })
	// Enqueued without one: the run's trace is the trace id it stores, and
	// its first execution's span is a root of that trace.
	t.Run("enqueued without a span", func(t *testing.T) { t.Parallel(); oneTraceAcrossAMapRollback(t, false) })
}

func oneTraceAcrossAMapRollback(t *testing.T, underSpan bool) {
	const n = 20
	exp := tracetest.NewInMemoryExporter()
	var ownerID string
	var idMu sync.Mutex
	watch := &spanWatch{ended: map[string]int{}, done: make(chan struct{}),
		ready: func(ended map[string]int, s sdktrace.ReadOnlySpan) bool {
			idMu.Lock()
			defer idMu.Unlock()
			// The owner's last execution ends after its elements' and
			// rollback jobs' spans did: it is resumed by the last job.
			return ended["reactor.map.element"] >= n && ended["reactor.map.rollback"] >= n &&
				s.Name() == "reactor.run" && attrOf(s.Attributes(), "reactor.run.id") == ownerID &&
				attrOf(s.Attributes(), "reactor.status") == string(reactor.StatusFailed)
		}}
	// The watch runs after the syncer: a span is exported when it is seen.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSpanProcessor(watch))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	f := newFixture(t)
	type itemIn struct {
		N int `json:"n"`
	}
	element := reactor.MustDefine("trace-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[itemIn, int]{
			Args: reactor.Bindings{"n": reactor.FromInput("item")},
			Run:  func(_ context.Context, in itemIn) (int, error) { return in.N, nil },
			Undo: func(context.Context, itemIn, int) error { return nil },
		}),
	)
	owner := mapThenDecline("trace-owner", element)
	engine := f.engine("w", func(c *reactor.Config) { c.TracerProvider = tp })
	require.NoError(t, engine.Register(element))
	f.startWorker(engine)

	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	ctx := ctxTimeout(t)
	cctx, caller := ctx, trace.SpanFromContext(ctx)
	if underSpan {
		cctx, caller = tp.Tracer("test").Start(ctx, "caller")
	}
	idMu.Lock()
	res, err := engine.Enqueue(cctx, owner, map[string]any{"items": items})
	if err == nil {
		ownerID = res.RunID
	}
	idMu.Unlock()
	caller.End()
	require.NoError(t, err)
	res, err = engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	select {
	case <-watch.done:
	case <-ctx.Done():
		t.Fatalf("the spans of the run did not all end: %v", watch.ended)
	}

	run, err := engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	traceID, err := trace.TraceIDFromHex(run.TraceID)
	require.NoError(t, err)
	if underSpan {
		require.Equal(t, caller.SpanContext().TraceID(), traceID, "the run stores the caller's trace id")
	}

	spans := exp.GetSpans()
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	count := map[string]int{}
	elementRuns := map[string]bool{}
	roots := 0
	for _, s := range spans {
		require.Equal(t, traceID, s.SpanContext.TraceID(), "span %s (%v) is in the run's trace", s.Name, s.Attributes)
		if s.Name == "caller" {
			continue
		}
		if !ids[s.Parent.SpanID()] {
			// Only the first execution, when no span enqueued the run, has
			// a parent outside the trace's spans (a remote parent made of
			// the stored trace id).
			roots++
			require.False(t, underSpan, "span %s (%v) has a parent in the trace", s.Name, s.Attributes)
			require.True(t, s.Parent.IsRemote(), s.Name)
			require.Equal(t, "reactor.run", s.Name)
		}
		count[s.Name]++
		if s.Name == "reactor.run" && attrOf(s.Attributes, "reactor.element.owner") == res.RunID {
			elementRuns[attrOf(s.Attributes, "reactor.run.id")] = true
		}
	}
	t.Logf("spans: %v", count)
	require.Equal(t, n, count["reactor.map.element"], "one span per element task")
	require.Equal(t, n, count["reactor.map.rollback"], "one span per rollback job")
	if !underSpan {
		require.Equal(t, 1, roots, "one root: the run's first execution")
	}
	require.Len(t, elementRuns, n, "every element run's executions are in the trace")
	require.GreaterOrEqual(t, count["reactor.run"], 3+2*n, "the owner's three executions, each element's run and undo")
	require.GreaterOrEqual(t, count["reactor.step"], 4+2*n, "hold, each, decline, hold's undo, and each element's reserve and undo")
}
