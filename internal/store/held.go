package store

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
)

var (
	//go:embed lua/held.lua
	heldSrc    string
	heldScript = redis.NewScript(heldSrc)
)

// Held counts what map elements still hold after their rollbacks: entries
// waiting for a person, left applied by one, and failed or blocked.
type Held struct{ Waiting, LeftApplied, Failed int }

// IsZero reports whether nothing is held.
func (h Held) IsZero() bool { return h.Waiting+h.LeftApplied+h.Failed == 0 }

// SetHeld records what element index of map mapID holds now (its latest
// truth replaces what was recorded) and returns the map's totals, over every
// element and rollback generation. Both keys are in the map's slot.
func SetHeld(ctx context.Context, rdb redis.Scripter, k keys.Keys, mapID string, index int, h Held) (Held, error) {
	res, err := heldScript.Run(ctx, rdb, []string{k.MapHeld(mapID), k.MapMeta(mapID)},
		index, h.Waiting, h.LeftApplied, h.Failed).Int64Slice()
	if err != nil {
		return Held{}, fmt.Errorf("store: record what element %d of map %s holds: %w", index, mapID, err)
	}
	return Held{Waiting: int(res[0]), LeftApplied: int(res[1]), Failed: int(res[2])}, nil
}

// HeldTotals reads what the elements of map mapID hold, in total.
func HeldTotals(ctx context.Context, rdb redis.Cmdable, k keys.Keys, mapID string) (Held, error) {
	vals, err := rdb.HMGet(ctx, k.MapHeld(mapID), "#w", "#l", "#f").Result()
	if err != nil {
		return Held{}, fmt.Errorf("store: read what the elements of map %s hold: %w", mapID, err)
	}
	n := func(v any) int {
		s, _ := v.(string)
		i, _ := strconv.Atoi(s)
		return i
	}
	return Held{Waiting: n(vals[0]), LeftApplied: n(vals[1]), Failed: n(vals[2])}, nil
}

// SetHeld is the package function over the store's client and keys.
func (s *Store) SetHeld(ctx context.Context, mapID string, index int, h Held) (Held, error) {
	return SetHeld(ctx, s.rdb, s.keys, mapID, index, h)
}
