package redistest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ScanKeys returns every key of c matching pattern (a SCAN MATCH pattern):
// on a *redis.ClusterClient, those of every master (a SCAN of one node sees
// its own slots only, and KEYS or SCAN sent through a cluster client goes to
// one node of its choosing).
func ScanKeys(ctx context.Context, c redis.UniversalClient, pattern string) ([]string, error) {
	var (
		mu  sync.Mutex
		out []string
	)
	err := forEachMaster(ctx, c, func(ctx context.Context, node *redis.Client) error {
		keys, err := scanAll(ctx, scanKeys(node), "", pattern)
		if err != nil {
			return fmt.Errorf("SCAN on %s: %w", node.Options().Addr, err)
		}
		mu.Lock()
		out = append(out, keys...)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	// A key of a slot that moved between two masters' SCANs is seen twice.
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Unlink deletes keys from c (UNLINK) and returns the first error. On a
// *redis.ClusterClient it sends one UNLINK per hash slot, all in one
// pipeline, since a command whose keys span slots is refused (CROSSSLOT)
// even when one master serves them all.
func Unlink(ctx context.Context, c redis.UniversalClient, keys ...string) error {
	const chunk = 1000 // keys per UNLINK, so no command grows without bound
	var groups [][]string
	if _, ok := c.(*redis.ClusterClient); ok {
		bySlot := map[int][]string{}
		for _, k := range keys {
			bySlot[Slot(k)] = append(bySlot[Slot(k)], k)
		}
		for _, slot := range slices.Sorted(maps.Keys(bySlot)) {
			groups = append(groups, bySlot[slot])
		}
	} else if len(keys) > 0 {
		groups = [][]string{keys}
	}
	if len(groups) == 0 {
		return nil
	}
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, g := range groups {
			for len(g) > 0 {
				n := min(chunk, len(g))
				p.Unlink(ctx, g[:n]...)
				g = g[n:]
			}
		}
		return nil
	})
	return err
}

// forEachMaster calls fn with a client of each master of c: c itself when
// it is one node. On a cluster the calls run concurrently; the first error
// is returned.
func forEachMaster(ctx context.Context, c redis.UniversalClient, fn func(ctx context.Context, node *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("redistest: cannot list the nodes of a %T", c)
	}
}
