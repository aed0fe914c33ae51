package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/redisurl"
)

// The default run on a Redis Cluster named by -redis-cluster, its workers
// in a subprocess that is handed the seeds: every check holds, the server
// counts are read from every master, and no key is left on any of them.
func TestDefaultRunOnACluster(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	addrs := redistest.StartCluster(t)
	cfg := tiny(t)
	cfg.procs = 1
	cfg.redis = redisurl.Target{Cluster: strings.Join(addrs, ","), ClusterFrom: redisurl.ClusterFlag}
	out, stderr, err := runJSON(t, ctx, cfg)
	require.NoError(t, err, stderr)
	require.Equal(t, true, out["ok"], "check failures: %v", out["check_failures"])
	require.Contains(t, out["redis"], "Redis Cluster")
	require.InDelta(t, 2, out["roundtrips_per_element_forward"].(float64), 1)
	require.Greater(t, out["redis_cmds_per_element_forward"].(float64), out["roundtrips_per_element_forward"].(float64))
	require.EqualValues(t, 20, out["max_burst"], "action %v", out["max_burst_action"])

	for _, addr := range addrs {
		node := redis.NewClient(&redis.Options{Addr: addr})
		requireNoKeysAt(t, node, out)
		require.NoError(t, node.Close())
	}
}
