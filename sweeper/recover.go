package sweeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/reactor"
)

// ErrNotLive refuses RecoverRun on a run that is finished, unknown, or a
// map element (an element's work is recovered with its map, from the
// owner run).
var ErrNotLive = errors.New("sweeper: the run is not live: there is nothing to recover")

// ErrBusy is RecoverRun's answer while a sweeper pass holds the leader lock
// for longer than RecoverRun waits: try again in a moment (the pass may
// recover the run itself).
var ErrBusy = errors.New("sweeper: a sweeper pass is under way (it holds the leader lock); try again in a moment")

// recoverLeaderWait is how long RecoverRun waits for a pass to release the
// leader lock. A pass over a page of runs and maps takes milliseconds to a
// few seconds.
const recoverLeaderWait = 5 * time.Second

// RunRecovery is what RecoverRun did for one run.
type RunRecovery struct {
	// Woken is set when a wake-up of the run itself was enqueued.
	Woken bool
	// Locked is set when the run's lock is held: a worker executes it
	// now, so nothing was enqueued for the run itself.
	Locked bool
	// Paused is set when the run is paused at an interrupt that still
	// waits for payloads before its deadline: it is not lost, and nothing
	// was enqueued for it (Continue it, or Cancel it).
	Paused bool
	// Maps counts what was enqueued for the run's fan-out maps (forward
	// elements, rollback jobs, batch claims, owner resumes).
	Maps MapReport
}

// Recovered is the number of tasks enqueued.
func (r RunRecovery) Recovered() int {
	n := r.Maps.Recovered()
	if r.Woken {
		n++
	}
	return n
}

// RecoverRun is a pass of the run and map sweepers over run id alone, now,
// whatever its age: what the next passes would re-enqueue for it once it is
// StaleAfter old, by the same rules (the run's wake-up when its lock is
// free and nothing of it is queued; the lost element tasks, rollback jobs,
// claims and owner resumes of its fan-out maps, at most a batch per map).
// Nothing is enqueued that is still queued or held, so asking twice costs
// nothing more. An operator asks for it (the dashboard's re-dispatch) when
// a run stalled because its tasks were lost.
//
// It holds the leader lock while it works, so it never overlaps a pass;
// while a pass holds the lock it waits a few seconds, then returns ErrBusy.
// A finished or unknown run, or a map element's run, is ErrNotLive.
//
// An active task whose worker died needs two looks some time apart before
// it is called dead (TaskFate); a RecoverRun is one look, and the sweeper's
// next pass (or a second RecoverRun) finishes the verdict.
func (s *Sweeper) RecoverRun(ctx context.Context, id string) (RunRecovery, error) {
	var rec RunRecovery
	if err := keys.ValidateID(id); err != nil {
		return rec, fmt.Errorf("sweeper: run id: %w", err)
	}
	if _, _, elem := keys.SplitElementID(id); elem {
		return rec, fmt.Errorf("%w: %s is a map element; recover its owner run", ErrNotLive, id)
	}
	run, err := s.cfg.Engine.Get(ctx, id)
	switch {
	case errors.Is(err, reactor.ErrNotFound):
		return rec, fmt.Errorf("%w: no run %s is stored", ErrNotLive, id)
	case err != nil:
		return rec, err
	case run.Status.Terminal():
		return rec, fmt.Errorf("%w: run %s is %s", ErrNotLive, id, run.Status)
	}
	lease, err := s.leaderWithin(ctx, recoverLeaderWait)
	if err != nil {
		return rec, err
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	defer lease.Stop()
	lctx := lease.Keep(ctx)

	rdb := s.runs.cfg.Client
	now, err := rdb.Time(lctx).Result()
	if err != nil {
		return rec, fmt.Errorf("sweeper: read the server time: %w", err)
	}
	read := time.Now()
	clock := func() time.Time { return now.Add(time.Since(read)) }
	score, err := rdb.ZScore(lctx, s.runs.keys.Active(), id).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return rec, fmt.Errorf("sweeper: read the active entry of run %s: %w", id, err)
	}
	// A cutoff of now: every write is old enough, as if StaleAfter had
	// passed since the last one.
	woken, _, due, paused, err := s.runs.sweepRun(lctx, id, score, now.UnixMilli()+1, clock)
	if err != nil {
		return rec, err
	}
	rec.Woken, rec.Locked, rec.Paused = woken, !woken && !due.IsZero() && !paused, paused
	mapIDs, err := rdb.SMembers(lctx, s.runs.keys.RunMaps(id)).Result()
	if err != nil {
		return rec, fmt.Errorf("sweeper: read the maps of run %s: %w", id, err)
	}
	// StaleBefore now: every map is examined, however recently it settled
	// (0 would not do: it is older than any settle).
	opt := maptask.SweepOptions{Tasks: s.maps.tasks, StaleBefore: now.UnixMilli() + 1, IdleAfter: idleAfter}
	var errs []error
	for _, m := range mapIDs {
		_, err := rdb.ZScore(lctx, s.maps.keys.Maps(), m).Result()
		if errors.Is(err, redis.Nil) {
			continue // no outstanding work: the map index holds every map that has some
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sweeper: map %s: %w", m, err))
			continue
		}
		r, err := mapcore.RecoverMap(lctx, s.cfg.Engine, m, opt)
		rec.Maps.Examined++
		rec.Maps.add(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("sweeper: map %s: %w", m, err))
		}
	}
	if lock.Lost(lctx) {
		errs = append(errs, errors.New("sweeper: leader lock lost during the recovery of a run"))
	}
	s.cfg.Logger.Info("recovered a run on request", "event", "reactor.sweep.recover_run", "run", id, "status", run.Status,
		"woken", rec.Woken, "locked", rec.Locked, "maps", rec.Maps.Examined, "elements", rec.Maps.Elements,
		"rollbacks", rec.Maps.Rollbacks, "claims", rec.Maps.Claims, "resumes", rec.Maps.Resumes)
	return rec, errors.Join(errs...)
}

// leaderWithin takes the leader lock, trying again while a pass holds it,
// for up to wait.
func (s *Sweeper) leaderWithin(ctx context.Context, wait time.Duration) (*lock.Lease, error) {
	deadline := time.Now().Add(wait)
	for {
		lease, err := s.locker.TryAcquire(ctx, s.leader)
		switch {
		case err == nil:
			return lease, nil
		case !errors.Is(err, lock.ErrHeld):
			return nil, fmt.Errorf("sweeper: leader lock: %w", err)
		case time.Now().After(deadline):
			return nil, ErrBusy
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
