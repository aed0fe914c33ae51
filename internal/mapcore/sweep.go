package mapcore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/internal/tracing"
)

// maptask.Recovery of lost map work. A worker dies holding element tasks; a settle
// stores its outcome but the enqueue after it fails; an owner resume is
// dropped. The map sweeper (package sweeper) calls recoverMap for each map
// in the map index; recoverMap re-dispatches exactly what the protocol would
// have dispatched, and nothing else:
//
//   - a claimed position with no outcome, no live element lock and no live
//     task is enqueued again (at most the map's batch size per call);
//   - when every claimed position settled but the next batch was not claimed
//     (the trigger's claim is missing), exactly the next batch is claimed,
//     with the compare-and-set a settle uses;
//   - a settled map whose owner signal was claimed but whose resume is gone
//     gets the resume enqueued again.
//
// Rollbacks get the same three over their current generation's keys.
// Back pressure holds: a map never has more than a batch of positions
// outstanding beyond what its settles claimed.

var (
	// claim.lua serves the forward pass (with the map's failed flag) and
	// every rollback generation (without it): one claim protocol.
	//go:embed lua/claim.lua
	claimSrc string

	claimScript = redis.NewScript(claimSrc)
)

// sweepView is everything recoverMap reads of a map, in one round trip.
type sweepView struct {
	md                  meta
	touched             int64
	signalled           bool
	rb                  rbMeta
	rbTouched           int64
	handedOff, rbSignal bool
	lwm, rbLwm          int
}

func (s mapStore) readSweep(ctx context.Context, mapID string) (sweepView, error) {
	k := s.keys
	var mh *redis.MapStringStringCmd
	var off, failed *redis.StringCmd
	var sig *redis.IntCmd
	var rb rbSweepCmds
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		mh = p.HGetAll(ctx, k.MapMeta(mapID))
		off = p.Get(ctx, k.MapOffset(mapID))
		failed = p.Get(ctx, k.MapFailed(mapID))
		sig = p.Exists(ctx, k.MapSignalled(mapID))
		rb = s.queueRbSweep(ctx, p, mapID, 1)
		return nil
	})
	if err != nil && err != redis.Nil {
		return sweepView{}, fmt.Errorf("mapstep: read map %s for the sweeper: %w", mapID, err)
	}
	v := sweepView{md: parseMeta(mh.Val(), off.Val(), failed), signalled: sig.Val() == 1}
	if gen := v.md.rbGen(); gen > 1 {
		// A re-triggered rollback: its current generation's keys.
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			rb = s.queueRbSweep(ctx, p, mapID, gen)
			return nil
		})
		if err != nil && err != redis.Nil {
			return sweepView{}, fmt.Errorf("mapstep: read map %s for the sweeper: %w", mapID, err)
		}
	}
	rb.into(&v)
	v.touched, _ = strconv.ParseInt(mh.Val()["touched"], 10, 64)
	v.lwm, _ = strconv.Atoi(mh.Val()["swept"])
	return v, nil
}

// rbSweepCmds are the queued sweeper reads of one rollback generation.
type rbSweepCmds struct {
	gen      int
	rb       rbCmds
	ho, rsig *redis.IntCmd
}

func (s mapStore) queueRbSweep(ctx context.Context, p redis.Pipeliner, mapID string, gen int) rbSweepCmds {
	return rbSweepCmds{gen: gen, rb: s.queueRb(ctx, p, mapID, gen),
		ho: p.Exists(ctx, s.keys.MapRbHandedOff(mapID, gen)), rsig: p.Exists(ctx, s.keys.MapRbSignalled(mapID, gen))}
}

func (c rbSweepCmds) into(v *sweepView) {
	v.rb = c.rb.parse(c.gen)
	v.handedOff, v.rbSignal = c.ho.Val() == 1, c.rsig.Val() == 1
	v.rbTouched, _ = strconv.ParseInt(c.rb.meta.Val()["touched"], 10, 64)
	v.rbLwm, _ = strconv.Atoi(c.rb.meta.Val()["swept"])
}

// recoverMap re-dispatches the lost work of one fan-out map, forward or
// rolling back (see the package comment above). It never runs an element
// itself, so the sweeper needs no reactor definitions: an element task it
// enqueues carries no item, and the worker fetches it from the map's source.
func recoverMap(ctx context.Context, e *engine.Engine, mapID string, opt maptask.SweepOptions) (maptask.Recovery, error) {
	if opt.Tasks == nil {
		return maptask.Recovery{}, errors.New("mapstep: recoverMap needs maptask.SweepOptions.Tasks")
	}
	ms := storeOf(e)
	if _, cluster := ms.rdb.(*redis.ClusterClient); cluster && opt.StaleAfter > 0 && opt.StaleBefore > 0 {
		// The settles stamp the map with its own node's clock: age it by
		// that clock, not by the node the sweeper read TIME from.
		now, err := store.ServerTimeAt(ctx, ms.rdb, ms.keys.MapMeta(mapID))
		if err != nil {
			return maptask.Recovery{}, fmt.Errorf("mapstep: read the clock of map %s: %w", mapID, err)
		}
		opt.StaleBefore = now - opt.StaleAfter.Milliseconds()
	}
	v, err := ms.readSweep(ctx, mapID)
	if err != nil {
		return maptask.Recovery{}, err
	}
	if !v.md.exists {
		return maptask.Recovery{Missing: true}, nil
	}
	if !v.md.FanOut {
		return maptask.Recovery{Done: true, Owner: v.md.Owner}, nil // inline maps have no tasks to lose
	}
	// What the pass re-enqueues for this map joins the owner run's trace.
	ctx, span := tracing.StartIn(ctx, engine.Tracer(e), v.md.Trace, "reactor.sweeper.recover",
		attribute.String("reactor.map.id", mapID), attribute.String("reactor.run.id", v.md.Owner),
		attribute.String("reactor.sweeper.recovery", "map"))
	defer span.End()
	sw := &mapSweep{e: e, ms: ms, mapID: mapID, opt: opt, v: v, rec: maptask.Recovery{Owner: v.md.Owner}}
	if !v.rb.exists {
		return sw.sweep(ctx, sw.forwardPass())
	}
	ps, err := sw.rollbackPass(ctx)
	if err != nil {
		return sw.rec, err
	}
	return sw.sweep(ctx, ps)
}

type mapSweep struct {
	e     *engine.Engine
	ms    mapStore
	mapID string
	opt   maptask.SweepOptions
	v     sweepView
	rec   maptask.Recovery
}

// sweepPass is what the one recovery algorithm (mapSweep.sweep) needs of
// the pass it sweeps: the map's forward pass, or its current rollback
// generation. The two differ only in their keys, in which element a
// position names, in the task a position is, and in what a settled pass
// still owes its owner.
type sweepPass struct {
	touched int64 // server time (ms) of the pass's last settle
	settled bool  // every position has an outcome
	// claimable: every claimed position settled, yet positions remain
	// unclaimed (the trigger's claim is missing); claim.lua with claimKeys
	// from offset claims exactly the next batch.
	claimable bool
	claimKeys []string
	offset    int
	// results and meta are the outcomes hash and the meta hash (whose
	// "swept" field records the settled prefix, from lwm); positions
	// [lwm, claimed) are swept, at most batch a pass.
	results, meta       string
	lwm, claimed, batch int
	// element and task name position p's element run and task (its id
	// and its queue's shard).
	element func(p int) string
	task    func(p int) maptask.TaskRef
	// redeliver enqueues position p again (under fresh, when its task
	// died active); dispatch enqueues a batch the sweeper claimed.
	redeliver func(ctx context.Context, p int, fresh string) error
	dispatch  func(ctx context.Context, from, to int) error
	// whenSettled is what a settled pass still owes: the owner's resume.
	whenSettled func(ctx context.Context) error
}

// sweep recovers the lost work of pass ps (see the package comment).
func (sw *mapSweep) sweep(ctx context.Context, ps sweepPass) (maptask.Recovery, error) {
	sw.rec.Touched = ps.touched
	if ps.touched > sw.opt.StaleBefore {
		sw.rec.Live = true
		return sw.rec, nil
	}
	if ps.settled {
		return sw.rec, ps.whenSettled(ctx)
	}
	if ps.claimable {
		res, err := claimScript.Run(ctx, sw.ms.rdb, ps.claimKeys, ps.offset).Int64Slice()
		if err != nil {
			return sw.rec, fmt.Errorf("mapstep: claim the next batch of %s (%s): %w", sw.mapID, ps.meta, err)
		}
		if res[0] >= 0 {
			sw.rec.Claims++
			return sw.rec, ps.dispatch(ctx, int(res[0]), int(res[1])) // the claimed batch is the pass's budget
		}
	}
	return sw.rec, sw.outstanding(ctx, ps)
}

// forwardPass is the map's forward pass as sweep sees it.
func (sw *mapSweep) forwardPass() sweepPass {
	md, k, id := sw.v.md, sw.ms.keys, sw.mapID
	return sweepPass{
		touched: sw.v.touched, settled: md.settled(),
		claimable: !md.Failed && md.Settled >= md.Offset && md.Offset < md.Total,
		claimKeys: []string{k.MapMeta(id), k.MapOffset(id), k.MapFailed(id)}, offset: md.Offset,
		results: k.MapResults(id), meta: k.MapMeta(id),
		lwm: sw.v.lwm, claimed: min(md.Offset, md.Total), batch: md.BatchSize,
		element: func(p int) string { return ElementID(id, p) },
		task:    func(p int) maptask.TaskRef { return maptask.ElementTask{MapID: id, Index: p}.Ref() },
		redeliver: func(ctx context.Context, p int, fresh string) error {
			return sw.enqueueElements(ctx, []maptask.ElementTask{{MapID: id, Index: p, Redelivery: fresh}})
		},
		dispatch: func(ctx context.Context, from, to int) error {
			var items []codec.Raw
			if !md.Paged {
				var err error
				if items, err = sw.ms.sourceRange(ctx, id, from, to); err != nil {
					return err
				}
			}
			ts := make([]maptask.ElementTask, 0, to-from+1)
			for i := from; i <= to; i++ {
				t := maptask.ElementTask{MapID: id, Index: i}
				if items != nil {
					t.Input = items[i-from]
				}
				ts = append(ts, t)
			}
			return sw.enqueueElements(ctx, ts)
		},
		whenSettled: func(ctx context.Context) error {
			if !sw.v.signalled {
				// Settled without a signal: the owner stopped the map
				// itself (Cancel/Undo mid-map) and goes on without a resume.
				return nil
			}
			return sw.resumeOwner(ctx, fwdResumeID(md.Owner, id))
		},
	}
}

// rollbackPass is the map's current rollback generation as sweep sees it.
func (sw *mapSweep) rollbackPass(ctx context.Context) (sweepPass, error) {
	rb, k, id := sw.v.rb, sw.ms.keys, sw.mapID
	gen := rb.Gen
	// The element of each claimed position (a re-triggered generation's
	// come from its work list, at most its claimed length).
	index := func(p int) int { return rb.Total - 1 - p }
	// (Not read for a pass sweep leaves alone: live, or settled.)
	if rb.Work && rb.Offset > 0 && !rb.settled() && sw.v.rbTouched <= sw.opt.StaleBefore {
		idx, err := sw.ms.indexes(ctx, id, rb, 0, min(rb.Offset, rb.Total)-1)
		if err != nil {
			return sweepPass{}, err
		}
		index = func(p int) int { return idx[p] }
	}
	return sweepPass{
		touched: sw.v.rbTouched, settled: rb.settled(),
		claimable: rb.Settled >= rb.Offset && rb.Offset < rb.Total,
		claimKeys: []string{k.MapRbMeta(id, gen), k.MapRbOffset(id, gen)}, offset: rb.Offset,
		results: k.MapRbResults(id, gen), meta: k.MapRbMeta(id, gen),
		lwm: sw.v.rbLwm, claimed: min(rb.Offset, rb.Total), batch: rb.BatchSize,
		element: func(p int) string { return ElementID(id, index(p)) },
		task: func(p int) maptask.TaskRef {
			return maptask.RollbackTask{MapID: id, Gen: gen, Pos: p, Index: index(p)}.Ref()
		},
		redeliver: func(ctx context.Context, p int, fresh string) error {
			return sw.enqueueRollbacks(ctx, []maptask.RollbackTask{{MapID: id, Gen: gen, Pos: p, Index: index(p), Redelivery: fresh}})
		},
		dispatch: func(ctx context.Context, from, to int) error {
			idx, err := sw.ms.indexes(ctx, id, rb, from, to)
			if err != nil {
				return err
			}
			ts := make([]maptask.RollbackTask, 0, to-from+1)
			for p := from; p <= to; p++ {
				ts = append(ts, maptask.RollbackTask{MapID: id, Gen: gen, Pos: p, Index: idx[p-from]})
			}
			return sw.enqueueRollbacks(ctx, ts)
		},
		whenSettled: func(ctx context.Context) error { return sw.rollbackSettled(ctx, gen) },
	}, nil
}

// rollbackSettled resumes the owner of a settled rollback generation, once
// both halves of the handshake are there.
func (sw *mapSweep) rollbackSettled(ctx context.Context, gen int) error {
	owner := sw.v.md.Owner
	switch {
	case sw.v.handedOff && sw.v.rbSignal:
		return sw.resumeOwner(ctx, rbResumeID(owner, sw.mapID, gen))
	case sw.v.handedOff:
		// Cannot happen through the handshake scripts (whichever of the
		// two runs second sees both halves), but the sweeper completes
		// the job's half rather than leave the owner waiting.
		ok, err := sw.ms.rdb.SetNX(ctx, sw.ms.keys.MapRbSignalled(sw.mapID, gen), "1", 0).Result()
		if err != nil {
			return fmt.Errorf("mapstep: claim the rollback signal of %s: %w", sw.mapID, err)
		}
		if !ok {
			return nil // claimed meanwhile: its claimer resumes
		}
		return sw.resumeOwner(ctx, rbResumeID(owner, sw.mapID, gen))
	}
	// Not handed off: the owner has not saved its hand-off yet, or died
	// before; the run sweeper wakes it and it adopts the rollback.
	return nil
}

// outstanding re-enqueues claimed positions of ps that have no outcome,
// whose element is not locked and whose task will not run, at most a batch
// of them. It records in the meta's "swept" field the first position
// without an outcome, so the next pass skips the settled prefix.
func (sw *mapSweep) outstanding(ctx context.Context, ps sweepPass) error {
	const chunk = 500
	lwm, budget := -1, ps.batch
	for lo := ps.lwm; lo < ps.claimed && budget > 0; lo += chunk {
		hi := min(lo+chunk, ps.claimed)
		fields := make([]string, 0, hi-lo)
		for p := lo; p < hi; p++ {
			fields = append(fields, strconv.Itoa(p))
		}
		vals, err := sw.ms.rdb.HMGet(ctx, ps.results, fields...).Result()
		if err != nil {
			return fmt.Errorf("mapstep: read outcomes of %s: %w", sw.mapID, err)
		}
		var open []int
		for j, val := range vals {
			if val == nil {
				open = append(open, lo+j)
			}
		}
		if len(open) > 0 && lwm < 0 {
			lwm = open[0]
		}
		if budget, err = sw.redeliver(ctx, ps, open, budget); err != nil {
			return err
		}
	}
	if lwm < 0 {
		lwm = ps.claimed
	}
	if lwm > ps.lwm {
		if err := sw.ms.rdb.HSet(ctx, ps.meta, "swept", lwm).Err(); err != nil {
			return fmt.Errorf("mapstep: record the sweep of %s: %w", sw.mapID, err)
		}
	}
	return nil
}

// lookAgain asks for the map to be examined again within d.
func (sw *mapSweep) lookAgain(d time.Duration) {
	if d > 0 && (sw.rec.LookAgain == 0 || d < sw.rec.LookAgain) {
		sw.rec.LookAgain = d
	}
}

// redeliver enqueues again, at most budget of them, the positions of open
// (claimed, no outcome) whose element no delivery holds and whose task will
// not run; it returns the budget left. An element lock says a delivery is
// on it right now; the map is looked at again when the lock would lapse,
// so that a dead holder's position is redelivered as soon as it can be.
func (sw *mapSweep) redeliver(ctx context.Context, ps sweepPass, open []int, budget int) (int, error) {
	if len(open) == 0 || budget == 0 {
		return budget, nil
	}
	locks := make([]*redis.DurationCmd, len(open))
	if _, err := sw.ms.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for j, p := range open {
			locks[j] = pl.PTTL(ctx, sw.ms.keys.ElemLock(ps.element(p)))
		}
		return nil
	}); err != nil {
		return budget, fmt.Errorf("mapstep: read element locks of %s: %w", sw.mapID, err)
	}
	for j, p := range open {
		if budget == 0 {
			break
		}
		id := ps.task(p)
		// PTTL: -2 no lock; -1 a lock without expiry (not goreactor's).
		if ttl := locks[j].Val(); ttl != -2*time.Nanosecond {
			if err := sw.held(ctx, id, ttl); err != nil {
				return budget, err
			}
			continue
		}
		fate, err := sw.idleFate(ctx, id)
		if err != nil {
			return budget, err
		}
		if fate != maptask.TaskLive {
			// The outcome was read before the lock and the task: a job
			// that released the element lock, settled and completed in
			// between is not lost. Looked at again before any redelivery.
			settled, err := sw.ms.rdb.HExists(ctx, ps.results, strconv.Itoa(p)).Result()
			if err != nil {
				return budget, fmt.Errorf("mapstep: read the outcome of %s position %d: %w", sw.mapID, p, err)
			}
			if settled {
				continue
			}
		}
		fresh := ""
		switch fate {
		case maptask.TaskLive:
			continue
		case maptask.TaskDead:
			var skip bool
			if fresh, skip, err = sw.redelivery(ctx, id, sw.idleFate); err != nil {
				return budget, err
			}
			if skip {
				continue
			}
		case maptask.TaskArchived, maptask.TaskCompleted:
			if err := sw.opt.Tasks.DeleteTask(ctx, id); err != nil {
				return budget, err
			}
			sw.rec.Deleted++
		}
		if err := ps.redeliver(ctx, p, fresh); err != nil {
			return budget, err
		}
		budget--
	}
	return budget, nil
}

// held deals with a position whose element lock has ttl to live: its task
// is left alone, and the map is looked at again when the lock is about to
// lapse, then once it has. A live holder extends its lock every third of
// its expiry, so a lock about to lapse is one whose holder stopped (or a
// short one): the look then starts the idle observation of its task, and
// the look after the lapse finds it dead at once instead of a second
// later.
func (sw *mapSweep) held(ctx context.Context, id maptask.TaskRef, ttl time.Duration) error {
	if ttl <= 0 {
		return nil
	}
	if ttl > sw.opt.IdleAfter+lapseMargin {
		sw.lookAgain(ttl - sw.opt.IdleAfter)
		return nil
	}
	_, again, err := sw.opt.Tasks.IdleTaskFate(ctx, id) // an observation; no verdict while held
	sw.lookAgain(max(again, ttl+lapseMargin))
	return err
}

// idleFate is the IdleTaskFate of task id, noting when to look again.
func (sw *mapSweep) idleFate(ctx context.Context, id maptask.TaskRef) (maptask.TaskFate, error) {
	fate, again, err := sw.opt.Tasks.IdleTaskFate(ctx, id)
	sw.lookAgain(again)
	return fate, err
}

// lapseMargin is how long after an element lock's expiry the map is looked
// at again: the lock has lapsed by then on the Redis server's clock too.
const lapseMargin = 100 * time.Millisecond

// maxRedeliveries bounds the fresh ids one dead task gets. Should every
// redelivery die active too, the sweeper leaves the position to asynq's own
// recoverer, which re-queues dead tasks once their lease runs out.
const maxRedeliveries = 3

// redelivery picks the fresh id suffix for task id, which died active: the
// first of r1, r2, ... that no task holds, each judged by fateOf. The ids
// are deterministic, so a later pass finds a redelivery still queued
// (skip) instead of adding another.
func (sw *mapSweep) redelivery(ctx context.Context, id maptask.TaskRef,
	fateOf func(ctx context.Context, id maptask.TaskRef) (maptask.TaskFate, error)) (suffix string, skip bool, err error) {
	for n := 1; n <= maxRedeliveries; n++ {
		suffix = "r" + strconv.Itoa(n)
		fate, err := fateOf(ctx, id.Redelivered(suffix))
		if err != nil {
			return "", false, err
		}
		switch fate {
		case maptask.TaskLive:
			return "", true, nil
		case maptask.TaskDead:
			continue
		case maptask.TaskCompleted:
			return "", true, nil // it ran; its work has settled or will
		case maptask.TaskArchived:
			if err := sw.opt.Tasks.DeleteTask(ctx, id.Redelivered(suffix)); err != nil {
				return "", false, err
			}
			sw.rec.Deleted++
		}
		sw.rec.Fresh++
		return suffix, false, nil
	}
	return "", true, nil
}

// enqueueElements enqueues element tasks ts, and counts them.
func (sw *mapSweep) enqueueElements(ctx context.Context, ts []maptask.ElementTask) error {
	q, ok := maptask.Adapt(engine.EnqueuerOf(sw.e))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue element tasks (use worker.Client)")
	}
	if err := maptask.EnqueueElements(ctx, q, ts); err != nil {
		return err
	}
	sw.rec.Elements += len(ts)
	return nil
}

// enqueueRollbacks enqueues rollback jobs ts, and counts them.
func (sw *mapSweep) enqueueRollbacks(ctx context.Context, ts []maptask.RollbackTask) error {
	q, ok := maptask.Adapt(engine.EnqueuerOf(sw.e))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue rollback jobs (use worker.Client)")
	}
	if err := maptask.EnqueueRollbacks(ctx, q, ts); err != nil {
		return err
	}
	sw.rec.Rollbacks += len(ts)
	return nil
}

// resumeOwner enqueues the owner's resume again if it was lost: not when the
// owner holds its lock (it is running), not when the resume is still
// queued, and not when it ran (then the owner has the map, and the map is
// done). An owner that is gone or finished has no use for its map either.
func (sw *mapSweep) resumeOwner(ctx context.Context, id string) error {
	md := sw.v.md
	run, err := sw.e.Get(ctx, md.Owner)
	if errors.Is(err, engine.ErrNotFound) {
		sw.rec.Done = true
		return nil
	}
	if err != nil {
		return err
	}
	if run.Status.Terminal() {
		sw.rec.Done = true
		return nil
	}
	locked, err := engine.Locked(sw.e, ctx, md.Owner)
	if err != nil || locked {
		return err
	}
	ref := maptask.OwnerRef(id)
	fate, err := sw.opt.Tasks.TaskFate(ctx, ref)
	if err != nil {
		return err
	}
	w := engine.Wake{ID: id, RunID: md.Owner, Reactor: md.OwnerReact, Retain: resumeRetention}
	switch fate {
	case maptask.TaskLive:
		return nil
	case maptask.TaskCompleted:
		sw.rec.Done = true
		return nil
	case maptask.TaskDead:
		fresh, skip, err := sw.redelivery(ctx, ref, sw.opt.Tasks.TaskFate)
		if err != nil || skip {
			return err
		}
		w.ID = id + ":" + fresh
	case maptask.TaskArchived:
		if err := sw.opt.Tasks.DeleteTask(ctx, ref); err != nil {
			return err
		}
		sw.rec.Deleted++
	}
	if err := engine.EnqueuerOf(sw.e).Enqueue(ctx, w); err != nil {
		return err
	}
	sw.rec.Resumes++
	return nil
}

// awaiting reports whether run runID is waiting for one of its fan-out maps
// to settle, forward or rolling back: the run sweeper leaves such a run
// alone (waking it would only make it hand off again); the map's workers,
// or the map sweeper, resume it when the map settles. For the maps that
// have settled and signalled the owner, it returns the ids of those resume
// tasks: while one of them is still queued, the run is not lost either.
func awaiting(ctx context.Context, e *engine.Engine, runID string) (waiting bool, resumes []string, err error) {
	ms := storeOf(e)
	ids, err := ms.rdb.SMembers(ctx, ms.keys.RunMaps(runID)).Result()
	if err != nil {
		return false, nil, fmt.Errorf("mapstep: read the maps of run %s: %w", runID, err)
	}
	for _, id := range ids {
		v, err := ms.readSweep(ctx, id)
		if err != nil {
			return false, nil, err
		}
		if !v.md.exists || v.md.Owner != runID {
			continue
		}
		switch {
		case v.rb.exists && !v.rb.settled():
			return true, nil, nil
		case v.rb.exists && v.rbSignal:
			resumes = append(resumes, rbResumeID(runID, id, v.rb.Gen))
		case v.rb.exists:
		case !v.md.settled():
			return true, nil, nil
		case v.signalled:
			resumes = append(resumes, fwdResumeID(runID, id))
		}
	}
	return false, resumes, nil
}
