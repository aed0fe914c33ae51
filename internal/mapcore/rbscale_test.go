package mapcore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/worker"
)

// TestRbScale10k rolls back 10,000-element maps (DESIGN 9, scale), inline
// and fan-out, each followed by a step that fails:
//   - every element is undone exactly once;
//   - element runs are loaded one at a time per job: a gauge of the element
//     runs a job has in memory (from an element's rollback start to its
//     terminal event, both emitted on the job's goroutine, attributed to
//     the job through its context) never exceeds 1, each rollback job
//     loads exactly one element, and the fan-out owner's own jobs load
//     none; the inline owner loads them one after another;
//   - a gauge of undo calls in progress never exceeds 1 inline, nor the
//     workers' concurrency fan-out;
//   - the owner's stored state for 10,000 elements is within 2x of the same
//     owner's state for 10 elements.
//
// It logs the forward and the rollback time of each mode. Not parallel, and
// the modes run one after the other, so that each time means something.
func TestRbScale10k(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000-element rollbacks: skipped with -short")
	}
	const n, concurrency = 10_000, 20
	ctx := eoCtx(t, 170*time.Second)
	jobs := &rbsJobs{}
	h := newRBFHarness(t, rbfOptions{concurrency: concurrency, hooks: []engine.Hook{jobs.hook()}, wrap: jobs.wrap})

	for _, fanOut := range []bool{false, true} {
		mode := map[bool]string{false: "Inline", true: "FanOut"}[fanOut]
		t.Run(mode, func(t *testing.T) {
			small := rbsRun(t, ctx, h, jobs, fanOut, 10)
			large := rbsRun(t, ctx, h, jobs, fanOut, n)
			t.Logf("%s, %d elements: forward %v, rollback %v (%.0f undone/s), max undos at once %d; owner state %d bytes (10 elements: %d bytes)",
				mode, n, large.forward.Round(time.Millisecond), large.rollback.Round(time.Millisecond), n/large.rollback.Seconds(),
				large.maxUndos, large.stateSize, small.stateSize)
			require.LessOrEqual(t, large.stateSize, 2*small.stateSize, "the owner's state does not grow with the map")
			if fanOut {
				require.LessOrEqual(t, large.maxUndos, int32(concurrency), "fan-out: undos at once")
			} else {
				require.Equal(t, int32(1), large.maxUndos, "inline: one undo at a time")
			}
		})
	}
}

type rbsResult struct {
	forward, rollback time.Duration
	maxUndos          int32
	stateSize         int
}

// rbsRun runs an owner whose map of n elements is followed by a failing
// step, and checks its rollback.
func rbsRun(t *testing.T, ctx context.Context, h *rbfHarness, jobs *rbsJobs, fanOut bool, n int) rbsResult {
	t.Helper()
	mode := map[bool]string{false: "inline", true: "fanout"}[fanOut]
	name := fmt.Sprintf("rbs-%s-%d", mode, n)
	undone := make([]atomic.Int32, n)
	var inUndo, maxUndos atomic.Int32
	elem := engine.MustDefine(name+"-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("double", engine.StepConfig[eoIn, int]{
			Args: engine.Bindings{"n": engine.FromInput("item")},
			Run:  func(_ context.Context, in eoIn) (int, error) { return 2 * in.N, nil },
			Undo: func(_ context.Context, in eoIn, out int) error {
				cur := inUndo.Add(1)
				defer inUndo.Add(-1)
				rbsMax(&maxUndos, cur)
				if out != 2*in.N {
					return fmt.Errorf("element %d: undo got result %d", in.N, out)
				}
				undone[in.N].Add(1)
				return nil
			},
		}),
		engine.Returns(engine.FromStep("double")),
	)
	// The items are a constant of the definition, so the owner's state
	// holds only what the map step adds (as in TestScaleFanOut10k).
	def := engine.MustDefine(name,
		mapcore.Map("each", mapcore.Config{Element: elem, Items: engine.Const(eoSeq(0, n)), FanOut: fanOut}),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{
			After: []string{"each"},
			Run:   func(context.Context, engine.Args) (int, error) { return 0, errBoom },
		}),
	)
	owner := name + "-" + engine.NewRunID()
	mapID := mapcore.MapID(owner, "each")
	var rbStarted atomic.Int64
	h.intercept(engine.EventRollbackStarted, owner, func(context.Context) { rbStarted.Store(time.Now().UnixNano()) })

	// The inline owner runs here, as one "job" of the gauge.
	ownerJob := &rbsJob{typ: "in-process"}
	runCtx := context.WithValue(ctx, rbsJobKey{}, ownerJob)
	before := jobs.snapshot()
	finished := h.done(owner)
	start := time.Now()
	res, err := h.engine.Run(runCtx, def, nil, engine.WithRunID(owner), engine.NoWait())
	require.NoError(t, err)
	if fanOut {
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		eoAwait(t, ctx, finished, "the owner "+owner)
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
	}
	end := time.Now()
	requireBoom(t, res)
	r := rbsResult{maxUndos: maxUndos.Load(), stateSize: rbsStateSize(t, ctx, h, owner)}
	began := time.Unix(0, rbStarted.Load())
	r.forward, r.rollback = began.Sub(start), end.Sub(began)

	for i := range n {
		if got := undone[i].Load(); got != 1 {
			require.Equal(t, int32(1), got, "%s: element %d undone once", name, i)
		}
	}
	meta := h.rbMeta(ctx, mapID)
	require.Equal(t, strconv.Itoa(n), meta["total"])
	require.Equal(t, strconv.Itoa(n), meta["settled"])
	require.Equal(t, strconv.Itoa(n), meta["n:undone"])
	stored, err := h.rdb.HLen(ctx, h.keys.MapRbResults(mapID, 1)).Result()
	require.NoError(t, err)
	require.EqualValues(t, n, stored, "one rollback outcome per element")

	require.Zero(t, jobs.orphans.Load(), "every element rollback ran in a job (or the in-process owner)")
	if !fanOut {
		require.EqualValues(t, n, ownerJob.elements.Load(), "the inline owner undoes every element...")
		require.EqualValues(t, 1, ownerJob.max.Load(), "...one element run at a time")
		return r
	}
	require.Zero(t, ownerJob.elements.Load(), "the fan-out owner loads no element run")
	// Every job that ran for this owner since it started, once they have
	// all been recorded (the terminal event fires inside the resume task).
	h.rec.await(t, ctx, "the owner's rollback resume task", func(rr *rbfRecorder) bool { return rr.ok[rbResumeID(owner, mapID)] == 1 })
	h.rec.awaitOK(t, ctx, resumeTaskID(owner, mapID)) // the forward resume
	h.rec.awaitRollbackJobs(t, ctx, mapID, n)
	var rollbackJobs, ownerJobs int
	for _, j := range jobs.since(before) {
		switch {
		case j.typ == worker.TypeRollback && strings.HasPrefix(j.id, "rb:"+mapID+":"):
			rollbackJobs++
			require.EqualValues(t, 1, j.elements.Load(), "rollback job %s loads one element run", j.id)
			require.EqualValues(t, 1, j.max.Load(), "rollback job %s", j.id)
		case j.typ == worker.TypeRun && strings.HasPrefix(j.id, "resume:"+owner+":"):
			ownerJobs++
			require.Zero(t, j.elements.Load(), "owner job %s loads no element run", j.id)
		default:
			require.Zero(t, j.elements.Load(), "job %s (%s) rolls back no element", j.id, j.typ)
		}
	}
	require.Equal(t, n, rollbackJobs, "one rollback job per element, each delivered once")
	require.Equal(t, 2, ownerJobs, "the owner's forward and rollback resumes")
	return r
}

func rbsMax(m *atomic.Int32, v int32) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}

func rbsStateSize(t *testing.T, ctx context.Context, h *rbfHarness, id string) int {
	t.Helper()
	d, err := h.rdb.HGet(ctx, h.keys.RunState(id), "d").Result()
	require.NoError(t, err)
	return len(d)
}

// ---- per-job gauge of element runs in memory ----

type rbsJobKey struct{}

// rbsJob is one delivery of a task (or the in-process owner): how many
// element runs it rolled back, and how many it had in memory at once.
type rbsJob struct {
	typ, id             string
	live, max, elements atomic.Int32
}

// rbsJobs attributes element rollbacks to the job whose context they run
// in: the asynq handler puts a fresh rbsJob into each delivery's context,
// and the engine's events carry that context.
type rbsJobs struct {
	mu      sync.Mutex
	all     []*rbsJob
	orphans atomic.Int32 // element rollbacks outside any job
}

func (g *rbsJobs) wrap(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		j := &rbsJob{typ: t.Type(), id: id}
		err := next.ProcessTask(context.WithValue(ctx, rbsJobKey{}, j), t)
		if err == nil {
			g.mu.Lock()
			g.all = append(g.all, j)
			g.mu.Unlock()
		}
		return err
	})
}

func (g *rbsJobs) hook() engine.Hook {
	return engine.HookFunc(func(ctx context.Context, ev engine.Event) {
		if !strings.Contains(ev.RunID, "~each.") { // element runs only
			return
		}
		j, _ := ctx.Value(rbsJobKey{}).(*rbsJob)
		switch ev.Kind {
		case engine.EventRollbackStarted:
			if j == nil {
				g.orphans.Add(1)
				return
			}
			j.elements.Add(1)
			rbsMax(&j.max, j.live.Add(1))
		case engine.EventRunCancelled:
			if j != nil {
				j.live.Add(-1)
			}
		}
	})
}

func (g *rbsJobs) snapshot() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.all)
}

func (g *rbsJobs) since(from int) []*rbsJob {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*rbsJob(nil), g.all[from:]...)
}
