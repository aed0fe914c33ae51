package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
)

// A run tree is a run and everything its steps created in keys of their own:
// the maps it started (listed in its tree set, P:{run:<id>}:tree, by the map
// step before a map's first key is written), each map's forward and rollback
// keys, its element runs, and the maps nested in those elements (each
// element's own tree set). Nothing of a tree may expire while the run is
// live, and when it finishes the whole tree gets the run's retention, so an
// element never expires before its owner's rollback could need it and a
// reused run id never finds a stale map.
//
// The walk is idempotent and needs no definitions (the sweeper runs it for a
// run whose process died between its terminal write and the walk): it reads
// the tree sets and each map's size, and sets one expiry, or removes it, on
// every key. The tree set itself goes last, so an interrupted walk can be
// walked again.

// treeChunk is how many elements one pipeline of the walk covers.
const treeChunk = 500

// RetainTree gives every key of run id's tree the expiry ttl (the run's
// retention), or removes their expiry when ttl is 0 (a finished run made
// live again by an undo). The run's own state is expired by its terminal
// write, not here.
func (s *Store) RetainTree(ctx context.Context, id string, ttl time.Duration) error {
	k := s.keys
	return s.retain(ctx, k.RunTree(id), []string{k.RunMaps(id), k.RunAudit(id), k.RunTasks(id)}, ttl)
}

// retain walks the maps listed in tree, then sets ttl on own and on tree.
func (s *Store) retain(ctx context.Context, tree string, own []string, ttl time.Duration) error {
	maps, err := s.rdb.SMembers(ctx, tree).Result()
	if err != nil {
		return fmt.Errorf("store: read run tree %s: %w", tree, err)
	}
	if err := s.retainMaps(ctx, maps, ttl); err != nil {
		return err
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, key := range append(own, tree) {
			expire(ctx, p, key, ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("store: retain run tree %s: %w", tree, err)
	}
	return nil
}

func (s *Store) retainMaps(ctx context.Context, maps []string, ttl time.Duration) error {
	if len(maps) == 0 {
		return nil
	}
	k := s.keys
	totals := make([]*redis.SliceCmd, len(maps))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for j, m := range maps {
			totals[j] = p.HMGet(ctx, k.MapMeta(m), "total", "rbgen", "layout")
		}
		return nil
	})
	if err != nil && err != redis.Nil {
		return fmt.Errorf("store: read map sizes: %w", err)
	}
	for j, m := range maps {
		total, gens, layout := mapShape(totals[j].Val())
		retain := s.retainElements
		if layout < 2 {
			retain = s.retainLegacyElements
		}
		if err := retain(ctx, m, total, ttl); err != nil {
			return err
		}
		// The map's own keys after its elements: an interrupted walk still
		// finds the map's size on the next try.
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, key := range mapKeys(k, m, gens) {
				expire(ctx, p, key, ttl)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: retain map %s: %w", m, err)
		}
	}
	return nil
}

// retainElements sets ttl on the element runs of map m and walks the maps
// nested in them. An element run is one key (its lock is gone once it
// finished, its audit entries are in the map's stream, the maps nested in
// its map's elements are in one set): one command per element.
func (s *Store) retainElements(ctx context.Context, m string, total int, ttl time.Duration) error {
	k := s.keys
	for lo := 0; lo < total; lo += treeChunk {
		hi := min(lo+treeChunk, total)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				expire(ctx, p, k.ElemState(m+"."+strconv.Itoa(i)), ttl)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: retain elements of %s: %w", m, err)
		}
	}
	// The maps nested in the elements (keys.ElemTree: one set per map).
	return s.retain(ctx, k.ElemTree(m+".0"), []string{k.MapAudit(m)}, ttl)
}

// retainLegacyElements is retainElements for a map started before element
// runs moved into their map's slot: each element has its own keys and tree.
func (s *Store) retainLegacyElements(ctx context.Context, m string, total int, ttl time.Duration) error {
	k := s.keys
	for lo := 0; lo < total; lo += treeChunk {
		hi := min(lo+treeChunk, total)
		nested := make([]*redis.StringSliceCmd, hi-lo)
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i := lo; i < hi; i++ {
				id := m + "." + strconv.Itoa(i)
				nested[i-lo] = p.SMembers(ctx, k.LegacyElemTree(id))
				expire(ctx, p, k.LegacyElemState(id), ttl)
				expire(ctx, p, k.LegacyElemCancel(id), ttl)
				expire(ctx, p, k.LegacyElemAudit(id), ttl)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("store: retain elements of %s: %w", m, err)
		}
		for i := lo; i < hi; i++ {
			if len(nested[i-lo].Val()) == 0 {
				continue
			}
			if err := s.retain(ctx, k.LegacyElemTree(m+"."+strconv.Itoa(i)), nil, ttl); err != nil {
				return err
			}
		}
	}
	return nil
}

// mapShape reads a map's size, rollback generations and key layout from its
// meta's total, rbgen and layout fields: every generation from 1 to rbgen
// (the current one, written by mapstep's rb_start.lua) has keys; layout 2
// (mapstep's start.lua) keeps element runs in the map's slot, an older map
// (no layout) each in its own.
func mapShape(vals []any) (total, gens, layout int) {
	if len(vals) == 3 {
		s, _ := vals[0].(string)
		total, _ = strconv.Atoi(s)
		g, _ := vals[1].(string)
		gens, _ = strconv.Atoi(g)
		l, _ := vals[2].(string)
		layout, _ = strconv.Atoi(l)
	}
	return total, max(gens, 1), layout
}

// mapKeys lists every key of map m: forward, and rollback of each of its
// generations 1..gens (a re-triggered rollback adds one).
func mapKeys(k keys.Keys, m string, gens int) []string {
	out := []string{k.MapMeta(m), k.MapSource(m), k.MapOffset(m), k.MapResults(m), k.MapFailed(m), k.MapSignalled(m), k.MapHeld(m), k.MapStates(m)}
	for gen := 1; gen <= gens; gen++ {
		out = append(out, k.MapRbMeta(m, gen), k.MapRbOffset(m, gen), k.MapRbResults(m, gen), k.MapRbHandedOff(m, gen),
			k.MapRbSignalled(m, gen), k.MapRbWork(m, gen))
	}
	return out
}

func expire(ctx context.Context, p redis.Pipeliner, key string, ttl time.Duration) {
	if ttl > 0 {
		p.PExpire(ctx, key, ttl)
	} else {
		p.Persist(ctx, key)
	}
}
