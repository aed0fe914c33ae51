package store

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lua/slot.lua
	slotSrc    string
	slotScript = redis.NewScript(slotSrc)
	//go:embed lua/rate.lua
	rateSrc    string
	rateScript = redis.NewScript(rateSrc)
)

// SlotGrant is what an acquire of a semaphore slot found.
type SlotGrant struct {
	// Held is true when the holder has a slot now.
	Held bool
	// Holders counts the holders after the call.
	Holders int
	// Wait is how long until the earliest lease ends (refused only): the
	// latest a slot frees up if no holder releases first.
	Wait time.Duration
}

func (s *Store) slot(ctx context.Context, key string, args ...any) ([]any, error) {
	var res []any
	keys := []string{key}
	if args[0] == "acquire" {
		keys = append(keys, key+":w")
	}
	err := rideOut(ctx, func() (err error) {
		res, err = slotScript.Run(ctx, s.rdb, keys, args...).Slice()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: limit %s: %w", args[0], err)
	}
	return res, nil
}

// AcquireSlot takes one of n slots of semaphore key for holder, with a lease
// (a holder that has one renews it). waiter names who waits when it is full
// (recorded in key+":w", see slot.lua).
func (s *Store) AcquireSlot(ctx context.Context, key, holder, waiter string, n int, lease time.Duration) (SlotGrant, error) {
	res, err := s.slot(ctx, key, "acquire", holder, n, max(1, lease.Milliseconds()), waiter)
	if err != nil {
		return SlotGrant{}, err
	}
	g := SlotGrant{Held: toInt(res[0]) == 1, Holders: int(toInt(res[1]))}
	if !g.Held && len(res) > 2 {
		g.Wait = time.Duration(toInt(res[2])) * time.Millisecond
	}
	return g, nil
}

// RenewSlot extends holder's lease; false once the holder lost its slot
// (its lease ended and another took it).
func (s *Store) RenewSlot(ctx context.Context, key, holder string, lease time.Duration) (bool, error) {
	res, err := s.slot(ctx, key, "renew", holder, max(1, lease.Milliseconds()))
	if err != nil {
		return false, err
	}
	return toInt(res[0]) == 1, nil
}

// ReleaseSlot gives holder's slot back.
func (s *Store) ReleaseSlot(ctx context.Context, key, holder string) error {
	_, err := s.slot(ctx, key, "release", holder)
	return err
}

// ParkSlot parks holder's slot: held with no lease while its run waits
// with no process (a run's own limits; slot.lua). False when the holder
// does not hold it (its lease ended and another took it).
func (s *Store) ParkSlot(ctx context.Context, key, holder string) (bool, error) {
	res, err := s.slot(ctx, key, "park", holder)
	if err != nil {
		return false, err
	}
	return toInt(res[0]) == 1, nil
}

// ParkedScore is a parked holder's score in a semaphore (slot.lua).
const ParkedScore = 1_000_000_000_000_000

// SlotHolder is one holder of a semaphore and when its lease ends.
type SlotHolder struct {
	Holder string
	Until  time.Time
}

// SlotHolders lists the holders of semaphore key, leases ended or not.
func (s *Store) SlotHolders(ctx context.Context, key string) ([]SlotHolder, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("store: read limit holders: %w", err)
	}
	out := make([]SlotHolder, len(zs))
	for i, z := range zs {
		m, _ := z.Member.(string)
		out[i] = SlotHolder{Holder: m, Until: time.UnixMilli(int64(z.Score))}
	}
	return out, nil
}

// Window is one rate limit: at most N admissions in any Per.
type Window struct {
	N   int
	Per time.Duration
}

// Admit records admission member under the rate limits of key if every
// window has room; else it records nothing and returns how long until the
// fullest has room again.
func (s *Store) Admit(ctx context.Context, key, member string, windows []Window) (bool, time.Duration, error) {
	args := make([]any, 0, 2+2*len(windows))
	args = append(args, member, len(windows))
	for _, w := range windows {
		args = append(args, w.N, max(1, w.Per.Milliseconds()))
	}
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = rateScript.Run(ctx, s.rdb, []string{key}, args...).Slice()
		return err
	})
	if err != nil {
		return false, 0, fmt.Errorf("store: rate limit: %w", err)
	}
	if toInt(res[0]) == 1 {
		return true, 0, nil
	}
	return false, time.Duration(toInt(res[1])) * time.Millisecond, nil
}

var (
	//go:embed lua/once.lua
	onceSrc    string
	onceScript = redis.NewScript(onceSrc)
)

// ClaimPeriod claims the current period of once-per-period guard key for
// run: "" when run holds it, else the run that does and how long until the
// period ends.
func (s *Store) ClaimPeriod(ctx context.Context, key, run string, period time.Duration) (string, time.Duration, error) {
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = onceScript.Run(ctx, s.rdb, []string{key}, run, max(1, period.Milliseconds())).Slice()
		return err
	})
	if err != nil {
		return "", 0, fmt.Errorf("store: once per period: %w", err)
	}
	if toInt(res[0]) == 1 {
		return "", 0, nil
	}
	return toStr(res[1]), time.Duration(toInt(res[2])) * time.Millisecond, nil
}

var (
	//go:embed lua/ordered.lua
	orderedSrc    string
	orderedScript = redis.NewScript(orderedSrc)
)

// AcquireOrdered is AcquireSlot for a limit whose waiters get in in order
// of place (their runs' creation time, ms): waiter keeps its place in
// key+":q" by trying again within a lease.
func (s *Store) AcquireOrdered(ctx context.Context, key, holder, waiter string, place int64, n int, lease time.Duration) (SlotGrant, error) {
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = orderedScript.Run(ctx, s.rdb, []string{key, key + ":q", key + ":qs"},
			holder, n, max(1, lease.Milliseconds()), waiter, place).Slice()
		return err
	})
	if err != nil {
		return SlotGrant{}, fmt.Errorf("store: ordered limit: %w", err)
	}
	g := SlotGrant{Held: toInt(res[0]) == 1, Holders: int(toInt(res[1]))}
	if !g.Held && len(res) > 2 {
		g.Wait = time.Duration(toInt(res[2])) * time.Millisecond
	}
	return g, nil
}

var (
	//go:embed lua/fair.lua
	fairSrc    string
	fairScript = redis.NewScript(fairSrc)
)

// fairWindow is how long a waiter refused a fair-shared slot counts as
// waiting without trying again: longer than a waiter's retry interval
// (in-process 200 ms at most; a snoozed task's return, when the queue is
// short).
const fairWindow = 2 * time.Second

func fairKeys(key string) []string {
	return []string{key, key + ":hk", key + ":n", key + ":w", key + ":wk", key + ":wn"}
}

func (s *Store) fair(ctx context.Context, key string, args ...any) ([]any, error) {
	var res []any
	err := rideOut(ctx, func() (err error) {
		res, err = fairScript.Run(ctx, s.rdb, fairKeys(key), args...).Slice()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("store: fair limit %s: %w", args[0], err)
	}
	return res, nil
}

// AcquireFair takes one of the n slots of fair-shared semaphore key for
// holder on behalf of tenant (the limit's key): a tenant below its share
// (n among the tenants holding or waiting) gets a free slot, one above it
// only while no waiting tenant lacks its share (fair.lua).
func (s *Store) AcquireFair(ctx context.Context, key, holder, tenant, waiter string, n int, lease time.Duration) (SlotGrant, error) {
	res, err := s.fair(ctx, key, "acquire", holder, tenant, n, max(1, lease.Milliseconds()), fairWindow.Milliseconds(), waiter)
	if err != nil {
		return SlotGrant{}, err
	}
	g := SlotGrant{Held: toInt(res[0]) == 1, Holders: int(toInt(res[1]))}
	if !g.Held && len(res) > 2 {
		g.Wait = time.Duration(toInt(res[2])) * time.Millisecond
	}
	return g, nil
}

// RenewFair is RenewSlot for a fair-shared semaphore.
func (s *Store) RenewFair(ctx context.Context, key, holder string, lease time.Duration) (bool, error) {
	res, err := s.fair(ctx, key, "renew", holder, max(1, lease.Milliseconds()))
	if err != nil {
		return false, err
	}
	return toInt(res[0]) == 1, nil
}

// ReleaseFair is ReleaseSlot for a fair-shared semaphore.
func (s *Store) ReleaseFair(ctx context.Context, key, holder string) error {
	_, err := s.fair(ctx, key, "release", holder)
	return err
}

// FairCounts reads how many slots each tenant of fair-shared semaphore key
// holds (leases that ended and were not yet reclaimed included).
func (s *Store) FairCounts(ctx context.Context, key string) (map[string]int, error) {
	h, err := s.rdb.HGetAll(ctx, key+":n").Result()
	if err != nil {
		return nil, fmt.Errorf("store: read fair limit counts: %w", err)
	}
	out := make(map[string]int, len(h))
	for k, v := range h {
		n, _ := strconv.Atoi(v)
		out[k] = n
	}
	return out, nil
}

var (
	//go:embed lua/place.lua
	placeSrc    string
	placeScript = redis.NewScript(placeSrc)
)

// PlaceOrdered takes waiter's place in ordered semaphore key's queue
// (key+":q", scored by place; key+":qs", last seen) without trying for a
// slot: a run's place, taken at enqueue (place.lua). An existing place is
// kept.
func (s *Store) PlaceOrdered(ctx context.Context, key, waiter string, place int64, lease time.Duration) error {
	keep := 4 * max(lease, time.Millisecond) // as ordered.lua keeps the queue
	err := rideOut(ctx, func() error {
		return placeScript.Run(ctx, s.rdb, []string{key + ":q", key + ":qs"}, waiter, place, keep.Milliseconds()).Err()
	})
	if err != nil {
		return fmt.Errorf("store: ordered place: %w", err)
	}
	return nil
}
