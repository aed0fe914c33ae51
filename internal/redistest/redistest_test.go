package redistest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := redistest.CheckLeftovers(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = max(code, 1)
	}
	redistest.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestPrefixCleanupDeletesKeys(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	var prefix string
	t.Run("sub/test", func(t *testing.T) {
		prefix = redistest.Prefix(t)
		if !strings.HasPrefix(prefix, "grt:TestPrefixCleanupDeletesKeys_sub_test:") {
			t.Fatalf("unexpected prefix %q", prefix)
		}
		for i := range 2500 { // more than one SCAN batch
			key := fmt.Sprintf("%s:{run:%d}:ctx", prefix, i)
			if err := c.Set(ctx, key, i, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
	})
	keys, err := redistest.ScanKeys(ctx, c, prefix+"*")
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Fatalf("%d keys left under %s after cleanup, e.g. %s", len(keys), prefix, keys[0])
	}
}

func TestQueueNamesAreUniqueAndCleaned(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	seen := map[string]bool{}
	var queues []string
	t.Run("queues", func(t *testing.T) {
		for range 100 {
			q := redistest.Queue(t)
			if seen[q] {
				t.Fatalf("duplicate queue name %q", q)
			}
			seen[q] = true
			queues = append(queues, q)
		}
		q := queues[0]
		if err := c.SAdd(ctx, "asynq:queues", q).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.LPush(ctx, "asynq:{"+q+"}:pending", "task").Err(); err != nil {
			t.Fatal(err)
		}
	})
	q := queues[0]
	if n, err := c.Exists(ctx, "asynq:{"+q+"}:pending").Result(); err != nil || n != 0 {
		t.Fatalf("asynq key for %s left after cleanup: n=%d err=%v", q, n, err)
	}
	if ok, err := c.SIsMember(ctx, "asynq:queues", q).Result(); err != nil || ok {
		t.Fatalf("%s still in asynq:queues: %v %v", q, ok, err)
	}
}

// A queue's cleanup deletes the queues named after it too (the dashboard
// tests' queue+"-ctl"), their asynq:queues members and keys named after it,
// and nothing of a queue whose name merely shares its test's name.
func TestQueueCleanupCoversDerivedQueues(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	var q, other string
	t.Run("sub", func(t *testing.T) {
		q = redistest.Queue(t)
		for _, name := range []string{q, q + "-ctl"} {
			require.NoError(t, c.SAdd(ctx, "asynq:queues", name).Err())
			require.NoError(t, c.LPush(ctx, "asynq:{"+name+"}:pending", "task").Err())
			require.NoError(t, c.Set(ctx, "asynq:{"+name+"}:processed:2026-01-01", 1, time.Hour).Err())
		}
		require.NoError(t, c.Set(ctx, q+":fixture", "x", 0).Err())
		// Same test name, another random part: another test's queue.
		other = strings.TrimSuffix(q, q[len(q)-8:]) + "00000000"
		require.NotEqual(t, q, other)
		require.NoError(t, c.SAdd(ctx, "asynq:queues", other).Err())
		require.NoError(t, c.LPush(ctx, "asynq:{"+other+"}:pending", "task").Err())
	})
	t.Cleanup(func() {
		c.SRem(context.Background(), "asynq:queues", other)
		c.Del(context.Background(), "asynq:{"+other+"}:pending")
	})
	for _, name := range []string{q, q + "-ctl"} {
		n, err := c.Exists(ctx, "asynq:{"+name+"}:pending", "asynq:{"+name+"}:processed:2026-01-01").Result()
		require.NoError(t, err)
		require.Zero(t, n, "asynq keys of %s left after cleanup", name)
		ok, err := c.SIsMember(ctx, "asynq:queues", name).Result()
		require.NoError(t, err)
		require.False(t, ok, "%s still in asynq:queues", name)
	}
	n, err := c.Exists(ctx, q+":fixture").Result()
	require.NoError(t, err)
	require.Zero(t, n, "a key named after the queue left after cleanup")
	n, err = c.Exists(ctx, "asynq:{"+other+"}:pending").Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "another queue's keys deleted")
	ok, err := c.SIsMember(ctx, "asynq:queues", other).Result()
	require.NoError(t, err)
	require.True(t, ok, "another queue removed from asynq:queues")
}

// The deletion runs after the cleanups registered after the first Prefix or
// Queue (a worker stopping, whose last writes land then), even for a name
// handed out after them.
func TestCleanupRunsAfterLaterCleanups(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	var first, second, q string
	t.Run("sub", func(t *testing.T) {
		first = redistest.Prefix(t)
		t.Cleanup(func() {
			for _, k := range []string{first + ":last", second + ":last", "asynq:{" + q + "}:processed"} {
				if err := c.Set(ctx, k, "x", 0).Err(); err != nil {
					t.Error(err)
				}
			}
		})
		second, q = redistest.Prefix(t), redistest.Queue(t)
	})
	require.Zero(t, exists(t, c, first+":last", second+":last", "asynq:{"+q+"}:processed"),
		"keys written by a cleanup registered after the first name")
}

// CheckLeftovers reports what was written under a test's prefix or queue
// after its cleanup ran (not keys about to expire, nor names it did not hand
// out), and deletes the keys of example prefixes.
func TestCheckLeftovers(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	require.NoError(t, redistest.CheckLeftovers(), "before the test")
	var prefix, q string
	t.Run("sub", func(t *testing.T) {
		prefix, q = redistest.Prefix(t), redistest.Queue(t)
	})
	late := []string{prefix + ":{run:1}:ctx", "asynq:{" + q + "-ctl}:pending", q + ":fixture"}
	for _, k := range late {
		require.NoError(t, c.Set(ctx, k, "late", 0).Err())
	}
	require.NoError(t, c.SAdd(ctx, "asynq:queues", q).Err())
	expiring := prefix + ":{run:1}:lock"
	require.NoError(t, c.Set(ctx, expiring, "token", 10*time.Second).Err())
	foreign := "grt:TestSomebodyElse:0000abcd:idx:runs"
	require.NoError(t, c.Set(ctx, foreign, "x", 0).Err())
	t.Cleanup(func() { c.Del(context.Background(), foreign) })
	example := redistest.ExamplePrefix()
	require.True(t, strings.HasPrefix(example, "grt:Example:"), example)
	require.NoError(t, c.Set(ctx, example+":idx:runs", "x", 0).Err())

	err := redistest.CheckLeftovers()
	require.Error(t, err)
	for _, k := range late {
		require.Contains(t, err.Error(), k)
	}
	require.Contains(t, err.Error(), "4 key(s)")
	require.Contains(t, err.Error(), "asynq:queues member "+q)
	require.NotContains(t, err.Error(), expiring, "a key that expires within seconds")
	require.NotContains(t, err.Error(), foreign, "a key of a prefix this binary did not hand out")
	require.NotContains(t, err.Error(), example, "an example's keys are deleted, not reported")
	n, err := c.Exists(ctx, example+":idx:runs").Result()
	require.NoError(t, err)
	require.Zero(t, n, "an example prefix's keys deleted")

	require.NoError(t, redistest.Unlink(ctx, c, append(late, expiring)...))
	require.NoError(t, c.SRem(ctx, "asynq:queues", q).Err())
	require.NoError(t, redistest.CheckLeftovers(), "once they are deleted")
}

// exists counts the keys that exist, one EXISTS each: on a cluster, keys of
// several slots cannot share a command.
func exists(t *testing.T, c redis.UniversalClient, keys ...string) int64 {
	t.Helper()
	var n int64
	for _, k := range keys {
		one, err := c.Exists(context.Background(), k).Result()
		require.NoError(t, err)
		n += one
	}
	return n
}

func TestStartServerRestartKeepsAOFData(t *testing.T) {
	ctx := context.Background()
	s := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	down := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	if err := down.Ping(ctx).Err(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	s.Restart()
	got, err := c.Get(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got != "v" {
		t.Fatalf("GET k = %q after restart, want %q", got, "v")
	}
}

func TestStartCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	ctx := context.Background()
	addrs := redistest.StartCluster(t)
	if len(addrs) != 3 {
		t.Fatalf("got %d nodes, want 3", len(addrs))
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })

	// Keys chosen to hash to slots owned by different masters.
	keys := []string{"{a}:k", "{b}:k", "{c}:k", "{d}:k", "{e}:k", "{f}:k"}
	masters := map[string]bool{}
	for _, k := range keys {
		if err := c.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		got, err := c.Get(ctx, k).Result()
		if err != nil || got != k {
			t.Fatalf("GET %s = %q, %v", k, got, err)
		}
		node, err := c.MasterForKey(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("keys landed on %d master(s), want several", len(masters))
	}

	// ScanKeys sees every master's keys; Unlink deletes keys of many slots
	// (one UNLINK each would be refused: CROSSSLOT).
	found, err := redistest.ScanKeys(ctx, c, "{?}:k")
	require.NoError(t, err)
	require.ElementsMatch(t, keys, found)
	require.Error(t, c.Unlink(ctx, keys...).Err(), "a multi-slot UNLINK, refused")
	require.NoError(t, redistest.Unlink(ctx, c, keys...))
	found, err = redistest.ScanKeys(ctx, c, "{?}:k")
	require.NoError(t, err)
	require.Empty(t, found)
}

// Slot agrees with the server's CLUSTER KEYSLOT, hash tags included.
func TestSlotMatchesClusterKeyslot(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Redis Cluster")
	}
	ctx := context.Background()
	node := redis.NewClient(&redis.Options{Addr: redistest.StartCluster(t)[0]})
	t.Cleanup(func() { _ = node.Close() })
	keys := []string{"", "foo", "123456789", "{user1000}.following", "{user1000}.followers",
		"foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "{", "}", "{}", "}{x}", "a{b", "grt:T:1234abcd:{run:r1}:ctx"}
	for range 200 {
		keys = append(keys, fmt.Sprintf("grt:T:%08x:{map:%x}:el:%d:ctx", rand.Uint32(), rand.Uint64(), rand.IntN(10000)))
	}
	for _, k := range keys {
		want, err := node.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		require.Equal(t, int(want), redistest.Slot(k), "slot of %q", k)
	}
	require.Equal(t, 12739, redistest.Slot("123456789"), "CRC16/XMODEM check value 0x31C3")
}

// Client hands out a cluster client when the tests share a cluster.
func TestClientKind(t *testing.T) {
	c := redistest.Client(t)
	if redistest.ClusterAddrs() != nil {
		require.IsType(t, &redis.ClusterClient{}, c)
	} else {
		require.IsType(t, &redis.Client{}, c)
	}
}

// A cluster with replicas: every master has its replica attached; a killed
// master's replica is promoted and serves what the master had acknowledged
// to a WAIT.
func TestClusterWithReplicasFailsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a six-node Redis Cluster and fails a master over")
	}
	ctx := context.Background()
	cl := redistest.NewCluster(t, redistest.ClusterConfig{Replicas: 1, NodeTimeout: time.Second})
	require.Len(t, cl.Addrs, 6)
	require.Len(t, cl.Masters(), 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { _ = c.Close() })

	for _, m := range cl.Masters() {
		replicas := cl.ReplicasOf(m)
		require.Len(t, replicas, 1, "replicas of %s", m)
		info, err := redisInfo(ctx, replicas[0])
		require.NoError(t, err)
		require.Contains(t, info, "role:slave")
		require.Contains(t, info, "master_port:"+m[strings.LastIndexByte(m, ':')+1:])
		require.Contains(t, info, "master_link_status:up")
	}

	const key = "{failover}:k"
	require.NoError(t, c.Set(ctx, key, "v", 0).Err())
	master, err := c.MasterForKey(ctx, key)
	require.NoError(t, err)
	require.NoError(t, master.Do(ctx, "WAIT", 1, 5000).Err())
	addr := master.Options().Addr
	replica := cl.ReplicasOf(addr)[0]
	require.NoError(t, cl.Kill(addr))
	require.NoError(t, cl.Ready(30*time.Second))
	info, err := redisInfo(ctx, replica)
	require.NoError(t, err)
	require.Contains(t, info, "role:master", "the killed master's replica, promoted")
	require.Eventually(t, func() bool {
		// A reload is lazy (one in the background, at most so often): one
		// that read a node not yet told of the promotion leaves the client
		// on the dead master, so every look asks again.
		c.ReloadState(ctx)
		got, err := c.Get(ctx, key).Result()
		return err == nil && got == "v"
	}, 20*time.Second, 20*time.Millisecond, "the key, read from the promoted replica")
}

func redisInfo(ctx context.Context, addr string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	return c.Info(ctx, "replication").Result()
}
