package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/envconfig"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/store"
)

// Config configures an Engine.
type Config struct {
	// Client is the Redis client (a *redis.Client or *redis.ClusterClient).
	// Required. On Redis Cluster, give the ClusterClient a MaxRedirects of
	// at least MinClusterRedirects: while a slot moves between masters,
	// Redis refuses a script whose keys are split between the two nodes
	// (TRYAGAIN) and go-redis retries it MaxRedirects times, backing off up
	// to MaxRetryBackoff (512 ms) each, so 16 ride out several seconds of a
	// half-moved slot where go-redis's default, 3, gives up within 0.1 s.
	// NewEngine logs a warning for a ClusterClient with fewer.
	Client redis.UniversalClient
	// Prefix starts every key. Default: GOREACTOR_PREFIX, else
	// "goreactor" (the prefix the binaries read too).
	Prefix string
	// Logger receives the structured events. Default slog.Default().
	Logger *slog.Logger
	// Hooks receive every event. Default none.
	Hooks []Hook
	// Middleware wraps every call of a step function, outermost first.
	// Default none.
	Middleware []Middleware
	// LockExpiry is how long a run lock lives without a heartbeat; the
	// heartbeat extends it every third of that. Default 30 s.
	LockExpiry time.Duration
	// LockGrace is how long a run's lock goes on being extended after the
	// context of its execution ended (a worker shutting down, a delivery
	// whose queue lease lapsed) while a step that ignores its context still
	// runs: a redelivery cannot run the same step concurrently meanwhile.
	// Past it the lock is let go and nothing the step returns is recorded.
	// Default 2 minutes.
	LockGrace time.Duration
	// UndoLockWait is how long Undo waits for a run's lock. Default 5 s.
	UndoLockWait time.Duration
	// UndoTimeout bounds each Undo and Compensate call of steps that set no
	// UndoTimeout of their own. Default 30 s.
	UndoTimeout time.Duration
	// Retention is how long a finished run stays in Redis. Default 7 days.
	Retention time.Duration
	// Enqueuer hands runs to workers (Enqueue, hand-off points, sweeps).
	// Default none: runs execute in-process only.
	Enqueuer Enqueuer
	// MaxRollbackFailures is how many rollback failures a Failure keeps; the
	// rest are counted. Default 100.
	MaxRollbackFailures int
	// TracerProvider gives the tracer of the engine's spans (a reactor.run
	// span per execution of a run, a reactor.step span per call of a step
	// function) and of its workers' (reactor.map.element,
	// reactor.map.rollback). Default: the global provider
	// (otel.GetTracerProvider), a no-op until otel.SetTracerProvider is
	// called. No exporter is set up here: the provider brings its own.
	TracerProvider trace.TracerProvider
	// ReplicaAcks, when positive, makes every write that records a run's
	// progress wait until that many replicas of its Redis node have it:
	// a run's start and checkpoints, a map element's start and finish, a
	// map's and a map rollback's settles. Each is followed by WAIT on its
	// connection, so the step after a checkpoint runs only once the
	// replicas hold it, and a failover that promotes one of them keeps it
	// (see docs/configuration.md, "Failover"). A WAIT that times out
	// (ReplicaAckTimeout) leaves the write standing on its master and the
	// run going on, as without ReplicaAcks: it is counted
	// (EventReplicaAcksShort) and logged at Warn at most every 10 s. It
	// needs a *redis.Client or a *redis.ClusterClient. Default 0: no
	// waiting, replication is asynchronous.
	ReplicaAcks int
	// ReplicaAckTimeout bounds each wait of ReplicaAcks. Default 1 s.
	ReplicaAckTimeout time.Duration
}

// WithDefaults returns c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.Prefix == "" {
		c.Prefix = envconfig.Prefix()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LockExpiry <= 0 {
		c.LockExpiry = 30 * time.Second
	}
	if c.LockGrace <= 0 {
		c.LockGrace = 2 * time.Minute
	}
	if c.UndoLockWait <= 0 {
		c.UndoLockWait = 5 * time.Second
	}
	if c.UndoTimeout <= 0 {
		c.UndoTimeout = 30 * time.Second
	}
	if c.Retention <= 0 {
		c.Retention = 7 * 24 * time.Hour
	}
	if c.MaxRollbackFailures <= 0 {
		c.MaxRollbackFailures = 100
	}
	if c.ReplicaAckTimeout <= 0 {
		c.ReplicaAckTimeout = time.Second
	}
	return c
}

func (c Config) validate() error {
	if c.Client == nil {
		return errors.New("reactor: Config.Client is required")
	}
	if c.LockExpiry < 30*time.Millisecond {
		return fmt.Errorf("reactor: Config.LockExpiry %s is too short to be extended in time", c.LockExpiry)
	}
	if c.ReplicaAcks < 0 {
		return fmt.Errorf("reactor: Config.ReplicaAcks %d is negative", c.ReplicaAcks)
	}
	if c.ReplicaAcks > 0 && c.ReplicaAckTimeout < time.Millisecond {
		// WAIT takes milliseconds, and 0 would wait forever.
		return fmt.Errorf("reactor: Config.ReplicaAckTimeout %s is under a millisecond", c.ReplicaAckTimeout)
	}
	return nil
}

// Engine runs reactors and manages stored runs. It is safe for concurrent
// use; create one per process and share it.
type Engine struct {
	cfg   Config
	log   *slog.Logger
	store *store.Store
	locks *lock.Locker

	mu sync.RWMutex
	// defs holds the highest version registered under each name (what
	// Definition returns), versions every version, lowest first.
	defs     map[string]*Definition
	versions map[string][]*Definition

	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	// clockSkew is added to readings of the Redis server's clock (ms):
	// tests stand in a node whose clock is behind (export_test.go).
	clockSkew atomic.Int64
	// ackShort counts the replica waits that fell short since the last
	// Warn about them, ackWarned is when that Warn was logged (Unix ns).
	ackShort  atomic.Int64
	ackWarned atomic.Int64
	// slotWaits are this process's attempts waiting for a limit's slot.
	slotWaits slotWaits
}

// MinClusterRedirects is the least ClusterOptions.MaxRedirects that lets
// goreactor's writes ride out a Redis Cluster slot migration (see
// Config.Client).
const MinClusterRedirects = 16

// NewEngine returns an Engine. It loads its Lua scripts, so an unreachable
// Redis fails here.
func NewEngine(ctx context.Context, cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	st, err := store.New(ctx, cfg.Client, keys.New(cfg.Prefix))
	if err != nil {
		return nil, err
	}
	if err := lock.LoadScripts(ctx, cfg.Client); err != nil {
		return nil, err
	}
	if cc, ok := cfg.Client.(*redis.ClusterClient); ok && cc.Options().MaxRedirects < MinClusterRedirects {
		cfg.Logger.Warn("the Redis Cluster client gives up on a refused command after few retries; a slot migration will fail "+
			"runs' writes and redo their steps: set ClusterOptions.MaxRedirects to at least "+strconv.Itoa(MinClusterRedirects),
			"event", "reactor.engine.cluster_redirects", "max_redirects", cc.Options().MaxRedirects)
	}
	e := &Engine{
		cfg:      cfg,
		log:      cfg.Logger,
		store:    st,
		locks:    lock.New(cfg.Client, cfg.LockExpiry).WithGrace(cfg.LockGrace),
		defs:     map[string]*Definition{},
		versions: map[string][]*Definition{},
		now:      time.Now,
		sleep:    sleepCtx,
	}
	if cfg.ReplicaAcks > 0 {
		a := &store.Acks{Replicas: cfg.ReplicaAcks, Timeout: cfg.ReplicaAckTimeout, Short: e.replicaAcksShort}
		if err := st.SetAcks(ctx, a); err != nil {
			return nil, fmt.Errorf("reactor: Config.ReplicaAcks: %w", err)
		}
	}
	return e, nil
}

// replicaAcksShort is told of a WAIT that returned fewer replicas than
// Config.ReplicaAcks (got), or failed (got -1, err): an event for hooks
// and metrics each time, a Warn for operators at most every 10 s.
func (e *Engine) replicaAcksShort(got int, err error) {
	if err == nil {
		err = fmt.Errorf("%d of %d replicas acknowledged a write within %s", got, e.cfg.ReplicaAcks, e.cfg.ReplicaAckTimeout)
	} else {
		err = fmt.Errorf("waiting for %d replicas: %w", e.cfg.ReplicaAcks, err)
	}
	ctx := context.Background()
	e.emit(ctx, Event{Kind: EventReplicaAcksShort, Err: err})
	n := e.ackShort.Add(1)
	now, last := time.Now().UnixNano(), e.ackWarned.Load()
	if now-last >= int64(10*time.Second) && e.ackWarned.CompareAndSwap(last, now) {
		e.ackShort.Add(-n)
		e.log.Warn("writes went on without the replicas Config.ReplicaAcks asks for: a failover now may lose them",
			"event", string(EventReplicaAcksShort), "short_writes", n, "replica_acks", e.cfg.ReplicaAcks,
			"timeout", e.cfg.ReplicaAckTimeout, "last_error", err.Error())
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Register makes definitions known by name, so that stored runs can be
// resumed, undone and inspected, with the children and element reactors
// they run. Definitions of one name with different versions (Version) are
// registered side by side: each stored run executes under the one it
// started with. Registering a different definition under a taken name and
// version is an error.
func (e *Engine) Register(defs ...*Definition) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range defs {
		if d == nil {
			return errors.New("reactor: Register of a nil definition")
		}
		if err := e.registerLocked(d); err != nil {
			return err
		}
	}
	return nil
}

// registerLocked registers d and the definitions it runs: composed children
// and the element reactors of constructs (Definitions() []*Definition).
func (e *Engine) registerLocked(d *Definition) error {
	vs := e.versions[d.name]
	for _, old := range vs {
		if old == d {
			return nil
		}
		if old.Version() == d.Version() {
			return &DefinitionError{Reactor: d.name, Reason: fmt.Sprintf("another definition is already registered under this name "+
				"and version %d (define each reactor once, at package level, and reuse the *Definition; "+
				"a changed reactor that must run beside the old one takes reactor.Version(%d))", d.Version(), maxVersion(vs)+1)}
		}
	}
	vs = append(vs, d)
	slices.SortFunc(vs, func(a, b *Definition) int { return a.Version() - b.Version() })
	e.versions[d.name] = vs
	e.defs[d.name] = vs[len(vs)-1]
	for _, s := range d.steps {
		var nested []*Definition
		switch {
		case s.child != nil:
			nested = []*Definition{s.child}
		case s.spawn != nil:
			nested = []*Definition{s.spawn}
		case s.construct != nil:
			if n, ok := s.construct.(interface{ Definitions() []*Definition }); ok {
				nested = n.Definitions()
			}
		}
		for _, c := range nested {
			if err := e.registerLocked(c); err != nil {
				return err
			}
		}
	}
	return nil
}

func maxVersion(vs []*Definition) int {
	n := 0
	for _, d := range vs {
		n = max(n, d.Version())
	}
	return n
}

// Definition returns the definition registered under name: its highest
// version (Versions lists them all).
func (e *Engine) Definition(name string) (*Definition, bool) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	d, ok := e.defs[name]
	return d, ok
}

func (e *Engine) lookup(name string) (*Definition, error) {
	d, ok := e.Definition(name)
	if !ok {
		return nil, fmt.Errorf("%w %q: register its definition with Engine.Register", ErrUnknownReactor, name)
	}
	return d, nil
}

// Run executes def and returns its final result: Run runs to the end, in
// this process and, after a hand-off point or a fan-out map, on the workers,
// whose finish it waits for (NoWait returns at the hand-off instead; Enqueue
// runs the whole run on workers without waiting). The run is stored in
// Redis and checkpointed after every step; this process holds the run's
// lock (extended by a heartbeat) for as long as it executes. An error is
// returned for what prevented the run from being executed, recorded or
// waited for (invalid inputs, Redis, a lost lock, ctx ending while workers
// have the run, in which case the dispatched Result comes with it); what
// the run did is in the Result.
func (e *Engine) Run(ctx context.Context, def *Definition, inputs map[string]any, opts ...RunOption) (*Result, error) {
	o, encoded, err := e.prepareRun(ctx, callRun, def, inputs, opts)
	if err != nil {
		return nil, err
	}
	res, err := e.start(ctx, def, o.id, encoded, &o)
	return e.finish(ctx, res, err, opts)
}

// prepareRun is what starting a run in-process and enqueuing it share:
// register the definition, settle the options (run id, trace id), and check
// the inputs before anything is stored.
func (e *Engine) prepareRun(ctx context.Context, call callKind, def *Definition, inputs map[string]any, opts []RunOption) (runOptions, map[string]Raw, error) {
	if err := e.Register(def); err != nil {
		return runOptions{}, nil, err
	}
	o, err := collectOptions(call, opts)
	if err != nil {
		return o, nil, err
	}
	if o.trace, err = traceFor(ctx); err != nil {
		return o, nil, err
	}
	encoded, err := def.prepareInputs(inputs)
	if err != nil {
		return o, nil, err
	}
	return o, encoded, nil
}

// ExecuteElement runs (or resumes, or reads the result of) the element run
// id of a construct, in this process: a map element "<mapID>.<i>". Element
// runs live in their own keys and slot, are not in the run indexes, never
// hand off, and run nested constructs inline. Inputs are encoded values by
// input name. It returns ErrRunLocked when another process holds the
// element.
func (e *Engine) executeElement(ctx context.Context, def *Definition, id string, inputs map[string]Raw) (*Result, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	checked, err := def.checkInputs(inputs)
	if err != nil {
		return nil, err
	}
	return e.startElement(ctx, def, id, checked) // element_run.go
}

// Element returns a stored element run.
func (e *Engine) element(ctx context.Context, id string) (*Run, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	target, err := e.storedElemTarget(ctx, id) // element_run.go
	if err != nil {
		return nil, err
	}
	snap, err := e.store.Load(ctx, target)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: element %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, err
	}
	st, err := decodeState(snap.Data)
	if err != nil {
		return nil, err
	}
	d := e.viewDef(st)
	return st.view(d, snap.Version), nil
}

// start creates or resumes root run id (element runs: startElement, element_run.go).
func (e *Engine) start(ctx context.Context, def *Definition, id string, inputs map[string]Raw, o *runOptions) (*Result, error) {
	target := e.store.RunTarget(id)
	if o.fresh {
		return e.startNew(ctx, def, id, inputs, o, target)
	}
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		// Someone executes this id. A finished run answers with its result.
		if snap, lerr := e.store.Load(ctx, target); lerr == nil {
			if st, derr := decodeState(snap.Data); derr == nil && st.Status.Terminal() {
				if err := sameInputs(id, st.Inputs, inputs); err != nil {
					return nil, err
				}
				return st.result(), nil
			}
		}
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	if err != nil {
		return nil, err
	}
	now := e.now()
	st, data, err := e.newRunState(def, id, inputs, o, now)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	var added bool // the start added the run's active entry
	// The index entry goes first: a crash after the state write must still
	// leave the run where the sweeper looks.
	if added, err = e.store.IndexStart(ctx, id, def.name, string(StatusRunning), now); err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	snap, created, err := e.store.Create(ctx, target, lease.Token(), data)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	x := &execution{e: e, def: def, target: target, lease: lease, version: snap.Version, indexed: StatusRunning}
	if created {
		x.st, x.created = st, true
		return x.execute(ctx, EventRunStarted)
	}
	existing, err := decodeState(snap.Data)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	// The id is taken. Put the speculative index entry back the way the
	// existing run needs it (a live run stays in the active index), still
	// under the lock, so that no writer can re-index the run in between.
	bg := context.WithoutCancel(ctx)
	refuse := func(err error) (*Result, error) {
		owner := def.name
		if existing.Reactor != def.name {
			// A run of another reactor: this start's reactor entries
			// name the wrong reactor (the dashboard's counts by
			// reactor would include it); the run's own are untouched.
			_ = e.store.UnindexReactor(bg, id, def.name, string(StatusRunning))
			owner = existing.Reactor
		}
		if existing.Status.Terminal() {
			_ = e.store.TakeBackStart(bg, id, owner, string(StatusRunning), added, now)
		} else if existing.Status != StatusRunning {
			_ = e.store.MarkStatus(bg, id, owner, string(StatusRunning), string(existing.Status), false, now)
		}
		_ = lease.Release(bg)
		return nil, err
	}
	if existing.Reactor != def.name {
		return refuse(errIDTaken(id, existing.Reactor))
	}
	if err := sameInputs(id, existing.Inputs, inputs); err != nil {
		return refuse(err)
	}
	if existing.Def != "" && existing.Def != def.fp && !existing.Status.Terminal() {
		// The id's run started under another version: it goes on under
		// that one, or not at all here.
		d, err := e.lookupRun(existing)
		if err != nil {
			return refuse(err)
		}
		x.def = d
	}
	if existing.Status.Terminal() {
		_ = e.store.TakeBackStart(bg, id, def.name, string(StatusRunning), added, now)
		_ = lease.Release(bg)
		return existing.result(), nil
	}
	x.st = existing
	if existing.Status != StatusRunning {
		if err := e.store.MarkStatus(ctx, id, def.name, string(StatusRunning), string(existing.Status), false, now); err != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
			return nil, err
		}
		x.indexed = existing.Status
	}
	return x.execute(ctx, EventRunResumed)
}

// newRunState is the state a root run's start creates: the first step's
// intent rides on the create.
func (e *Engine) newRunState(def *Definition, id string, inputs map[string]Raw, o *runOptions, now time.Time) (*runState, []byte, error) {
	st := newState(id, def, inputs, now)
	o.applyTo(st)
	if st.Queue == "" {
		// The queue its wake-ups go to if it hands off, recorded as
		// Enqueue records it (the dashboard shows it).
		st.Queue = e.enqueuerQueue()
	}
	st.Intent = nextIntent(&frame{def: def, st: st})
	if st.Intent != nil {
		st.stepStarted(st.Intent.Step, now)
	}
	data, err := codec.Marshal(st)
	if err != nil {
		return nil, nil, fmt.Errorf("reactor: encode run: %w", err)
	}
	return st, data, nil
}

// startNew starts a run under an id the engine generated: nobody else can
// hold its lock or have stored it, so the lock is taken by the create
// script, and on one Redis the index entries share its round trip (queued
// first: a crash after the state write still leaves the run where the
// sweeper looks).
func (e *Engine) startNew(ctx context.Context, def *Definition, id string, inputs map[string]Raw, o *runOptions, target store.Target) (*Result, error) {
	now := e.now()
	st, data, err := e.newRunState(def, id, inputs, o, now)
	if err != nil {
		return nil, err
	}
	token, sent := lock.NewToken(), time.Now()
	_, created, err := e.store.CreateNew(ctx, target, token, e.locks.Expiry(), data, def.name, func(p redis.Pipeliner) {
		e.store.QueueIndexStart(ctx, p, id, def.name, string(StatusRunning), now)
	})
	if errors.Is(err, store.ErrLockNotHeld) {
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	lease := e.locks.Adopt(target.Lock, token, sent)
	if err == nil && !created {
		// A generated id that is taken: 96 random bits make this a
		// broken random source, not a race.
		err = fmt.Errorf("reactor: generated run id %s is already stored", id)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	x := &execution{e: e, def: def, target: target, lease: lease, version: 1, indexed: StatusRunning,
		st: st, created: true}
	return x.execute(ctx, EventRunStarted)
}

// ErrRunIDReused is returned when a run is started under the id of a stored
// run (live, or finished and still retained) with other inputs. Starting an
// id again is idempotent only with the same inputs; pick a new id for a new
// run.
var ErrRunIDReused = errors.New("reactor: run id already used with other inputs")

// sameInputs reports whether a start's inputs are the stored run's (both
// encoded by the same codec, map keys sorted, so equal values encode alike).
func sameInputs(id string, stored, given map[string]Raw) error {
	var differ []string
	for k, v := range given {
		if !bytes.Equal(stored[k], v) {
			differ = append(differ, k)
		}
	}
	for k := range stored {
		if _, ok := given[k]; !ok {
			differ = append(differ, k)
		}
	}
	if len(differ) == 0 {
		return nil
	}
	slices.Sort(differ)
	return fmt.Errorf("%w: run %s was started with other values for %s (the same id with the same inputs returns the stored run)",
		ErrRunIDReused, id, strings.Join(slices.Compact(differ), ", "))
}

// Resume continues a stored, unfinished run in this process from its last
// checkpoint (or its rollback from the last undone entry). A finished run
// returns its result; a run held by another process returns ErrRunLocked.
func (e *Engine) Resume(ctx context.Context, id string) (*Result, error) {
	return e.resume(ctx, id, false)
}

func (e *Engine) resume(ctx context.Context, id string, inWorker bool) (*Result, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	if err != nil {
		return nil, err
	}
	// The state and any cancel request come in one read: a cancel
	// requested while nobody held the run (queued, handed off) is honoured
	// before any step runs.
	snap, err := e.store.Load(ctx, target)
	var st *runState
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %s", ErrNotFound, id)
	} else if err == nil {
		st, err = decodeState(snap.Data)
	}
	if err == nil && st.Status.Terminal() {
		_ = lease.Release(context.WithoutCancel(ctx))
		return st.result(), nil
	}
	var def *Definition
	if err == nil {
		def, err = e.lookupRun(st)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	x := &execution{e: e, def: def, st: st, target: target, lease: lease, version: snap.Version, indexed: st.Status,
		inWorker: inWorker, cancel: snap.Cancel}
	return x.execute(ctx, EventRunResumed)
}

// Locked reports whether some process holds run id's lock right now.
func (e *Engine) locked(ctx context.Context, id string) (bool, error) {
	if err := validateRunID(id); err != nil {
		return false, err
	}
	n, err := e.cfg.Client.Exists(ctx, e.store.RunTarget(id).Lock).Result()
	return n == 1, err
}

// Logger returns the engine's logger.
func (e *Engine) logger() *slog.Logger { return e.log }

// Client returns the engine's Redis client.
func (e *Engine) client() redis.UniversalClient { return e.cfg.Client }

// Enqueuer returns the engine's Enqueuer (nil when runs are in-process only).
func (e *Engine) enqueuer() Enqueuer { return e.cfg.Enqueuer }

// Prefix returns the engine's key prefix.
func (e *Engine) prefix() string { return e.cfg.Prefix }

// Get returns the stored run id.
func (e *Engine) Get(ctx context.Context, id string) (*Run, error) {
	st, version, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	d := e.viewDef(st)
	return st.view(d, version), nil
}

// runs returns the stored root runs ids in one round trip, nil where no run
// is stored (or the id is not one).
func (e *Engine) runs(ctx context.Context, ids []string) ([]*Run, error) {
	return e.views(ctx, ids, e.store.RunTarget)
}

// elementRuns returns the stored element runs ids ("<map id>.<i>") of
// fan-out maps in one round trip, nil where none is stored in the current
// layout (an element of a map started before it, keys.ElemState, is left
// out: a batch read does not look for it in the old one).
func (e *Engine) elementRuns(ctx context.Context, ids []string) ([]*Run, error) {
	return e.views(ctx, ids, e.store.ElemTarget)
}

// views reads the runs ids at their target's keys in one round trip.
func (e *Engine) views(ctx context.Context, ids []string, target func(string) store.Target) ([]*Run, error) {
	ts := make([]store.Target, 0, len(ids))
	valid := make([]int, 0, len(ids))
	for i, id := range ids {
		if validateRunID(id) == nil {
			ts = append(ts, target(id))
			valid = append(valid, i)
		}
	}
	snaps, err := e.store.LoadMany(ctx, ts)
	if err != nil {
		return nil, err
	}
	out := make([]*Run, len(ids))
	for j, snap := range snaps {
		if snap.Data == nil {
			continue
		}
		st, err := decodeState(snap.Data)
		if err != nil {
			// One unreadable state must not hide the others (a listing
			// page): it is left out, and reported.
			e.log.WarnContext(ctx, "a stored run state cannot be decoded; left out of a batch read",
				"event", "reactor.state.undecodable", "run", ids[valid[j]], "error", err)
			continue
		}
		d := e.viewDef(st)
		out[valid[j]] = st.view(d, snap.Version)
	}
	return out, nil
}

func validateRunID(id string) error {
	if err := keys.ValidateID(id); err != nil {
		return fmt.Errorf("reactor: run id: %w", err)
	}
	return nil
}

func (e *Engine) load(ctx context.Context, id string) (*runState, int64, error) {
	if err := validateRunID(id); err != nil {
		return nil, 0, err
	}
	snap, err := e.store.Load(ctx, e.store.RunTarget(id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, 0, err
	}
	st, err := decodeState(snap.Data)
	return st, snap.Version, err
}

func decodeState(data []byte) (*runState, error) {
	var st runState
	if err := codec.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("reactor: decode run state: %w", err)
	}
	if st.Steps == nil {
		st.Steps = map[string]*stepRec{}
	}
	return &st, nil
}

// Undo rolls back a finished run (completed, halted or aborted): every
// ledger entry is undone, newest first, and the run ends cancelled. It waits
// up to Config.UndoLockWait for the run's lock and returns ErrRunLocked if it
// stays held. A run that is rolling back is refused with
// ErrRollbackInProgress.
func (e *Engine) Undo(ctx context.Context, id string) (*Result, error) {
	target := e.store.RunTarget(id)
	if err := keys.ValidateID(id); err != nil {
		return nil, fmt.Errorf("reactor: run id: %w", err)
	}
	lease, err := e.locks.Acquire(ctx, target.Lock, e.cfg.UndoLockWait)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (run %s; waited %s)", ErrRunLocked, id, e.cfg.UndoLockWait)
	}
	if err != nil {
		return nil, err
	}
	st, version, err := e.load(ctx, id)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	if err := undoable(st); err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	def, err := e.lookupRun(st)
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	x := &execution{e: e, def: def, st: st, target: target, lease: lease, version: version, indexed: st.Status, revive: true}
	if windowed(def, st.Ledger) {
		// Judged before anything changes: a clock that went backwards
		// refuses the undo as it stands.
		if x.windowNow, err = x.windowClock(ctx); err != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return x.undo(ctx, "undone on request")
}

// UndoElement rolls back a completed construct element run (a map
// element) in this process, newest first, saving after every undone entry
// (a crashed element undo resumes after the last saved entry); it ends
// cancelled. An element that failed, was cancelled or is already undone
// returns its stored result and undoes nothing. It waits up to wait for the
// element's lock (0: one try) and returns ErrRunLocked if it stays held.
func (e *Engine) undoElement(ctx context.Context, id string, wait time.Duration) (*Result, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	x, err := e.lockAndLoad(ctx, e.elemTarget(ctx, id), "element "+id, wait)
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	st, lease := x.st, x.lease
	switch st.Status {
	case StatusCompleted, StatusHalted, StatusRollingBack:
	case StatusRunning, StatusPending, StatusAborted, StatusPaused:
		// An element cut short (its map is being undone before it
		// settled): roll back what it completed.
	default:
		_ = lease.Release(bg)
		return st.result(), nil
	}
	if x.def, err = e.lookupRun(st); err != nil {
		_ = lease.Release(bg)
		return nil, err
	}
	adoptElement(ctx, st)
	x.element, x.inWorker, x.windowNow = true, true, elementWindowAt(ctx)
	if st.Status == StatusRollingBack { // a crashed element undo: resume it
		return x.execute(ctx, EventRunResumed)
	}
	return x.undo(ctx, "undone with its map")
}

// Cancel stops a run that has not finished and rolls back what it completed;
// the run ends cancelled. A run executing in another process is asked to
// cancel and does so at its next checkpoint: before its next step, an
// inline map's next element, or its terminal write (a cancel that arrives
// during the last step rolls back that step too). A finished run is refused with
// ErrAlreadyFinished (use Undo), a rolling-back one with
// ErrRollbackInProgress.
func (e *Engine) Cancel(ctx context.Context, id string) error {
	st, _, err := e.load(ctx, id)
	if err != nil {
		return err
	}
	if err := cancelable(st); err != nil {
		return err
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		// Kept until the run's terminal write deletes it: a long step or a
		// hand-off must not outlive the request.
		err := e.store.RequestCancel(ctx, target)
		if err == nil && st.Status == StatusPaused && e.cfg.Enqueuer != nil {
			// A paused run held for a moment (a resume finding its
			// interrupt still waiting) writes nothing before it leaves,
			// and would not see the request: wake it once more to act on
			// it (the wake-up waits while the run is held).
			w := Wake{ID: wakeID(id, fmt.Sprintf("cancel:%d", st.Pauses)), RunID: id, Reactor: st.Reactor, Queue: st.Queue}
			if werr := e.cfg.Enqueuer.Enqueue(ctx, w); werr != nil {
				return fmt.Errorf("reactor: cancel of paused run %s is recorded, but waking the run failed: %w", id, werr)
			}
		}
		if errors.Is(err, store.ErrAlreadyDone) {
			// It finished meanwhile.
			if st, _, lerr := e.load(ctx, id); lerr == nil {
				return cancelable(st)
			}
			return &StatusError{RunID: id, Status: StatusCompleted, Op: "cancel", Err: ErrAlreadyFinished}
		}
		return err
	}
	if err != nil {
		return err
	}
	st, version, err := e.load(ctx, id)
	if err == nil {
		err = cancelable(st)
	}
	var def *Definition
	if err == nil {
		def, err = e.lookupRun(st)
	}
	if err != nil {
		_ = lease.Release(context.WithoutCancel(ctx))
		return err
	}
	x := &execution{e: e, def: def, st: st, target: target, lease: lease, version: version, indexed: st.Status}
	_, err = x.undo(ctx, "cancelled on request")
	return err
}

// undoable is Undo's status rule (Check shares it): a finished run that kept
// what it did.
func undoable(st *runState) error {
	switch {
	case treeRollingBack(st):
		return &StatusError{RunID: st.ID, Status: StatusRollingBack, Op: string(OpUndo), Err: ErrRollbackInProgress}
	case st.Status == StatusCompleted, st.Status == StatusHalted, st.Status == StatusAborted:
		return nil
	}
	return &StatusError{RunID: st.ID, Status: st.Status, Op: string(OpUndo), Err: ErrNotUndoable}
}

// cancelable is Cancel's status rule (Check shares it).
func cancelable(st *runState) error {
	switch {
	case treeRollingBack(st):
		return &StatusError{RunID: st.ID, Status: StatusRollingBack, Op: string(OpCancel), Err: ErrRollbackInProgress}
	case st.Status.Terminal():
		return &StatusError{RunID: st.ID, Status: st.Status, Op: string(OpCancel), Err: ErrAlreadyFinished}
	}
	return nil
}
