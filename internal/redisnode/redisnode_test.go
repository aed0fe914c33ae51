package redisnode_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redisnode"
	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// seed writes n keys under prefix, each with a hash tag of its own so that
// on a cluster they spread over every master, and returns them.
func seed(t *testing.T, rdb redis.UniversalClient, prefix string, n int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s:{%d}:k", prefix, i)
		require.NoError(t, rdb.Set(t.Context(), keys[i], i, time.Hour).Err())
	}
	return keys
}

func TestOnACluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = rdb.Close() })
	t.Run("Unlink", func(t *testing.T) { testUnlinkOnACluster(t, rdb, addrs) })
	t.Run("EachMaster errors", func(t *testing.T) { testEachMasterJoinsEveryError(t, rdb, addrs) })
}

// On a cluster, Unlink deletes the matching keys of every master (a SCAN
// through the cluster client would see one master's; one UNLINK of keys
// of several slots would be refused with CROSSSLOT), and nothing else.
func testUnlinkOnACluster(t *testing.T, rdb *redis.ClusterClient, addrs []string) {
	ctx := t.Context()
	// Over 1,000 keys, so that a node's SCAN takes several rounds.
	gone := append(seed(t, rdb, "gone", 2500), seed(t, rdb, "also", 40)...)
	kept := seed(t, rdb, "kept", 40)

	perNode := func(pattern string) map[string]int {
		counts := map[string]int{}
		for _, addr := range addrs {
			node := redis.NewClient(&redis.Options{Addr: addr})
			keys, err := node.Keys(ctx, pattern).Result()
			require.NoError(t, node.Close())
			require.NoError(t, err)
			counts[addr] = len(keys)
		}
		return counts
	}
	for addr, n := range perNode("gone:*") {
		require.NotZero(t, n, "no key on %s: the test proves nothing", addr)
	}

	n, err := redisnode.Unlink(ctx, rdb, "gone:*", "also:*")
	require.NoError(t, err)
	require.EqualValues(t, len(gone), n)
	for _, pattern := range []string{"gone:*", "also:*"} {
		for addr, n := range perNode(pattern) {
			require.Zero(t, n, "%d keys matching %s left on %s", n, pattern, addr)
		}
	}
	for _, k := range kept {
		require.EqualValues(t, 1, rdb.Exists(ctx, k).Val(), "%s deleted", k)
	}
}

// On one Redis the same calls do the same, and Scan sees every key.
func TestUnlinkOnOneRedis(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	ctx := t.Context()
	prefix := redistest.Prefix(t)
	gone := seed(t, rdb, prefix+":gone", 1200)
	kept := seed(t, rdb, prefix+":kept", 3)

	seen := map[string]bool{}
	require.NoError(t, redisnode.Scan(ctx, rdb, prefix+":gone:*", func(keys []string) error {
		for _, k := range keys {
			seen[k] = true
		}
		return nil
	}))
	require.Len(t, seen, len(gone))

	n, err := redisnode.Unlink(ctx, rdb, prefix+":gone:*")
	require.NoError(t, err)
	require.EqualValues(t, len(gone), n)
	require.Empty(t, rdb.Keys(ctx, prefix+":gone:*").Val())
	require.EqualValues(t, len(kept), rdb.Exists(ctx, kept...).Val())
}

// EachMaster returns the error of every node, not only the first, and a
// fn error stops the Scan of that node.
func testEachMasterJoinsEveryError(t *testing.T, rdb *redis.ClusterClient, addrs []string) {
	err := redisnode.EachMaster(t.Context(), rdb, func(_ context.Context, node *redis.Client) error {
		return fmt.Errorf("refused by %s", node.Options().Addr)
	})
	for _, addr := range addrs {
		require.ErrorContains(t, err, "refused by "+addr)
	}

	seed(t, rdb, "stop", 30)
	stop := errors.New("stop here")
	calls := 0
	err = redisnode.Scan(t.Context(), rdb, "stop:*", func([]string) error { calls++; return stop })
	require.ErrorIs(t, err, stop)
	require.Equal(t, 3, calls, "one call per master, each stopped by its error")
}

// A client that is neither one Redis nor a cluster is refused, not
// scanned on whichever node it picks.
func TestEachMasterRefusesAnUnknownClient(t *testing.T) {
	t.Parallel()
	err := redisnode.EachMaster(t.Context(), unknownClient{}, func(context.Context, *redis.Client) error { return nil })
	require.ErrorContains(t, err, "cannot reach its nodes")
}

type unknownClient struct{ redis.UniversalClient }
