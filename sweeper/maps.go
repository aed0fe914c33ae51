package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/store"
	// Imported for its registration of the map entry points (internal/maptask).
	_ "github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// MapConfig configures the map sweeper.
type MapConfig struct {
	// Engine reads runs and enqueues through its Enqueuer (a
	// *worker.Client). Required. It needs no reactor definitions.
	Engine *reactor.Engine
	// Queue is the asynq queue the map tasks go to. Default: the Engine's
	// Enqueuer's queue when it has a Queue() method, else the first queue
	// GOREACTOR_QUEUE names, else "goreactor".
	Queue string
	// StaleAfter is how long a map must have settled nothing before the
	// sweeper examines it, and how long after examining a map it looks
	// again. Default 10 s.
	StaleAfter time.Duration
	// Page bounds the maps examined per pass. Default 100.
	Page int
	// Logger receives a line per recovery. Default slog.Default().
	Logger *slog.Logger
}

// MapReport counts what one map sweeper pass did.
type MapReport struct {
	// Examined is the number of index entries looked at; Live of them were
	// making progress and were left alone.
	Examined, Live int
	// Elements and Rollbacks are element tasks and rollback jobs enqueued
	// again; Claims are batches claimed in place of a lost trigger; Resumes
	// are owner resumes enqueued again.
	Elements, Rollbacks, Claims, Resumes int
	// Fresh counts redeliveries under a fresh task id (the task died
	// active); Deleted counts archived tasks deleted before reuse.
	Fresh, Deleted int
	// Removed counts maps taken off the index (adopted, or never started).
	Removed int
	// Soonest, when positive, is how soon after the pass a map it kept
	// asked to be examined again, sooner than StaleAfter (an element lock
	// about to lapse, a task that needs a second look).
	Soonest time.Duration
}

func (r *MapReport) add(rec maptask.Recovery) {
	r.Elements += rec.Elements
	r.Rollbacks += rec.Rollbacks
	r.Claims += rec.Claims
	r.Resumes += rec.Resumes
	r.Fresh += rec.Fresh
	r.Deleted += rec.Deleted
	if rec.Live {
		r.Live++
	}
}

// Recovered is the number of tasks the pass enqueued.
func (r MapReport) Recovered() int { return r.Elements + r.Rollbacks + r.Resumes }

// MapSweeper recovers lost fan-out map work: forward element tasks and
// rollback jobs whose worker died or whose enqueue never happened, lost
// batch claims, and lost owner resumes (see maptask.RecoverMap). It reads
// its work from the map index, a page at a time, oldest-examined first.
type MapSweeper struct {
	cfg   MapConfig
	keys  keys.Keys
	rdb   redis.UniversalClient
	tasks *queueTasks
}

// NewMapSweeper returns a map sweeper.
func NewMapSweeper(cfg MapConfig) (*MapSweeper, error) {
	if cfg.Engine == nil || engine.EnqueuerOf(cfg.Engine) == nil {
		return nil, errors.New("sweeper: MapConfig needs an Engine with an Enqueuer (worker.Client)")
	}
	if q, ok := engine.EnqueuerOf(cfg.Engine).(interface{ Queue() string }); ok {
		if cfg.Queue == "" {
			cfg.Queue = q.Queue()
		} else if cfg.Queue != q.Queue() {
			return nil, fmt.Errorf("sweeper: MapConfig.Queue %q is not the queue its Enqueuer uses (%q)", cfg.Queue, q.Queue())
		}
	}
	if cfg.Queue == "" {
		cfg.Queue = envconfig.Queue()
	}
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = 10 * time.Second
	}
	if cfg.Page <= 0 {
		cfg.Page = 100
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rdb := engine.Client(cfg.Engine)
	tasks := newQueueTasks(rdb, cfg.Queue, enqueuerShards(engine.EnqueuerOf(cfg.Engine)), engine.Prefix(cfg.Engine))
	return &MapSweeper{cfg: cfg, keys: keys.New(engine.Prefix(cfg.Engine)), rdb: rdb, tasks: tasks}, nil
}

// enqueuerShards is the shard count of q's map tasks: a worker.Client's
// Shards (it puts element tasks and rollback jobs on that many queues), 1
// for an Enqueuer that does not say. The sweeper re-enqueues through q, so
// it looks for the tasks where q puts them.
func enqueuerShards(q any) int {
	if s, ok := q.(interface{ Shards() int }); ok && s.Shards() > 1 {
		return s.Shards()
	}
	return 1
}

// ownerGone reports whether the owner of map mapID, a map without keys, is
// gone or finished, so that the map will never be created: the owner's id
// is the map id up to a "~" (mapstep.MapID), and as step names may hold a
// "~" too, every such prefix that names a live run keeps the map.
func (s *MapSweeper) ownerGone(ctx context.Context, mapID string) (gone bool, owners []string, err error) {
	for i := strings.LastIndex(mapID, "~"); i > 0; i = strings.LastIndex(mapID[:i], "~") {
		owner := mapID[:i]
		if keys.ValidateID(owner) != nil {
			continue
		}
		owners = append(owners, owner)
		run, err := s.cfg.Engine.Get(ctx, owner)
		switch {
		case errors.Is(err, reactor.ErrNotFound):
			// Gone, or being created: a run being created holds its lock.
			locked, err := engine.Locked(s.cfg.Engine, ctx, owner)
			if err != nil || locked {
				return false, nil, err
			}
		case err != nil:
			return false, nil, err
		case !run.Status.Terminal():
			return false, nil, nil
		}
	}
	return true, owners, nil
}

// nextLook is the score that makes a map kept in the index due again at
// the right time (an entry is due StaleAfter after its score): a map that
// settled recently is due StaleAfter after that settle, not after this
// pass, so that one whose workers died just after a settle waits no longer
// than one that stalled long ago; a map whose pass asked to be looked at
// sooner (a verdict that needs a second look, an element lock that is
// about to lapse) is due then; any other, StaleAfter from now.
func (s *MapSweeper) nextLook(rec maptask.Recovery, now time.Time) time.Time {
	at := now
	if rec.Live && rec.Touched > 0 {
		at = time.UnixMilli(rec.Touched)
	}
	if rec.LookAgain > 0 && rec.LookAgain < s.cfg.StaleAfter {
		at = now.Add(rec.LookAgain - s.cfg.StaleAfter)
	}
	return at
}

// Sweep runs one pass over a page of the map index: entries not examined
// for StaleAfter, oldest first. Every entry it keeps is touched, so the
// next pass reaches the entries behind it. An error on one map is logged
// and the pass goes on; the errors are returned joined.
func (s *MapSweeper) Sweep(ctx context.Context) (MapReport, error) {
	var rep MapReport
	srvNow, err := s.rdb.Time(ctx).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read the server time: %w", err)
	}
	// One clock for every age: the server's. Settles stamp the maps with
	// it and the pass touches the entries it keeps with it.
	// The server time as the pass goes on: TIME once, plus the monotonic
	// time elapsed since (a duration, not a second clock).
	now, read := srvNow, time.Now()
	cutoff := now.Add(-s.cfg.StaleAfter).UnixMilli()
	entries, err := s.rdb.ZRangeByScoreWithScores(ctx, s.keys.Maps(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff, 10), Count: int64(s.cfg.Page),
	}).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read map index: %w", err)
	}
	opt := maptask.SweepOptions{Tasks: s.tasks, StaleBefore: cutoff, StaleAfter: s.cfg.StaleAfter, IdleAfter: idleAfter}
	var errs []error
	for _, z := range entries {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		id, _ := z.Member.(string)
		rep.Examined++
		rec, err := mapcore.RecoverMap(ctx, s.cfg.Engine, id, opt)
		rep.add(rec)
		var owners []string
		if rec.Owner != "" {
			owners = []string{rec.Owner}
		}
		if err == nil && rec.Missing {
			// No keys: the owner indexed the map and has not created it
			// yet (it is about to, or it died first and the run sweeper
			// will revive it, which creates the map), or the map and its
			// owner are gone (expired). Only the last may drop the entry.
			rec.Done, owners, err = s.ownerGone(ctx, id)
		}
		switch {
		case err == nil && rec.Done:
			// Adopted, or its owner is gone. The entry goes, unless an
			// owner re-indexed it meanwhile (a rollback starting indexes
			// the map again).
			var removed bool
			removed, err = store.RemoveIfScore(ctx, s.rdb, s.keys.Maps(), id, z.Score)
			if removed {
				rep.Removed++
				// The owner's set of maps has no expiry of its own.
				for _, o := range owners {
					if serr := s.rdb.SRem(ctx, s.keys.RunMaps(o), id).Err(); err == nil {
						err = serr
					}
				}
			}
		default:
			if d := rec.LookAgain; d > 0 && d < s.cfg.StaleAfter && (rep.Soonest == 0 || d < rep.Soonest) {
				rep.Soonest = d
			}
			if terr := s.rdb.ZAddXX(ctx, s.keys.Maps(), redis.Z{Score: float64(s.nextLook(rec, now.Add(time.Since(read))).UnixMilli()), Member: id}).Err(); err == nil {
				err = terr
			}
		}
		if err != nil {
			s.cfg.Logger.Error("cannot sweep map", "event", "reactor.sweep.error", "map", id, "error", err)
			errs = append(errs, fmt.Errorf("sweeper: map %s: %w", id, err))
		}
		if rec.Dispatched() > 0 || rec.Claims > 0 {
			s.cfg.Logger.Info("recovered map work", "event", "reactor.sweep.map", "map", id,
				"elements", rec.Elements, "rollbacks", rec.Rollbacks, "claims", rec.Claims, "resumes", rec.Resumes,
				"fresh_ids", rec.Fresh, "deleted", rec.Deleted)
		}
	}
	return rep, errors.Join(errs...)
}
