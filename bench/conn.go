package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redisnode"
	"github.com/goreactor/goreactor/internal/redisurl"
)

const (
	localAddr    = "127.0.0.1:6379"
	localTimeout = 300 * time.Millisecond
	urlTimeout   = 2 * time.Second
)

// target is the Redis the benchmark runs against.
type target struct {
	// redis reaches it from any process (the worker subprocesses parse it
	// again): a URL or a cluster's seeds.
	redis redisurl.Target
	// ep is redis parsed.
	ep *redisurl.Endpoint
	// desc says which Redis this is and why it was chosen.
	desc string
	// embedded is true for the in-process miniredis: it has no INFO
	// commandstats, and its numbers say nothing about a real Redis.
	embedded bool
	// warm opens every client's whole pool up front (MinIdleConns =
	// PoolSize), so that connection buffers, which go-redis allocates per
	// connection as a pool grows, do not show up as heap growth in the
	// heap comparison.
	warm  bool
	close func()
}

// newTarget is a target of t, which must parse.
func newTarget(t redisurl.Target, desc string) (*target, error) {
	ep, err := t.Parse()
	if err != nil {
		return nil, err
	}
	return &target{redis: t, ep: ep, desc: desc, close: func() {}}, nil
}

// pick chooses the Redis: the one -redis, REDIS_URL, -redis-cluster or
// REDIS_CLUSTER_ADDRS names, else 127.0.0.1:6379 if it answers within
// 300 ms, else an embedded miniredis. A Redis named explicitly that does
// not answer is an error: a benchmark silently run elsewhere would be
// worse than none.
func pick(ctx context.Context, named redisurl.Target) (*target, error) {
	redis.SetLogger(quietLogger{}) // failed probes are expected here
	byFlag := named.URLFrom == redisurl.URLFlag || named.ClusterFrom == redisurl.ClusterFlag
	if forced, _ := strconv.ParseBool(os.Getenv("GOREACTOR_EMBEDDED")); forced && !byFlag {
		return startEmbedded("GOREACTOR_EMBEDDED=1")
	}
	if named.Named() {
		c, ep, err := redisurl.Dial(ctx, named, urlTimeout)
		if err != nil {
			return nil, err
		}
		_ = c.Close()
		from, what := named.URLFrom, ""
		if ep.IsCluster() {
			from, what = named.ClusterFrom, "Redis Cluster, seeds "
		}
		return newTarget(named, fmt.Sprintf("%s%s (%s)", what, ep.Addr(), from))
	}
	if err := probe(ctx, &redis.Options{Addr: localAddr}, localTimeout); err == nil {
		return newTarget(local("redis://"+localAddr), localAddr+" (local Redis)")
	}
	return startEmbedded("no Redis answers on " + localAddr)
}

// local is the Target of a Redis the benchmark found or started itself.
func local(url string) redisurl.Target {
	return redisurl.Target{URL: url, URLFrom: "the benchmark"}
}

// probe PINGs the Redis of opts within timeout.
func probe(ctx context.Context, opts *redis.Options, timeout time.Duration) error {
	o := *opts
	o.DialTimeout, o.MaxRetries = timeout, -1
	c := redis.NewClient(&o)
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.Ping(pctx).Err()
}

// startEmbedded starts an in-process miniredis. It expires keys only when
// its clock is advanced, so a ticker advances it with real time (run locks
// expire, as on a real Redis).
func startEmbedded(why string) (*target, error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, fmt.Errorf("%s, and the embedded Redis does not start: %w", why, err)
	}
	const tick = 100 * time.Millisecond
	done, ticked := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ticked)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				mr.FastForward(tick)
			}
		}
	}()
	t, err := newTarget(local("redis://"+mr.Addr()),
		fmt.Sprintf("embedded miniredis at %s (%s; its numbers say little about a real Redis)", mr.Addr(), why))
	if err != nil {
		close(done)
		<-ticked
		mr.Close()
		return nil, err
	}
	t.embedded = true
	t.close = func() {
		close(done)
		<-ticked
		mr.Close()
	}
	return t, nil
}

// client returns a new client of the target with a pool large enough for
// poolSize concurrent users (per node, on a cluster).
func (t *target) client(poolSize int) redis.UniversalClient {
	p := redisurl.Pool{Size: max(poolSize, 10), Name: clientName}
	if t.warm {
		p.MinIdle = p.Size
	}
	return t.ep.NewClient(p)
}

// clientName names every connection of the benchmark and its workers, so
// that the connections of other clients of a shared Redis can be counted.
const clientName = "goreactor-bench"

// otherClients counts the connections to the Redis (every master of a
// cluster) that are not the benchmark's: their commands would show in
// INFO commandstats too.
func otherClients(ctx context.Context, rdb redis.UniversalClient) (int, error) {
	var n atomic.Int64
	err := redisnode.EachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		list, err := node.ClientList(ctx).Result()
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
			if line != "" && !strings.Contains(" "+line+" ", " name="+clientName+" ") {
				n.Add(1)
			}
		}
		return nil
	})
	return int(n.Load()), err
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// cleanup deletes every key of one benchmark run from a real Redis (every
// master of a cluster): the keys under its prefix (runs, maps, undo
// counts) and its asynq queues. It never touches anything else.
func cleanup(rdb redis.UniversalClient, prefix string, queues []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	patterns := []string{prefix + ":*"}
	for _, q := range queues {
		patterns = append(patterns, "asynq:{"+q+"}:*")
	}
	if _, err := redisnode.Unlink(ctx, rdb, patterns...); err != nil {
		return err
	}
	for _, q := range queues {
		if err := rdb.SRem(ctx, "asynq:queues", q).Err(); err != nil {
			return err
		}
	}
	return nil
}
