package sweeper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/reactor"
)

// Config configures a Sweeper: the run sweeper and the map sweeper in one
// loop, one pass per tick, under a leader lock.
type Config struct {
	// Engine reads runs and maps and enqueues through its Enqueuer (a
	// *worker.Client). Required. It needs no reactor definitions.
	Engine *reactor.Engine
	// Queue is the asynq queue goreactor's tasks go to. Default: the
	// Enqueuer's queue.
	Queue string
	// Interval is the time between passes of Run. Default 10 s.
	Interval time.Duration
	// StaleAfter is how long a run or map must have gone without progress
	// before a pass examines it. Default 10 s.
	StaleAfter time.Duration
	// PausedRecheck is how long a paused run whose interrupt still waits
	// is left before a pass examines it again (RunConfig.PausedRecheck).
	// Default 1 h.
	PausedRecheck time.Duration
	// RunPage and MapPage bound the runs and maps examined per pass.
	// Defaults 200 and 100.
	RunPage, MapPage int
	// TrimPage bounds the entries of each listing index (idx:runs,
	// idx:status:<s>, the dashboard's and idx:needs_human) the trim
	// examines per pass. Default 100.
	TrimPage int
	// Retention is how long a finished run's state lives: listing-index
	// entries older than this whose run is gone are trimmed. Default: the
	// Engine's Retention (set it to your workers' engines' Retention).
	Retention time.Duration
	// LeaderTTL is the expiry of the leader lock (kept alive while a pass
	// runs). Default 30 s.
	LeaderTTL time.Duration
	// Logger receives a summary line per pass. Default slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is given every pass's report (a
	// *metrics.Metrics implements it). Default none.
	Metrics Observer
}

// Observer receives every pass of a Sweeper, for metrics: rep.Leader is
// false for a tick skipped because another replica led; err is the pass's
// error. It runs on the sweeping goroutine: keep it fast.
type Observer interface {
	ObservePass(rep Report, err error)
}

// Report is what one pass did. Leader is false when another replica held
// the leader lock and this one did nothing.
type Report struct {
	Leader   bool
	Runs     RunReport
	Maps     MapReport
	Trim     TrimReport
	Duration time.Duration
}

// Recovered is the number of tasks the pass enqueued.
func (r Report) Recovered() int { return r.Runs.Woken + r.Maps.Recovered() }

// Totals are counters over the life of a Sweeper.
type Totals struct {
	Passes, Skipped, Errors                        int64
	RunsWoken, RunsDropped                         int64
	Elements, Rollbacks, Claims, Resumes, Removed  int64
	FreshIDs, DeletedTasks, RunsExamined, Examined int64
	TrimExamined, Trimmed                          int64
}

// Sweeper runs the run and map sweepers together.
type Sweeper struct {
	cfg    Config
	runs   *RunSweeper
	maps   *MapSweeper
	trim   *IndexTrimmer
	locker *lock.Locker
	leader string

	mu     sync.Mutex
	totals Totals
}

// New returns a Sweeper.
func New(cfg Config) (*Sweeper, error) {
	if cfg.Engine == nil || engine.EnqueuerOf(cfg.Engine) == nil {
		return nil, errors.New("sweeper: Config needs an Engine with an Enqueuer (worker.Client)")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.LeaderTTL <= 0 {
		cfg.LeaderTTL = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	rdb := engine.Client(cfg.Engine)
	runs, err := NewRunSweeper(RunConfig{Engine: cfg.Engine, Client: rdb, Enqueuer: engine.EnqueuerOf(cfg.Engine), Queue: cfg.Queue,
		StaleAfter: cfg.StaleAfter, Page: cfg.RunPage, PausedRecheck: cfg.PausedRecheck, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	maps, err := NewMapSweeper(MapConfig{Engine: cfg.Engine, Queue: cfg.Queue, StaleAfter: cfg.StaleAfter, Page: cfg.MapPage, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	trim, err := NewIndexTrimmer(TrimConfig{Engine: cfg.Engine, Retention: cfg.Retention, StaleAfter: cfg.StaleAfter,
		Page: cfg.TrimPage, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	return &Sweeper{cfg: cfg, runs: runs, maps: maps, trim: trim, locker: lock.New(rdb, cfg.LeaderTTL),
		leader: keys.New(engine.Prefix(cfg.Engine)).SweeperLeader()}, nil
}

// Once runs one pass (runs, then maps, then the index trim) if it can take the leader lock, and
// logs its summary. Errors on single runs or maps do not stop the pass;
// they are returned joined with its report.
func (s *Sweeper) Once(ctx context.Context) (Report, error) {
	began := time.Now()
	lease, err := s.locker.TryAcquire(ctx, s.leader)
	if errors.Is(err, lock.ErrHeld) {
		s.count(Report{}, nil)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.ObservePass(Report{}, nil)
		}
		s.cfg.Logger.Debug("sweep skipped: another sweeper holds the leader lock", "event", "reactor.sweep.skipped")
		return Report{}, nil
	}
	if err != nil {
		return Report{}, fmt.Errorf("sweeper: leader lock: %w", err)
	}
	pctx := lease.Keep(ctx)
	// One span per pass as leader; the tasks it re-enqueues join their own
	// runs' traces (tracing.StartIn), linked to this span.
	pctx, span := engine.Tracer(s.cfg.Engine).Start(pctx, "reactor.sweeper.pass")
	rep := Report{Leader: true}
	var errs []error
	var rerr, merr error
	rep.Runs, rerr = s.runs.Sweep(pctx)
	if rerr != nil {
		errs = append(errs, rerr)
	}
	if pctx.Err() == nil {
		rep.Maps, merr = s.maps.Sweep(pctx)
		if merr != nil {
			errs = append(errs, merr)
		}
	}
	if pctx.Err() == nil {
		var terr error
		rep.Trim, terr = s.trim.Trim(pctx)
		if terr != nil {
			errs = append(errs, terr)
		}
	}
	if lock.Lost(pctx) {
		errs = append(errs, errors.New("sweeper: leader lock lost mid-pass"))
	}
	lease.Stop()
	_ = lease.Release(context.WithoutCancel(ctx))
	rep.Duration = time.Since(began)
	err = errors.Join(errs...)
	endPass(span, rep, err)
	// A pass cut short because the caller stopped (shutdown) is not a
	// failed pass: it is not counted or reported as one.
	failed := err
	if ctx.Err() != nil {
		failed = nil
	}
	s.count(rep, failed)
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.ObservePass(rep, failed)
	}
	t := s.Totals()
	s.cfg.Logger.Info("sweep", "event", "reactor.sweep.pass", "duration_ms", rep.Duration.Milliseconds(),
		"runs_examined", rep.Runs.Examined, "runs_woken", rep.Runs.Woken, "runs_dropped", rep.Runs.Dropped, "runs_paused", rep.Runs.Paused,
		"maps_examined", rep.Maps.Examined, "maps_live", rep.Maps.Live, "elements", rep.Maps.Elements,
		"rollbacks", rep.Maps.Rollbacks, "claims", rep.Maps.Claims, "resumes", rep.Maps.Resumes,
		"maps_removed", rep.Maps.Removed, "trim_examined", rep.Trim.Examined, "trimmed", rep.Trim.Trimmed,
		"errors", err != nil,
		"total_recovered", t.RunsWoken+t.Elements+t.Rollbacks+t.Resumes, "total_claims", t.Claims,
		"total_trimmed", t.Trimmed)
	return rep, err
}

func (s *Sweeper) count(rep Report, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &s.totals
	if !rep.Leader {
		t.Skipped++
		return
	}
	t.Passes++
	if err != nil {
		t.Errors++
	}
	t.RunsExamined += int64(rep.Runs.Examined)
	t.RunsWoken += int64(rep.Runs.Woken)
	t.RunsDropped += int64(rep.Runs.Dropped)
	t.Examined += int64(rep.Maps.Examined)
	t.Elements += int64(rep.Maps.Elements)
	t.Rollbacks += int64(rep.Maps.Rollbacks)
	t.Claims += int64(rep.Maps.Claims)
	t.Resumes += int64(rep.Maps.Resumes)
	t.Removed += int64(rep.Maps.Removed)
	t.FreshIDs += int64(rep.Maps.Fresh)
	t.DeletedTasks += int64(rep.Maps.Deleted)
	t.TrimExamined += int64(rep.Trim.Examined)
	t.Trimmed += int64(rep.Trim.Trimmed)
}

// Totals returns the counters so far.
func (s *Sweeper) Totals() Totals {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.totals
}

// Run sweeps every Interval until ctx ends. A failed pass is logged and the
// loop goes on; Run returns nil when ctx ends.
//
// A pass that leaves a map due again sooner than Interval (a dead holder's
// element lock about to lapse, an idle task that needs its second look)
// is followed by an extra pass then, so that recovering a map takes what
// the verdict needs and not a whole Interval more.
func (s *Sweeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	early := time.NewTimer(time.Hour)
	early.Stop()
	defer early.Stop()
	for {
		rep, err := s.Once(ctx)
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Warn("sweep pass had errors", "event", "reactor.sweep.error", "error", err.Error())
		}
		early.Stop()
		if d := rep.Maps.Soonest; d > 0 && d < s.cfg.Interval {
			early.Reset(max(d, minEarlyPass))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-early.C:
		}
	}
}

// minEarlyPass bounds how soon after a pass Run's extra pass comes.
const minEarlyPass = 50 * time.Millisecond

// endPass ends a pass's span with what the pass did.
func endPass(span trace.Span, rep Report, err error) {
	span.SetAttributes(attribute.Int("reactor.sweeper.runs_examined", rep.Runs.Examined),
		attribute.Int("reactor.sweeper.runs_woken", rep.Runs.Woken),
		attribute.Int("reactor.sweeper.maps_examined", rep.Maps.Examined),
		attribute.Int("reactor.sweeper.elements", rep.Maps.Elements),
		attribute.Int("reactor.sweeper.rollbacks", rep.Maps.Rollbacks),
		attribute.Int("reactor.sweeper.claims", rep.Maps.Claims),
		attribute.Int("reactor.sweeper.resumes", rep.Maps.Resumes),
		attribute.Int("reactor.sweeper.trimmed", rep.Trim.Trimmed))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
