package mapcore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/worker"
)

// TestScaleFanOut10k runs a 10,000-element fan-out map on 20 concurrent
// workers (DESIGN 9, scale): the map completes, every element runs exactly
// once, and the owner's stored state does not grow with the map: it is
// within 2x of the same owner's state for a 10-element map, both while the
// map is out on workers and once the owner has finished.
//
// The items are a constant of the definition, not an input or an earlier
// step's result: those are the owner's own data and sit in its state
// whatever a map does with them. What is measured is what the map step
// adds.
//
// It is not parallel so that its time means something.
func TestScaleFanOut10k(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000-element map: skipped with -short")
	}
	ctx := eoCtx(t, 120*time.Second)
	h := newEOHarness(t, eoOptions{concurrency: 20})

	type sizes struct{ dispatched, finished int }
	run := func(n int) (sizes, time.Duration) {
		t.Helper()
		def := h.owner(fmt.Sprintf("scale-%d", n), engine.Const(eoSeq(n*100_000, n)), 0)
		owner := fmt.Sprintf("scale-%d-%s", n, engine.NewRunID())
		mapID := mapcore.MapID(owner, "each")
		finished := h.done(owner)
		start := time.Now()
		res, err := h.engine.Run(ctx, def, nil, engine.WithRunID(owner), engine.NoWait())
		require.NoError(t, err)
		require.Equal(t, engine.OutcomeDispatched, res.Outcome())
		var sz sizes
		sz.dispatched = h.stateSize(ctx, owner)
		eoAwait(t, ctx, finished, fmt.Sprintf("the %d-element map's owner", n))
		took := time.Since(start)
		res, err = h.engine.Wait(ctx, owner)
		require.NoError(t, err)
		require.Equal(t, engine.StatusCompleted, res.Status, "%v", res.Failure)
		sum, err := engine.ValueOf[int](res)
		require.NoError(t, err)
		require.Equal(t, 2*(n*n*100_000+n*(n-1)/2), sum, "the owner read every element's value")
		sz.finished = h.stateSize(ctx, owner)

		h.rec.await(t, ctx, "every element task and the resume", func(r *eoRecorder) bool {
			return r.ok[resumeTaskID(owner, mapID)] == 1
		})
		for i := range n {
			if got := h.ranOf(n*100_000 + i); got != 1 {
				require.Equal(t, 1, got, "element %d of the %d-element map", i, n)
			}
		}
		stored, err := h.rdb.HLen(ctx, h.keys.MapResults(mapID)).Result()
		require.NoError(t, err)
		require.EqualValues(t, n, stored, "one outcome per element")
		require.Equal(t, 1, h.resumes(owner), "one owner resume")
		return sz, took
	}

	small, smallTook := run(10)
	elemsBefore := h.recElements()
	large, largeTook := run(10_000)
	require.Equal(t, 10_000, h.recElements()-elemsBefore, "10,000 element tasks, each delivered once")

	t.Logf("10-element map: %v; owner state %d bytes dispatched, %d bytes finished", smallTook, small.dispatched, small.finished)
	t.Logf("10,000-element map: %v (%.0f elements/s); owner state %d bytes dispatched, %d bytes finished",
		largeTook, 10_000/largeTook.Seconds(), large.dispatched, large.finished)
	require.LessOrEqual(t, large.dispatched, 2*small.dispatched, "owner state while dispatched")
	require.LessOrEqual(t, large.finished, 2*small.finished, "owner state when finished")
}

// stateSize is the byte length of run id's stored state (field d of its ctx
// hash).
func (h *eoHarness) stateSize(ctx context.Context, id string) int {
	h.t.Helper()
	d, err := h.rdb.HGet(ctx, h.keys.RunState(id), "d").Result()
	require.NoError(h.t, err)
	return len(d)
}

// recElements counts element deliveries that returned nil.
func (h *eoHarness) recElements() int {
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	return h.rec.byType[worker.TypeElement]
}
