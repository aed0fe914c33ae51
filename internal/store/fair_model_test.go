package store_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fairModel is the reference a fair-shared semaphore is checked against:
// who holds a slot for which tenant, and which attempts (waiters) were
// refused and have not got in since (leases and the waiting window are
// long enough that nothing expires within a history).
type fairModel struct {
	n       int
	holders map[string]string // holder -> tenant
	waiters map[string]string // waiter -> tenant
}

func (m *fairModel) counts() map[string]int {
	c := map[string]int{}
	for _, tn := range m.holders {
		c[tn]++
	}
	return c
}

// acquire is the rule: each tenant's share is n among the tenants holding
// or waiting (the asking one included), at least 1. A free slot goes to a
// tenant below its share, or to any while the free slots outnumber what
// the other waiting tenants lack of their shares, as far as they have
// waiters to fill it.
func (m *fairModel) acquire(holder, tenant, waiter string) bool {
	if _, ok := m.holders[holder]; ok {
		return true
	}
	c := m.counts()
	waits := map[string]int{}
	for _, tn := range m.waiters {
		waits[tn]++
	}
	active := map[string]bool{tenant: true}
	for tn := range c {
		active[tn] = true
	}
	for tn := range waits {
		active[tn] = true
	}
	share := max(1, m.n/len(active))
	free := m.n - len(m.holders)
	grant := false
	if free > 0 {
		if c[tenant] < share {
			grant = true
		} else {
			lacking := 0
			for tn, w := range waits {
				if tn != tenant {
					lacking += min(w, max(0, share-c[tn]))
				}
			}
			grant = free > lacking
		}
	}
	if grant {
		m.holders[holder] = tenant
		delete(m.waiters, waiter)
	} else {
		m.waiters[waiter] = tenant
	}
	return grant
}

// TestFairSlotsModel drives a fair-shared semaphore through random
// histories of acquires (some by a holder that holds already) and
// releases by three tenants of unequal appetite, and checks every answer
// and the per-tenant counts against fairModel; then that the limit is
// never exceeded and that a tenant asking while another waits below its
// share is refused. GOREACTOR_MODEL_SEED replays a seed.
func TestFairSlotsModel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("GOREACTOR_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	histories := 40
	if testing.Short() {
		histories = 10
	}
	tenants := []string{"big", "mid", "small"}
	for h := range histories {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		t.Run(fmt.Sprintf("history-%d", h), func(t *testing.T) {
			key := f.k.Fair(fmt.Sprintf("model-%d", h))
			m := &fairModel{n: 1 + rng.IntN(6), holders: map[string]string{}, waiters: map[string]string{}}
			next := 0
			for i := range 120 {
				fail := fmt.Sprintf("seed %d history %d step %d (model n=%d holders %v waiters %v)", seed, h, i, m.n, m.holders, m.waiters)
				op := rng.IntN(10)
				switch {
				case op < 4 && len(m.holders) > 0:
					hs := slices.Sorted(maps.Keys(m.holders))
					holder := hs[rng.IntN(len(hs))]
					require.NoError(t, f.st.ReleaseFair(f.ctx, key, holder), fail)
					delete(m.holders, holder)
				case op == 9 && len(m.holders) > 0: // a holder asking again renews
					hs := slices.Sorted(maps.Keys(m.holders))
					holder := hs[rng.IntN(len(hs))]
					g, err := f.st.AcquireFair(f.ctx, key, holder, m.holders[holder], "again", m.n, time.Minute)
					require.NoError(t, err, fail)
					require.True(t, g.Held, "%s: %s asks again", fail, holder)
				default:
					// A waiting attempt tries again, or a new one arrives
					// (big most often, small least).
					next++
					holder := fmt.Sprintf("h%d", next)
					waiter, tenant := fmt.Sprintf("w%d", next), tenants[min(2, rng.IntN(6)/2)]
					if ws := slices.Sorted(maps.Keys(m.waiters)); len(ws) > 0 && rng.IntN(2) == 0 {
						waiter = ws[rng.IntN(len(ws))]
						tenant = m.waiters[waiter]
					}
					want := m.acquire(holder, tenant, waiter)
					g, err := f.st.AcquireFair(f.ctx, key, holder, tenant, waiter, m.n, time.Minute)
					require.NoError(t, err, fail)
					require.Equal(t, want, g.Held, "%s: acquire %s (%s) for %s", fail, holder, waiter, tenant)
					require.Equal(t, len(m.holders), g.Holders, fail)
				}
				got, err := f.st.FairCounts(f.ctx, key)
				require.NoError(t, err)
				require.Equal(t, m.counts(), got, fail)
				require.LessOrEqual(t, len(m.holders), m.n, fail)
				waits := map[string]string{}
				for _, tn := range m.waiters {
					n, _ := strconv.Atoi(waits[tn])
					waits[tn] = strconv.Itoa(n + 1)
				}
				require.Equal(t, waits, f.rdb.HGetAll(f.ctx, key+":wn").Val(), "%s: waiters per tenant", fail)
			}
		})
	}
}

// A fair-shared slot whose holder stopped renewing it is reclaimed when its
// lease ends, and its tenant's count with it; a release by a holder that
// lost its slot changes nothing.
func TestFairSlotLeaseEnds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key := f.k.Fair("lease")
	g, err := f.st.AcquireFair(f.ctx, key, "dead", "a", "a|s", 1, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, g.Held)
	g, err = f.st.AcquireFair(f.ctx, key, "next", "b", "b|s", 1, time.Minute)
	require.NoError(t, err)
	require.False(t, g.Held, "full while the lease lasts")
	require.Eventually(t, func() bool {
		g, err := f.st.AcquireFair(f.ctx, key, "next", "b", "b|s", 1, time.Minute)
		require.NoError(t, err)
		return g.Held
	}, 5*time.Second, 10*time.Millisecond)
	got, err := f.st.FairCounts(f.ctx, key)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"b": 1}, got)
	require.NoError(t, f.st.ReleaseFair(f.ctx, key, "dead"))
	got, err = f.st.FairCounts(f.ctx, key)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"b": 1}, got, "the lost holder's release is a no-op")
	ok, err := f.st.RenewFair(f.ctx, key, "dead", time.Minute)
	require.NoError(t, err)
	require.False(t, ok)
	for _, k := range []string{key, key + ":hk", key + ":n"} {
		ttl := f.rdb.PTTL(f.ctx, k).Val()
		require.Greater(t, ttl, time.Duration(0), "%s expires", k)
	}
}

// A parked holder (a run's own limit while the run waits) has no lease: it
// outlives any lease, the semaphore keeps no expiry while it is in it
// (another holder's acquire or renewal does not bring one back), and its
// release restores the expiry of the holders left.
func TestParkedSlot(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key := f.k.Slots("park", "k")
	g, err := f.st.AcquireSlot(f.ctx, key, "run|(run)|x.run", "run|(run)", 2, 50*time.Millisecond)
	require.NoError(t, err)
	require.True(t, g.Held)
	ok, err := f.st.ParkSlot(f.ctx, key, "run|(run)|x.run")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, time.Duration(-1), f.rdb.PTTL(f.ctx, key).Val())
	g, err = f.st.AcquireSlot(f.ctx, key, "other", "o|s", 2, time.Minute)
	require.NoError(t, err)
	require.True(t, g.Held)
	require.Equal(t, time.Duration(-1), f.rdb.PTTL(f.ctx, key).Val(), "still no expiry")
	g, err = f.st.AcquireSlot(f.ctx, key, "third", "t|s", 2, time.Minute)
	require.NoError(t, err)
	require.False(t, g.Held, "the parked holder still counts")
	require.InDelta(t, time.Minute, g.Wait, float64(5*time.Second), "the earliest lease end, the other holder's")
	require.NoError(t, f.st.ReleaseSlot(f.ctx, key, "run|(run)|x.run"))
	ttl := f.rdb.PTTL(f.ctx, key).Val()
	require.Greater(t, ttl, 50*time.Second, "the expiry of the holder left")
	ok, err = f.st.ParkSlot(f.ctx, key, "gone")
	require.NoError(t, err)
	require.False(t, ok, "parking a slot one does not hold")
}
