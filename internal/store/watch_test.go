package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/store"
)

// subscribed returns a shard subscription to channel whose confirmation has
// arrived, so that nothing published after it is missed.
func subscribed(t *testing.T, rdb redis.UniversalClient, channel string) *redis.PubSub {
	t.Helper()
	ps := rdb.SSubscribe(t.Context(), channel)
	t.Cleanup(func() { _ = ps.Close() })
	msg, err := ps.ReceiveTimeout(t.Context(), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, &redis.Subscription{Kind: "ssubscribe", Channel: channel, Count: 1}, msg)
	return ps
}

// shardNumSub returns channel's number of shard subscribers (PUBSUB
// SHARDNUMSUB), asked of the master serving its slot on a cluster: another
// node counts none.
func shardNumSub(t *testing.T, rdb redis.UniversalClient, channel string) int64 {
	t.Helper()
	var node interface {
		Do(ctx context.Context, args ...any) *redis.Cmd
	} = rdb
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		m, err := cc.MasterForKey(t.Context(), channel)
		require.NoError(t, err)
		node = m
	}
	n, err := node.Do(t.Context(), "PUBSUB", "SHARDNUMSUB", channel).Slice()
	require.NoError(t, err)
	require.Len(t, n, 2)
	return n[1].(int64)
}

// mastersOf returns how many masters serve channels: 1 on one node.
func mastersOf(t *testing.T, rdb redis.UniversalClient, channels ...string) int {
	t.Helper()
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return 1
	}
	addrs := map[string]bool{}
	for _, ch := range channels {
		m, err := cc.MasterForKey(t.Context(), ch)
		require.NoError(t, err)
		addrs[m.Options().Addr] = true
	}
	return len(addrs)
}

// requireFired waits for one notification of w, a few seconds at most.
func requireFired(t *testing.T, w *store.Watch, what string) {
	t.Helper()
	select {
	case <-w.C:
	case <-time.After(5 * time.Second):
		t.Fatalf("no notification: %s", what)
	}
}

func TestTerminalWritePublishes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := f.st.RunTarget("run-1")
	require.Equal(t, f.k.RunDone("run-1"), target.Done)
	ps := subscribed(t, f.rdb, target.Done)
	f.create(t, target, "tok", data1)

	_, err := f.st.Write(f.ctx, target, "tok", 1, data2, store.WriteOptions{})
	require.NoError(t, err)
	_, err = f.st.Write(f.ctx, target, "tok", 2, data3, store.WriteOptions{Retention: time.Hour})
	require.NoError(t, err)
	msg, err := ps.ReceiveTimeout(f.ctx, 5*time.Second)
	require.NoError(t, err)
	// Only the terminal write announces itself, with its version.
	require.Equal(t, &redis.Message{Channel: target.Done, Payload: "3"}, msg)

	// An element (no Done channel) publishes nothing.
	elem := f.st.ElemTarget("m~s.0")
	require.Empty(t, elem.Done)
	f.create(t, elem, "tok", data1)
	_, err = f.st.Write(f.ctx, elem, "tok", 1, data2, store.WriteOptions{Retention: time.Hour, Release: true})
	require.NoError(t, err)
	require.Zero(t, shardNumSub(t, f.rdb, f.k.ElemState("m~s.0")))
}

func TestWatcherSharesOneConnection(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.st.Watcher()
	ctx := f.ctx
	var (
		watches  []*store.Watch
		channels []string
	)
	for i := range 20 {
		ch := f.k.RunDone(fmt.Sprintf("run-%d", i%10)) // two waiters per channel
		wt, err := w.Watch(ctx, ch)
		require.NoError(t, err)
		requireFired(t, wt, "subscription confirmed") // the waiter reads after this
		watches, channels = append(watches, wt), append(channels, ch)
	}
	// One connection, or on a cluster one per master serving the channels.
	require.Equal(t, mastersOf(t, f.rdb, channels...), w.Connections())

	require.NoError(t, f.rdb.SPublish(ctx, f.k.RunDone("run-3"), "9").Err())
	requireFired(t, watches[3], "first waiter of run-3")
	requireFired(t, watches[13], "second waiter of run-3")
	for i, wt := range watches {
		if i%10 != 3 {
			require.Empty(t, wt.C, "waiter %d is not on run-3", i)
		}
	}

	watches[3].Close()
	watches[3].Close() // idempotent
	require.Equal(t, int64(1), shardNumSub(t, f.rdb, f.k.RunDone("run-3")), "run-3 keeps its other waiter")
	watches[13].Close()
	require.Eventually(t, func() bool {
		return shardNumSub(t, f.rdb, f.k.RunDone("run-3")) == 0
	}, 5*time.Second, 10*time.Millisecond, "the last waiter's Close unsubscribes")
	for _, wt := range watches {
		wt.Close()
	}
	require.Zero(t, w.Connections(), "an idle Watcher holds no connection")
}

// A subscriber connection killed by the server is replaced, and its
// channels are subscribed again; the confirmations fire every Watch, so
// waiters read their runs and miss nothing published meanwhile.
func TestWatcherReplacesAKilledConnection(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := t.Context()
	k := keys.New("w")
	st, err := store.New(ctx, rdb, k)
	require.NoError(t, err)
	w := st.Watcher()
	a, err := w.Watch(ctx, k.RunDone("a"))
	require.NoError(t, err)
	defer a.Close()
	b, err := w.Watch(ctx, k.RunDone("b"))
	require.NoError(t, err)
	defer b.Close()
	requireFired(t, a, "a subscribed")
	requireFired(t, b, "b subscribed")

	killed, err := rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Int()
	require.NoError(t, err)
	require.Equal(t, 1, killed)
	requireFired(t, a, "a subscribed again")
	requireFired(t, b, "b subscribed again")
	require.NoError(t, rdb.SPublish(ctx, k.RunDone("b"), "1").Err())
	requireFired(t, b, "b announced on the new connection")
	require.Equal(t, 1, w.Connections())
}

// clusterWatch is TestCluster's pub/sub part: the write script announces a
// terminal write on a shard channel of the run's slot (and a script cannot
// publish outside its slot), and one Watcher serves runs on every node with
// one connection per master.
func clusterWatch(t *testing.T, ctx context.Context, cc *redis.ClusterClient, st *store.Store, k keys.Keys) {
	w := st.Watcher()
	var watches []*store.Watch
	for i := range 12 {
		id := fmt.Sprintf("watched-%d", i)
		target := st.RunTarget(id)
		ps := subscribed(t, cc, target.Done)
		wt, err := w.Watch(ctx, target.Done)
		require.NoError(t, err)
		requireFired(t, wt, "subscribed on the cluster")
		watches = append(watches, wt)

		require.NoError(t, cc.Set(ctx, target.Lock, "tok", time.Minute).Err())
		_, created, err := st.Create(ctx, target, "tok", data1)
		require.NoError(t, err)
		require.True(t, created)
		_, err = st.Write(ctx, target, "tok", 1, data2, store.WriteOptions{Retention: time.Hour, Release: true})
		require.NoError(t, err)
		msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
		require.NoError(t, err)
		require.Equal(t, &redis.Message{Channel: target.Done, Payload: "2"}, msg)
		requireFired(t, wt, "the Watcher heard the terminal write")
	}
	require.Equal(t, 3, w.Connections(), "one subscriber connection per master")
	for _, wt := range watches {
		wt.Close()
	}
	require.Zero(t, w.Connections())

	// Control: a script refuses to SPUBLISH a shard channel of another slot,
	// which is why the channel carries the run's hash tag.
	a, b := "run-0", "run-1"
	require.NotEqual(t, hashSlot(k.RunState(a)), hashSlot(k.RunDone(b)))
	err := cc.Eval(ctx, "return redis.call('SPUBLISH', ARGV[1], 'x')", []string{k.RunState(a)}, k.RunDone(b)).Err()
	require.ErrorContains(t, err, "key", "the cluster checks a shard channel like a key")
}
