package engine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/engine"
)

// spanTracer returns a tracer provider recording into an in-memory exporter.
func spanTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func TestTracingSpansOfARunAndItsRollback(t *testing.T) {
	t.Parallel()
	tp, exp := spanTracer(t)
	env := newEnv(t, func(c *engine.Config) { c.TracerProvider = tp })
	def := engine.MustDefine("trace-spans",
		simple(env.trail, "a", nil),
		simple(env.trail, "b", engine.Permanent(errors.New("boom")), "a"),
	)
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)

	spans := exp.GetSpans()
	var runs, steps int
	kinds := map[string]int{}
	for _, s := range spans {
		require.Equal(t, run.TraceID, s.SpanContext.TraceID().String(), "span %s is in the run's trace", s.Name)
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.String()
		}
		switch s.Name {
		case "reactor.run":
			runs++
			require.Equal(t, res.RunID, attrs["reactor.run.id"])
			require.Equal(t, "failed", attrs["reactor.status"])
		case "reactor.step":
			steps++
			kinds[attrs["reactor.step"]+"/"+attrs["reactor.kind"]]++
		}
	}
	require.Equal(t, 1, runs)
	require.Equal(t, map[string]int{"a/run": 1, "b/run": 1, "a/undo": 1}, kinds)
	require.Equal(t, 3, steps)
}

func TestTracingTraceIDFromTheCallersSpan(t *testing.T) {
	t.Parallel()
	tp, exp := spanTracer(t)
	env := newEnv(t, func(c *engine.Config) { c.TracerProvider = tp })
	def := engine.MustDefine("trace-caller", simple(env.trail, "a", nil))
	ctx, span := tp.Tracer("test").Start(ctxTimeout(t), "caller")
	res, err := env.engine.Run(ctx, def, nil)
	span.End()
	require.NoError(t, err)
	run, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, span.SpanContext().TraceID().String(), run.TraceID, "the run stores the caller's trace id")
	for _, s := range exp.GetSpans() {
		require.Equal(t, run.TraceID, s.SpanContext.TraceID().String(), s.Name)
		if s.Name == "reactor.run" {
			require.Equal(t, span.SpanContext().SpanID(), s.Parent.SpanID(), "the run's span is a child of the caller's")
		}
	}
}

func TestTracingNoProviderIsANoOp(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	var inStep trace.SpanContext
	def := engine.MustDefine("trace-noop", engine.Step("a", engine.StepConfig[engine.Args, string]{
		Run: func(ctx context.Context, _ engine.Args) (string, error) {
			inStep = trace.SpanContextFromContext(ctx)
			return "", nil
		},
	}))
	ctx := ctxTimeout(t)
	res, err := env.engine.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.False(t, inStep.IsValid(), "without a tracer provider a step's context carries no span (its tasks no traceparent)")
}

// Every event's log line carries the run's trace id (trace_id), the OTel
// trace id when tracing is on and the stored one when it is off; so do the
// events hooks receive.
func TestEventLogLinesCarryTheTraceID(t *testing.T) {
	t.Parallel()
	for _, traced := range []bool{false, true} {
		var buf syncBuffer
		var hooked []engine.Event
		var mu sync.Mutex
		tp, _ := spanTracer(t)
		env := newEnv(t, func(c *engine.Config) {
			c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c.Hooks = append(c.Hooks, engine.HookFunc(func(_ context.Context, e engine.Event) {
				mu.Lock()
				defer mu.Unlock()
				hooked = append(hooked, e)
			}))
			if traced {
				c.TracerProvider = tp
			}
		})
		def := engine.MustDefine("trace-logs",
			simple(env.trail, "a", nil),
			simple(env.trail, "b", engine.Permanent(errors.New("boom")), "a"),
		)
		ctx := ctxTimeout(t)
		res, err := env.engine.Run(ctx, def, nil)
		require.NoError(t, err)
		run, err := env.engine.Get(ctx, res.RunID)
		require.NoError(t, err)
		require.Len(t, run.TraceID, 32)

		lines := 0
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var rec map[string]any
			require.NoError(t, json.Unmarshal([]byte(l), &rec))
			ev, _ := rec["event"].(string)
			if !strings.HasPrefix(ev, "reactor.run.") && !strings.HasPrefix(ev, "reactor.step.") && !strings.HasPrefix(ev, "reactor.rollback.") {
				continue
			}
			lines++
			require.Equal(t, run.TraceID, rec["trace_id"], "traced=%v: %s", traced, l)
		}
		require.GreaterOrEqual(t, lines, 6, "run, steps, rollback and undo events were logged")
		mu.Lock()
		for _, e := range hooked {
			require.Equal(t, run.TraceID, e.TraceID, "hooked %s", e.Kind)
		}
		mu.Unlock()
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
