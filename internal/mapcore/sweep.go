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
	if v.rb.exists {
		return sw.rollback(ctx)
	}
	return sw.forward(ctx)
}

type mapSweep struct {
	e     *engine.Engine
	ms    mapStore
	mapID string
	opt   maptask.SweepOptions
	v     sweepView
	rec   maptask.Recovery
}

func (sw *mapSweep) forward(ctx context.Context) (maptask.Recovery, error) {
	md := sw.v.md
	sw.rec.Touched = sw.v.touched
	if sw.v.touched > sw.opt.StaleBefore {
		sw.rec.Live = true
		return sw.rec, nil
	}
	if md.settled() {
		if !sw.v.signalled {
			// Settled without a signal: the owner stopped the map itself
			// (Cancel/Undo mid-map) and goes on without a resume.
			return sw.rec, nil
		}
		return sw.rec, sw.resumeOwner(ctx, fwdResumeID(md.Owner, sw.mapID))
	}
	budget := md.BatchSize
	if !md.Failed && md.Settled >= md.Offset && md.Offset < md.Total {
		res, err := claimScript.Run(ctx, sw.ms.rdb, []string{sw.ms.keys.MapMeta(sw.mapID), sw.ms.keys.MapOffset(sw.mapID), sw.ms.keys.MapFailed(sw.mapID)}, md.Offset).Int64Slice()
		if err != nil {
			return sw.rec, fmt.Errorf("mapstep: claim the next batch of %s: %w", sw.mapID, err)
		}
		if res[0] >= 0 {
			sw.rec.Claims++
			from, to := int(res[0]), int(res[1])
			var items []codec.Raw
			if !md.Paged {
				if items, err = sw.ms.sourceRange(ctx, sw.mapID, from, to); err != nil {
					return sw.rec, err
				}
			}
			for i := from; i <= to; i++ {
				t := maptask.ElementTask{MapID: sw.mapID, Index: i}
				if items != nil {
					t.Input = items[i-from]
				}
				if err := sw.enqueueElement(ctx, t); err != nil {
					return sw.rec, err
				}
			}
			return sw.rec, nil // the claimed batch is the pass's budget
		}
	}
	err := sw.outstanding(ctx, sw.ms.keys.MapResults(sw.mapID), sw.ms.keys.MapMeta(sw.mapID), sw.v.lwm, min(md.Offset, md.Total), budget,
		func(p int) (string, string) {
			return ElementID(sw.mapID, p), maptask.ElementTask{MapID: sw.mapID, Index: p}.TaskID()
		},
		func(ctx context.Context, p int, fresh string) error {
			return sw.enqueueElement(ctx, maptask.ElementTask{MapID: sw.mapID, Index: p, Redelivery: fresh})
		})
	return sw.rec, err
}

func (sw *mapSweep) rollback(ctx context.Context) (maptask.Recovery, error) {
	rb, md := sw.v.rb, sw.v.md
	gen := rb.Gen
	sw.rec.Touched = sw.v.rbTouched
	if sw.v.rbTouched > sw.opt.StaleBefore {
		sw.rec.Live = true
		return sw.rec, nil
	}
	if rb.settled() {
		switch {
		case sw.v.handedOff && sw.v.rbSignal:
			return sw.rec, sw.resumeOwner(ctx, rbResumeID(md.Owner, sw.mapID, gen))
		case sw.v.handedOff:
			// Cannot happen through the handshake scripts (whichever of the
			// two runs second sees both halves), but the sweeper completes
			// the job's half rather than leave the owner waiting.
			ok, err := sw.ms.rdb.SetNX(ctx, sw.ms.keys.MapRbSignalled(sw.mapID, gen), "1", 0).Result()
			if err != nil {
				return sw.rec, fmt.Errorf("mapstep: claim the rollback signal of %s: %w", sw.mapID, err)
			}
			if !ok {
				return sw.rec, nil // claimed meanwhile: its claimer resumes
			}
			return sw.rec, sw.resumeOwner(ctx, rbResumeID(md.Owner, sw.mapID, gen))
		}
		// Not handed off: the owner has not saved its hand-off yet, or died
		// before; the run sweeper wakes it and it adopts the rollback.
		return sw.rec, nil
	}
	// The element of each claimed position (a re-triggered generation's
	// come from its work list, at most its claimed length).
	index := func(p int) int { return rb.Total - 1 - p }
	if rb.Work && rb.Offset > 0 {
		idx, err := sw.ms.indexes(ctx, sw.mapID, rb, 0, min(rb.Offset, rb.Total)-1)
		if err != nil {
			return sw.rec, err
		}
		index = func(p int) int { return idx[p] }
	}
	enqueue := func(ctx context.Context, p int, fresh string) error {
		err := dispatchRollbackTask(ctx, sw.e, maptask.RollbackTask{MapID: sw.mapID, Gen: gen, Pos: p, Index: index(p), Redelivery: fresh})
		if err == nil {
			sw.rec.Rollbacks++
		}
		return err
	}
	if rb.Settled >= rb.Offset && rb.Offset < rb.Total {
		res, err := claimScript.Run(ctx, sw.ms.rdb, []string{sw.ms.keys.MapRbMeta(sw.mapID, gen), sw.ms.keys.MapRbOffset(sw.mapID, gen)}, rb.Offset).Int64Slice()
		if err != nil {
			return sw.rec, fmt.Errorf("mapstep: claim the next rollback batch of %s: %w", sw.mapID, err)
		}
		if res[0] >= 0 {
			sw.rec.Claims++
			from, to := int(res[0]), int(res[1])
			idx, err := sw.ms.indexes(ctx, sw.mapID, rb, from, to)
			if err != nil {
				return sw.rec, err
			}
			for p := from; p <= to; p++ {
				if err := dispatchRollbackTask(ctx, sw.e, maptask.RollbackTask{MapID: sw.mapID, Gen: gen, Pos: p, Index: idx[p-from]}); err != nil {
					return sw.rec, err
				}
				sw.rec.Rollbacks++
			}
			return sw.rec, nil
		}
	}
	err := sw.outstanding(ctx, sw.ms.keys.MapRbResults(sw.mapID, gen), sw.ms.keys.MapRbMeta(sw.mapID, gen), sw.v.rbLwm, min(rb.Offset, rb.Total), rb.BatchSize,
		func(p int) (string, string) {
			return ElementID(sw.mapID, index(p)), maptask.RollbackTask{MapID: sw.mapID, Gen: gen, Pos: p}.TaskID()
		}, enqueue)
	return sw.rec, err
}

// outstanding re-enqueues claimed positions in [from, to) that have no
// outcome, whose element is not locked and whose task will not run, at most
// budget of them. It records in metaKey's "swept" field the first position
// without an outcome, so the next pass skips the settled prefix.
func (sw *mapSweep) outstanding(ctx context.Context, results, metaKey string, from, to, budget int,
	ids func(p int) (elementID, taskID string), enqueue func(ctx context.Context, p int, fresh string) error) error {
	const chunk = 500
	lwm := -1
	for lo := from; lo < to && budget > 0; lo += chunk {
		hi := min(lo+chunk, to)
		fields := make([]string, 0, hi-lo)
		for p := lo; p < hi; p++ {
			fields = append(fields, strconv.Itoa(p))
		}
		vals, err := sw.ms.rdb.HMGet(ctx, results, fields...).Result()
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
		if budget, err = sw.redeliver(ctx, open, budget, ids, enqueue); err != nil {
			return err
		}
	}
	if lwm < 0 {
		lwm = to
	}
	if lwm > from {
		if err := sw.ms.rdb.HSet(ctx, metaKey, "swept", lwm).Err(); err != nil {
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
func (sw *mapSweep) redeliver(ctx context.Context, open []int, budget int,
	ids func(p int) (elementID, taskID string), enqueue func(ctx context.Context, p int, fresh string) error) (int, error) {
	if len(open) == 0 || budget == 0 {
		return budget, nil
	}
	locks := make([]*redis.DurationCmd, len(open))
	if _, err := sw.ms.rdb.Pipelined(ctx, func(pl redis.Pipeliner) error {
		for j, p := range open {
			el, _ := ids(p)
			locks[j] = pl.PTTL(ctx, sw.ms.keys.ElemLock(el))
		}
		return nil
	}); err != nil {
		return budget, fmt.Errorf("mapstep: read element locks of %s: %w", sw.mapID, err)
	}
	for j, p := range open {
		if budget == 0 {
			break
		}
		_, id := ids(p)
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
		if err := enqueue(ctx, p, fresh); err != nil {
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
func (sw *mapSweep) held(ctx context.Context, id string, ttl time.Duration) error {
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
func (sw *mapSweep) idleFate(ctx context.Context, id string) (maptask.TaskFate, error) {
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
func (sw *mapSweep) redelivery(ctx context.Context, id string,
	fateOf func(ctx context.Context, id string) (maptask.TaskFate, error)) (suffix string, skip bool, err error) {
	for n := 1; n <= maxRedeliveries; n++ {
		suffix = "r" + strconv.Itoa(n)
		fate, err := fateOf(ctx, id+":"+suffix)
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
			if err := sw.opt.Tasks.DeleteTask(ctx, id+":"+suffix); err != nil {
				return "", false, err
			}
			sw.rec.Deleted++
		}
		sw.rec.Fresh++
		return suffix, false, nil
	}
	return "", true, nil
}

func (sw *mapSweep) enqueueElement(ctx context.Context, t maptask.ElementTask) error {
	q, ok := maptask.Adapt(engine.EnqueuerOf(sw.e))
	if !ok {
		return errors.New("mapstep: the engine's Enqueuer cannot enqueue element tasks (use worker.Client)")
	}
	if err := q.EnqueueElement(ctx, t); err != nil {
		return err
	}
	sw.rec.Elements++
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
	fate, err := sw.opt.Tasks.TaskFate(ctx, id)
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
		fresh, skip, err := sw.redelivery(ctx, id, sw.opt.Tasks.TaskFate)
		if err != nil || skip {
			return err
		}
		w.ID = id + ":" + fresh
	case maptask.TaskArchived:
		if err := sw.opt.Tasks.DeleteTask(ctx, id); err != nil {
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
