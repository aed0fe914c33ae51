package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/redisurl"
)

const (
	localAddr    = "127.0.0.1:6379"
	localTimeout = 300 * time.Millisecond
	urlTimeout   = 2 * time.Second
)

// target is the Redis the benchmark runs against.
type target struct {
	// url reaches it from any process (the worker subprocesses dial it).
	url string
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

// pick chooses the Redis: the -redis flag, else REDIS_URL, else
// 127.0.0.1:6379 if it answers within 300 ms, else an embedded miniredis.
// A Redis named explicitly (flag or REDIS_URL) that does not answer is an
// error: a benchmark silently run elsewhere would be worse than none.
func pick(ctx context.Context, flagURL string) (*target, error) {
	redis.SetLogger(quietLogger{}) // failed probes are expected here
	if forced, _ := strconv.ParseBool(os.Getenv("GOREACTOR_EMBEDDED")); forced && flagURL == "" {
		return startEmbedded("GOREACTOR_EMBEDDED=1")
	}
	for _, named := range []struct{ url, from string }{{flagURL, "-redis"}, {os.Getenv("REDIS_URL"), "REDIS_URL"}} {
		if named.url == "" {
			continue
		}
		c, opts, err := redisurl.Dial(ctx, named.url, named.from, urlTimeout)
		if err != nil {
			return nil, err
		}
		_ = c.Close()
		return &target{url: named.url, desc: fmt.Sprintf("%s (%s)", opts.Addr, named.from), close: func() {}}, nil
	}
	if err := probe(ctx, &redis.Options{Addr: localAddr}, localTimeout); err == nil {
		return &target{url: "redis://" + localAddr, desc: localAddr + " (local Redis)", close: func() {}}, nil
	}
	return startEmbedded("no Redis answers on " + localAddr)
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
	return &target{
		url:      "redis://" + mr.Addr(),
		desc:     fmt.Sprintf("embedded miniredis at %s (%s; its numbers say little about a real Redis)", mr.Addr(), why),
		embedded: true,
		close: func() {
			close(done)
			<-ticked
			mr.Close()
		},
	}, nil
}

// client returns a new client of the target with a pool large enough for
// poolSize concurrent users.
func (t *target) client(poolSize int) (*redis.Client, error) {
	opts, err := redis.ParseURL(t.url)
	if err != nil {
		return nil, err
	}
	opts.PoolSize = max(poolSize, 10)
	opts.ClientName = clientName
	if t.warm {
		opts.MinIdleConns = opts.PoolSize
	}
	return redis.NewClient(opts), nil
}

// clientName names every connection of the benchmark and its workers, so
// that the connections of other clients of a shared Redis can be counted.
const clientName = "goreactor-bench"

// otherClients counts the connections to the Redis that are not the
// benchmark's: their commands would show in INFO commandstats too.
func otherClients(ctx context.Context, rdb *redis.Client) (int, error) {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		if line != "" && !strings.Contains(" "+line+" ", " name="+clientName+" ") {
			n++
		}
	}
	return n, nil
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// cleanup deletes every key of one benchmark run from a real Redis: the
// keys under its prefix (runs, maps, undo counts) and its asynq queues.
// It never touches anything else.
func cleanup(rdb *redis.Client, prefix string, queues []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	patterns := []string{prefix + ":*"}
	for _, q := range queues {
		patterns = append(patterns, "asynq:{"+q+"}:*")
	}
	for _, pattern := range patterns {
		iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		batch := make([]string, 0, 1000)
		for iter.Next(ctx) {
			if batch = append(batch, iter.Val()); len(batch) == cap(batch) {
				if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
					return err
				}
				batch = batch[:0]
			}
		}
		if err := iter.Err(); err != nil {
			return err
		}
		if len(batch) > 0 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
		}
	}
	for _, q := range queues {
		if err := rdb.SRem(ctx, "asynq:queues", q).Err(); err != nil {
			return err
		}
	}
	return nil
}
