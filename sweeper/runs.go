package sweeper

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/internal/tracing"
	"github.com/goreactor/goreactor/reactor"
)

// runWalkLockExpiry is the expiry of the run lock the sweeper holds while it
// walks a finished run's tree (a heartbeat extends it).
const runWalkLockExpiry = 15 * time.Second

// RunConfig configures the run sweeper pass.
type RunConfig struct {
	// Engine reads runs. Required.
	Engine *reactor.Engine
	// Client is the Redis client. Required.
	Client redis.UniversalClient
	// Enqueuer wakes runs (a *worker.Client). Required.
	Enqueuer reactor.Enqueuer
	// Queue is the asynq queue the wake-ups go to, where the sweeper looks
	// for a run's queued task. Default: the Enqueuer's queue when it has a
	// Queue() method (worker.Client does), else the first queue
	// GOREACTOR_QUEUE names, else "goreactor".
	Queue string
	// StaleAfter is how long a run must have gone without a write before the
	// sweeper considers it lost. Default 10 s.
	StaleAfter time.Duration
	// Page bounds the runs examined per pass. Default 200.
	Page int
	// PausedRecheck is how long a paused run whose interrupt still waits
	// for payloads, with no deadline (or a deadline further off), is left
	// before a pass examines it again. Such a run is not lost: it waits
	// for a Continue, so N paused runs cost one examination each per
	// PausedRecheck (an HMGET and a touch beside the run's read), never a
	// wake-up. It is also the longest a run waits for the sweeper when a
	// Continue recorded its last payload but failed to enqueue the run's
	// wake-up (Continue returns that error; Engine.Resume wakes it at
	// once). A run with a deadline nearer than that is examined at the
	// deadline plus StaleAfter instead, when its timer wake-up should have
	// fired. Default 1 h.
	PausedRecheck time.Duration
	// Logger receives a line per recovery. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at its default.
func (c RunConfig) WithDefaults() RunConfig {
	if c.Queue == "" {
		c.Queue = envconfig.Queue()
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 10 * time.Second
	}
	if c.Page <= 0 {
		c.Page = 200
	}
	if c.PausedRecheck <= 0 {
		c.PausedRecheck = time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RunReport counts what one pass did.
type RunReport struct {
	// Examined is the number of index entries looked at.
	Examined int
	// Woken is the number of runs a resume was enqueued for. A run whose
	// sweep wake-up is still queued from an earlier pass is not woken again
	// and not counted.
	Woken int
	// Dropped is the number of index entries of finished or vanished runs
	// removed from the active index.
	Dropped int
	// Paused is the number of paused runs left alone because their
	// interrupt still waits for payloads before its deadline: their
	// entries are touched ahead, to be examined again at the deadline (plus
	// StaleAfter) or PausedRecheck later, whichever comes first.
	Paused int
}

// RunSweeper recovers runs whose worker died: non-terminal runs in the
// active index, untouched for StaleAfter, whose lock is free, that wait for
// no unsettled fan-out map and whose last wake-up task is no longer queued,
// get a resume with a fresh sweep id.
// Resume is idempotent, so a mistaken wake-up is harmless.
//
// A run found locked is looked at again when its lock would expire (the
// holder's heartbeat pushes that on while it lives), so a dead worker's
// run is woken by the first pass after its lock expired, not StaleAfter
// after the pass that last saw it locked.
//
// A paused run (an interrupt step waits for a Continue) is read with one
// HMGET of its interrupt record, and:
//   - while the interrupt waits short of payloads and before its deadline
//     it is not lost, whatever its age: it is left alone and its entry is
//     moved to its deadline plus StaleAfter, or PausedRecheck ahead when
//     that comes first (no deadline: PausedRecheck), so paused runs cost
//     a bounded pass, not a wake-up each;
//   - past its deadline short of payloads, it is woken unless its timer
//     wake-up (Run.Wake) is still deliverable: the resume times it out;
//   - when the interrupt holds every payload it accepts, it is woken
//     unless the continue's wake-up (resume:<run>:continue:<step>:<n>:<fill>) is
//     still deliverable: a Continue whose enqueue failed is recovered;
//   - in any other case (the record was adopted, timed out or closed by a
//     process that died before saving the run) it is a lost run like any.
type RunSweeper struct {
	cfg   RunConfig
	keys  keys.Keys
	insp  *asynq.Inspector
	store *store.Store
	locks *lock.Locker

	// beforeRemove, if set (tests only), runs between a pass's read of an
	// entry and its conditional removal.
	beforeRemove func(id string)
}

// NewRunSweeper returns a run sweeper.
func NewRunSweeper(cfg RunConfig) (*RunSweeper, error) {
	if q, ok := cfg.Enqueuer.(interface{ Queue() string }); ok {
		if cfg.Queue == "" {
			cfg.Queue = q.Queue()
		} else if cfg.Queue != q.Queue() {
			return nil, fmt.Errorf("sweeper: RunConfig.Queue %q is not the queue its Enqueuer uses (%q)", cfg.Queue, q.Queue())
		}
	}
	cfg = cfg.WithDefaults()
	if cfg.Engine == nil || cfg.Client == nil || cfg.Enqueuer == nil {
		return nil, errors.New("sweeper: RunConfig needs Engine, Client and Enqueuer")
	}
	k := keys.New(engine.Prefix(cfg.Engine))
	st, err := store.New(context.Background(), cfg.Client, k)
	if err != nil {
		return nil, fmt.Errorf("sweeper: %w", err)
	}
	return &RunSweeper{cfg: cfg, keys: k, insp: asynq.NewInspectorFromRedisClient(cfg.Client), store: st,
		locks: lock.New(cfg.Client, runWalkLockExpiry)}, nil
}

// Sweep runs one pass over the oldest-touched page of the active index.
//
// Every entry the pass examines and keeps is touched: its score becomes the
// time of the pass, so it is examined again only StaleAfter later and the
// next pass's page reaches the entries behind it. Without that, a page full
// of live long-running or still-queued runs would hide every lost run behind
// it for good.
//
// Every age the pass compares is the Redis server's: the pass reads TIME
// once, judges a run by the server time of its last state write (the `at`
// field of its state hash) and touches entries with the server time. The
// entries engines write carry their own clocks; they only bound the page.
//
// An error examining one run (an undecodable state, a failed inspection) is
// logged and the pass goes on with the next; the errors are returned joined
// with the report of what the pass did.
func (s *RunSweeper) Sweep(ctx context.Context) (RunReport, error) {
	var rep RunReport
	now, err := s.cfg.Client.Time(ctx).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read the server time: %w", err)
	}
	// The server time as the pass goes on: TIME once, plus the monotonic
	// time elapsed since (a duration, not a second clock).
	read := time.Now()
	cutoff := now.Add(-s.cfg.StaleAfter).UnixMilli()
	// Only entries last touched before the cutoff. With the scores: an
	// entry is removed only if its score is still the one read here.
	entries, err := s.cfg.Client.ZRangeByScoreWithScores(ctx, s.keys.Active(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff, 10), Count: int64(s.cfg.Page),
	}).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read active index: %w", err)
	}
	var errs []error
	for _, z := range entries {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		id, _ := z.Member.(string)
		rep.Examined++
		clock := func() time.Time { return now.Add(time.Since(read)) }
		woken, dropped, due, hold, err := s.sweepRun(ctx, id, z.Score, cutoff, clock)
		if !dropped {
			// Also when the run could not be examined: it must not hold
			// the head of the index for ever.
			at := clock()
			if !due.IsZero() {
				// Looked at again when it may be lost, not StaleAfter
				// from now: a killed worker's run is woken at the first
				// pass after its lock expired.
				at = due.Add(-s.cfg.StaleAfter)
			}
			var terr error
			if hold {
				// A waiting paused run, moved far ahead: only if no
				// writer re-indexed it since the read.
				terr = s.touchIf(ctx, id, z.Score, at)
				rep.Paused++
			} else {
				terr = s.touch(ctx, id, at)
			}
			if err == nil {
				err = terr
			}
		}
		if err != nil {
			s.cfg.Logger.Error("cannot sweep run", "event", "reactor.sweep.error", "run", id, "error", err)
			errs = append(errs, fmt.Errorf("sweeper: run %s: %w", id, err))
		}
		if woken {
			rep.Woken++
		}
		if dropped && err == nil {
			rep.Dropped++
		}
	}
	return rep, errors.Join(errs...)
}

// touch moves id's active entry to now, the server time of its
// examination (or, for a run sweepRun can tell more of, StaleAfter before
// it is due again), if it still has one, so that a long pass does not leave
// its first entries due again at its end. XX never re-adds an entry a
// terminal write removed meanwhile.
func (s *RunSweeper) touch(ctx context.Context, id string, now time.Time) error {
	return s.cfg.Client.ZAddXX(ctx, s.keys.Active(), redis.Z{Score: float64(now.UnixMilli()), Member: id}).Err()
}

var (
	//go:embed lua/touch_if.lua
	touchIfSrc    string
	touchIfScript = redis.NewScript(touchIfSrc)
)

// touchIf moves id's active entry to at if it still has the score the pass
// read (touch_if.lua): a writer that re-indexed the run meanwhile keeps its
// score.
func (s *RunSweeper) touchIf(ctx context.Context, id string, score float64, at time.Time) error {
	err := touchIfScript.Run(ctx, s.cfg.Client, []string{s.keys.Active()}, id,
		strconv.FormatFloat(score, 'f', -1, 64), at.UnixMilli()).Err()
	if err != nil {
		return fmt.Errorf("sweeper: touch the entry of paused run %s: %w", id, err)
	}
	return nil
}

// drop removes id's active entry if it still has the score the pass read.
// An Undo or a resume that made the run live again meanwhile re-indexed it
// with another score, and keeps its entry; dropped is false then, and the
// entry is touched like any kept one.
// underRunLock runs fn holding run id's lock, taken with one try: done is
// false (and fn not called) when another process holds it (the run is being
// created, executed, or finished by its own process).
func (s *RunSweeper) underRunLock(ctx context.Context, id string, fn func(ctx context.Context) error) (done bool, err error) {
	lease, err := s.locks.TryAcquire(ctx, s.keys.RunLock(id))
	if errors.Is(err, lock.ErrHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	held := lease.Keep(ctx)
	err = fn(held)
	if lock.Lost(held) && err == nil {
		err = fmt.Errorf("sweeper: lost the lock of run %s during its retention walk", id)
	}
	_ = lease.Release(context.WithoutCancel(ctx))
	return err == nil, err
}

func (s *RunSweeper) drop(ctx context.Context, id string, score float64) (bool, error) {
	if s.beforeRemove != nil {
		s.beforeRemove(id)
	}
	return store.RemoveIfScore(ctx, s.cfg.Client, s.keys.Active(), id, score)
}

// lastWrite returns the server time (ms) of run id's last state write: the
// `at` field every state write stamps, or, for a state written before writes
// stamped it, the writer's own UpdatedAt.
func (s *RunSweeper) lastWrite(ctx context.Context, id string, run *reactor.Run) (int64, error) {
	at, err := s.cfg.Client.HGet(ctx, s.keys.RunState(id), "at").Int64()
	switch {
	case errors.Is(err, redis.Nil):
		return run.UpdatedAt.UnixMilli(), nil
	case err != nil:
		return 0, fmt.Errorf("sweeper: read the write time of run %s: %w", id, err)
	}
	return at, nil
}

// pauseRecord is a paused run's interrupt record, as one HMGET of its state
// hash reads it (store/lua/interrupt.lua names the fields), with the
// server time of the run's last state write.
type pauseRecord struct {
	at                int64 // 0: not stamped
	path, instance    string
	accepts, received int
	state             string
	deadline          int64  // server ms; 0: none
	fills             string // times it filled up: its continue wake-up's id
}

// readPause reads run id's interrupt record and last write time.
func (s *RunSweeper) readPause(ctx context.Context, id string) (pauseRecord, error) {
	v, err := s.cfg.Client.HMGet(ctx, s.keys.RunState(id), "at", "iw", "ii", "ia", "in", "is", "idl", "if").Result()
	if err != nil {
		return pauseRecord{}, fmt.Errorf("sweeper: read the interrupt of run %s: %w", id, err)
	}
	str := func(i int) string { x, _ := v[i].(string); return x }
	num := func(i int) int64 { n, _ := strconv.ParseInt(str(i), 10, 64); return n }
	return pauseRecord{at: num(0), path: str(1), instance: str(2), accepts: int(num(3)), received: int(num(4)),
		state: str(5), deadline: num(6), fills: str(7)}, nil
}

// sweepRun examines run id, woken when it enqueued a wake-up and dropped
// when it removed its entry. due, when not zero, is the server time at which
// a kept entry may need the sweeper next: the end of a held lock, or
// StaleAfter past a recent write, or a waiting paused run's next look; hold
// is true for the last (the entry moves far ahead, and only if its score is
// still the one read). clock reads the server time.
func (s *RunSweeper) sweepRun(ctx context.Context, id string, score float64, cutoff int64,
	clock func() time.Time) (woken, dropped bool, due time.Time, hold bool, err error) {
	run, err := s.cfg.Engine.Get(ctx, id)
	if errors.Is(err, reactor.ErrNotFound) {
		// No state: the run is gone (expired, or its creator died before
		// the create), or it is being created right now. Its creator takes
		// the lock before it indexes the run and keeps it until the state
		// exists, so a held lock says "being created", whatever the clocks.
		// A run that expired before its tree got the retention (its process
		// died in between, and the sweeper came after the run's own
		// retention) leaves the tree behind: it goes now.
		done, err := s.underRunLock(ctx, id, func(ctx context.Context) error {
			return s.store.RetainTree(ctx, id, time.Millisecond)
		})
		if err != nil || !done {
			return false, false, due, false, err
		}
		dropped, err := s.drop(ctx, id, score)
		return false, dropped, due, false, err
	}
	if err != nil {
		return false, false, due, false, err
	}
	if run.Status.Terminal() {
		// A finished run still indexed may have died between its terminal
		// write and the retention of its tree (maps, element runs): finish
		// that first, with what is left of the run's own retention, so the
		// tree expires with the run. Under the run's lock: an Undo that
		// makes the run live again takes the expiry off the tree, and must
		// not have it put back by a walk that started before it.
		done, err := s.underRunLock(ctx, id, func(ctx context.Context) error {
			ttl, err := s.cfg.Client.PTTL(ctx, s.keys.RunState(id)).Result()
			if err != nil {
				return fmt.Errorf("sweeper: read the retention of run %s: %w", id, err)
			}
			switch {
			case ttl == -1:
				// No expiry: a finished run that waits for a person to
				// resolve a conflicted undo keeps its tree as long.
				ttl = 0
			case ttl <= 0:
				ttl = time.Millisecond // expired meanwhile: the tree goes too
			}
			return s.store.RetainTree(ctx, id, ttl)
		})
		if err != nil || !done {
			return false, false, due, false, err
		}
		dropped, err := s.drop(ctx, id, score)
		if err != nil || !dropped {
			return false, dropped, due, false, err
		}
		// Left over only if an unindex failed. Should an Undo re-index the
		// run and index a map rollback between the removal and this, the
		// cost is one needless wake-up (the owner hands off again).
		return false, true, due, false, s.cfg.Client.Del(ctx, s.keys.RunMaps(id)).Err()
	}
	var at int64
	// full is the wake-up id of a paused run whose interrupt holds every
	// payload it accepts ("" otherwise).
	full := ""
	if run.Status == reactor.StatusPaused {
		p, err := s.readPause(ctx, id)
		if err != nil {
			return false, false, due, false, err
		}
		at = p.at
		if at == 0 {
			at = run.UpdatedAt.UnixMilli()
		}
		waits := run.Paused != nil && p.path == run.Paused.Step && p.state == store.InterruptWaiting
		now := clock()
		switch {
		case waits && p.received < p.accepts && (p.deadline == 0 || now.UnixMilli() < p.deadline):
			// Waiting for a Continue: not lost, however old. Looked at
			// again once its timer should have fired, or PausedRecheck
			// from now.
			next := now.Add(s.cfg.PausedRecheck)
			if p.deadline > 0 {
				if d := time.UnixMilli(p.deadline).Add(s.cfg.StaleAfter); d.Before(next) {
					next = d
				}
			}
			return false, false, next, true, nil
		case waits && p.received >= p.accepts:
			// Every payload is in: the Continue that recorded the last
			// one enqueued this (or failed to).
			full = fmt.Sprintf("resume:%s:continue:%s:%s:%s", id, p.path, p.instance, p.fills)
		}
		// Past its deadline short of payloads: its timer (Run.Wake) wakes
		// it, or this pass does. Adopted, timed out or closed while still
		// saved paused: its process died before it saved the run.
	} else if at, err = s.lastWrite(ctx, id, run); err != nil {
		return false, false, due, false, err
	}
	if at > cutoff {
		// Written since the entry was touched: due StaleAfter after that
		// write.
		return false, false, time.UnixMilli(at).Add(s.cfg.StaleAfter), false, nil
	}
	// A held lock says the run executes somewhere; its expiry is the
	// earliest it can be lost (the holder's heartbeat pushes it on).
	ttl, err := s.cfg.Client.PTTL(ctx, s.keys.RunLock(id)).Result()
	switch {
	case err != nil:
		return false, false, due, false, fmt.Errorf("sweeper: read the lock of run %s: %w", id, err)
	case ttl > 0:
		return false, false, clock().Add(ttl), false, nil
	case ttl == -1:
		return false, false, due, false, nil // held for good (no expiry): left alone, looked at again StaleAfter later
	}
	// A run parked on a step that runs as its own task, whose attempt a
	// worker runs (its lease live), is resumed by that attempt; looked at
	// again when the lease would end.
	if until, err := s.store.StepLeaseUntil(ctx, id); err != nil {
		return false, false, due, false, err
	} else if at := time.UnixMilli(until); at.After(clock()) {
		return false, false, at, false, nil
	}
	// A run waiting for a fan-out map is resumed by the map's workers (or
	// by the map sweeper) when the map settles; waking it earlier would
	// only make it hand off again.
	waiting, resumes, err := mapcore.Awaiting(ctx, s.cfg.Engine, id)
	if err != nil || waiting {
		return false, false, due, false, err
	}
	// A settled map's own resume (or the map sweeper's redelivery of it)
	// still queued will wake the run.
	for _, r := range resumes {
		for _, tid := range []string{r, r + ":r1", r + ":r2", r + ":r3"} {
			state, found, err := s.taskState(s.cfg.Queue, tid)
			if err != nil {
				return false, false, due, false, err
			}
			if found && (deliverable(state) || state == asynq.TaskStateActive) {
				return false, false, due, false, nil
			}
		}
	}
	sweepID := fmt.Sprintf("resume:%s:sweep:%d", id, run.Version)
	// The run's wake-ups are on its own queue (reactor.WithQueue), if it
	// has one.
	queue := s.cfg.Queue
	if run.Queue != "" {
		queue = run.Queue
	}
	if full != "" {
		// Not Run.Wake: that is the interrupt's timer, perhaps far ahead,
		// and the run has its payloads now.
		state, found, err := s.taskState(queue, full)
		if err != nil {
			return false, false, due, false, err
		}
		if found && deliverable(state) {
			return false, false, due, false, nil // the continue's wake-up will be delivered
		}
	} else if run.Wake != "" && run.Wake != sweepID {
		state, found, err := s.taskState(queue, run.Wake)
		if err != nil {
			return false, false, due, false, err
		}
		if found && deliverable(state) {
			return false, false, due, false, nil // it will be delivered
		}
		if found && state == asynq.TaskStateActive {
			// Active without the run's lock: its worker died, or took the
			// task a moment ago and is about to take the lock. A worker
			// takes it within milliseconds: a lock still free after
			// justTaken says the worker is gone.
			taken, err := s.lockTakenWithin(ctx, id, justTaken)
			if err != nil || taken {
				return false, false, due, false, err
			}
		}
		// archived or completed: nothing will deliver it again.
	}
	// The run's own wake-up is not queued; an earlier pass's may be (the
	// sweeper records its wake-ups nowhere but in the queue).
	w := reactor.Wake{ID: sweepID, RunID: id, Reactor: run.Reactor, Queue: run.Queue}
	state, found, err := s.taskState(queue, sweepID)
	if err != nil {
		return false, false, due, false, err
	}
	if found {
		if deliverable(state) {
			return false, false, due, false, nil // woken by an earlier pass
		}
		// The id is spent: its worker died with it active, or it was
		// archived. Enqueueing it again would be an id conflict, a silent
		// no-op, and the run would wait for asynq's lease recovery (a minute
		// and more) or for ever. Wake the run under a fresh id: the first
		// of r1..r3 no task holds, so a later pass finds that wake-up
		// queued instead of adding another.
		fresh, err := s.freshID(queue, sweepID)
		if err != nil || fresh == "" {
			return false, false, due, false, err
		}
		w.ID = fresh
	}
	tctx, span := tracing.StartIn(ctx, engine.Tracer(s.cfg.Engine), run.TraceID, "reactor.sweeper.recover",
		attribute.String("reactor.run.id", id), attribute.String("reactor.sweeper.recovery", "run"))
	err = s.cfg.Enqueuer.Enqueue(tctx, w)
	span.End()
	if err != nil {
		return false, false, due, false, err
	}
	s.cfg.Logger.Info("woke a lost run", "event", "reactor.sweep.run", "run", id, "status", run.Status, "task", w.ID)
	return true, false, due, false, nil
}

// freshID returns the first of id:r1, id:r2, id:r3 free for a new wake-up,
// or "" when one of them is still deliverable (an earlier pass woke the run)
// or all are spent (asynq's own recovery takes over).
func (s *RunSweeper) freshID(queue, id string) (string, error) {
	for n := 1; n <= 3; n++ {
		fid := id + ":r" + strconv.Itoa(n)
		state, found, err := s.taskState(queue, fid)
		switch {
		case err != nil:
			return "", err
		case !found:
			return fid, nil
		case deliverable(state):
			return "", nil
		case state == asynq.TaskStateArchived || state == asynq.TaskStateCompleted:
			if err := s.insp.DeleteTask(queue, fid); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
				return "", fmt.Errorf("sweeper: delete task %s: %w", fid, err)
			}
			return fid, nil
		}
	}
	return "", nil
}

// taskState returns the state of task id on queue; found is
// false when the task (or the whole queue) does not exist.
func (s *RunSweeper) taskState(queue, id string) (state asynq.TaskState, found bool, err error) {
	info, err := s.insp.GetTaskInfo(queue, id)
	switch {
	case err == nil:
		return info.State, true, nil
	case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		return 0, false, nil
	default:
		return 0, false, fmt.Errorf("sweeper: inspect task %s: %w", id, err)
	}
}

// deliverable reports whether asynq will deliver a task in state to a worker.
func deliverable(state asynq.TaskState) bool {
	switch state {
	case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry:
		return true
	}
	return false
}

// justTaken is how long the run sweeper gives a worker that has taken a
// run's wake-up task to take the run's lock before it calls the worker
// dead: far above the moment a live worker needs, far below the lock
// expiry that a dead worker's run already waited out.
const justTaken = 250 * time.Millisecond

// lockTakenWithin reports whether run id's lock is taken within d, looking
// every 25 ms.
func (s *RunSweeper) lockTakenWithin(ctx context.Context, id string, d time.Duration) (bool, error) {
	t := time.NewTicker(25 * time.Millisecond)
	defer t.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-t.C:
		}
		ttl, err := s.cfg.Client.PTTL(ctx, s.keys.RunLock(id)).Result()
		if err != nil {
			return false, fmt.Errorf("sweeper: read the lock of run %s: %w", id, err)
		}
		if ttl > 0 || ttl == -1 {
			return true, nil
		}
	}
	return false, nil
}
