package main

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/redisurl"
)

// The whole demo runs on a Redis Cluster named by its seeds, on every
// master, and its cleanup leaves none of its keys on any of them.
func TestDemoOnACluster(t *testing.T) {
	t.Setenv("GOREACTOR_EMBEDDED", "")
	addrs := redistest.StartCluster(t)
	nodes := make([]*redis.Client, len(addrs))
	for i, addr := range addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: addr})
		defer nodes[i].Close()
	}
	commands := func(node *redis.Client) int {
		info, err := node.Info(t.Context(), "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, v, _ := strings.Cut(info, "total_commands_processed:")
		n, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(v, "\n", 2)[0]))
		if err != nil {
			t.Fatalf("INFO stats: %v", err)
		}
		return n
	}
	before := make([]int, len(nodes))
	for i, node := range nodes {
		before[i] = commands(node)
	}

	if err := run(redisurl.Target{Cluster: strings.Join(addrs, ","), ClusterFrom: redisurl.ClusterVar}); err != nil {
		t.Fatal(err)
	}
	for i, node := range nodes {
		if n := commands(node) - before[i]; n < 100 {
			t.Errorf("the demo sent %d commands to %s: it did not run on every master", n, addrs[i])
		}
		for _, pattern := range []string{"goreactor-demo:*", "asynq:{goreactor-demo-*"} {
			left, err := node.Keys(t.Context(), pattern).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(left) > 0 {
				t.Errorf("%d keys matching %s left on %s, e.g. %s", len(left), pattern, addrs[i], left[0])
			}
		}
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer rdb.Close()
	queues, err := rdb.SMembers(context.Background(), "asynq:queues").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range queues {
		if strings.HasPrefix(q, "goreactor-demo-") {
			t.Errorf("queue %s still listed in asynq:queues", q)
		}
	}
}
