package redistest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) {
	code := m.Run()
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
	keys, err := c.Keys(ctx, prefix+"*").Result()
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
}
