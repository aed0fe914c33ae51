package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/worker"
)

// Step-wise acceptance of the distributed map rollback (DESIGN 5): a fan-out
// map that completed, then a failing step after it. The drainer runs every
// task one at a time, so each action's rollback burst is observable.

// rbDrainOwner maps the element over "items" (fan-out, batch size batch, 0
// for the default), sums the results, then fails in "boom".
func rbDrainOwner(f *drainFixture, name string, batch int) *engine.Definition {
	return engine.MustDefine(name,
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: f.element(name + "-el"), Items: engine.FromInput("items"),
			FanOut: true, BatchSize: batch}),
		drainSumStep(),
		engine.Step("boom", engine.StepConfig[engine.Args, int]{After: []string{"sum"},
			Run: func(context.Context, engine.Args) (int, error) {
				return 0, engine.Permanent(errors.New("boom after the map"))
			}}),
		engine.Returns(engine.FromStep("sum")),
	)
}

func TestRbDrain500(t *testing.T) {
	t.Parallel()
	const n = 500
	for _, tc := range []struct {
		name    string
		batch   int // 0: the default
		b       int // effective batch size
		bursts  []int
		trigger []int // the rollback positions whose settle claims the next batch
	}{
		{name: "B50", batch: 0, b: mapcore.DefaultBatchSize, bursts: slices.Repeat([]int{50}, 10),
			trigger: []int{24, 74, 124, 174, 224, 274, 324, 374, 424}},
		{name: "B200", batch: 200, b: 200, bursts: []int{200, 200, 100}, trigger: []int{99, 299}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newDrainFixture(t)
			ctx := drainCtx(t)
			def := rbDrainOwner(f, "rbdrain-"+tc.name, tc.batch)
			id, first := f.start(def, n)
			require.Equal(t, tc.b, first.Burst(), "the first forward batch")
			mapID := mapcore.MapID(id, "each")

			log := f.d.Drain()

			// Forward: as without a rollback.
			require.Equal(t, tc.bursts, f.d.Bursts(), "forward element bursts")
			require.Equal(t, n, f.d.Appeared(worker.TypeElement))
			f.requireRanOnce(n)

			// Back pressure on the way back: no action, the owner's
			// hand-off included, enqueues more than B rollback jobs.
			require.LessOrEqual(t, f.d.MaxRbBurst(), tc.b)
			require.Equal(t, tc.bursts, f.d.RbBursts(), "rollback bursts")
			require.Equal(t, n, f.d.Appeared(worker.TypeRollback), "one rollback job per claimed position")

			// Exactly two owner resumes: the forward settle and the
			// rollback settle, in that order, each under its cause's id.
			require.Equal(t, 2, f.d.Appeared(worker.TypeRun))
			var resumes []drainRecord
			var rbJobs []drainRecord
			for _, r := range log {
				switch r.Type {
				case worker.TypeRun:
					resumes = append(resumes, r)
				case worker.TypeRollback:
					rbJobs = append(rbJobs, r)
				}
			}
			require.Len(t, resumes, 2)
			fwd, rb := resumes[0], resumes[1]
			require.Equal(t, "resume:"+id+":fwd:"+mapID, fwd.Task)
			require.Equal(t, fmt.Sprintf("resume:%s:rb:%s:1", id, mapID), rb.Task)
			require.Equal(t, id, fwd.RunID)
			require.Equal(t, id, rb.RunID)
			// The forward resume runs "sum" and "boom", starts the rollback
			// and hands off: its burst is the first rollback batch, nothing
			// else (the rollback has not settled, so no resume).
			require.Equal(t, tc.b, fwd.Rollbacks(), "the owner's hand-off burst")
			require.Zero(t, fwd.Burst())
			require.Zero(t, fwd.Resumes())
			require.Empty(t, rb.IDs(), "the adopting resume enqueues nothing")

			// The rollback jobs ran in position order; the last position
			// of each batch claimed the next batch, and only the very last
			// job (the owner having handed off long before) resumed the
			// owner.
			require.Len(t, rbJobs, n)
			var triggers []int
			for p, r := range rbJobs {
				require.Equal(t, p, r.Index, "drain order of rollback jobs")
				require.Equal(t, mapID, r.MapID)
				require.Equal(t, fmt.Sprintf("rb:%s:1:%d", mapID, p), r.Task)
				require.Zero(t, r.Burst(), "%s", r)
				if r.Rollbacks() > 0 {
					triggers = append(triggers, p)
				}
				if p == n-1 {
					require.Equal(t, []string{rb.Task}, r.IDs(), "the last job resumes the owner")
				} else {
					require.Zero(t, r.Resumes(), "%s", r)
				}
			}
			require.Equal(t, tc.trigger, triggers)

			// Every element undone exactly once, newest first: position p
			// is element n-1-p, and batch k+1 is claimed only when batch
			// k's last position settled, so the whole drain is newest
			// first, and so is each batch.
			f.mu.Lock()
			undone := slices.Clone(f.undone)
			f.mu.Unlock()
			want := drainItems(n)
			slices.Reverse(want)
			require.Equal(t, want, undone)
			for k := 0; k*tc.b < n; k++ {
				batch := undone[k*tc.b : min((k+1)*tc.b, n)]
				require.True(t, slices.IsSortedFunc(batch, func(a, b int) int { return b - a }), "batch %d newest first", k)
			}

			// The rollback's counters.
			meta, err := f.rdb.HGetAll(ctx, f.keys.MapRbMeta(mapID, 1)).Result()
			require.NoError(t, err)
			require.Equal(t, fmt.Sprint(n), meta["total"])
			require.Equal(t, fmt.Sprint(tc.b), meta["batch_size"])
			require.Equal(t, fmt.Sprint(n), meta["settled"])
			require.Equal(t, fmt.Sprint(n), meta["n:undone"])
			require.Equal(t, "0", meta["failed"])

			res := f.result(id)
			require.Equal(t, engine.StatusFailed, res.Status)
			require.Equal(t, "boom", res.Failure.Step)
			require.Equal(t, "boom after the map", res.Failure.Message)
			require.Empty(t, res.Failure.RollbackFailures)
			require.Zero(t, res.Failure.RollbackFailuresOmitted)
			t.Logf("forward bursts %v, rollback bursts %v", f.d.Bursts(), f.d.RbBursts())
		})
	}
}
