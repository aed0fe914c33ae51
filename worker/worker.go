package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/maptask"
	"github.com/goreactor/goreactor/internal/payload"
	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// Config configures a Worker.
type Config struct {
	// Concurrency is the number of tasks processed at once. Default 10.
	Concurrency int
	// Queues maps queue names to priorities. Default: the queue of the
	// engine's Enqueuer when it is a *Client, else the first queue
	// GOREACTOR_QUEUE names (DefaultQueue when unset), at priority 1. When the engine's Enqueuer is a *Client, Queues must
	// include its queue (Start refuses a worker that does not): the
	// hand-offs, map elements and sweeps of the runs this worker executes
	// go there, and a worker that does not serve it could leave them
	// waiting for a worker that never comes. When that Client has shards
	// (ClientConfig.Shards), its shard queues are added at its queue's
	// priority. Start logs one Warn (event worker.shards.unserved) when
	// shard queues of a served queue hold tasks that no live worker
	// polls.
	Queues map[string]int
	// TaskCheckInterval is how often an idle worker polls for tasks.
	// Default 10 ms: back pressure empties queues between batches, and
	// asynq's default of 1 s would dominate a map's run time.
	TaskCheckInterval time.Duration
	// DelayedTaskCheckInterval is how often snoozed and retried tasks are
	// moved back to their queue. Default 200 ms (asynq's 5 s would make a
	// 100 ms snooze last seconds).
	DelayedTaskCheckInterval time.Duration
	// Snooze is the base delay of a task waiting for a held run lock; each
	// snooze waits Snooze to 2*Snooze. Default 100 ms.
	Snooze time.Duration
	// DefinitionSnooze is the base delay of a task this worker refused for
	// want of its run's definition (a rolling deploy: the run started under
	// a definition this worker does not have, see reactor.Version); it
	// waits DefinitionSnooze to 2*DefinitionSnooze for a worker that has
	// it, for as long as it takes. Default 5 s.
	DefinitionSnooze time.Duration
	// ShutdownTimeout is how long Stop waits for running tasks. Default 10 s.
	ShutdownTimeout time.Duration
	// Logger receives the worker's logs. Default slog.Default().
	Logger *slog.Logger
	// Metrics, when set, is told what each task handler did (a
	// *metrics.Metrics implements it). Default none.
	Metrics Observer
}

// Observer receives what a Worker's task handlers did, for metrics. Its
// methods run on the handler's goroutine: keep them fast and never block.
// Package metrics implements it; the engine's events (runs, steps, undos)
// reach metrics through reactor.Config.Hooks instead.
type Observer interface {
	// ObserveTask is called once per delivery of a task: task is "run",
	// "element", "rollback" or "control" (a Controller's request); outcome is "done" (the handler succeeded),
	// "snoozed" (the run was locked elsewhere; delivered again shortly),
	// "dropped" (the task can never succeed and is archived) or "error"
	// (retried by the queue).
	ObserveTask(task, outcome string)
	// ObserveOwnerResume is called when a run task that resumed a fan-out
	// map's owner succeeded: kind is "forward" (the map's elements all
	// settled) or "rollback" (the map's rollback finished).
	ObserveOwnerResume(kind string)
}

// DefinitionObserver is implemented by an Observer that also counts the
// tasks a worker refused for want of their run's definition (package
// metrics does): reactor is the definition's name.
type DefinitionObserver interface {
	ObserveDefinitionMismatch(reactor string)
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Concurrency <= 0 {
		c.Concurrency = 10
	}
	if len(c.Queues) == 0 {
		c.Queues = map[string]int{envconfig.Queue(): 1}
	}
	if c.TaskCheckInterval <= 0 {
		c.TaskCheckInterval = 10 * time.Millisecond
	}
	if c.DelayedTaskCheckInterval <= 0 {
		c.DelayedTaskCheckInterval = 200 * time.Millisecond
	}
	if c.Snooze <= 0 {
		c.Snooze = 100 * time.Millisecond
	}
	if c.DefinitionSnooze <= 0 {
		c.DefinitionSnooze = 5 * time.Second
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// SnoozeError asks the server to deliver the task again after a short delay
// without counting a failure: the run is locked by someone else for now.
type SnoozeError struct {
	RunID string
	Base  time.Duration
	// Definition is set when the task waits for a worker that has its
	// run's definition, not for a lock.
	Definition bool
	// Cluster, when set, is the Redis Cluster error the task waits out
	// (a slot moving, a failover); RunID is then the task's id.
	Cluster error
	// Limit, when set, is the step limit the task waits for room in.
	Limit *reactor.LimitError
}

func (e *SnoozeError) Error() string {
	if e.Definition {
		return fmt.Sprintf("worker: %s started under a definition this worker does not have; snoozing for a worker that has it", e.RunID)
	}
	if e.Cluster != nil {
		return fmt.Sprintf("worker: task %s met redis cluster moving a slot or failing over (%v); snoozing", e.RunID, e.Cluster)
	}
	if e.Limit != nil {
		return fmt.Sprintf("worker: %v; snoozing", e.Limit)
	}
	return fmt.Sprintf("worker: run %s is locked by another process; snoozing", e.RunID)
}

// QueueMismatchError is Start's refusal of a worker whose Config.Queues does
// not include the queue its engine's Client enqueues on.
type QueueMismatchError struct {
	// Enqueues is the queue of the engine's Client.
	Enqueues string
	// Serves are the queues in Config.Queues, sorted.
	Serves []string
}

func (e *QueueMismatchError) Error() string {
	return fmt.Sprintf("worker: the engine's Client enqueues on queue %q but Config.Queues serves only %q: "+
		"add %q to Config.Queues, or leave Queues empty to serve the Client's queue", e.Enqueues, e.Serves, e.Enqueues)
}

// queueNames returns the names of queues, sorted.
func queueNames(queues map[string]int) []string {
	return slices.Sorted(maps.Keys(queues))
}

// Worker executes goreactor tasks pulled from Redis.
type Worker struct {
	cfg    Config
	engine *reactor.Engine
	srv    *asynq.Server
	mux    *asynq.ServeMux
	log    *slog.Logger
	rdb    redis.UniversalClient
	// rec is the record this worker publishes (record.go); nil before
	// Start, and when asynq's registry could not name the server.
	rec *record

	// invalid is why Start refuses the worker; nil when it may start.
	invalid error

	mu      sync.Mutex
	started bool
	stopped bool
	// checks is the background check of Start (warnUnservedShards).
	checks sync.WaitGroup

	// warned holds the definitions (reactor and fingerprint) this worker
	// has warned it lacks: one Warn each per process.
	warned sync.Map
}

// New returns a Worker for engine, pulling from rdb. The worker does not own
// rdb. The queues it serves default to its engine's Enqueuer's, when that
// is a *Client; Start refuses Config.Queues that leave that queue out (see
// Config.Queues).
func New(eng *reactor.Engine, rdb redis.UniversalClient, cfg Config) *Worker {
	var invalid error
	if c, ok := engine.EnqueuerOf(eng).(*Client); ok {
		if len(cfg.Queues) == 0 {
			cfg.Queues = map[string]int{c.Queue(): 1}
		} else if cfg.Queues[c.Queue()] <= 0 {
			invalid = &QueueMismatchError{Enqueues: c.Queue(), Serves: queueNames(cfg.Queues)}
		}
		if invalid == nil {
			cfg.Queues = withShards(cfg.Queues, c)
		}
	}
	cfg = cfg.WithDefaults()
	w := &Worker{cfg: cfg, engine: eng, log: cfg.Logger, mux: asynq.NewServeMux(), invalid: invalid, rdb: rdb}
	w.mux.HandleFunc(TypeRun, w.observe("run", w.transient(w.handleRun)))
	w.mux.HandleFunc(TypeElement, w.observe("element", w.transient(w.handleElement)))
	w.mux.HandleFunc(TypeRollback, w.observe("rollback", w.transient(w.handleRollback)))
	w.mux.HandleFunc(TypeControl, w.observe("control", w.transient(w.handleControl)))
	w.mux.HandleFunc(TypeStep, w.observe("step", w.transient(w.handleStep)))
	w.srv = asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   cfg.Queues,
		TaskCheckInterval:        cfg.TaskCheckInterval,
		DelayedTaskCheckInterval: cfg.DelayedTaskCheckInterval,
		ShutdownTimeout:          cfg.ShutdownTimeout,
		RetryDelayFunc:           w.retryDelay,
		IsFailure:                isFailure,
		Logger:                   asynqLogger{cfg.Logger},
		LogLevel:                 asynq.WarnLevel,
	})
	return w
}

// Handler returns the worker's task handler, for use with a server of your
// own (its config must use RetryDelay and IsFailure from this package).
func (w *Worker) Handler() asynq.Handler { return w.mux }

// Start begins processing in the background, and publishes the worker's
// record (its goreactor version, for the dashboard's workers view; see
// record.go) once asynq's server registry lists it, which takes a round trip
// or two. A worker starts once: Start after Start or after Stop is an error.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("worker: already started")
	}
	if w.stopped {
		// Stop before Start: a server started now could never be stopped.
		return errors.New("worker: stopped")
	}
	if w.invalid != nil {
		return w.invalid
	}
	w.started = true
	if err := w.startServer(); err != nil {
		return err
	}
	// In the background: asynq's Inspector takes no context, and a slow
	// Redis must not hold up Start. Stop waits for it.
	w.checks.Go(func() { w.warnUnservedShards(asynq.NewInspectorFromRedisClient(w.rdb)) })
	return nil
}

// Stop stops fetching tasks, waits up to ShutdownTimeout for running tasks
// (their contexts are then cancelled; their runs stay checkpointed and are
// redelivered), deletes the worker's record, and returns. It is idempotent.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.started || w.stopped {
		w.stopped = true
		w.mu.Unlock()
		return nil
	}
	w.stopped = true
	w.mu.Unlock()
	done := make(chan struct{})
	go func() {
		w.srv.Shutdown()
		w.checks.Wait()
		if w.rec != nil {
			w.rec.stop(ctx, w)
		}
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// transientSnooze is the base delay of a task whose handler met Redis
// Cluster moving a slot or failing over (see clusterTransient).
const transientSnooze = 100 * time.Millisecond

// transient wraps a handler so that an error that only says "not now" from
// Redis Cluster becomes a short jittered snooze: never asynq's exponential
// backoff for infrastructure trouble, never spending the task's retries.
// The run's or element's state is checkpointed (every write is fenced and
// resend-safe), so the next delivery goes on from where this one stopped.
func (w *Worker) transient(h func(context.Context, *asynq.Task) error) func(context.Context, *asynq.Task) error {
	return func(ctx context.Context, t *asynq.Task) error {
		err := h(ctx, t)
		var snooze *SnoozeError
		if err == nil || errors.As(err, &snooze) || !clusterTransient(err) {
			return err
		}
		id, _ := asynq.GetTaskID(ctx)
		w.log.Debug("redis cluster is moving a slot or failing over; snoozing the task", "event", "worker.task.cluster_transient",
			"task", id, "type", t.Type(), "error", err)
		return &SnoozeError{RunID: id, Base: transientSnooze, Cluster: err}
	}
}

// clusterTransient reports whether err is Redis Cluster saying "not now"
// once go-redis's own redirects and retries, and the store's riding out of
// a refused write, ran out (store.ClusterTransient).
func clusterTransient(err error) bool { return store.ClusterTransient(err) }

// observe wraps a handler to tell Config.Metrics each delivery's outcome.
func (w *Worker) observe(task string, h func(context.Context, *asynq.Task) error) func(context.Context, *asynq.Task) error {
	if w.cfg.Metrics == nil {
		return h
	}
	return func(ctx context.Context, t *asynq.Task) error {
		err := h(ctx, t)
		var snooze *SnoozeError
		outcome := "done"
		switch {
		case err == nil:
		case errors.As(err, &snooze):
			outcome = "snoozed"
		case errors.Is(err, asynq.SkipRetry):
			outcome = "dropped"
		default:
			outcome = "error"
		}
		w.cfg.Metrics.ObserveTask(task, outcome)
		return err
	}
}

// ownerResumeKind tells an owner resume from the other wake-ups of a run
// by its task id: mapstep enqueues "resume:<owner>:fwd:<map>" when a map's
// elements settled and "resume:<owner>:rb:<map>:<gen>" when its rollback
// finished. It returns "" for any other task.
func ownerResumeKind(taskID, runID string) string {
	rest, ok := strings.CutPrefix(taskID, "resume:"+runID+":")
	switch {
	case !ok:
		return ""
	case strings.HasPrefix(rest, "fwd:"):
		return "forward"
	case strings.HasPrefix(rest, "rb:"):
		return "rollback"
	}
	return ""
}

func (w *Worker) handleRun(ctx context.Context, t *asynq.Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: panic handling %s: %v\n%s", t.Type(), r, debug.Stack())
		}
	}()
	p, err := payload.DecodeRun(t.Payload())
	if err != nil {
		w.log.Error("archiving undecodable task", "event", "worker.task.malformed", "type", t.Type(), "error", err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	if _, ok := w.engine.Definition(p.Reactor); !ok {
		// A rolling deploy may not have the definition here yet: retry.
		err := fmt.Errorf("worker: unknown reactor %q for run %s: register it on every worker (retrying)", p.Reactor, p.RunID)
		w.unknownReactor(ctx, p.Reactor, "run", p.RunID)
		if nerr := engine.NoteDefinitionWait(w.engine, ctx, p.RunID, p.Reactor, fmt.Errorf("%w %q", reactor.ErrUnknownReactor, p.Reactor)); nerr != nil {
			w.log.Debug("could not note a run waiting for its definition", "event", "worker.definition.note_failed", "run", p.RunID, "error", nerr)
		}
		return err
	}
	ctx = withTraceparent(ctx, p.TP)
	res, err := engine.Process(w.engine, ctx, p.RunID)
	if le, ok := errors.AsType[*reactor.LimitError](err); ok {
		return limitSnooze(p.RunID, le)
	}
	switch {
	case errors.Is(err, reactor.ErrRunLocked):
		return &SnoozeError{RunID: p.RunID, Base: w.cfg.Snooze}
	case errors.Is(err, reactor.ErrLockLost):
		// Usually another process owns the run now; but the lock may simply
		// have expired (a long GC pause, a partition). A redelivery is
		// harmless either way: it snoozes while someone holds the run and
		// resumes it otherwise.
		w.log.Warn("run lock lost; the run will be looked at again", "event", "worker.run.lock_lost", "run", p.RunID)
		return &SnoozeError{RunID: p.RunID, Base: w.cfg.Snooze}
	case errors.Is(err, reactor.ErrNotFound):
		return fmt.Errorf("worker: run %s no longer exists: %w", p.RunID, asynq.SkipRetry)
	case errors.Is(err, reactor.ErrDefinitionMismatch):
		return w.refuse(ctx, "run", p.RunID, err)
	case err != nil:
		return err
	}
	w.log.Debug("task done", "event", "worker.run.done", "run", p.RunID, "status", res.Status)
	if w.cfg.Metrics != nil {
		id, _ := asynq.GetTaskID(ctx)
		if kind := ownerResumeKind(id, p.RunID); kind != "" {
			w.cfg.Metrics.ObserveOwnerResume(kind)
		}
	}
	return nil
}

func (w *Worker) handleElement(ctx context.Context, t *asynq.Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: panic handling %s: %v\n%s", t.Type(), r, debug.Stack())
		}
	}()
	p, err := payload.DecodeElement(t.Payload())
	if err != nil {
		w.log.Error("archiving undecodable task", "event", "worker.task.malformed", "type", t.Type(), "error", err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	ctx, span := w.startTask(ctx, "reactor.map.element", p.TP,
		attribute.String("reactor.map.id", p.MapID), attribute.Int("reactor.element.index", p.Index))
	defer func() { endTask(span, err) }()
	err = mapcore.ProcessElement(ctx, w.engine, maptask.ElementTask{MapID: p.MapID, Index: p.Index, Input: p.Input, Meta: p.Meta})
	if errors.Is(err, reactor.ErrUnknownReactor) {
		w.unknownReactor(ctx, "", "element", mapstep.ElementID(p.MapID, p.Index))
	}
	if le, ok := errors.AsType[*reactor.LimitError](err); ok {
		return limitSnooze(mapstep.ElementID(p.MapID, p.Index), le)
	}
	switch {
	case errors.Is(err, reactor.ErrDefinitionMismatch):
		return w.refuse(ctx, "element", mapstep.ElementID(p.MapID, p.Index), err)
	case errors.Is(err, reactor.ErrRunLocked):
		return &SnoozeError{RunID: mapstep.ElementID(p.MapID, p.Index), Base: w.cfg.Snooze}
	case errors.Is(err, reactor.ErrLockLost):
		return &SnoozeError{RunID: mapstep.ElementID(p.MapID, p.Index), Base: w.cfg.Snooze}
	case errors.Is(err, maptask.ErrMapGone), errors.Is(err, maptask.ErrBadTask):
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}

func (w *Worker) handleRollback(ctx context.Context, t *asynq.Task) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker: panic handling %s: %v\n%s", t.Type(), r, debug.Stack())
		}
	}()
	p, err := payload.DecodeRollback(t.Payload())
	if err != nil {
		w.log.Error("archiving undecodable task", "event", "worker.task.malformed", "type", t.Type(), "error", err)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	ctx, span := w.startTask(ctx, "reactor.map.rollback", p.TP, attribute.String("reactor.map.id", p.MapID),
		attribute.Int("reactor.element.index", p.Index), attribute.Int("reactor.rollback.gen", p.Gen), attribute.Int("reactor.rollback.pos", p.Pos))
	defer func() { endTask(span, err) }()
	err = mapcore.ProcessRollback(ctx, w.engine, maptask.RollbackTask{MapID: p.MapID, Gen: p.Gen, Pos: p.Pos, Index: p.Index,
		Meta: p.Meta, Fwd: p.Fwd, Total: p.Total, WindowAt: p.WA})
	if le, ok := errors.AsType[*reactor.LimitError](err); ok {
		return limitSnooze(fmt.Sprintf("%s rollback %d", p.MapID, p.Pos), le)
	}
	if errors.Is(err, reactor.ErrUnknownReactor) {
		w.unknownReactor(ctx, "", "element rollback", mapstep.ElementID(p.MapID, p.Index))
	}
	switch {
	case errors.Is(err, reactor.ErrDefinitionMismatch):
		return w.refuse(ctx, "element rollback", mapstep.ElementID(p.MapID, p.Index), err)
	case errors.Is(err, reactor.ErrRunLocked), errors.Is(err, reactor.ErrLockLost):
		return &SnoozeError{RunID: fmt.Sprintf("%s rollback %d", p.MapID, p.Pos), Base: w.cfg.Snooze}
	case errors.Is(err, maptask.ErrMapGone), errors.Is(err, maptask.ErrBadTask):
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}

// refuse answers a task whose run started under a definition this worker
// does not have (err is a *reactor.DefinitionMismatchError): nothing of the
// run executes here. The task is snoozed for a worker that has the
// definition (it is never archived for this), the run is noted as waiting
// (Wait's error and the dashboard say for what), the refusal is counted,
// and the first refusal of each definition is logged as a Warn naming what
// the run wants and what this worker has.
func (w *Worker) refuse(ctx context.Context, kind, id string, err error) error {
	mm, _ := errors.AsType[*reactor.DefinitionMismatchError](err)
	if mm == nil {
		return err
	}
	if nerr := engine.NoteDefinitionWait(w.engine, ctx, mm.Run, mm.Reactor, err); nerr != nil {
		w.log.Debug("could not note a run waiting for its definition", "event", "worker.definition.note_failed", "run", mm.Run, "error", nerr)
	}
	if o, ok := w.cfg.Metrics.(DefinitionObserver); ok {
		o.ObserveDefinitionMismatch(mm.Reactor)
	}
	have := make([]string, len(mm.Have))
	for i, v := range mm.Have {
		have[i] = v.String()
	}
	attrs := []any{"event", "worker.definition.mismatch", "reactor", mm.Reactor, "run", mm.Run, "task", kind, "id", id,
		"wants", mm.Want.String(), "has", have}
	if _, seen := w.warned.LoadOrStore(mm.Reactor+"\x00"+mm.Want.Fingerprint, true); !seen {
		w.log.WarnContext(ctx, "refusing a task whose run started under a definition this worker does not have; "+
			"it waits for a worker that has it (keep the old Version registered beside the new one until its runs finish)", attrs...)
	} else {
		w.log.DebugContext(ctx, "refusing a task whose run started under another definition", attrs...)
	}
	return &SnoozeError{RunID: id, Base: w.cfg.DefinitionSnooze, Definition: true}
}

// unknownReactor tells the operator that this worker received work for a
// reactor it has no definition of. The task is retried (a rolling deploy
// may not have reached this worker yet), so this logs once per task, on its
// first delivery, not on every retry: a Warn naming the reactor and what
// this worker does have. On the delivery that exhausts the retries (the task
// is archived) it logs an Error. name is "" when only the error knows it (a
// map element's reactor).
func (w *Worker) unknownReactor(ctx context.Context, name, kind, id string) {
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, ok := asynq.GetMaxRetry(ctx)
	attrs := []any{"event", "worker.unknown_reactor", kind, id, "registered", w.engine.Names()}
	if name != "" {
		attrs = append(attrs, "reactor", name)
	}
	switch {
	case retried == 0:
		w.log.Warn("received a "+kind+" of a reactor this worker has not registered; retrying it "+
			"(register every reactor on every worker; during a rolling deploy a newer worker will take it)", attrs...)
	case ok && retried >= maxRetry:
		w.log.Error("giving up on a "+kind+" of a reactor this worker has not registered; its task is archived "+
			"(register the reactor on the workers; a run sweeper wakes the run again)", append(attrs, "deliveries", retried+1)...)
	}
}

func (w *Worker) retryDelay(n int, err error, t *asynq.Task) time.Duration {
	return RetryDelay(n, err, t)
}

// limitSnooze is the snooze of a task whose step found a limit full. A
// concurrency slot frees up when a holder finishes, which is usually long
// before the lease end the limit reports: 100 ms (jittered to 200 ms by
// RetryDelay; asynq forwards retries every 200 ms or so). A rate limit's
// RetryAfter is exact: about half of it, between 100 ms and 5 s.
func limitSnooze(id string, le *reactor.LimitError) *SnoozeError {
	base := 100 * time.Millisecond
	if le.Kind == "rate" {
		base = min(max(le.RetryAfter/2, base), 5*time.Second)
	}
	return &SnoozeError{RunID: id, Base: base, Limit: le}
}

// RetryDelay is the asynq RetryDelayFunc goreactor needs: a snooze waits its
// base to twice its base (jittered); anything else is infrastructure trouble
// (a run's own failures are handled inside the run, never by asynq), retried
// after 1 s, 2 s, 4 s ... up to 5 minutes, jittered by up to a half.
func RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	var s *SnoozeError
	if errors.As(err, &s) {
		return s.Base + rand.N(s.Base+1)
	}
	d := time.Second << min(n, 9)
	d = min(d, 5*time.Minute)
	return d + rand.N(d/2+1)
}

// IsFailure is the asynq IsFailure goreactor needs: snoozes are not failures.
func IsFailure(err error) bool { return isFailure(err) }

func isFailure(err error) bool {
	var s *SnoozeError
	return err != nil && !errors.As(err, &s)
}

// asynqLogger routes asynq's logs to slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
