package mapcore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/runctx"
)

// index puts a fan-out map where the sweepers look: the map index (the
// map sweeper's work list) and the owner's set of maps still working (the
// run sweeper leaves an owner alone while one of them works). It is called
// before the map's keys exist, so a crash can never leave claimed work
// where no sweeper looks.
func (s mapStore) index(ctx context.Context, mapID, owner string) error {
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, s.keys.Maps(), redis.Z{Score: float64(time.Now().UnixMilli()), Member: mapID})
		p.SAdd(ctx, s.keys.RunMaps(owner), mapID)
		// A fan-out map's owner is always a top-level run (maps nested in
		// an element run inline).
		p.SAdd(ctx, s.keys.RunTree(owner), mapID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("mapstep: index map %s: %w", mapID, err)
	}
	return nil
}

// addToTree lists an inline map in its run's tree set before any of its keys
// exist, so the map expires with the run (internal/store's retention walk).
func (s mapStore) addToTree(ctx context.Context, mapID, owner string, nested bool) error {
	tree := s.keys.RunTree(owner)
	if nested {
		tree = s.keys.ElemTree(owner)
	}
	if err := s.rdb.SAdd(ctx, tree, mapID).Err(); err != nil {
		return fmt.Errorf("mapstep: record map %s in its run's tree: %w", mapID, err)
	}
	return nil
}

// unindex removes an adopted map from both indexes. It is best effort: a
// map left in the index costs the map sweeper a look and is removed then.
func (s mapStore) unindex(ctx context.Context, mapID, owner string) {
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, s.keys.Maps(), mapID)
		p.SRem(ctx, s.keys.RunMaps(owner), mapID)
		return nil
	})
}

// dispatch enqueues the element tasks of positions [from, from+len(items))
// of map md, each carrying the map's immutable metadata.
func dispatch(ctx context.Context, e *engine.Engine, md meta, mapID string, from int, items []codec.Raw) error {
	q, ok := maptask.Adapt(engine.EnqueuerOf(e))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue element tasks (use worker.Client)")
	}
	hook := failpoints.beforeEnqueue
	carried := md.carried()
	ts := make([]maptask.ElementTask, 0, len(items))
	for k, it := range items {
		if hook != nil {
			if err := hook(mapID, from+k); err != nil {
				// The positions before the failing one still go out.
				return errors.Join(inWaves(md.BatchSize, from, len(ts), func(lo, hi int) error {
					return maptask.EnqueueElements(ctx, q, ts[lo:hi])
				}), err)
			}
		}
		ts = append(ts, maptask.ElementTask{MapID: mapID, Index: from + k, Input: it, Meta: carried})
	}
	return inWaves(md.BatchSize, from, len(ts), func(lo, hi int) error {
		return maptask.EnqueueElements(ctx, q, ts[lo:hi])
	})
}

// inWaves sends the tasks of positions [from, from+n) of a batch protocol
// with batch size b in waves, calling send(lo, hi) for the tasks at offsets
// [lo, hi) one wave after another; within a wave the enqueues go out
// together (maptask.All) and may reach the queue in any order. A trigger
// position (the one whose settle claims the next batch, (p+1+b/2)%b == 0)
// starts a new wave, so every position before it is queued before it, as
// when tasks went out one by one: the next batch is not claimed before
// the positions ahead of its trigger have been taken from the queue, and
// the queue holds at most B + B/2 waiting tasks.
func inWaves(b, from, n int, send func(lo, hi int) error) error {
	ahead := b / 2
	lo := 0
	for k := 1; k < n; k++ {
		if b > 0 && (from+k+1+ahead)%b == 0 {
			if err := send(lo, k); err != nil {
				return err
			}
			lo = k
		}
	}
	if lo < n {
		return send(lo, n)
	}
	return nil
}

// processElement executes one element task on a worker: runs (or resumes)
// the element run, settles its outcome, then claims and enqueues the next
// batch or resumes the owner if this settle says so. It returns
// reactor.ErrRunLocked when the element is held elsewhere (snooze).
func processElement(ctx context.Context, e *engine.Engine, t maptask.ElementTask) error {
	ms := storeOf(e)
	if len(t.Meta) > 0 {
		md, err := fromTask(t.Meta)
		if err != nil {
			return err
		}
		sr, err := runCarried(ctx, e, ms, md, t)
		switch {
		case errors.Is(err, errElemOwnerDone):
			engine.Logger(e).Debug("element task for a finished map ignored", "event", "reactor.map.element.late",
				"map", t.MapID, "index", t.Index)
			return nil
		case errors.Is(err, errElemMapFailed):
			// Settled stopped, under the element's lock (see below).
		case err != nil:
			return err
		default:
			return settled(ctx, e, ms, md, t, sr)
		}
	}
	md, err := ms.readMeta(ctx, t.MapID)
	if err != nil {
		return err
	}
	if !md.exists {
		return maptask.ErrMapGone
	}
	// The position is checked against the map before anything runs: a
	// task for a position never claimed (or past the end) would run the
	// element's steps, and the settle would then refuse it, leaving a side
	// effect that no rollback ever looks at.
	if t.Index < 0 || t.Index >= md.Total || t.Index >= md.Offset {
		return fmt.Errorf("%w: element %d of map %s is outside the map (size %d, %d claimed)", maptask.ErrBadTask, t.Index, t.MapID, md.Total, md.Offset)
	}
	if md.ownerDone {
		// A late duplicate of a task whose map its owner has adopted (or
		// rolled back) and finished with: nothing may run or settle now,
		// and sealing a missing element run would create a key outside
		// the retention the owner's tree already got.
		engine.Logger(e).Debug("element task for a finished map ignored", "event", "reactor.map.element.late",
			"map", t.MapID, "index", t.Index)
		return nil
	}
	var sr settleResult
	if md.Failed {
		sr, err = settleStopped(ctx, e, ms, md, t)
	} else {
		sr, err = runAndSettle(ctx, e, ms, md, t)
	}
	if err != nil {
		return err
	}
	return settled(ctx, e, ms, md, t, sr)
}

// settled acts on what element t's settle did: claim and dispatch the next
// batch, or resume the owner.
func settled(ctx context.Context, e *engine.Engine, ms mapStore, md meta, t maptask.ElementTask, sr settleResult) error {
	if !sr.Stored {
		return nil // a duplicate delivery: the first settle acted
	}
	if hook := failpoints.afterSettle; hook != nil {
		if err := hook(t.MapID, t.Index); err != nil {
			return err
		}
	}
	if sr.From >= 0 {
		claimedBatch(ctx, e, md, engine.EventMapBatchClaimed)
		items, err := claimedItems(ctx, e, ms, md, t.MapID, sr.From, sr.To)
		if err != nil {
			return err
		}
		if err := dispatch(ctx, e, md, t.MapID, sr.From, items); err != nil {
			return err
		}
	}
	if sr.Signal {
		if hook := failpoints.onSignal; hook != nil {
			if err := hook(t.MapID, t.Index); err != nil {
				return err
			}
		}
		return resumeOwner(ctx, e, md, t.MapID)
	}
	return nil
}

// claimedBatch tells the engine's hooks (metrics) and its Debug log that
// map md claimed a batch: kind is reactor.EventMapBatchClaimed or
// reactor.EventMapRollbackBatchClaimed. It costs no Redis round trip.
func claimedBatch(ctx context.Context, e *engine.Engine, md meta, kind engine.EventKind) {
	engine.Emit(e, ctx, engine.Event{Kind: kind, RunID: md.Owner, Reactor: md.OwnerReact, Step: md.Step, TraceID: md.Trace})
}

// claimedItems reads the items of a claimed batch: from the stored source,
// or from the map's Source (found through the owner's definition).
func claimedItems(ctx context.Context, e *engine.Engine, ms mapStore, md meta, mapID string, from, to int) ([]codec.Raw, error) {
	if !md.Paged {
		return ms.sourceRange(ctx, mapID, from, to)
	}
	owner, err := engine.DefinitionFor(e, md.Owner, md.OwnerReact, md.OwnerDef)
	if err != nil {
		return nil, fmt.Errorf("mapstep: owner of map %s: %w", mapID, err)
	}
	c, ok := engine.ConstructAt(owner, md.Step)
	m, isMap := c.(*construct)
	if !ok || !isMap || m.cfg.Pages == nil {
		return nil, fmt.Errorf("mapstep: reactor %q has no paged map step at %q", md.OwnerReact, md.Step)
	}
	var with engine.Args
	if len(md.With) > 0 {
		if err := codec.Unmarshal(md.With, &with); err != nil {
			return nil, err
		}
	}
	return m.page(ctx, with, from, to)
}

func resumeOwner(ctx context.Context, e *engine.Engine, md meta, mapID string) error {
	return engine.EnqueuerOf(e).Enqueue(ctx, engine.Wake{
		ID:    fwdResumeID(md.Owner, mapID),
		RunID: md.Owner, Reactor: md.OwnerReact, Retain: resumeRetention,
	})
}

// resumeRetention keeps an owner's completed resume visible to the map
// sweeper, which tells a resume that ran from one that was lost by it.
const resumeRetention = time.Hour

func fwdResumeID(owner, mapID string) string { return "resume:" + owner + ":fwd:" + mapID }

func rbResumeID(owner, mapID string, gen int) string {
	return fmt.Sprintf("resume:%s:rb:%s:%d", owner, mapID, gen)
}

// failpoints are test-only hooks at the narrow windows of the protocol.
// They are set only by tests (export_test.go), before any map runs.
var failpoints struct {
	// beforeStart runs between the owner's save of its map id and the
	// start script of a fan-out map.
	beforeStart func(mapID string, index int) error
	// afterSettle runs after a settle stored an outcome, before it acts.
	afterSettle func(mapID string, index int) error
	// beforeEnqueue runs before each element task is enqueued.
	beforeEnqueue func(mapID string, index int) error
	// onSignal runs when a settle claimed the owner signal, before the
	// owner's resume is enqueued.
	onSignal func(mapID string, index int) error

	// Rollback windows (index = rollback position, -1 for the owner).
	rbBeforeEnqueue func(mapID string, pos int) error // before each rollback job is enqueued
	rbAfterSettle   func(mapID string, pos int) error // after a job stored its outcome
	rbJobSignal     func(mapID string, pos int) error // a job claimed the owner signal
	rbBeforeHandOff func(mapID string, pos int) error // owner saved, handed_off not yet set
	rbOwnerSignal   func(mapID string, pos int) error // the owner claimed the signal itself
}

// settleStopped settles position t.Index of a map that failed (or was
// stopped for a rollback) without running it.
func settleStopped(ctx context.Context, e *engine.Engine, ms mapStore, md meta, t maptask.ElementTask) (settleResult, error) {
	// The map failed (or was stopped for a rollback): the position
	// settles without running, so the map can settle and the owner
	// resume. An earlier delivery may have run part of the element
	// before it died: "stopped" tells the rollback to look. It settles
	// only under the element's lock: another delivery may still be
	// executing the element (asynq re-queued it after a lease lapse,
	// or the sweeper redelivered it), and settling under it would let
	// the map settle and the rollback judge the element before that
	// delivery completes it. A held lock snoozes this task; once the
	// other delivery settled, this settle is a refused duplicate.
	// StopElement also creates a missing element run finished, so a
	// delivery that read the map before it failed and reaches the
	// element only now (after the rollback found nothing to undo)
	// cannot start it.
	sctx := runctx.WithElement(ctx, runctx.Element{Owner: md.Owner, Step: md.Step, Index: t.Index, Trace: md.Trace, Legacy: md.Layout < 2})
	var sr settleResult
	err := engine.StopElement(e, sctx, md.Element, ElementID(t.MapID, t.Index), func(ctx context.Context) error {
		var err error
		sr, err = ms.settle(ctx, t.MapID, t.Index, outcome{Status: outcomeStopped})
		return err
	})
	return sr, err
}

// runAndSettle runs element t.Index of a map whose task carries no meta (a
// task of the previous layout) and settles its outcome.
func runAndSettle(ctx context.Context, e *engine.Engine, ms mapStore, md meta, t maptask.ElementTask) (settleResult, error) {
	def, err := engine.DefinitionFor(e, md.Owner, md.Element, md.ElementDef)
	if err != nil {
		return settleResult{}, fmt.Errorf("mapstep: element of map %s: %w", t.MapID, err)
	}
	item := t.Input
	if len(item) == 0 {
		items, err := claimedItems(ctx, e, ms, md, t.MapID, t.Index, t.Index)
		if err != nil {
			return settleResult{}, err
		}
		item = items[0]
	}
	o, err := runElement(ctx, e, def, md, t.MapID, t.Index, item)
	if errors.Is(err, errElemPaused) {
		return settleResult{}, nil // nothing settled: the job is done
	}
	if err != nil {
		return settleResult{}, err
	}
	// This settle comes after the element run ended (the run's
	// terminal write released the element lock): a terminal run is
	// never executed again, so nothing can complete behind it.
	return ms.settle(ctx, t.MapID, t.Index, o)
}
