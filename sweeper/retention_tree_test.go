package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/reactortest"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

// retentionDefs is a small saga family: an element with an undo, an owner
// with a fan-out map, one with an inline map, each failing after its map on
// request (so it rolls back), and a gate that holds one element of a run
// while the test looks at it live.
func retentionDefs(gate func(ctx context.Context, item int) error) (fan, inline *reactor.Definition) {
	elem := reactor.MustDefine("ret-elem",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[struct {
			Item int `json:"item"`
		}, int]{
			Args: reactor.Bindings{"item": reactor.FromInput("item")},
			Run: func(ctx context.Context, in struct {
				Item int `json:"item"`
			}) (int, error) {
				return in.Item, gate(ctx, in.Item)
			},
			Undo: func(context.Context, struct {
				Item int `json:"item"`
			}, int) error {
				return nil
			},
		}))
	owner := func(name string, fanOut bool) *reactor.Definition {
		return reactor.MustDefine(name,
			reactor.Input[[]int]("items", reactor.Required()),
			reactor.Input[bool]("fail", reactor.Default(false)),
			mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: fanOut, BatchSize: 4}),
			reactor.Step("after", reactor.StepConfig[struct {
				Fail bool `json:"fail"`
			}, string]{
				Args:  reactor.Bindings{"fail": reactor.FromInput("fail")},
				After: []string{"each"},
				Run: func(_ context.Context, in struct {
					Fail bool `json:"fail"`
				}) (string, error) {
					if in.Fail {
						return "", reactor.Permanent(errors.New("fail after the map"))
					}
					return "ok", nil
				},
			}))
	}
	return owner("ret-fan", true), owner("ret-inline", false)
}

// runKeys lists the keys under prefix that belong to run id's tree (its own
// keys, its maps' and their elements'), excluding the global indexes.
func runKeys(t *testing.T, rdb redis.UniversalClient, prefix, id string) []string {
	t.Helper()
	var out []string
	keys, err := redistest.ScanKeys(context.Background(), rdb, prefix+":*") // every master of a cluster
	require.NoError(t, err)
	for _, k := range keys {
		if strings.Contains(k, ":idx:") {
			continue
		}
		if strings.Contains(k, "{run:"+id+"}") || strings.Contains(k, "{map:"+id+"~") || strings.Contains(k, "{elem:"+id+"~") {
			out = append(out, k)
		}
	}
	return out
}

// TestHardeningRetentionExpiresTheWholeTree: 200 runs (fan-out and inline
// maps, a third of them rolled back) under a 6 s retention. While a run is
// live nothing of its tree has an expiry; after the retention not one key of
// any of them remains, and a reused id starts a fresh run instead of
// adopting stale map results.
func TestHardeningRetentionExpiresTheWholeTree(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a retention")
	}
	t.Parallel()
	// Long enough for the 200 runs to finish on a loaded machine before the
	// first of them expires.
	const retention = 6 * time.Second
	hold := make(chan struct{})
	var holdOnce sync.Once
	held := make(chan struct{})
	gate := func(ctx context.Context, item int) error {
		if item == 999 {
			holdOnce.Do(func() { close(held) })
			select {
			case <-hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	fan, inline := retentionDefs(gate)
	h := reactortest.NewWithOptions(t, reactortest.Options{
		Engine:  func(c *reactor.Config) { c.Retention = retention },
		Worker:  func(c *worker.Config) { c.Concurrency = 20 },
		Timeout: time.Minute,
	}, fan, inline)
	ctx := context.Background()

	// One run held live mid-map: nothing of its tree may carry an expiry.
	_, err := h.Engine.Enqueue(ctx, fan, map[string]any{"items": []int{1, 2, 999, 4, 5}}, reactor.WithRunID("live"))
	require.NoError(t, err)
	<-held

	ids := make([]string, 0, 200)
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for n := range 200 {
		def := fan
		if n%2 == 1 {
			def = inline
		}
		id := fmt.Sprintf("ret-%03d", n)
		ids = append(ids, id)
		items := []int{n, n + 1, n + 2, n + 3, n + 4, n + 5}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := h.Run(ctx, def, map[string]any{"items": items, "fail": n%3 == 0}, reactor.WithRunID(id))
			if err == nil && res.Status != map[bool]reactor.Status{true: reactor.StatusFailed, false: reactor.StatusCompleted}[n%3 == 0] {
				err = fmt.Errorf("run %s ended %s", id, res.Status)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	live := runKeys(t, h.Redis, h.Prefix, "live")
	require.NotEmpty(t, live)
	for _, k := range live {
		if strings.HasSuffix(k, ":lock") {
			continue // a held lock expires by design; its holder extends it
		}
		ttl, err := h.Redis.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Equal(t, time.Duration(-1), ttl, "key %s of a live run has an expiry", k)
	}
	// The finished runs' trees all carry the retention (those finished
	// longest ago may be gone already).
	checked := 0
	for _, id := range ids {
		for _, k := range runKeys(t, h.Redis, h.Prefix, id) {
			ttl, err := h.Redis.PTTL(ctx, k).Result()
			require.NoError(t, err)
			if ttl == -2 {
				continue // expired between the scan and now
			}
			require.NotEqual(t, time.Duration(-1), ttl, "key %s of finished run %s never expires", k, id)
			require.LessOrEqual(t, ttl, retention)
			checked++
		}
	}
	require.Greater(t, checked, 100, "too few finished keys left to check; the runs took longer than the retention")

	// After the retention nothing of any finished run is left (Redis
	// deletes expired keys lazily and in samples: give a loaded machine
	// time, and name what is left with its expiry if it never goes).
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for _, id := range ids {
			left := runKeys(t, h.Redis, h.Prefix, id)
			ttls := make([]string, 0, len(left))
			for _, k := range left {
				ttl, _ := h.Redis.PTTL(ctx, k).Result()
				ttls = append(ttls, fmt.Sprintf("%s (pttl %v)", k, ttl))
			}
			require.Empty(c, ttls, "run %s", id)
		}
	}, 45*time.Second, 100*time.Millisecond)

	// The listing indexes hold none of their ids once the trim has passed
	// (a page per index per pass; the clock margin is the test's, the
	// machine has one clock).
	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: h.Engine, ClockMargin: time.Millisecond, Logger: discard})
	require.NoError(t, err)
	indexes := []string{h.Prefix + ":idx:runs", h.Prefix + ":idx:active", h.Prefix + ":idx:maps"}
	for _, s := range reactor.Statuses() {
		indexes = append(indexes, h.Prefix+":idx:status:"+string(s))
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		_, err := trim.Trim(ctx)
		require.NoError(c, err)
		for _, ix := range indexes {
			members, err := h.Redis.ZRange(ctx, ix, 0, -1).Result()
			require.NoError(c, err)
			for _, m := range members {
				require.False(c, strings.HasPrefix(m, "ret-"), "index %s still holds %s", ix, m)
			}
		}
	}, 15*time.Second, 50*time.Millisecond)

	// A reused id after its retention is a fresh run, with other inputs too.
	res, err := h.Run(ctx, fan, map[string]any{"items": []int{7, 8}}, reactor.WithRunID(ids[0]))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	run := h.Get(t, ids[0])
	require.Equal(t, []string{"each", "after"}, run.Completed)

	close(hold)
	res, err = h.Wait(ctx, "live")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
}

// TestHardeningSweeperFinishesAnInterruptedRetention: a run that died between
// its terminal write and the retention walk of its tree is left finished in
// the active index with maps and element runs that never expire. The run
// sweeper walks the tree (with what is left of the run's retention) before
// dropping the entry.
func TestHardeningSweeperFinishesAnInterruptedRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	_, inline := retentionDefs(func(context.Context, int) error { return nil })
	res, err := e.engine.Run(ctx, inline, map[string]any{"items": []int{1, 2, 3}}, reactor.WithRunID("walked"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)

	// The crash: the tree never got its retention and the run is still
	// indexed as active, as it was before its terminal write.
	keys := runKeys(t, e.rdb, e.prefix, "walked")
	var tree []string
	for _, k := range keys {
		if !strings.Contains(k, "{run:walked}:ctx") {
			require.NoError(t, e.rdb.Persist(ctx, k).Err())
			tree = append(tree, k)
		}
	}
	require.GreaterOrEqual(t, len(tree), 3+1+1, "element runs, map keys and the tree set")
	audits := 0
	for _, k := range tree {
		if strings.HasSuffix(k, ":audit") {
			audits++
		}
	}
	require.Equal(t, 1+1, audits, "the run's audit stream and its map's (its elements' entries) are part of the tree")
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: 1, Member: "walked"}).Err())

	// A client retrying the start (idempotent: the finished result) must not
	// take the entry away from the sweeper.
	again, err := e.engine.Run(ctx, inline, map[string]any{"items": []int{1, 2, 3}}, reactor.WithRunID("walked"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, again.Status)
	_, err = e.rdb.ZScore(ctx, e.activeKey(), "walked").Result()
	require.NoError(t, err, "a restart of a finished run keeps an active entry it did not add")
	e.waitPast(time.Now()) // the restart touched the entry: stale again after StaleAfter

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Dropped)
	runTTL, err := e.rdb.PTTL(ctx, e.prefix+":{run:walked}:ctx").Result()
	require.NoError(t, err)
	for _, k := range tree {
		ttl, err := e.rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		require.Greater(t, ttl, time.Duration(0), "key %s of the finished run never expires", k)
		require.InDelta(t, runTTL.Seconds(), ttl.Seconds(), 60, "key %s expires with its run", k)
	}
	_, err = e.rdb.ZScore(ctx, e.activeKey(), "walked").Result()
	require.ErrorIs(t, err, redis.Nil)
}

// TestHardeningTrimKeepsAReusedID: an id reused after its retention gets its
// idx:runs entry kept even when the trim checked the old run (gone) just
// before the new one started: idx:runs is written with NX, so the score
// cannot tell the two apart, and the trim looks again after removing.
func TestHardeningTrimKeepsAReusedID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	runs := e.prefix + ":idx:runs"
	// The old run: gone, its entry left behind long ago.
	require.NoError(t, e.rdb.ZAdd(ctx, runs, redis.Z{Score: 1000, Member: "reused"}).Err())
	def := reactor.MustDefine("reused", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "a", nil },
	}))
	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: e.engine, Retention: time.Second, ClockMargin: time.Millisecond, Logger: discard})
	require.NoError(t, err)
	sweeper.SetTrimBeforeRemove(trim, func(key, id string) {
		if key == runs && id == "reused" {
			// The new run starts in the window.
			_, err := e.engine.Run(ctx, def, nil, reactor.WithRunID("reused"))
			require.NoError(t, err)
		}
	})
	_, err = trim.Trim(ctx)
	require.NoError(t, err)
	_, err = e.rdb.ZScore(ctx, runs, "reused").Result()
	require.NoError(t, err, "the new run must stay listed")
}

// TestHardeningUndoTakesTheExpiryOffTheTree: an Undo makes a finished run
// live again; while it rolls back, nothing of its tree may expire (its map's
// keys and element runs carried the retention), and once it is finished
// again the whole tree carries the retention again.
func TestHardeningUndoTakesTheExpiryOffTheTree(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	undoing, finish := make(chan struct{}, 10), make(chan struct{})
	elem := reactor.MustDefine("undo-tree-elem",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("hold", reactor.StepConfig[reactor.Args, int]{
			Run: func(context.Context, reactor.Args) (int, error) { return 1, nil },
			Undo: func(context.Context, reactor.Args, int) error {
				undoing <- struct{}{}
				<-finish
				return nil
			},
		}))
	def := reactor.MustDefine("undo-tree",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items")}))
	res, err := e.engine.Run(ctx, def, map[string]any{"items": []int{1, 2}}, reactor.WithRunID("undo-tree"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	ttls := func() map[string]time.Duration {
		out := map[string]time.Duration{}
		for _, k := range runKeys(t, e.rdb, e.prefix, "undo-tree") {
			if strings.HasSuffix(k, ":lock") {
				continue
			}
			d, err := e.rdb.PTTL(ctx, k).Result()
			require.NoError(t, err)
			out[k] = d
		}
		return out
	}
	for k, d := range ttls() {
		require.Greater(t, d, time.Duration(0), "finished: %s", k)
	}

	done := make(chan error, 1)
	go func() { _, err := e.engine.Undo(ctx, "undo-tree"); done <- err }()
	<-undoing
	for k, d := range ttls() {
		require.Equal(t, time.Duration(-1), d, "rolling back: %s must not expire", k)
	}
	close(finish)
	require.NoError(t, <-done)
	for k, d := range ttls() {
		require.Greater(t, d, time.Duration(0), "finished again: %s", k)
	}
}

// TestHardeningSweeperExpiresTheTreeOfAnExpiredRun: a run whose process died
// before its tree got the retention, and whose own state expired before the
// sweeper came by, leaves its maps and element runs behind: the sweeper lets
// them go with it, so a reused id never finds a stale map.
func TestHardeningSweeperExpiresTheTreeOfAnExpiredRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	_, inline := retentionDefs(func(context.Context, int) error { return nil })
	_, err := e.engine.Run(ctx, inline, map[string]any{"items": []int{1, 2}}, reactor.WithRunID("expired"))
	require.NoError(t, err)
	for _, k := range runKeys(t, e.rdb, e.prefix, "expired") {
		require.NoError(t, e.rdb.Persist(ctx, k).Err())
	}
	require.NoError(t, e.rdb.Del(ctx, e.prefix+":{run:expired}:ctx").Err()) // the run's own retention ran out
	require.NoError(t, e.rdb.ZAdd(ctx, e.activeKey(), redis.Z{Score: 1, Member: "expired"}).Err())

	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Dropped)
	require.Eventually(t, func() bool { return len(runKeys(t, e.rdb, e.prefix, "expired")) == 0 },
		5*time.Second, 10*time.Millisecond, "the tree of an expired run must go with it")
}

// TestHardeningTrimDropsAStaleStatusEntry: an id reused after its retention
// leaves the old run's status entry behind (the old run completed, the new
// one failed): the trim removes the entry of the status the stored run is not
// in, and keeps the one it is in.
func TestHardeningTrimDropsAStaleStatusEntry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	completed, failed := e.prefix+":idx:status:completed", e.prefix+":idx:status:failed"
	require.NoError(t, e.rdb.ZAdd(ctx, completed, redis.Z{Score: 1000, Member: "again"}).Err())
	def := reactor.MustDefine("again", reactor.Step("a", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "", reactor.Permanent(errors.New("no")) },
	}))
	res, err := e.engine.Run(ctx, def, nil, reactor.WithRunID("again"))
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	trim, err := sweeper.NewIndexTrimmer(sweeper.TrimConfig{Engine: e.engine, Retention: time.Second, ClockMargin: time.Millisecond, Logger: discard})
	require.NoError(t, err)
	rep, err := trim.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rep.Trimmed)
	_, err = e.rdb.ZScore(ctx, completed, "again").Result()
	require.ErrorIs(t, err, redis.Nil, "the old run's status entry goes")
	_, err = e.rdb.ZScore(ctx, failed, "again").Result()
	require.NoError(t, err, "the stored run's status entry stays")
}
