package mapcore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

// A fan-out map runs and rolls back with Config.ReplicaAcks: its element
// starts and finishes and its settles, sent as one-command pipelines so
// that WAIT follows them, give the map layer the same replies; every wait
// is answered by the replica.
func TestFanOutMapWithReplicaAcks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two redis-servers")
	}
	t.Parallel()
	m, _ := redistest.StartReplicated(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	var short atomic.Int32
	f := newFixtureOn(t, rdb, true, func(c *engine.Config) {
		c.ReplicaAcks, c.ReplicaAckTimeout = 1, 5*time.Second
		c.Hooks = append(c.Hooks, engine.HookFunc(func(_ context.Context, ev engine.Event) {
			if ev.Kind == engine.EventReplicaAcksShort {
				short.Add(1)
			}
		}))
	})
	waits, err := redistest.CommandCalls(t.Context(), rdb, "wait")
	require.NoError(t, err)
	def := sumOwner("acked-fan", f.element("acked-fan-el", 7), true, false)
	res, err := f.engine.Enqueue(ctxT(t), def, map[string]any{"items": items(30)})
	require.NoError(t, err)
	res, err = f.engine.Wait(ctxT(t), res.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[7]/double", res.Failure.Step)
	f.mu.Lock()
	completed := 0
	for i, n := range f.ran {
		require.LessOrEqual(t, n, 1, "element %d ran once", i)
		if i != 7 && n > 0 {
			completed++
		}
	}
	require.Len(t, f.undone, completed, "every completed element is undone")
	f.mu.Unlock()
	after, err := redistest.CommandCalls(t.Context(), rdb, "wait")
	require.NoError(t, err)
	require.Greater(t, after-waits, completed, "the elements' writes waited for the replica")
	require.Zero(t, short.Load())
}
