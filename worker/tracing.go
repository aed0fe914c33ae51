package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/engine"
)

// traceparentKey is the W3C header the payload's tp field holds.
const traceparentKey = "traceparent"

// traceparent is the W3C traceparent of ctx's span, "" when it has none:
// what a task carries so that its handler's spans continue the trace.
func traceparent(ctx context.Context) string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ""
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier[traceparentKey]
}

// withTraceparent returns ctx carrying the remote span context of tp (a
// task's traceparent); ctx itself when tp is empty or malformed.
func withTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier{traceparentKey: tp})
}

// startTask starts the span of a map task's handler (reactor.map.element,
// reactor.map.rollback), a child of the span context the task carried.
func (w *Worker) startTask(ctx context.Context, name, tp string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx = withTraceparent(ctx, tp)
	return engine.Tracer(w.engine).Start(ctx, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
}

// endTask ends the span of a handler that returned err: a failure (not a
// snooze) marks it an error.
func endTask(span trace.Span, err error) {
	if isFailure(err) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
