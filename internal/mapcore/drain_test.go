package mapcore_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// The acceptance tests of map steps (back pressure, claims, duplicates,
// owner resumes), driven one task at a time by a drainer (drainer_test.go).

// drainFixture is one test's engine, queue, drainer and element bookkeeping.
type drainFixture struct {
	t      *testing.T
	rdb    redis.UniversalClient
	keys   keys.Keys
	queue  string
	client *worker.Client
	engine *engine.Engine
	d      *drainer

	mu     sync.Mutex
	ran    map[int]int // element step runs by item
	undone []int       // element undos, in order
	// crash, if set, runs in the element step before it doubles item n.
	crash func(ctx context.Context, n int) error
}

func newDrainFixture(t *testing.T, mod ...func(*engine.Config)) *drainFixture {
	t.Helper()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	cfg := engine.Config{Client: rdb, Prefix: prefix, Enqueuer: client,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := engine.NewEngine(context.Background(), cfg)
	require.NoError(t, err)
	return &drainFixture{t: t, rdb: rdb, keys: keys.New(prefix), queue: queue, client: client, engine: e,
		d: newDrainer(t, e, rdb, queue), ran: map[int]int{}}
}

type drainItem struct {
	N int `json:"n"`
}

// element doubles its item; it fails (permanently) for the items in failOn.
func (f *drainFixture) element(name string, failOn ...int) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[int]("item", engine.Required()),
		engine.Step("double", engine.StepConfig[drainItem, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run: func(ctx context.Context, in drainItem) (int, error) {
				f.mu.Lock()
				f.ran[in.N]++
				crash := f.crash
				f.mu.Unlock()
				if crash != nil {
					if err := crash(ctx, in.N); err != nil {
						return 0, err
					}
				}
				if slices.Contains(failOn, in.N) {
					return 0, engine.Permanent(fmt.Errorf("item %d is bad", in.N))
				}
				return in.N * 2, nil
			},
			Undo: func(_ context.Context, in drainItem, _ int) error {
				f.mu.Lock()
				f.undone = append(f.undone, in.N)
				f.mu.Unlock()
				return nil
			},
		}),
		engine.Returns(engine.FromStep("double")),
	)
}

// drainSumStep adds the values of the map step "each" (failed elements count 0).
func drainSumStep() engine.Part {
	type args struct {
		R mapcore.Result `json:"r"`
	}
	return engine.Step("sum", engine.StepConfig[args, int]{
		Args: engine.Bindings{"r": engine.FromStep("each")},
		Run: func(ctx context.Context, in args) (int, error) {
			rd, err := mapcore.Read[int](ctx, in.R)
			if err != nil {
				return 0, err
			}
			sum := 0
			for i := 0; ; i++ {
				el, ok, err := rd.Next(ctx)
				if err != nil {
					return 0, err
				}
				if !ok {
					return sum, nil
				}
				if el.Index != i {
					return 0, fmt.Errorf("element %d read at position %d", el.Index, i)
				}
				sum += el.Value
			}
		},
	})
}

// owner maps cfg over the input "items" with a map step "each", then returns
// the sum of the results.
func (f *drainFixture) owner(name string, cfg mapcore.Config) *engine.Definition {
	cfg.Items = engine.FromInput("items")
	return engine.MustDefine(name,
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", cfg),
		drainSumStep(),
		engine.Returns(engine.FromStep("sum")),
	)
}

func drainItems(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func drainCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// start runs def in-process: a fan-out map hands off after enqueueing its
// first batch, which is observed as the first burst.
func (f *drainFixture) start(def *engine.Definition, n int, opts ...engine.RunOption) (runID string, first drainRecord) {
	f.t.Helper()
	res, err := f.engine.Run(drainCtx(f.t), def, map[string]any{"items": drainItems(n)}, append(opts, engine.NoWait())...)
	require.NoError(f.t, err)
	require.Equal(f.t, engine.OutcomeDispatched, res.Outcome(), "%v", res.Failure)
	return res.RunID, f.d.Observe()
}

// result returns the stored result of run id, which must be terminal.
func (f *drainFixture) result(id string) *engine.Result {
	f.t.Helper()
	run, err := f.engine.Get(drainCtx(f.t), id)
	require.NoError(f.t, err)
	require.True(f.t, run.Status.Terminal(), "run %s is %s", id, run.Status)
	return run.Result()
}

func (f *drainFixture) status(id string) engine.Status {
	f.t.Helper()
	run, err := f.engine.Get(drainCtx(f.t), id)
	require.NoError(f.t, err)
	return run.Status
}

// requireRanOnce checks that elements [0, n) ran exactly once each and no
// other element ran.
func (f *drainFixture) requireRanOnce(n int) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range n {
		require.Equal(f.t, 1, f.ran[i], "runs of element %d", i)
	}
	require.Len(f.t, f.ran, n, "elements that ran")
}

// drainTriggers returns the element indexes whose delivery enqueued elements.
func drainTriggers(log []drainRecord) []int {
	var out []int
	for _, r := range log {
		if r.Task != "" && r.Burst() > 0 {
			out = append(out, r.Index)
		}
	}
	return out
}

func TestDrainBurstsStayWithinDefaultBatch(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("burst-500", mapcore.Config{Element: f.element("burst-500-el"), FanOut: true})
	id, first := f.start(def, 500)
	require.Equal(t, mapcore.DefaultBatchSize, first.Burst(), "the first batch")
	require.Zero(t, first.Resumes())

	f.d.Drain()

	require.LessOrEqual(t, f.d.MaxBurst(), mapcore.DefaultBatchSize)
	require.Equal(t, slices.Repeat([]int{50}, 10), f.d.Bursts())
	require.Equal(t, []int{24, 74, 124, 174, 224, 274, 324, 374, 424}, drainTriggers(f.d.Log),
		"the position half a batch before each batch's end claims the next one")
	require.Equal(t, 500, f.d.Appeared(worker.TypeElement), "every element dispatched once")
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun), "the owner resumed once")
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 499*500, sum)
	f.requireRanOnce(500)
	t.Logf("bursts: %v (max %d)", f.d.Bursts(), f.d.MaxBurst())
}

func TestDrainSmallMapGoesOutAtOnce(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("burst-20", mapcore.Config{Element: f.element("burst-20-el"), FanOut: true})
	id, first := f.start(def, 20)
	require.Equal(t, 20, first.Burst())

	log := f.d.Drain()
	for _, r := range log {
		require.Zero(t, r.Burst(), "no later element burst: %s", r)
	}
	require.Equal(t, []int{20}, f.d.Bursts())
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 19*20, sum)
	f.requireRanOnce(20)
}

func TestDrainExplicitBatchSizeIsHonoured(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("burst-b200", mapcore.Config{Element: f.element("burst-b200-el"), FanOut: true, BatchSize: 200})
	id, first := f.start(def, 500)
	require.Equal(t, 200, first.Burst())

	f.d.Drain()
	require.Equal(t, []int{200, 200, 100}, f.d.Bursts())
	require.Equal(t, []int{99, 299}, drainTriggers(f.d.Log))
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	f.requireRanOnce(500)
	t.Logf("bursts: %v", f.d.Bursts())
}

func TestDrainAtomicFailureStopsClaims(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("burst-fail", mapcore.Config{Element: f.element("burst-fail-el", 60), FanOut: true})
	id, first := f.start(def, 500)
	require.Equal(t, 50, first.Burst())
	mapID := mapcore.MapID(id, "each")

	f.d.Drain()

	// Position 24 claimed [50, 100) before 60 failed; nothing was claimed
	// after (74 settled after the failure): no task for a position of 100
	// or more ever existed.
	require.Equal(t, []int{50, 50}, f.d.Bursts())
	require.Equal(t, []int{24}, drainTriggers(f.d.Log))
	require.Equal(t, 100, f.d.Appeared(worker.TypeElement))
	// The owner is resumed once when the map settles, and once more when
	// the distributed rollback of its completed elements settles.
	require.Equal(t, 2, f.d.Appeared(worker.TypeRun))
	require.Equal(t, 100, f.d.Appeared(worker.TypeRollback), "one rollback job per claimed position")
	off, err := f.rdb.Get(drainCtx(t), f.keys.MapOffset(mapID)).Int()
	require.NoError(t, err)
	require.Equal(t, 100, off)

	f.mu.Lock()
	for i := range 500 {
		want := 0
		if i <= 60 {
			want = 1
		}
		require.Equal(t, want, f.ran[i], "runs of element %d", i)
	}
	f.mu.Unlock()

	// Claimed positions that never ran settled as skipped.
	n, err := f.rdb.HLen(drainCtx(t), f.keys.MapResults(mapID)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 100, n, "only claimed positions have outcomes")
	all, err := mapcore.ReadWith[int](f.engine, mapcore.Result{MapID: mapID, Total: 100}).All(drainCtx(t))
	require.NoError(t, err)
	for _, el := range all {
		switch {
		case el.Index < 60:
			require.True(t, el.OK, "element %d", el.Index)
		case el.Index == 60:
			require.NotNil(t, el.Failure)
		default:
			require.True(t, el.Skipped, "element %d", el.Index)
		}
	}

	res := f.result(id)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Equal(t, "each[60]/double", res.Failure.Step)
	require.Equal(t, "item 60 is bad", res.Failure.Message)
	f.mu.Lock()
	defer f.mu.Unlock()
	want := drainItems(60)
	slices.Reverse(want)
	require.Equal(t, want, f.undone, "completed elements undone, newest first")
}

func TestDrainPartialMap(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := engine.MustDefine("burst-partial",
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: f.element("burst-partial-el", 3, 77, 110),
			Items: engine.FromInput("items"), FanOut: true, Partial: true}),
		engine.Returns(engine.FromStep("each")))
	id, first := f.start(def, 120)
	require.Equal(t, 50, first.Burst())

	f.d.Drain()
	require.Equal(t, []int{50, 50, 20}, f.d.Bursts(), "a failure claims on in partial mode")
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	r, err := engine.ValueOf[mapcore.Result](res)
	require.NoError(t, err)
	require.Equal(t, 120, r.Total)
	require.Equal(t, 3, r.Failed)
	all, err := mapcore.ReadWith[int](f.engine, r).All(drainCtx(t))
	require.NoError(t, err)
	require.Len(t, all, 120)
	for _, el := range all {
		if el.Index == 3 || el.Index == 77 || el.Index == 110 {
			require.False(t, el.OK, "element %d", el.Index)
			require.NotNil(t, el.Failure, "element %d", el.Index)
			require.Equal(t, "double", el.Failure.Step)
			require.Equal(t, fmt.Sprintf("item %d is bad", el.Index), el.Failure.Message)
		} else {
			require.True(t, el.OK, "element %d", el.Index)
			require.Equal(t, el.Index*2, el.Value)
		}
	}
	f.requireRanOnce(120)
	require.Empty(t, f.undone, "a partial map keeps its successes")
}

func TestDrainDuplicateElementDeliveryChangesNothing(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("dup-el", mapcore.Config{Element: f.element("dup-el-el"), FanOut: true})
	id, _ := f.start(def, 60)
	mapID := mapcore.MapID(id, "each")
	ctx := drainCtx(t)

	ti := f.d.ElementTask(mapID, 10)
	require.NotNil(t, ti)
	first := f.d.Run(ti)
	require.NoError(t, first.Err)
	stored, err := f.rdb.HGet(ctx, f.keys.MapResults(mapID), "10").Result()
	require.NoError(t, err)
	meta, err := f.rdb.HGetAll(ctx, f.keys.MapMeta(mapID)).Result()
	require.NoError(t, err)

	second := f.d.Again(ti)
	require.NoError(t, second.Err)
	require.Empty(t, second.IDs(), "the duplicate enqueues nothing")
	again, err := f.rdb.HGet(ctx, f.keys.MapResults(mapID), "10").Result()
	require.NoError(t, err)
	require.Equal(t, stored, again, "the first outcome stands")
	metaAgain, err := f.rdb.HGetAll(ctx, f.keys.MapMeta(mapID)).Result()
	require.NoError(t, err)
	require.Equal(t, meta, metaAgain, "counters unchanged")
	f.mu.Lock()
	require.Equal(t, 1, f.ran[10], "the second delivery read the finished element run")
	f.mu.Unlock()

	// The last element's settle signals the owner. Deliver the owner's
	// resume, then that element again: no second resume.
	var last *drainRecord
	for {
		r, ok := f.d.Step()
		if !ok {
			break
		}
		require.NoError(t, r.Err, "%s", r)
		if r.Resumes() > 0 {
			last = &r
		}
	}
	require.NotNil(t, last)
	require.Equal(t, engine.StatusCompleted, f.status(id))
	sig := f.d.Again(last.Info)
	require.NoError(t, sig.Err)
	require.Empty(t, sig.IDs(), "a redelivered signalling element resumes no one")

	require.Equal(t, []int{50, 10}, f.d.Bursts())
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 59*60, sum)
	f.requireRanOnce(60)
}

func TestDrainDuplicateTriggerClaimsOnce(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("dup-trigger", mapcore.Config{Element: f.element("dup-trigger-el"), FanOut: true})
	id, first := f.start(def, 120)
	require.Equal(t, 50, first.Burst())

	trig := f.d.DrainUntil(drainIsElement(24))
	require.NotNil(t, trig)
	a, b := f.d.Duplicate(trig)
	require.NoError(t, a.Err)
	require.NoError(t, b.Err)
	require.Equal(t, 50, a.Burst(), "the trigger claims the next batch")
	require.Empty(t, b.IDs(), "its duplicate claims nothing")

	// A late redelivery, once the batch it claimed has run and freed its
	// task ids: a second claim would enqueue them again.
	require.NotNil(t, f.d.DrainUntil(drainIsElement(99)))
	late := f.d.Again(trig)
	require.NoError(t, late.Err)
	require.Empty(t, late.IDs(), "a late duplicate claims nothing")
	require.Equal(t, 50, a.Burst()+b.Burst()+late.Burst(), "[50, 100) claimed once")

	f.d.Drain()
	require.Equal(t, []int{50, 50, 20}, f.d.Bursts())
	require.Equal(t, 120, f.d.Appeared(worker.TypeElement))
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))
	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 119*120, sum)
	f.requireRanOnce(120)
}

func TestDrainEarlyOwnerResumeDispatchesNothing(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	def := f.owner("early-resume", mapcore.Config{Element: f.element("early-resume-el"), FanOut: true})
	id, _ := f.start(def, 120)
	mapID := mapcore.MapID(id, "each")
	ctx := drainCtx(t)
	require.NotNil(t, f.d.DrainUntil(drainIsElement(10)))

	// In-process, as a sweeper's mistaken resume would run it.
	res, err := engine.Process(f.engine, ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	require.Empty(t, f.d.Observe().IDs(), "an unsettled map dispatches nothing")
	require.Equal(t, engine.StatusRunning, f.status(id))

	// As a task, under the very id of the forward resume.
	wake := engine.Wake{ID: "resume:" + id + ":fwd:" + mapID, RunID: id, Reactor: def.Name()}
	require.NoError(t, f.client.Enqueue(ctx, wake))
	require.Equal(t, 1, f.d.Observe().Resumes())
	early := f.d.Run(f.d.Pending(wake.ID))
	require.NoError(t, early.Err)
	require.Empty(t, early.IDs(), "an early resume dispatches nothing")
	require.Equal(t, engine.StatusRunning, f.status(id))

	// On a batch boundary too: position 49 settled and claimed [50, 100).
	require.NotNil(t, f.d.DrainUntil(drainIsElement(50)))
	res, err = engine.Process(f.engine, ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.OutcomeDispatched, res.Outcome())
	require.Empty(t, f.d.Observe().IDs())

	var resume *drainRecord
	for _, r := range f.d.Drain() {
		if r.Type == worker.TypeRun {
			resume = &r
		}
	}
	require.NotNil(t, resume, "the settled map resumed its owner")
	require.Equal(t, []int{50, 50, 20}, f.d.Bursts())
	require.Equal(t, 120, f.d.Appeared(worker.TypeElement), "nothing dispatched twice")
	require.Equal(t, 2, f.d.Appeared(worker.TypeRun), "the test's early resume and the map's own")
	res = f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	f.requireRanOnce(120)

	// A duplicate of the resume after the end changes nothing.
	dup := f.d.Again(resume.Info)
	require.NoError(t, dup.Err)
	require.Empty(t, dup.IDs())
	require.Equal(t, res, f.result(id))
}

func TestDrainFanOutMapInComposedChildResumesRoot(t *testing.T) {
	t.Parallel()
	f := newDrainFixture(t)
	child := f.owner("composed-child", mapcore.Config{Element: f.element("composed-child-el"), FanOut: true})
	root := engine.MustDefine("composed-root",
		engine.Input[[]int]("items", engine.Required()),
		engine.Compose("child", child, engine.ComposeConfig{Args: engine.Bindings{"items": engine.FromInput("items")}}),
		engine.Returns(engine.FromStep("child")))
	id, first := f.start(root, 70)
	require.Equal(t, 50, first.Burst())
	mapID := mapcore.MapID(id, "child/each")
	owner, err := f.rdb.HGet(drainCtx(t), f.keys.MapMeta(mapID), "owner").Result()
	require.NoError(t, err)
	require.Equal(t, id, owner, "the map's owner is the root")

	var resumes []*drainRecord
	for _, r := range f.d.Drain() {
		if r.Type == worker.TypeRun {
			resumes = append(resumes, &r)
		}
	}
	require.Len(t, resumes, 1)
	require.Equal(t, "resume:"+id+":fwd:"+mapID, resumes[0].Task)
	require.Equal(t, id, resumes[0].RunID, "the resume goes to the root")
	p, err := payload.DecodeRun(resumes[0].Info.Payload)
	require.NoError(t, err)
	require.Equal(t, "composed-root", p.Reactor)
	require.Equal(t, 1, f.d.Appeared(worker.TypeRun))

	res := f.result(id)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 69*70, sum)
	f.requireRanOnce(70)
}

func TestDrainInlineMapCrashResumesMidMap(t *testing.T) {
	t.Parallel()
	// A heartbeat every 333ms notices the takeover; one up to 667ms late (a
	// process starved by a parallel run) keeps the lock till then.
	f := newDrainFixture(t, func(c *engine.Config) { c.LockExpiry = time.Second })
	ctx := drainCtx(t)
	id := engine.NewRunID()
	lockKey := f.keys.RunLock(id)
	crashed := false
	f.crash = func(ctx context.Context, n int) error {
		f.mu.Lock()
		first := n == 5 && !crashed
		crashed = crashed || first
		f.mu.Unlock()
		if !first {
			return nil
		}
		// Another process takes the run: the heartbeat's next extension
		// is refused and this process loses the run mid-element.
		if err := f.rdb.Set(context.WithoutCancel(ctx), lockKey, "another-process", 0).Err(); err != nil {
			return err
		}
		<-ctx.Done()
		return ctx.Err()
	}
	def := f.owner("inline-crash", mapcore.Config{Element: f.element("inline-crash-el")})

	_, err := f.engine.Run(ctx, def, map[string]any{"items": drainItems(10)}, engine.WithRunID(id))
	require.ErrorIs(t, err, engine.ErrLockLost)
	f.mu.Lock()
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}, f.ran)
	f.mu.Unlock()
	require.Empty(t, f.d.Observe().IDs(), "an inline map enqueues nothing")

	// The process that took the run is gone. Element 5's lock outlives the
	// process that lost the run (it expires, it is not released); pin it
	// for 300ms so that the resume surely finds it held: the resume must
	// wait it out, not fail the map.
	require.NoError(t, f.rdb.Del(ctx, lockKey).Err())
	elemLock := f.keys.ElemLock(mapcore.ElementID(mapcore.MapID(id, "each"), 5))
	require.NoError(t, f.rdb.Set(ctx, elemLock, "crashed-process", 300*time.Millisecond).Err())
	res, err := f.engine.Resume(ctx, id)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
	sum, err := engine.ValueOf[int](res)
	require.NoError(t, err)
	require.Equal(t, 90, sum)
	f.mu.Lock()
	defer f.mu.Unlock()
	require.Equal(t, map[int]int{0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1, 7: 1, 8: 1, 9: 1}, f.ran,
		"settled elements 0-4 are not re-run; 5 (interrupted) and 6-9 run")
	require.Empty(t, f.undone)
}
