package engine

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/tracing"
)

// tracerName is the instrumentation name of goreactor's spans.
const tracerName = "github.com/goreactor/goreactor"

// tracer is the tracer the engine's spans come from: Config.TracerProvider's
// when set, else the global provider's (otel.SetTracerProvider), a no-op
// until one is set. Package worker starts its spans with it too.
func (e *Engine) tracer() trace.Tracer {
	if tp := e.cfg.TracerProvider; tp != nil {
		return tp.Tracer(tracerName)
	}
	return otel.Tracer(tracerName)
}

// traceRun runs fn (an execution of x's run) inside a reactor.run span.
func (x *execution) traceRun(ctx context.Context, fn func(context.Context) (*Result, error)) (*Result, error) {
	pctx, opts := tracing.Parent(ctx, x.st.Trace)
	attrs := []attribute.KeyValue{attribute.String("reactor.name", x.st.Reactor), attribute.String("reactor.run.id", x.st.ID)}
	if el := x.st.Elem; el != nil {
		attrs = append(attrs, attribute.String("reactor.element.owner", el.Owner), attribute.Int("reactor.element.index", el.Index))
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	sctx, span := x.e.tracer().Start(pctx, "reactor.run", opts...)
	defer span.End()
	if span.IsRecording() || trace.SpanContextFromContext(ctx).IsValid() {
		ctx = sctx
	}
	// Else tracing is off (a no-op provider): the execution carries no
	// span context, so its tasks carry no traceparent.
	res, err := x.withRunLimits(ctx, fn)
	switch {
	case err != nil:
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	case res != nil:
		span.SetAttributes(attribute.String("reactor.status", string(res.Status)))
		if res.Status == StatusFailed {
			span.SetStatus(codes.Error, "run failed")
		}
	}
	return res, err
}

// startCall starts the reactor.step span of call c.
func (x *execution) startCall(ctx context.Context, c Call) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{attribute.String("reactor.name", c.Reactor), attribute.String("reactor.run.id", c.RunID),
		attribute.String("reactor.step", c.Step), attribute.String("reactor.kind", string(c.Kind))}
	if c.Kind == CallRun {
		attrs = append(attrs, attribute.Int("reactor.attempt", c.Attempt))
	}
	return x.e.tracer().Start(ctx, "reactor.step", trace.WithAttributes(attrs...))
}

// endCall ends the span of a call that returned err.
func endCall(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// otelTraceID is the trace id of ctx's span, "" when it has none.
func otelTraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.TraceID().IsValid() {
		return sc.TraceID().String()
	}
	return ""
}
