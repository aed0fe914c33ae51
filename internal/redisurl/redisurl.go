// Package redisurl connects the binaries to the Redis an operator named.
//
// A Redis named explicitly (a -redis flag, REDIS_URL) that does not answer
// is an error, never a reason to use another one: a worker, sweeper, demo or
// benchmark silently running against a different Redis than the one it was
// pointed at is worse than one that does not start.
package redisurl

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// Dial parses rawURL (redis://[user:password@]host:port/db, rediss:// for
// TLS), connects and PINGs within timeout. from names where the URL came
// from ("REDIS_URL", "-redis"), for the error. The error names the URL with
// its password redacted. The caller closes the client.
func Dial(ctx context.Context, rawURL, from string, timeout time.Duration) (*redis.Client, *redis.Options, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w; want redis://[user:password@]host:port/db", from, Redact(rawURL), err)
	}
	if opts.DialTimeout == 0 || opts.DialTimeout > timeout {
		opts.DialTimeout = timeout
	}
	c := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		_ = c.Close()
		return nil, nil, fmt.Errorf("redis at %s (%s, db %d) does not answer PING within %s: %w; start it or set %s to a Redis that answers",
			Redact(rawURL), from, opts.DB, timeout, err, from)
	}
	return c, opts, nil
}

// Redact returns rawURL with its password replaced by "xxxxx", for logs and
// errors; a string that does not parse as a URL is returned as "<unparsable
// URL>" in case it holds a secret.
func Redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "<unparsable URL>"
	}
	return u.Redacted()
}
