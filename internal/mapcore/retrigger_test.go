package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/inspect"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// A re-triggered rollback of a run whose map left elements applied starts a
// new rollback generation of the map over exactly those elements: fresh
// keys and task ids (generation 2), the same protocol (batches, hand-off,
// one owner resume), each element retrying only its own failed undo; the
// first generation's outcomes stay readable, and every key of both expires
// with the run.

// rtFailing makes s2's undo of the items in fail fail its first call.
func rtFailing(c *rbfCounts, fail ...int) {
	bad := map[int]bool{}
	for _, i := range fail {
		bad[i] = true
	}
	c.setOnUndo(func(_ context.Context, item, step int) error {
		if step == 2 && bad[item] && c.undos(item)[1] == 1 {
			return fmt.Errorf("undo s2 of %d: the service was down", item)
		}
		return nil
	})
}

func rtItems(n int) []int {
	items := make([]int, n)
	for i := range items {
		items[i] = i
	}
	return items
}

// rtFailures are the rollback failures of elements failed (newest first).
func rtFailures(failed ...int) []engine.RollbackFailure {
	var out []engine.RollbackFailure
	for j := len(failed) - 1; j >= 0; j-- {
		out = append(out, engine.RollbackFailure{Step: fmt.Sprintf("each[%d]/s2", failed[j]), Kind: engine.ActionUndo, Reason: ""})
	}
	return out
}

func requireRollbackFailures(t *testing.T, res *engine.Result, failed ...int) {
	t.Helper()
	var got []string
	for _, f := range res.Failure.RollbackFailures {
		got = append(got, f.Step)
	}
	var want []string
	for _, w := range rtFailures(failed...) {
		want = append(want, w.Step)
	}
	require.Equal(t, want, got)
}

// requireSecondGeneration checks the map after its generation-2 retry of
// the elements failed: their s2 undone twice, every other undo once, the
// generation's work list, outcomes and task ids, and the first
// generation's outcomes still there.
func requireSecondGeneration(t *testing.T, ctx context.Context, h *rbfHarness, c *rbfCounts, mapID string, n int, failed []int, fanOut bool) {
	t.Helper()
	want := map[int][3]int{}
	for _, i := range failed {
		want[i] = [3]int{1, 2, 1}
	}
	c.requireUndos(t, n, want)
	require.Equal(t, "2", h.rdb.HGet(ctx, h.keys.MapMeta(mapID), "rbgen").Val())
	work, err := h.rdb.LRange(ctx, h.keys.MapRbWork(mapID, 2), 0, -1).Result()
	require.NoError(t, err)
	var wantWork []string
	for j := len(failed) - 1; j >= 0; j-- {
		wantWork = append(wantWork, strconv.Itoa(failed[j]))
	}
	require.Equal(t, wantWork, work, "generation 2's work list: the failed elements, newest first")
	meta2 := h.rdb.HGetAll(ctx, h.keys.MapRbMeta(mapID, 2)).Val()
	require.Equal(t, strconv.Itoa(len(failed)), meta2["total"])
	require.Equal(t, strconv.Itoa(len(failed)), meta2["n:undone"])
	for p := range failed {
		raw, err := h.rdb.HGet(ctx, h.keys.MapRbResults(mapID, 2), strconv.Itoa(p)).Result()
		require.NoError(t, err)
		require.Contains(t, raw, "undone")
		if fanOut {
			ok, _, _ := h.rec.get(fmt.Sprintf("rb:%s:2:%d", mapID, p))
			require.Equal(t, 1, ok, "generation 2's job of position %d ran once", p)
		}
	}
	// Generation 1 is still readable: its failed outcomes are kept.
	meta1 := h.rdb.HGetAll(ctx, h.keys.MapRbMeta(mapID, 1)).Val()
	require.Equal(t, strconv.Itoa(n), meta1["total"])
	require.Equal(t, strconv.Itoa(len(failed)), meta1["n:failed"])
	for _, i := range failed {
		require.Equal(t, "failed", h.outcome(ctx, mapID, n-1-i).Outcome)
	}
	// The dashboard's reader shows generation 2 and the elements undone.
	pic, ok, err := inspect.New(h.rdb, h.keys.Prefix()).Read(ctx, mapID, 0, n)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 2, pic.Map.Rollback.Generation)
	require.Equal(t, len(failed), pic.Map.Rollback.Total)
	for _, el := range pic.Elements {
		require.Equal(t, inspect.StateUndone, el.State, "element %d", el.Index)
	}
	for _, cell := range pic.Cells {
		require.Equal(t, cell.To-cell.From+1, cell.Counts[inspect.StateUndone])
	}
}

func TestRetriggerFanOutMapStartsASecondGeneration(t *testing.T) {
	t.Parallel()
	const n, retention = 20, 3 * time.Second
	h := newRBFHarness(t, rbfOptions{retention: retention})
	ctx := eoCtx(t, time.Minute)
	c := newRBFCounts()
	failed := []int{3, 8, 15}
	rtFailing(c, failed...)
	def := rbfOwner("rt_fan", c.element("rt_fan_elem"), true, 5, nil)
	owner := "rt-fan-" + engine.NewRunID()
	mapID := mapcore.MapID(owner, "each")
	res := h.runFanOut(ctx, def, owner, rtItems(n))
	requireRollbackFailures(t, res, failed...)
	h.rec.awaitOK(t, ctx, rbResumeID(owner, mapID))
	resumes := h.resumes(owner)

	finished := h.done(owner)
	again, err := h.engine.RetryRollback(ctx, owner)
	require.NoError(t, err)
	require.Equal(t, engine.StatusRollingBack, again.Status, "the map handed its generation 2 to workers")
	eoAwait(t, ctx, finished, "the retried rollback")
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(t, err)
	requireBoom(t, res)
	require.Equal(t, resumes+1, h.resumes(owner), "generation 2 resumed the owner once")
	rbResume2 := "resume:" + owner + ":rb:" + mapID + ":2"
	h.rec.awaitOK(t, ctx, rbResume2)
	ok, failedDeliveries, _ := h.rec.get(rbResume2)
	require.Equal(t, [2]int{1, 0}, [2]int{ok, failedDeliveries})
	requireSecondGeneration(t, ctx, h, c, mapID, n, failed, true)
	run, err := h.engine.Get(ctx, owner)
	require.NoError(t, err)
	require.Equal(t, 2, run.RollbackGeneration)
	for _, i := range failed {
		h.requireElementRetried(ctx, mapID, i)
	}

	_, err = h.engine.RetryRollback(ctx, owner)
	require.ErrorIs(t, err, engine.ErrNothingToRetry)

	// A generation-2 job delivered again, and a stale generation-1 job,
	// undo nothing more.
	q, adapted := maptask.Adapt(h.client)
	require.True(t, adapted)
	for _, task := range []maptask.RollbackTask{
		{MapID: mapID, Gen: 2, Pos: 0, Index: failed[len(failed)-1], Redelivery: "r1"},
		{MapID: mapID, Gen: 1, Pos: 0, Index: n - 1, Redelivery: "r1"},
	} {
		require.NoError(t, q.EnqueueRollback(ctx, task))
		h.rec.awaitOK(t, ctx, task.TaskID())
	}
	want := map[int][3]int{}
	for _, i := range failed {
		want[i] = [3]int{1, 2, 1}
	}
	c.requireUndos(t, n, want)

	// Every key of the tree, both generations', expires with the run.
	keys := rtRunKeys(t, h, owner)
	require.Contains(t, keys, h.keys.MapRbWork(mapID, 2))
	require.Contains(t, keys, h.keys.MapRbResults(mapID, 2))
	for _, k := range keys {
		ttl := h.rdb.PTTL(ctx, k).Val()
		require.True(t, ttl > 0 || ttl == -2, "key %s has no expiry (%v)", k, ttl)
	}
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		require.Empty(c, rtRunKeys(t, h, owner))
	}, 4*retention, 50*time.Millisecond)
}

// requireElementRetried checks element i after generation 2: cancelled,
// no failure left, its report s3, s2 (failed), s1, then s2 compensated.
func (h *rbfHarness) requireElementRetried(ctx context.Context, mapID string, i int) {
	h.t.Helper()
	run, err := engine.Element(h.engine, ctx, mapcore.ElementID(mapID, i))
	require.NoError(h.t, err)
	require.Equal(h.t, engine.StatusCancelled, run.Status)
	require.Empty(h.t, run.Failure.RollbackFailures)
	require.Equal(h.t, 2, run.RollbackGeneration)
	var steps []string
	for _, r := range run.Rollbacks {
		steps = append(steps, r.Step+":"+string(r.Status))
	}
	require.Equal(h.t, []string{"s3:compensated", "s2:compensation_failed", "s1:compensated", "s2:compensated"}, steps)
}

// rtRunKeys lists the keys of run id's tree under the harness's prefix.
func rtRunKeys(t *testing.T, h *rbfHarness, id string) []string {
	t.Helper()
	var out []string
	keys, err := redistest.ScanKeys(context.Background(), h.rdb, h.keys.Prefix()+":*") // every master of a cluster
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

// The same through worker.Controller: the control task retries, and a
// second request is refused with the engine's reason.
func TestRetriggerFanOutMapThroughTheController(t *testing.T) {
	t.Parallel()
	const n = 20
	h := newRBFHarness(t, rbfOptions{})
	ctx := eoCtx(t, time.Minute)
	c := newRBFCounts()
	failed := []int{0, 11, 19}
	rtFailing(c, failed...)
	def := rbfOwner("rt_ctl", c.element("rt_ctl_elem"), true, 5, nil)
	owner := "rt-ctl-" + engine.NewRunID()
	mapID := mapcore.MapID(owner, "each")
	res := h.runFanOut(ctx, def, owner, rtItems(n))
	requireRollbackFailures(t, res, failed...)

	ctl, err := worker.NewController(ctx, worker.ControllerConfig{Client: h.rdb, Prefix: h.keys.Prefix(), Queue: h.queue, Logger: rbfLogger})
	require.NoError(t, err)
	finished := h.done(owner)
	req, err := ctl.Request(ctx, owner, worker.ActionRollback)
	require.NoError(t, err)
	eoAwait(t, ctx, finished, "the retried rollback")
	h.rec.awaitOK(t, ctx, req.TaskID)
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(t, err)
	requireBoom(t, res)
	requireSecondGeneration(t, ctx, h, c, mapID, n, failed, true)
	_, err = ctl.Request(ctx, owner, worker.ActionRollback)
	require.ErrorIs(t, err, engine.ErrNothingToRetry)
}

// An inline map retries its failed elements in the process re-triggering
// the rollback, in generation 2 alike.
func TestRetriggerInlineMapRetriesItsFailedElements(t *testing.T) {
	t.Parallel()
	const n = 12
	h := newRBFHarness(t, rbfOptions{noServer: true})
	ctx := eoCtx(t, time.Minute)
	c := newRBFCounts()
	failed := []int{2, 9}
	rtFailing(c, failed...)
	def := rbfOwner("rt_inline", c.element("rt_inline_elem"), false, 5, nil)
	owner := "rt-inline-" + engine.NewRunID()
	mapID := mapcore.MapID(owner, "each")
	res, err := h.engine.Run(ctx, def, map[string]any{"items": rtItems(n)}, engine.WithRunID(owner))
	require.NoError(t, err)
	requireRollbackFailures(t, res, failed...)

	res, err = h.engine.RetryRollback(ctx, owner)
	require.NoError(t, err)
	requireBoom(t, res)
	requireSecondGeneration(t, ctx, h, c, mapID, n, failed, false)
	for _, i := range failed {
		h.requireElementRetried(ctx, mapID, i)
	}
}

// An element that fails again stays in the next generation's work list.
func TestRetriggerFanOutMapThirdGeneration(t *testing.T) {
	t.Parallel()
	const n = 10
	h := newRBFHarness(t, rbfOptions{})
	ctx := eoCtx(t, time.Minute)
	c := newRBFCounts()
	c.setOnUndo(func(_ context.Context, item, step int) error {
		u := c.undos(item)
		switch {
		case step == 2 && item == 4 && u[1] <= 2, step == 2 && item == 7 && u[1] == 1:
			return errors.New("still down")
		}
		return nil
	})
	def := rbfOwner("rt_third", c.element("rt_third_elem"), true, 3, nil)
	owner := "rt-third-" + engine.NewRunID()
	mapID := mapcore.MapID(owner, "each")
	res := h.runFanOut(ctx, def, owner, rtItems(n))
	requireRollbackFailures(t, res, 4, 7)
	finished := h.done(owner)
	_, err := h.engine.RetryRollback(ctx, owner, engine.FromGeneration(1))
	require.NoError(t, err)
	eoAwait(t, ctx, finished, "generation 2")
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(t, err)
	requireRollbackFailures(t, res, 4)
	// Generation 2's job for element 4 (work list 7, 4) delivered again retries nothing:
	// the element is at generation 2 already.
	q, _ := maptask.Adapt(h.client)
	again := maptask.RollbackTask{MapID: mapID, Gen: 2, Pos: 1, Index: 4, Redelivery: "r1"}
	require.NoError(t, q.EnqueueRollback(ctx, again))
	h.rec.awaitOK(t, ctx, again.TaskID())
	require.Equal(t, [3]int{1, 2, 1}, c.undos(4))
	finished = h.done(owner)
	_, err = h.engine.RetryRollback(ctx, owner, engine.FromGeneration(2))
	require.NoError(t, err)
	eoAwait(t, ctx, finished, "generation 3")
	res, err = h.engine.Wait(ctx, owner)
	require.NoError(t, err)
	requireBoom(t, res)
	require.Equal(t, []string{"4"}, h.rdb.LRange(ctx, h.keys.MapRbWork(mapID, 3), 0, -1).Val())
	require.Equal(t, [3]int{1, 3, 1}, c.undos(4))
	require.Equal(t, [3]int{1, 2, 1}, c.undos(7))
	require.Equal(t, [3]int{1, 1, 1}, c.undos(0))
}
