package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// With Config.ReplicaAcks, the step after a checkpoint runs only once the
// replica holds that checkpoint: step a stalls the replica and returns;
// step b finds the replica back and holding a's result. Every progress
// write carries a WAIT. With the replica gone, runs go on: each short wait
// is an event, and one Warn sums them.
func TestReplicaAcksHoldTheNextStepUntilTheReplicaHasTheCheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two redis-servers")
	}
	t.Parallel()
	ctx := ctxTimeout(t)
	m, r := redistest.StartReplicated(t)
	mc := redis.NewClient(&redis.Options{Addr: m.Addr})
	rc := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = mc.Close(); _ = rc.Close() })

	var mu sync.Mutex
	var short []engine.Event
	var logs bytes.Buffer
	newEngine := func(timeout time.Duration) *engine.Engine {
		e, err := engine.NewEngine(ctx, engine.Config{Client: mc, Prefix: "acks", ReplicaAcks: 1, ReplicaAckTimeout: timeout,
			Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelWarn})),
			Hooks: []engine.Hook{engine.HookFunc(func(_ context.Context, ev engine.Event) {
				if ev.Kind == engine.EventReplicaAcksShort {
					mu.Lock()
					short = append(short, ev)
					mu.Unlock()
				}
			})}})
		require.NoError(t, err)
		return e
	}
	e := newEngine(10 * time.Second)

	var back <-chan struct{}
	def := engine.MustDefine("acked",
		engine.Step("a", engine.StepConfig[engine.Args, string]{Run: func(context.Context, engine.Args) (string, error) {
			back = redistest.Stall(t, r.Addr, 500*time.Millisecond)
			return "a-done", nil
		}}),
		engine.Step("b", engine.StepConfig[engine.Args, string]{After: []string{"a"}, Run: func(ctx context.Context, _ engine.Args) (string, error) {
			// The replica answers the checkpoint's WAIT as soon as it wakes;
			// the stalling client's reply (which closes back) may come a
			// moment later. A checkpoint that did not wait would have b
			// here within microseconds, with 500 ms of stall to go.
			select {
			case <-back:
			case <-time.After(100 * time.Millisecond):
				return "", errors.New("step b runs while the replica is stalled: a's checkpoint did not wait for it")
			}
			st, err := rc.HGet(ctx, "acks:{run:r1}:ctx", "d").Result()
			if err != nil {
				return "", err
			}
			if !strings.Contains(st, "a-done") {
				return "", errors.New("the replica lacks step a's result")
			}
			return "b-done", nil
		}}),
	)
	waits, err := redistest.CommandCalls(ctx, mc, "wait")
	require.NoError(t, err)
	res, err := e.Run(ctx, def, nil, engine.WithRunID("r1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Err())
	after, err := redistest.CommandCalls(ctx, mc, "wait")
	require.NoError(t, err)
	require.GreaterOrEqual(t, after-waits, 3, "the start and the two checkpoints each waited")
	require.Empty(t, short)

	// The replica is gone: runs complete, each short wait is an event, and
	// one Warn says so.
	r.Stop()
	e = newEngine(20 * time.Millisecond)
	plain := engine.MustDefine("plain", engine.Step("x", engine.StepConfig[engine.Args, int]{
		Run: func(context.Context, engine.Args) (int, error) { return 1, nil }}))
	for range 3 {
		res, err := e.Run(ctx, plain, nil)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status)
	}
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(short), 3)
	require.Contains(t, short[0].Err.Error(), "0 of 1 replicas acknowledged a write within 20ms")
	require.Equal(t, 1, strings.Count(logs.String(), "event=reactor.replica_acks.short"), logs.String())
	require.NoError(t, mc.Del(ctx, "acks:{run:r1}:ctx").Err())
}

// syncWriter serialises writes to w under mu.
type syncWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// ReplicaAcks is checked when the engine is made.
func TestReplicaAcksConfigIsChecked(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	_, err := engine.NewEngine(t.Context(), engine.Config{Client: rdb, ReplicaAcks: -1})
	require.ErrorContains(t, err, "ReplicaAcks -1 is negative")
	_, err = engine.NewEngine(t.Context(), engine.Config{Client: rdb, ReplicaAcks: 1, ReplicaAckTimeout: time.Microsecond})
	require.ErrorContains(t, err, "under a millisecond")
}
