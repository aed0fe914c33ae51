package worker

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/payload"
)

func TestTraceparentRoundTrip(t *testing.T) {
	require.Empty(t, traceparent(context.Background()), "no span, no traceparent: the payload does not grow")
	body, err := payload.EncodeRun(payload.RunPayload{RunID: "r1", Reactor: "x"})
	require.NoError(t, err)
	require.NotContains(t, string(body), "tp", "an empty traceparent is left out of the payload")

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	tp := traceparent(trace.ContextWithSpanContext(context.Background(), sc))
	require.Equal(t, "00-01020300000000000000000000000000-0405060000000000-01", tp)
	body, err = codec.Marshal(payload.ElementPayload{MapID: "m1", Index: 2, TP: tp})
	require.NoError(t, err)
	p, err := payload.DecodeElement(body)
	require.NoError(t, err)
	got := trace.SpanContextFromContext(withTraceparent(context.Background(), p.TP))
	require.True(t, got.IsRemote())
	require.Equal(t, sc.TraceID(), got.TraceID())
	require.Equal(t, sc.SpanID(), got.SpanID())

	require.False(t, trace.SpanContextFromContext(withTraceparent(context.Background(), "garbage")).IsValid())
	require.False(t, trace.SpanContextFromContext(withTraceparent(context.Background(), "")).IsValid())
}
