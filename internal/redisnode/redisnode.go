// Package redisnode reaches every node that holds data: the one server of
// a plain client, each master of a Redis Cluster (or shard of a Ring).
//
// SCAN, INFO and CLIENT LIST answer for the node they are sent to, and a
// cluster client sends a keyless command to any one node: a cleanup that
// SCANs through it sees a third of a three-master cluster's keys and
// leaves the rest behind without an error. Tools that mean the whole data
// set go through EachMaster, and delete through Unlink, whose UNLINKs name
// one key each (a multi-key UNLINK across slots is refused with CROSSSLOT).
package redisnode

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// EachMaster calls fn with a client of each node that holds data: every
// master of a *redis.ClusterClient, every shard of a *redis.Ring, the
// client itself otherwise. On a cluster or a ring fn runs concurrently, one
// call per node. It returns every error fn returned, joined, and an error
// for a cluster whose nodes cannot be listed.
func EachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, node *redis.Client) error) error {
	var (
		mu   sync.Mutex
		errs []error
	)
	// go-redis keeps only the first error of a ForEach; every node's counts.
	each := func(ctx context.Context, node *redis.Client) error {
		if err := fn(ctx, node); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		return nil
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Ring:
		err = c.ForEachShard(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	default:
		err = fmt.Errorf("redisnode: a %T is neither one Redis nor a cluster: cannot reach its nodes", rdb)
	}
	return errors.Join(append([]error{err}, errs...)...)
}

// scanCount is the COUNT hint of every SCAN: keys per round trip.
const scanCount = 1000

// Scan calls fn with the keys matching pattern, a batch at a time, on every
// node EachMaster reaches. fn is never called concurrently, and a key may
// come twice (SCAN's guarantee). A node's scan stops at its first error,
// fn's or the node's; the errors of every node are returned, joined.
func Scan(ctx context.Context, rdb redis.UniversalClient, pattern string, fn func(keys []string) error) error {
	var mu sync.Mutex // fn is called once at a time
	return EachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
			if err != nil {
				return fmt.Errorf("SCAN %s on %s: %w", pattern, node.Options().Addr, err)
			}
			if len(keys) > 0 {
				mu.Lock()
				err = fn(keys)
				mu.Unlock()
				if err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
}

// Unlink deletes every key matching any of patterns, on every node, and
// returns how many it deleted. Each UNLINK names one key and goes through
// rdb, so a cluster client routes it to the key's slot (and follows a
// MOVED); the UNLINKs of one SCAN batch share a pipeline.
func Unlink(ctx context.Context, rdb redis.UniversalClient, patterns ...string) (int64, error) {
	var deleted int64
	for _, pattern := range patterns {
		err := Scan(ctx, rdb, pattern, func(keys []string) error {
			pipe := rdb.Pipeline()
			cmds := make([]*redis.IntCmd, len(keys))
			for i, k := range keys {
				cmds[i] = pipe.Unlink(ctx, k)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return fmt.Errorf("UNLINK %d keys matching %s: %w", len(keys), pattern, err)
			}
			for _, c := range cmds {
				deleted += c.Val()
			}
			return nil
		})
		if err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}
