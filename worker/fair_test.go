package worker_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

type tenantItem struct {
	Tenant string `json:"tenant"`
	N      int    `json:"n"`
}

// tenantMap is a fan-out map whose element step takes the fair-shared
// limit "tenants" (10 slots in all, keyed by the item's tenant) and works
// 10 ms; counts records each tenant's attempts in Run now.
func tenantMap(counts *tenantCounts) *reactor.Definition {
	element := reactor.MustDefine("tenant-element",
		reactor.Input[tenantItem]("item", reactor.Required()),
		reactor.Step("call", reactor.StepConfig[tenantItem, int]{
			Args: reactor.Bindings{"tenant": reactor.FromInput("item", "tenant"), "n": reactor.FromInput("item", "n")},
			Limits: []reactor.Limit{{Name: "tenants", Concurrency: 10, Fair: true,
				Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "tenant") }}},
			Run: func(ctx context.Context, in tenantItem) (int, error) {
				counts.enter(in.Tenant)
				defer counts.leave(in.Tenant)
				time.Sleep(10 * time.Millisecond)
				return in.N, nil
			},
		}),
	)
	return reactor.MustDefine("tenant-map",
		reactor.Input[[]tenantItem]("items"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 20}),
	)
}

// tenantCounts counts each tenant's attempts in Run, the most at once per
// tenant and in all.
type tenantCounts struct {
	mu              sync.Mutex
	now, most       map[string]int
	total, mostSeen int
	order           []string // the tenant of each attempt, in order of entry
}

func (c *tenantCounts) enter(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now[tenant]++
	c.most[tenant] = max(c.most[tenant], c.now[tenant])
	c.total++
	c.mostSeen = max(c.mostSeen, c.total)
	c.order = append(c.order, tenant)
}

func (c *tenantCounts) leave(tenant string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now[tenant]--
	c.total--
}

func items(tenant string, n int) []tenantItem {
	out := make([]tenantItem, n)
	for i := range out {
		out[i] = tenantItem{Tenant: tenant, N: i}
	}
	return out
}

// Who gets a freed slot of a fair-shared limit: the big tenant holds all
// 10 slots and has 10 more attempts waiting; the small tenant's 5 arrive
// and wait. Each of the next 5 slots freed goes to the small tenant (below
// its share of 5, while the big one is above it), whatever the big
// tenant's waiters do; the 6th, with the small tenant at its share and
// the big one below, goes to the big tenant.
func TestLimitFairHandsFreedSlotsToTheTenantBelowItsShare(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	counts := &tenantCounts{now: map[string]int{}, most: map[string]int{}}
	gates := map[string]chan struct{}{}
	for i := range 20 {
		gates["big-"+strconv.Itoa(i)] = make(chan struct{})
	}
	for i := range 5 {
		gates["small-"+strconv.Itoa(i)] = make(chan struct{})
	}
	def := reactor.MustDefine("tenant-call",
		reactor.Input[string]("tenant", reactor.Required()),
		reactor.Input[string]("gate", reactor.Required()),
		reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"tenant": reactor.FromInput("tenant"), "gate": reactor.FromInput("gate")},
			Limits: []reactor.Limit{{Name: "tenants", Concurrency: 10, Fair: true,
				Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "tenant") }}},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				tenant, _ := reactor.Arg[string](a, "tenant")
				gate, _ := reactor.Arg[string](a, "gate")
				counts.enter(gate)
				defer counts.leave(gate)
				select {
				case <-gates[gate]:
				case <-ctx.Done():
				}
				return tenant, nil
			},
		}),
	)
	e := f.engine("in-process")
	require.NoError(t, e.Register(def))
	fairKey := f.prefix + ":{fair:tenants}"
	var wg sync.WaitGroup
	start := func(tenant string, from, to int) {
		for i := from; i < to; i++ {
			gate := tenant + "-" + strconv.Itoa(i)
			wg.Go(func() {
				// In-process, a full limit returns a *LimitError after
				// the engine's wait; the run waits at its checkpoint and
				// Resume tries again.
				res, err := e.Run(ctx, def, map[string]any{"tenant": tenant, "gate": gate}, reactor.WithRunID(gate))
				for errors.Is(err, reactor.ErrLimited) {
					res, err = e.Resume(ctx, gate)
				}
				if assert.NoError(t, err, gate) {
					assert.Equal(t, reactor.StatusCompleted, res.Status, gate)
				}
			})
		}
	}
	entered := func() []string {
		counts.mu.Lock()
		defer counts.mu.Unlock()
		return slices.Clone(counts.order)
	}
	waiting := func(n int64) func() bool {
		return func() bool { return f.rdb.ZCard(ctx, fairKey+":w").Val() == n }
	}
	start("big", 0, 10)
	require.Eventually(t, func() bool { return len(entered()) == 10 }, 10*time.Second, time.Millisecond)
	start("big", 10, 20)
	require.Eventually(t, waiting(10), 10*time.Second, time.Millisecond, "the big tenant's 10 more wait")
	start("small", 0, 5)
	require.Eventually(t, waiting(15), 10*time.Second, time.Millisecond, "the small tenant's 5 wait too")

	freeOne := func(i int) string {
		close(gates["big-"+strconv.Itoa(i)])
		require.Eventually(t, func() bool { return len(entered()) == 11+i }, 10*time.Second, time.Millisecond, "slot %d taken", i)
		return entered()[10+i]
	}
	var got []string
	for i := range 5 {
		got = append(got, freeOne(i))
	}
	for _, g := range got {
		assert.Contains(t, g, "small-", "the 5 slots freed went to the small tenant, below its share: %v", got)
	}
	assert.Contains(t, freeOne(5), "big-", "the 6th to the big tenant, below its share now")
	for _, g := range gates {
		select {
		case <-g:
		default:
			close(g)
		}
	}
	wg.Wait()
	left, err := f.rdb.HLen(ctx, fairKey+":n").Result()
	require.NoError(t, err)
	assert.Zero(t, left, "every slot given back")
}

// A fan-out map's elements take a fair-shared limit per element task: two
// tenants' maps on three worker processes of 10 slots each, one of 300
// elements and one of 10 started once the first fills the limit; both
// complete, and the limit is never exceeded, in Run and in Redis.
func TestLimitFairAcrossFanOutMaps(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	counts := &tenantCounts{now: map[string]int{}, most: map[string]int{}}
	def := tenantMap(counts)
	engines := f.processes(3, 10, def)
	fairKey := f.prefix + ":{fair:tenants}"
	stop := make(chan struct{})
	most := sampleMax(t, f.rdb, fairKey, stop)

	big, err := engines[0].Enqueue(ctx, def, map[string]any{"items": items("big", 300)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, err := f.rdb.HGet(ctx, fairKey+":n", "big").Int()
		return err == nil && n == 10
	}, 10*time.Second, time.Millisecond, "the big tenant fills the limit")
	small, err := engines[1].Enqueue(ctx, def, map[string]any{"items": items("small", 10)})
	require.NoError(t, err)
	awaitCompleted(ctx, t, engines[1], small.RunID)
	awaitCompleted(ctx, t, engines[0], big.RunID)
	close(stop)

	counts.mu.Lock()
	defer counts.mu.Unlock()
	assert.LessOrEqual(t, counts.mostSeen, 10, "never more than 10 attempts at once")
	assert.LessOrEqual(t, <-most, int64(10), "never more than 10 holders in Redis")
	left, err := f.rdb.HLen(ctx, fairKey+":n").Result()
	require.NoError(t, err)
	assert.Zero(t, left, "every slot given back")
}
