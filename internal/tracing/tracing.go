// Package tracing holds the span plumbing goreactor's packages share: how
// an execution, a task handler or a sweeper recovery joins the one trace
// of the run it works for.
package tracing

import (
	"context"
	"crypto/rand"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Parent returns ctx made the parent of work done for a run whose stored
// trace id is stored: ctx itself when its span is in that trace, else ctx
// carrying a remote span context of the stored trace (a fresh span id,
// sampled), so that everything done for a run, wherever it happens, is in
// the run's one trace. A span of another trace that ctx carried becomes a
// link. A stored id that is not a trace id leaves ctx as it is.
func Parent(ctx context.Context, stored string) (context.Context, []trace.SpanStartOption) {
	tid, err := trace.TraceIDFromHex(stored)
	if err != nil {
		return ctx, nil
	}
	sc := trace.SpanContextFromContext(ctx)
	if sc.IsValid() && sc.TraceID() == tid {
		return ctx, nil
	}
	var opts []trace.SpanStartOption
	if sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: newSpanID(), TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithRemoteSpanContext(ctx, parent), opts
}

// StartIn starts span name in the run trace stored (see Parent), for work
// a process does on a run's behalf outside its execution (a sweeper
// re-enqueueing its lost tasks). The tasks enqueued under the returned
// context carry the run's trace. With tracing off (the span does not
// record) it returns ctx unchanged, so those tasks carry no traceparent.
func StartIn(ctx context.Context, tr trace.Tracer, stored, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	pctx, opts := Parent(ctx, stored)
	opts = append(opts, trace.WithAttributes(attrs...))
	sctx, span := tr.Start(pctx, name, opts...)
	if !span.IsRecording() {
		return ctx, span
	}
	return sctx, span
}

func newSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		_, _ = rand.Read(id[:])
	}
	return id
}
