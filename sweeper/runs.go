package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// RunConfig configures the run sweeper pass.
type RunConfig struct {
	// Engine reads runs. Required.
	Engine *reactor.Engine
	// Client is the Redis client. Required.
	Client redis.UniversalClient
	// Enqueuer wakes runs (a *worker.Client). Required.
	Enqueuer reactor.Enqueuer
	// Queue is the asynq queue the wake-ups go to, where the sweeper looks
	// for a run's queued task. Default "goreactor".
	Queue string
	// StaleAfter is how long a run must have gone without a write before the
	// sweeper considers it lost. Default 10 s.
	StaleAfter time.Duration
	// Page bounds the runs examined per pass. Default 200.
	Page int
	// Logger receives a line per recovery. Default slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every unset field at its default.
func (c RunConfig) WithDefaults() RunConfig {
	if c.Queue == "" {
		c.Queue = "goreactor"
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = 10 * time.Second
	}
	if c.Page <= 0 {
		c.Page = 200
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
	// Woken is the number of runs a resume was enqueued for.
	Woken int
	// Dropped is the number of index entries of finished or vanished runs
	// removed from the active index.
	Dropped int
}

// RunSweeper recovers runs whose worker died: non-terminal runs in the
// active index, untouched for StaleAfter, whose lock is free and whose last
// wake-up task is no longer queued, get a resume with a fresh sweep id.
// Resume is idempotent, so a mistaken wake-up is harmless.
type RunSweeper struct {
	cfg  RunConfig
	keys keys.Keys
	insp *asynq.Inspector
}

// NewRunSweeper returns a run sweeper.
func NewRunSweeper(cfg RunConfig) (*RunSweeper, error) {
	cfg = cfg.WithDefaults()
	if cfg.Engine == nil || cfg.Client == nil || cfg.Enqueuer == nil {
		return nil, errors.New("sweeper: RunConfig needs Engine, Client and Enqueuer")
	}
	return &RunSweeper{cfg: cfg, keys: keys.New(cfg.Engine.Prefix()), insp: asynq.NewInspectorFromRedisClient(cfg.Client)}, nil
}

// Sweep runs one pass over the oldest-touched page of the active index.
func (s *RunSweeper) Sweep(ctx context.Context) (RunReport, error) {
	var rep RunReport
	now := time.Now()
	cutoff := now.Add(-s.cfg.StaleAfter).UnixMilli()
	// Only entries last touched before the cutoff: a run being created sits
	// in the index a moment before its state exists, and must not be
	// dropped for it.
	ids, err := s.cfg.Client.ZRangeByScore(ctx, s.keys.Active(), &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff, 10), Count: int64(s.cfg.Page),
	}).Result()
	if err != nil {
		return rep, fmt.Errorf("sweeper: read active index: %w", err)
	}
	for _, id := range ids {
		rep.Examined++
		woken, dropped, err := s.sweepRun(ctx, id, cutoff)
		if err != nil {
			return rep, err
		}
		if woken {
			rep.Woken++
		}
		if dropped {
			rep.Dropped++
		}
	}
	return rep, nil
}

func (s *RunSweeper) sweepRun(ctx context.Context, id string, cutoff int64) (woken, dropped bool, err error) {
	run, err := s.cfg.Engine.Get(ctx, id)
	if errors.Is(err, reactor.ErrNotFound) {
		return false, true, s.cfg.Client.ZRem(ctx, s.keys.Active(), id).Err()
	}
	if err != nil {
		return false, false, err
	}
	if run.Status.Terminal() {
		return false, true, s.cfg.Client.ZRem(ctx, s.keys.Active(), id).Err()
	}
	if run.UpdatedAt.UnixMilli() > cutoff {
		return false, false, nil
	}
	locked, err := s.cfg.Engine.Locked(ctx, id)
	if err != nil || locked {
		return false, false, err
	}
	if run.Wake != "" {
		info, err := s.insp.GetTaskInfo(s.cfg.Queue, run.Wake)
		if err == nil {
			switch info.State {
			case asynq.TaskStatePending, asynq.TaskStateScheduled, asynq.TaskStateRetry:
				return false, false, nil // it will be delivered
			}
			// active without the run's lock: its worker died. archived or
			// completed: nothing will deliver it again.
		} else if !errors.Is(err, asynq.ErrTaskNotFound) && !errors.Is(err, asynq.ErrQueueNotFound) {
			return false, false, fmt.Errorf("sweeper: inspect task %s: %w", run.Wake, err)
		}
	}
	w := reactor.Wake{ID: fmt.Sprintf("resume:%s:sweep:%d", id, run.Version), RunID: id, Reactor: run.Reactor}
	if err := s.cfg.Enqueuer.Enqueue(ctx, w); err != nil {
		return false, false, err
	}
	s.cfg.Logger.Info("woke a lost run", "event", "reactor.sweep.run", "run", id, "status", run.Status, "task", w.ID)
	return true, false, nil
}
