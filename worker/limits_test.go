package worker_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// inFlight counts the attempts of a step running now, and the most at once.
type inFlight struct {
	now, most atomic.Int32
}

func (c *inFlight) enter() {
	n := c.now.Add(1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *inFlight) leave() { c.now.Add(-1) }

// processes starts n engines with def, each with a worker of conc slots, as
// n worker processes of one deployment would be.
func (f *fixture) processes(n, conc int, def *reactor.Definition) []*reactor.Engine {
	f.t.Helper()
	var engines []*reactor.Engine
	for i := range n {
		e := f.engine(fmt.Sprintf("w%d", i))
		require.NoError(f.t, e.Register(def))
		f.startWorker(e, func(c *worker.Config) { c.Concurrency = conc })
		engines = append(engines, e)
	}
	return engines
}

// awaitCompleted waits for each run and requires it completed.
func awaitCompleted(ctx context.Context, t *testing.T, e *reactor.Engine, ids ...string) {
	t.Helper()
	for _, id := range ids {
		final, err := e.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	}
}

// sampleMax reads the cardinality of key every millisecond until stop is
// closed and returns the largest it saw: the limit's ground truth in Redis.
func sampleMax(t *testing.T, rdb redis.UniversalClient, key string, stop <-chan struct{}) <-chan int64 {
	t.Helper()
	out := make(chan int64, 1)
	go func() {
		var most int64
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				out <- most
				return
			case <-tick.C:
				if n, err := rdb.ZCard(context.Background(), key).Result(); err == nil {
					most = max(most, n)
				}
			}
		}
	}()
	return out
}

// Three worker processes (engines of their own) run 24 runs whose step is
// limited to 3 at a time per partner: never more than 3 run at once, in
// the step's own count and in Redis.
func TestLimitConcurrencyAcrossWorkers(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var c inFlight
	def := reactor.MustDefine("call-partner",
		reactor.Input[string]("partner", reactor.Required()),
		reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"partner": reactor.FromInput("partner")},
			Limits: []reactor.Limit{{Name: "partner-api", Concurrency: 3,
				Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "partner") }}},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				c.enter()
				defer c.leave()
				time.Sleep(20 * time.Millisecond) // the partner's latency
				return "ok", nil
			},
		}),
	)
	engines := f.processes(3, 4, def)
	stop := make(chan struct{})
	most := sampleMax(t, f.rdb, f.prefix+":{lim:partner-api:acme}", stop)
	var ids []string
	for i := range 24 {
		res, err := engines[i%3].Enqueue(ctx, def, map[string]any{"partner": "acme"})
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	awaitCompleted(ctx, t, engines[0], ids...)
	close(stop)
	assert.LessOrEqual(t, c.most.Load(), int32(3), "never more than 3 attempts at once")
	assert.Equal(t, int32(3), c.most.Load(), "the limit was reached (12 slots wanted it)")
	assert.LessOrEqual(t, <-most, int64(3), "never more than 3 holders in Redis")
}

// A rate limit of 5 per 400 ms: no window of 400 ms sees more than 5
// starts, across two worker processes.
func TestLimitRateAcrossWorkers(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var mu sync.Mutex
	var starts []time.Time
	def := reactor.MustDefine("rated",
		reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
			Limits: []reactor.Limit{{Name: "rated-api", Rates: []reactor.Rate{{N: 5, Per: 400 * time.Millisecond}}}},
			Run: func(context.Context, reactor.Args) (string, error) {
				mu.Lock()
				starts = append(starts, time.Now())
				mu.Unlock()
				return "ok", nil
			},
		}),
	)
	engines := f.processes(2, 5, def)
	var ids []string
	for i := range 15 {
		res, err := engines[i%2].Enqueue(ctx, def, nil)
		require.NoError(t, err)
		ids = append(ids, res.RunID)
	}
	awaitCompleted(ctx, t, engines[0], ids...)
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	require.Len(t, starts, 15)
	// A step starts a moment after its admission (at most a few ms here);
	// windows shortened by that much must hold at most 5.
	window := 400*time.Millisecond - 25*time.Millisecond
	for i := range starts {
		j := i
		for j < len(starts) && starts[j].Sub(starts[i]) < window {
			j++
		}
		require.LessOrEqual(t, j-i, 5, "%d starts within %s from start %d", j-i, window, i)
	}
	assert.GreaterOrEqual(t, starts[14].Sub(starts[0]), 2*window, "15 starts at 5 per window span at least two windows")
}

// A holder that stopped renewing (its process died) keeps the lock only
// until its lease ends; then a waiting run takes it.
func TestLimitDeadHolderIsReclaimedByItsLease(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := reactor.MustDefine("locked",
		reactor.Step("call", reactor.StepConfig[reactor.Args, string]{
			Limits: []reactor.Limit{reactor.Lock("ledger", nil)},
			Run:    func(context.Context, reactor.Args) (string, error) { return "ok", nil },
		}),
	)
	// The dead holder: a slot whose lease ends in 1.5 s, that nobody renews.
	key := f.prefix + ":{lim:ledger:}"
	tm, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	until := tm.Add(1500 * time.Millisecond)
	require.NoError(t, f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(until.UnixMilli()), Member: "dead-holder"}).Err())
	require.NoError(t, f.rdb.PExpire(ctx, key, time.Minute).Err())

	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	done, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	assert.False(t, done.Before(until), "the lock was taken only after the dead holder's lease ended")
	assert.Less(t, done.Sub(until), 8*time.Second, "and soon after it (a snooze or two)")
	assert.NotEmpty(t, f.events.steps("w", reactor.EventLimitWaited), "the run waited for the lock")
	assert.NotEmpty(t, f.events.steps("w", reactor.EventLimitRefused), "and its task was snoozed")
}

// In-process, a full limit is a typed error saying what was full; the run
// waits at its checkpoint and Resume goes on once there is room.
func TestLimitInProcessReturnsALimitError(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := reactor.MustDefine("locked-here",
		reactor.Input[string]("account", reactor.Required()),
		reactor.Step("post", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"account": reactor.FromInput("account")},
			Limits: []reactor.Limit{reactor.Lock("account", func(a reactor.Args) (string, error) {
				return reactor.Arg[string](a, "account")
			})},
			Run: func(context.Context, reactor.Args) (string, error) { return "posted", nil },
		}),
	)
	e := f.engine("here", func(c *reactor.Config) { c.Enqueuer = nil })
	require.NoError(t, e.Register(def))
	key := f.prefix + ":{lim:account:a-1}"
	require.NoError(t, f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(time.Now().Add(time.Hour).UnixMilli()), Member: "someone"}).Err())
	require.NoError(t, f.rdb.PExpire(ctx, key, time.Hour).Err())

	_, err := e.Run(ctx, def, map[string]any{"account": "a-1"}, reactor.WithRunID("post-1"))
	var le *reactor.LimitError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, reactor.ErrLimited)
	assert.Equal(t, "account", le.Limit)
	assert.Equal(t, "a-1", le.Key)
	assert.Equal(t, "concurrency", le.Kind)
	assert.Equal(t, "post", le.Step)
	run, err := e.Get(ctx, "post-1")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusRunning, run.Status)
	assert.Equal(t, []string{"post-1|post"}, f.rdb.ZRange(ctx, key+":w", 0, -1).Val(), "the waiter is on record")

	require.NoError(t, f.rdb.ZRem(ctx, key, "someone").Err())
	final, err := e.Resume(ctx, "post-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	assert.Zero(t, f.rdb.Exists(ctx, key).Val()+f.rdb.ZCard(ctx, key).Val(), "the slot was given back")
	assert.Zero(t, f.rdb.ZCard(ctx, key+":w").Val(), "and the waiter left the record when it got the slot")
}

// A fan-out map's elements take their step's limit per element task:
// 40 elements on 12 worker slots run at most 4 at once.
func TestLimitPerFanOutElement(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var c inFlight
	element := reactor.MustDefine("limited-element",
		reactor.Input[int]("item"),
		reactor.Step("call", reactor.StepConfig[reactor.Args, int]{
			Limits: []reactor.Limit{{Name: "elements", Concurrency: 4}},
			Run: func(context.Context, reactor.Args) (int, error) {
				c.enter()
				defer c.leave()
				time.Sleep(10 * time.Millisecond)
				return 1, nil
			},
		}),
	)
	owner := reactor.MustDefine("limited-map",
		reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true}),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(owner))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 12 })
	stop := make(chan struct{})
	most := sampleMax(t, f.rdb, f.prefix+":{lim:elements:}", stop)
	items := make([]int, 40)
	res, err := e.Enqueue(ctx, owner, map[string]any{"items": items})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	close(stop)
	assert.LessOrEqual(t, c.most.Load(), int32(4))
	assert.LessOrEqual(t, <-most, int64(4))
}

func TestLimitDefinitionErrors(t *testing.T) {
	for want, l := range map[string]reactor.Limit{
		"needs a Name":          {Concurrency: 1},
		"limits nothing":        {Name: "x"},
		"both must be positive": {Name: "x", Rates: []reactor.Rate{{N: 0, Per: time.Second}}},
		"contains a brace":      {Name: "a{b}", Concurrency: 1},
	} {
		_, err := reactor.Define("bad", reactor.Step("s", reactor.StepConfig[reactor.Args, int]{
			Limits: []reactor.Limit{l},
			Run:    func(context.Context, reactor.Args) (int, error) { return 0, nil },
		}))
		var de *reactor.DefinitionError
		require.ErrorAs(t, err, &de, want)
		assert.Contains(t, err.Error(), want)
	}
}

// The undo of a limited step takes its limits too: a rollback that finds
// the step's lock held waits for it (its task snoozed), never failing for
// it, and undoes the step once it has the lock.
func TestLimitContendedRollbackWaitsForTheLock(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	gate := make(chan struct{})
	def := reactor.MustDefine("post-then-fail",
		reactor.Step("post", reactor.StepConfig[reactor.Args, string]{
			Limits: []reactor.Limit{reactor.Lock("ledger-rb", nil)},
			Run:    func(context.Context, reactor.Args) (string, error) { tr.add("run:post"); return "posted", nil },
			Undo:   func(context.Context, reactor.Args, string) error { tr.add("undo:post"); return nil },
		}),
		reactor.Step("fail", reactor.StepConfig[reactor.Args, string]{
			After: []string{"post"},
			Run: func(context.Context, reactor.Args) (string, error) {
				<-gate
				return "", reactor.Permanent(fmt.Errorf("declined"))
			},
		}),
	)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return slices.Contains(tr.all(), "run:post") }, 10*time.Second, time.Millisecond)
	// Someone else takes the ledger lock (and dies holding it: nobody
	// renews its lease of 1.5 s).
	key := f.prefix + ":{lim:ledger-rb:}"
	tm, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	until := tm.Add(1500 * time.Millisecond)
	require.Eventually(t, func() bool { return f.rdb.ZCard(ctx, key).Val() == 0 }, 5*time.Second, time.Millisecond)
	require.NoError(t, f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(until.UnixMilli()), Member: "other|post|x"}).Err())
	close(gate)

	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.Empty(t, final.Failure.RollbackFailures, "the rollback waited for the lock instead of failing")
	assert.Equal(t, []string{"run:post", "undo:post"}, tr.all())
	done, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	assert.False(t, done.Before(until), "the undo ran only once the other holder's lease ended")
}

// Once per period: the first run for a key runs the step; a second run in
// the same period halts there, naming the first; another key runs.
func TestLimitOncePerPeriodHaltsTheSecondRun(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var ran atomic.Int32
	var attempts atomic.Int32
	def := reactor.MustDefine("daily-report",
		reactor.Input[string]("tenant", reactor.Required()),
		reactor.Step("send", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"tenant": reactor.FromInput("tenant")},
			Limits: []reactor.Limit{{Name: "daily-report", OncePer: time.Hour,
				Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "tenant") }}},
			Retry: reactor.Retry{MaxAttempts: 2},
			Run: func(context.Context, reactor.Args) (string, error) {
				if attempts.Add(1) == 1 {
					return "", fmt.Errorf("a hiccup: the holder's own retry still runs")
				}
				ran.Add(1)
				return "sent", nil
			},
		}),
	)
	e := f.serve(def)
	first, err := e.Enqueue(ctx, def, map[string]any{"tenant": "acme"})
	require.NoError(t, err)
	final, err := e.Wait(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())

	second, err := e.Enqueue(ctx, def, map[string]any{"tenant": "acme"})
	require.NoError(t, err)
	final, err = e.Wait(ctx, second.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusHalted, final.Status)
	assert.Contains(t, final.Reason, "run "+first.RunID+" ran it in this period")

	other, err := e.Enqueue(ctx, def, map[string]any{"tenant": "globex"})
	require.NoError(t, err)
	final, err = e.Wait(ctx, other.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	assert.Equal(t, int32(2), ran.Load())
}

// A fan-out element whose limit stays full past the in-process wait is
// snoozed like a run and completes once there is room.
func TestLimitSnoozesAFanOutElement(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	element := reactor.MustDefine("locked-element",
		reactor.Input[int]("item"),
		reactor.Step("call", reactor.StepConfig[reactor.Args, int]{
			Limits: []reactor.Limit{reactor.Lock("element-lock", nil)},
			Run:    func(context.Context, reactor.Args) (int, error) { return 1, nil },
		}),
	)
	owner := reactor.MustDefine("locked-map",
		reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true}),
	)
	key := f.prefix + ":{lim:element-lock:}"
	tm, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	until := tm.Add(1500 * time.Millisecond)
	require.NoError(t, f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(until.UnixMilli()), Member: "dead|call|x"}).Err())
	require.NoError(t, f.rdb.PExpire(ctx, key, time.Minute).Err())
	e := f.serve(owner)
	res, err := e.Enqueue(ctx, owner, map[string]any{"items": []int{1, 2, 3}})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	assert.NotEmpty(t, f.events.steps("w", reactor.EventLimitRefused), "an element's task was snoozed")
}

// An ordered lock: the runs waiting for a key get in in the order they were
// enqueued, and a waiter that died (its place not renewed for a lease)
// does not block the key.
func TestLimitOrderedRunsInEnqueueOrder(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var mu sync.Mutex
	var order []string
	def := reactor.MustDefine("ordered",
		reactor.Input[string]("n", reactor.Required()),
		reactor.Step("apply", reactor.StepConfig[reactor.Args, string]{
			Args:   reactor.Bindings{"n": reactor.FromInput("n")},
			Limits: []reactor.Limit{{Name: "ledger-order", Concurrency: 1, Ordered: true, Lease: 5 * time.Second}},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				n, err := reactor.Arg[string](a, "n")
				mu.Lock()
				order = append(order, n)
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				return n, err
			},
		}),
	)
	// A waiter that died long ago holds the first place, and a holder
	// holds the lock for 1.5 s more: the runs below all queue up meanwhile.
	key := f.prefix + ":{lim:ledger-order:}"
	require.NoError(t, f.rdb.ZAdd(ctx, key+":q", redis.Z{Score: 1, Member: "dead-run|apply"}).Err())
	require.NoError(t, f.rdb.HSet(ctx, key+":qs", "dead-run|apply", 1).Err())
	tm, err := f.rdb.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, f.rdb.ZAdd(ctx, key, redis.Z{Score: float64(tm.Add(1500 * time.Millisecond).UnixMilli()), Member: "holder|apply|x"}).Err())
	require.NoError(t, f.rdb.PExpire(ctx, key, time.Minute).Err())
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 8 })
	var ids, want []string
	for i := range 8 {
		res, err := e.Enqueue(ctx, def, map[string]any{"n": fmt.Sprint(i)})
		require.NoError(t, err)
		ids, want = append(ids, res.RunID), append(want, fmt.Sprint(i))
		time.Sleep(2 * time.Millisecond) // distinct creation times: the order's key
	}
	for _, id := range ids {
		final, err := e.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, want, order)
}
