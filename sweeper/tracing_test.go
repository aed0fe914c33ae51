package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// A sweeper pass is a span of its own, and the wake-up it enqueues for a
// lost run joins the run's trace: its task carries a traceparent of the
// run's trace id, the recovery span links back to the pass, and the
// execution the wake-up starts is that recovery span's child.
func TestSweeperPassSpanAndRecoveryJoinTheRunsTrace(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: client,
		Logger: discard, TracerProvider: tp})
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	e := &env{t: t, rdb: rdb, prefix: prefix, queue: queue, client: client, engine: engine, insp: insp, stale: testStaleAfter}
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	const id = "traced-lost"
	def := reactor.MustDefine("traced_lost", step(tr, "a", nil))
	require.NoError(t, engine.Register(def))
	_, err = engine.Enqueue(ctx, def, nil, reactor.WithRunID(id))
	require.NoError(t, err)
	require.NoError(t, insp.DeleteTask(queue, "resume:"+id+":start"))
	run := e.waitStale(ctx, id)
	require.NotEmpty(t, run.TraceID)

	sw, err := sweeper.New(sweeper.Config{Engine: engine, StaleAfter: testStaleAfter, Logger: discard})
	require.NoError(t, err)
	rep, err := sw.Once(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Runs.Woken)

	var pass, recovery sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "reactor.sweeper.pass":
			pass = s
		case "reactor.sweeper.recover":
			recovery = s
		}
	}
	require.NotNil(t, pass, "the pass has a span")
	require.NotNil(t, recovery, "the recovery has a span")
	require.Equal(t, run.TraceID, recovery.SpanContext().TraceID().String(), "the recovery is in the run's trace")
	require.NotEqual(t, pass.SpanContext().TraceID(), recovery.SpanContext().TraceID())
	require.Len(t, recovery.Links(), 1)
	require.Equal(t, pass.SpanContext().SpanID(), recovery.Links()[0].SpanContext.SpanID(), "the recovery links to its pass")

	info, err := insp.GetTaskInfo(queue, sweepTaskID(id, run.Version))
	require.NoError(t, err)
	p, err := payload.DecodeRun(info.Payload)
	require.NoError(t, err)
	require.Contains(t, p.TP, recovery.SpanContext().TraceID().String()+"-"+recovery.SpanContext().SpanID().String(),
		"the re-enqueued wake-up carries the recovery span as its parent")

	e.startWorker()
	res, err := engine.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	// The execution's span ends when its handler returns, a moment after
	// the terminal write Wait saw.
	var resumed sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "reactor.run" && s.Parent().SpanID() == recovery.SpanContext().SpanID() {
				resumed = s
			}
		}
		return resumed != nil
	}, 10*time.Second, 5*time.Millisecond, "the execution the wake-up started is the recovery span's child")
	require.Equal(t, run.TraceID, resumed.SpanContext().TraceID().String())
}
