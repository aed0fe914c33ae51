package redisurl

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// closedAddr returns a local host:port nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestDialNamesTheURLWithoutItsPassword(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	_, _, err := Dial(context.Background(), Target{URL: "redis://:secret@" + addr + "/3", URLFrom: URLVar}, time.Second)
	require.Error(t, err)
	require.Contains(t, err.Error(), "redis://:xxxxx@"+addr+"/3")
	require.Contains(t, err.Error(), "REDIS_URL")
	require.Contains(t, err.Error(), "does not answer PING")
	require.NotContains(t, err.Error(), "secret")
}

func TestDialAnswers(t *testing.T) {
	t.Parallel()
	c, e, err := Dial(context.Background(), Target{URL: "redis://" + redistest.Addr() + "/0", URLFrom: URLFlag}, 2*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.IsType(t, &redis.Client{}, c)
	require.False(t, e.IsCluster())
	require.Equal(t, redistest.Addr(), e.Addr())
}

func TestDialRejectsAMalformedURL(t *testing.T) {
	t.Parallel()
	_, _, err := Dial(context.Background(), Target{URL: "localhost:6379", URLFrom: URLFlag}, time.Second)
	require.ErrorContains(t, err, "-redis")
}

// FromEnv reads both variables; an empty one names nothing, and the URL
// then is the default, which cluster seeds replace.
func TestFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	require.Equal(t, Target{URL: DefaultURL}, FromEnv(env(nil), DefaultURL))
	require.False(t, FromEnv(env(nil), DefaultURL).Named())
	got := FromEnv(env(map[string]string{URLVar: "redis://r:1/2", ClusterVar: "a:1"}), DefaultURL)
	require.Equal(t, Target{URL: "redis://r:1/2", URLFrom: URLVar, Cluster: "a:1", ClusterFrom: ClusterVar}, got)
	got = FromEnv(env(map[string]string{ClusterVar: "a:1,b:2"}), DefaultURL)
	require.True(t, got.Named())
	e, err := got.Parse()
	require.NoError(t, err, "the default URL gives way to the seeds")
	require.True(t, e.IsCluster())
	require.Equal(t, "a:1,b:2", e.Addr())
}

// Parse refuses what cannot be a Redis or a cluster, naming the setting
// and redacting passwords; it accepts the two forms of seed list.
func TestParse(t *testing.T) {
	t.Parallel()
	cluster := func(list string) Target { return Target{URL: DefaultURL, Cluster: list, ClusterFrom: ClusterVar} }
	for _, tc := range []struct {
		name string
		t    Target
		want []string // in the error; none: no error
	}{
		{name: "both named", t: Target{URL: "redis://:pw@r:1/0", URLFrom: URLVar, Cluster: "redis://:pw@a:1", ClusterFrom: ClusterFlag},
			want: []string{"REDIS_URL redis://:xxxxx@r:1/0", "-redis-cluster redis://:xxxxx@a:1", "ambiguous", "unset one"}},
		{name: "flag and env", t: Target{URL: "redis://r:1/0", URLFrom: URLFlag, Cluster: "a:1", ClusterFrom: ClusterVar},
			want: []string{"-redis", "REDIS_CLUSTER_ADDRS", "ambiguous"}},
		{name: "db 2", t: cluster("redis://:pw@a:1/2,redis://:pw@b:1/2"), want: []string{"db 2", "only db 0", "redis://:xxxxx@a:1/2"}},
		{name: "db 0", t: cluster("redis://a:1/0,redis://b:1")},
		{name: "no seed", t: cluster(" , "), want: []string{"REDIS_CLUSTER_ADDRS", "no seed node"}},
		{name: "mixed", t: cluster("a:1,redis://b:1"), want: []string{"mixes URLs and host:port"}},
		{name: "no port", t: cluster("a:1,b"), want: []string{`seed "b": want host:port`}},
		{name: "other password", t: cluster("redis://:pw@a:1,redis://:other@b:1"),
			want: []string{"differs from", "user, password", "redis://:xxxxx@b:1"}},
		{name: "other scheme", t: cluster("rediss://a:1,redis://b:1"), want: []string{"differs from"}},
		{name: "bad scheme", t: cluster("http://a:1"), want: []string{"invalid URL scheme"}},
		{name: "bad option", t: cluster("redis://a:1?nope=1"), want: []string{"unexpected option"}},
		{name: "malformed URL", t: Target{URL: "localhost:6379", URLFrom: URLVar}, want: []string{"REDIS_URL", "want redis://"}},
		{name: "the default", t: Target{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := tc.t.Parse()
			if len(tc.want) == 0 {
				require.NoError(t, err)
				require.NotNil(t, e)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.NotContains(t, err.Error(), ":pw@")
			require.NotContains(t, err.Error(), "other@")
		})
	}

	// URL seeds: the user, password, TLS and options of the first apply
	// to every node, and every address is a seed.
	e, err := cluster("rediss://u:pw@a:7000?dial_timeout=3s, rediss://u:pw@b:7001/0?dial_timeout=3s").Parse()
	require.NoError(t, err)
	require.Equal(t, []string{"a:7000", "b:7001"}, e.cluster.Addrs)
	require.Equal(t, "u", e.cluster.Username)
	require.Equal(t, "pw", e.cluster.Password)
	require.NotNil(t, e.cluster.TLSConfig)
	require.Equal(t, 3*time.Second, e.cluster.DialTimeout)
	require.Equal(t, "rediss://u:xxxxx@a:7000?dial_timeout=3s,rediss://u:xxxxx@b:7001/0?dial_timeout=3s", e.String())
	require.Equal(t, "a:7000,b:7001", e.Addr())
	require.Equal(t, 0, e.DB())
}

// A cluster named by seeds of either form is dialled as a cluster client
// that reaches every master; a cluster that does not answer, a Redis that
// is not a cluster, a cluster node named as one Redis and a cluster whose
// state is not ok are errors naming what to change.
func TestCluster(t *testing.T) {
	t.Parallel()
	addrs := redistest.StartCluster(t)
	ctx := t.Context()

	dial := func(t *testing.T, list string) redis.UniversalClient {
		t.Helper()
		c, e, err := Dial(ctx, Target{URL: DefaultURL, Cluster: list, ClusterFrom: ClusterVar}, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		require.True(t, e.IsCluster())
		require.IsType(t, &redis.ClusterClient{}, c)
		require.GreaterOrEqual(t, c.(*redis.ClusterClient).Options().MaxRedirects, engine.MinClusterRedirects,
			"enough retries to ride out a slot migration")
		require.LessOrEqual(t, c.(*redis.ClusterClient).Options().ClusterStateReloadInterval, ClusterStateReload,
			"a slot map fresh enough to leave a failed-over master soon")
		return c
	}
	t.Run("host:port seeds", func(t *testing.T) {
		c := dial(t, strings.Join(addrs, ","))
		// Keys of every master: a one-node client would be answered MOVED.
		masters := map[string]bool{}
		for i := range 30 {
			k := fmt.Sprintf("{k%d}", i)
			require.NoError(t, c.Set(ctx, k, i, time.Minute).Err())
			node, err := c.(*redis.ClusterClient).MasterForKey(ctx, k)
			require.NoError(t, err)
			masters[node.Options().Addr] = true
		}
		require.Len(t, masters, 3)
	})
	t.Run("one seed finds the rest", func(t *testing.T) {
		c := dial(t, addrs[1])
		var n atomic.Int32
		require.NoError(t, c.(*redis.ClusterClient).ForEachMaster(ctx, func(context.Context, *redis.Client) error { n.Add(1); return nil }))
		require.EqualValues(t, 3, n.Load())
	})
	t.Run("URL seeds", func(t *testing.T) {
		c := dial(t, "redis://"+addrs[0]+"/0, redis://"+addrs[2])
		require.NoError(t, c.Ping(ctx).Err())
	})
	t.Run("seeds that do not answer", func(t *testing.T) {
		dead := closedAddr(t) + "," + closedAddr(t)
		_, _, err := Dial(ctx, Target{Cluster: dead, ClusterFrom: ClusterFlag}, time.Second)
		require.ErrorContains(t, err, "redis cluster at "+dead+" (-redis-cluster) is not ready")
		require.ErrorContains(t, err, "set -redis-cluster")
	})
	t.Run("a Redis that is not a cluster", func(t *testing.T) {
		_, _, err := Dial(ctx, Target{Cluster: redistest.Addr(), ClusterFrom: ClusterVar}, 2*time.Second)
		require.ErrorContains(t, err, "REDIS_CLUSTER_ADDRS")
		require.ErrorContains(t, err, "cluster support disabled")
	})
	t.Run("a cluster node as one Redis", func(t *testing.T) {
		_, _, err := Dial(ctx, Target{URL: "redis://" + addrs[0] + "/0", URLFrom: URLVar}, 2*time.Second)
		require.ErrorContains(t, err, "is a node of a Redis Cluster")
		require.ErrorContains(t, err, "REDIS_CLUSTER_ADDRS")
	})
	t.Run("cluster state not ok", func(t *testing.T) {
		// A cluster node that serves no slot, then some: its cluster is
		// down either way.
		srv := redistest.StartServer(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
		_, _, err := Dial(ctx, Target{Cluster: srv.Addr, ClusterFrom: ClusterVar}, 2*time.Second)
		require.ErrorContains(t, err, "no master serves a slot (cluster_state:fail)")
		node := redis.NewClient(&redis.Options{Addr: srv.Addr})
		defer node.Close()
		require.NoError(t, node.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", 0, 100).Err())
		_, _, err = Dial(ctx, Target{Cluster: srv.Addr, ClusterFrom: ClusterVar}, 2*time.Second)
		require.ErrorContains(t, err, "reports cluster_state:fail")
		require.ErrorContains(t, err, "redis-cli --cluster check")
	})
}
