package worker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

// The errors a Redis Cluster answers while a slot moves (TRYAGAIN for
// keys split between the nodes, ASK for keys gone to the importing node,
// MOVED from a node that does not serve the slot) are told apart from
// other errors, wrapped or not, and a handler that meets one snoozes
// briefly instead of failing into asynq's exponential backoff.
func TestClusterTransientErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	t.Parallel()
	ctx := context.Background()
	addrs := redistest.StartCluster(t)
	nodes := make([]*redis.Client, len(addrs))
	ids := make([]string, len(addrs))
	for i, a := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		t.Cleanup(func() { _ = nodes[i].Close() })
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		require.NoError(t, err)
		ids[i] = id
	}
	// The slot of {tr} and the master that serves it.
	slot, err := nodes[0].ClusterKeySlot(ctx, "{tr}a").Result()
	require.NoError(t, err)
	src := -1
	for i, n := range nodes {
		if err := n.Set(ctx, "{tr}a", "1", 0).Err(); err == nil {
			src = i
			break
		}
	}
	require.GreaterOrEqual(t, src, 0)
	dst, other := (src+1)%3, (src+2)%3
	require.NoError(t, nodes[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err())
	require.NoError(t, nodes[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err())
	t.Cleanup(func() {
		_ = nodes[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err()
		_ = nodes[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "STABLE").Err()
	})

	tryAgain := nodes[src].MGet(ctx, "{tr}a", "{tr}b").Err() // a present, b maybe on dst
	ask := nodes[src].Get(ctx, "{tr}b").Err()
	moved := nodes[other].Get(ctx, "{tr}a").Err()
	wrongType := nodes[src].LPush(ctx, "{tr}a", "x").Err()
	for name, err := range map[string]error{"TRYAGAIN": tryAgain, "ASK": ask, "MOVED": moved} {
		require.Error(t, err, name)
		require.Contains(t, err.Error(), name)
		require.True(t, clusterTransient(err), "%s: %v", name, err)
		require.True(t, clusterTransient(fmt.Errorf("engine: save: %w", err)), "%s, wrapped", name)
	}
	require.Error(t, wrongType)
	require.False(t, clusterTransient(wrongType), "WRONGTYPE is no cluster transition")
	require.False(t, clusterTransient(redis.Nil))

	// Through a worker's handler chain: the TRYAGAIN becomes a snooze of
	// about transientSnooze; any other error passes as it was.
	w := &Worker{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := w.transient(func(context.Context, *asynq.Task) error { return fmt.Errorf("mapstep: settle: %w", tryAgain) })
	err = h(ctx, asynq.NewTask(TypeElement, nil))
	var snooze *SnoozeError
	require.ErrorAs(t, err, &snooze)
	require.Equal(t, transientSnooze, snooze.Base)
	require.ErrorIs(t, snooze.Cluster, tryAgain)
	require.False(t, isFailure(err), "a snooze spends no retry")
	d := RetryDelay(5, err, nil)
	require.GreaterOrEqual(t, d, transientSnooze)
	require.LessOrEqual(t, d, 2*transientSnooze, "not the exponential backoff (32 s at the fifth retry)")
	other2 := w.transient(func(context.Context, *asynq.Task) error { return wrongType })
	require.ErrorIs(t, other2(ctx, asynq.NewTask(TypeElement, nil)), wrongType)
}
