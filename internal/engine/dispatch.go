package engine

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
)

// Wake asks a worker to execute run RunID. ID names the cause of the wake-up
// (a start, a hand-off, a sweep), so that a duplicate of the same cause is
// recognised as already queued.
type Wake struct {
	// ID is the task id: "resume:<run>:<cause>".
	ID      string
	RunID   string
	Reactor string
	// Queue is the asynq queue of the task; "" for the Enqueuer's own. A
	// run's wake-ups carry the queue it recorded: WithQueue's, or the
	// Enqueuer's when Enqueue stored it.
	Queue string
	// Delay postpones the task.
	Delay time.Duration
	// Element is true when RunID is a map element's run ("<map>.<i>",
	// paused at an interrupt): the wake-up is a delivery of that
	// element's task, on its map's queue.
	Element bool
	// Retain keeps the completed task visible this long (asynq retention),
	// so a sweeper can tell a wake-up that ran from one that was lost.
	// Zero: the task is forgotten when it completes.
	Retain time.Duration
}

// Enqueuer puts wake-ups on the workers' queue. The worker package's Client
// implements it with asynq. An Enqueue of an ID that is already queued must
// return nil: it is the same cause. An Enqueuer that also has a
// Queue() string method (worker.Client has) names its queue: a run
// Engine.Enqueue stores without WithQueue records that queue, so the run's
// later wake-ups, retries and operators' actions (a dashboard's undo) go
// where its workers are.
type Enqueuer interface {
	Enqueue(ctx context.Context, w Wake) error
}

// enqueuerQueue is the queue the Enqueuer names, "" when it names none.
func (e *Engine) enqueuerQueue() string {
	if q, ok := e.cfg.Enqueuer.(interface{ Queue() string }); ok {
		return q.Queue()
	}
	return ""
}

// ErrNoEnqueuer: the operation hands work to workers but Config.Enqueuer is
// not set.
var ErrNoEnqueuer = errors.New("reactor: Config.Enqueuer is required to hand runs to workers (see package worker)")

func errIDTaken(id, reactor string) error {
	return fmt.Errorf("reactor: run id %s is taken by a run of %q%w", id, reactor, errTaken)
}

// errTaken marks errIDTaken's errors (it adds no text).
var errTaken = errors.New("")

func wakeID(runID, cause string) string { return "resume:" + runID + ":" + cause }

// HandOff is where a step hands the rest of an in-process run to workers.
type HandOff uint8

// Hand-off points.
const (
	// NoHandOff: the step runs where the run runs.
	NoHandOff HandOff = iota
	// HandOffBefore: the in-process run saves, hands off, and a worker runs
	// this step and the rest.
	HandOffBefore
	// HandOffAfter: the step runs in-process, then a worker runs the rest.
	HandOffAfter
)

// errHandOff unwinds an execution at a hand-off point (or a retry backoff
// turned into a scheduled wake-up, after delay).
type errHandOff struct {
	step  string
	delay time.Duration
}

func (e *errHandOff) Error() string { return "reactor: handed off at step " + e.step }

// Enqueue stores a run of def as pending and hands it to workers; it returns
// at once with a dispatched Result (see Wait). WithDelay and WithStartAt
// schedule the start task for later (the run is stored pending at once);
// WithQueue picks the queue of the run's wake-ups, which is else the
// Enqueuer's (recorded with the run, see Enqueuer). Starting the same id again is
// idempotent: the stored run's result or status is returned.
func (e *Engine) Enqueue(ctx context.Context, def *Definition, inputs map[string]any, opts ...RunOption) (*Result, error) {
	if e.cfg.Enqueuer == nil {
		return nil, ErrNoEnqueuer
	}
	o, encoded, err := e.prepareRun(ctx, callEnqueue, def, inputs, opts)
	if err != nil {
		return nil, err
	}
	id := o.id
	target := e.store.RunTarget(id)
	lease, err := e.locks.TryAcquire(ctx, target.Lock)
	if errors.Is(err, lock.ErrHeld) {
		// Someone executes it already: it is dispatched, or finished.
		if st, _, lerr := e.load(ctx, id); lerr == nil {
			if st.Reactor != def.name {
				return nil, errIDTaken(id, st.Reactor)
			}
			if err := sameInputs(id, st.Inputs, encoded); err != nil {
				return nil, err
			}
			return st.result(), nil
		}
		return nil, fmt.Errorf("%w (run %s)", ErrRunLocked, id)
	}
	if err != nil {
		return nil, err
	}
	bg := context.WithoutCancel(ctx)
	defer func() { _ = lease.Release(bg) }()
	now := e.now()
	st := newState(id, def, encoded, now)
	st.Status = StatusPending
	o.applyTo(st)
	if st.Queue == "" {
		// The run records the queue it is really on, not "the default".
		st.Queue = e.enqueuerQueue()
	}
	w := Wake{ID: wakeID(id, "start"), RunID: id, Reactor: def.name, Queue: st.Queue, Delay: o.startDelay(now)}
	st.Wake = w.ID
	data, err := codec.Marshal(st)
	if err != nil {
		return nil, fmt.Errorf("reactor: encode run: %w", err)
	}
	added, err := e.store.IndexStart(ctx, id, def.name, string(StatusPending), now)
	if err != nil {
		return nil, err
	}
	snap, created, err := e.store.Create(ctx, target, lease.Token(), data)
	if err != nil {
		return nil, err
	}
	if !created {
		existing, err := decodeState(snap.Data)
		if err != nil {
			return nil, err
		}
		// Undo the speculative pending index entry where it is wrong (and
		// this reactor's entries, when the run is another reactor's).
		owner := def.name
		if existing.Reactor != def.name {
			_ = e.store.UnindexReactor(bg, id, def.name, string(StatusPending))
			owner = existing.Reactor
		}
		if existing.Status.Terminal() {
			_ = e.store.TakeBackStart(bg, id, owner, string(StatusPending), added, now)
		} else if existing.Status != StatusPending {
			_ = e.store.MarkStatus(bg, id, owner, string(StatusPending), string(existing.Status), false, now)
		}
		if existing.Reactor != def.name {
			// As Run does: the id belongs to another reactor's run, which
			// must not be woken under this reactor's name.
			return nil, errIDTaken(id, existing.Reactor)
		}
		if err := sameInputs(id, existing.Inputs, encoded); err != nil {
			return nil, err
		}
		if existing.Status.Terminal() {
			return existing.result(), nil
		}
		st = existing
		w.Queue = st.Queue // the stored run's, whatever this call asked
	}
	if st.Status == StatusPending {
		// An ordered run limit's place is taken now, so that the key's
		// runs execute in enqueue order whichever worker picks which up
		// first (runlimits.go).
		if err := e.placeOrdered(ctx, def, st); err != nil {
			return nil, err
		}
	}
	// Saved first, then enqueued: a crash in between leaves a pending run
	// that the run sweeper wakes.
	if err := e.cfg.Enqueuer.Enqueue(ctx, w); err != nil {
		return nil, fmt.Errorf("reactor: enqueue run %s (stored; the run sweeper will wake it): %w", id, err)
	}
	return st.result(), nil
}

// Wait blocks until run id reaches a terminal status or ctx ends, and
// returns its result. It listens for the run's terminal write, which
// announces itself on the run's shard pub/sub channel (Redis 7 SSUBSCRIBE;
// every Wait of an Engine shares one connection, one per master on a
// cluster), and reads the run every few seconds as well, in case an
// announcement was lost; on a Redis without sharded pub/sub it polls with
// a backoff from 5 ms to 250 ms. When ctx ends while the run is still
// pending and the Enqueuer is a ServingReporter (worker.Client is), Wait
// asks it whether any worker serves the queue; if none does, the error is a
// *NotServedError saying so. A run pending for longer than 5 s on a queue
// no worker serves is also logged once, as a warning, while Wait goes on
// waiting.
func (e *Engine) Wait(ctx context.Context, id string) (*Result, error) {
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	w, err := e.store.Watcher().Watch(ctx, e.store.RunTarget(id).Done)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("reactor: wait for run %s: %w", id, ctx.Err())
		}
		// No sharded pub/sub, or Redis trouble that the reads below will
		// report if it lasts.
		return e.pollWait(ctx, id)
	}
	defer w.Close()
	pending := newPendingWatch(e, id)
	fallback := time.NewTimer(waitFallbackDelay())
	defer fallback.Stop()
	for {
		// Read at once (a finished run returns without waiting for the
		// subscription), again when the subscription is confirmed (a
		// terminal write that landed before it was is not missed), on
		// every announcement, and on the fallback tick.
		st, _, err := e.load(ctx, id)
		if err != nil {
			return nil, err
		}
		if st.Status.Terminal() {
			return st.result(), nil
		}
		pending.observe(ctx, st)
		select {
		case <-w.C:
		case <-fallback.C:
			fallback.Reset(waitFallbackDelay())
		case <-ctx.Done():
			if nerr := pending.notServed(ctx, st, ctx.Err()); nerr != nil {
				return nil, nerr
			}
			return nil, fmt.Errorf("reactor: wait for run %s (last seen %s): %w", id, st.Status, ctx.Err())
		}
	}
}

// waitFallback is how often a listening Wait reads its run anyway, jittered
// by a fifth either way so that many waiters do not read in step.
const waitFallback = 5 * time.Second

func waitFallbackDelay() time.Duration {
	return waitFallback*4/5 + rand.N(waitFallback*2/5)
}

// pollWait is Wait without pub/sub: it reads the run with a backoff from
// 5 ms to 250 ms.
func (e *Engine) pollWait(ctx context.Context, id string) (*Result, error) {
	delay := 5 * time.Millisecond
	pending := newPendingWatch(e, id)
	for {
		st, _, err := e.load(ctx, id)
		if err != nil {
			return nil, err
		}
		if st.Status.Terminal() {
			return st.result(), nil
		}
		pending.observe(ctx, st)
		if err := sleepCtx(ctx, delay); err != nil {
			if nerr := pending.notServed(ctx, st, err); nerr != nil {
				return nil, nerr
			}
			return nil, fmt.Errorf("reactor: wait for run %s (last seen %s): %w", id, st.Status, err)
		}
		delay = min(delay*2, 250*time.Millisecond)
	}
}

// ServingReporter is implemented by an Enqueuer that can tell whether any
// worker is serving the queue it enqueues on; worker.Client does, through
// asynq's server registry. Wait consults it for a run that stays pending,
// so that "no worker is running" is not reported as a bare timeout.
type ServingReporter interface {
	// Queue names the queue the Enqueuer enqueues on.
	Queue() string
	// ServesQueue reports whether a live worker polls queue (a run
	// started WithQueue waits on its own).
	ServesQueue(ctx context.Context, queue string) (bool, error)
}

// NotServedError is Wait's error when its context ended while the run was
// still pending and no worker served the queue the run was enqueued on.
// It unwraps to the context's error.
type NotServedError struct {
	RunID string
	Queue string
	Err   error
}

func (e *NotServedError) Error() string {
	return fmt.Sprintf("reactor: wait for run %s: it is still pending and no worker serves queue %s; "+
		"start a worker on that queue (cmd/worker -queue %s) or check the workers' queues: %v", e.RunID, e.Queue, e.Queue, e.Err)
}

func (e *NotServedError) Unwrap() error { return e.Err }

// DefinitionWaitError is Wait's error when its context ended while the
// workers that received the run refused it for want of the definition it
// started with (or of any definition of its reactor): a rolling deploy
// removed it, or the workers run an older build. It unwraps to the
// context's error.
type DefinitionWaitError struct {
	RunID string
	Wait  *DefinitionWait
	Err   error
}

func (e *DefinitionWaitError) Error() string {
	return fmt.Sprintf("reactor: wait for run %s: it is %s, and the workers that received it do not have it (refused by %s); "+
		"register that definition on a worker (see reactor.Version): %v", e.RunID, e.Wait, e.Wait.By, e.Err)
}

func (e *DefinitionWaitError) Unwrap() error { return e.Err }

const (
	// servedWarnAfter is how long a run may stay pending in Wait before
	// Wait checks whether its queue is served at all.
	servedWarnAfter = 5 * time.Second
	// servedCheckEvery spaces the later checks (one Redis scan of asynq's
	// servers each), until one finds the queue unserved and warns.
	servedCheckEvery = 30 * time.Second
	// servedTimeout bounds one check, also after Wait's context ended.
	servedTimeout = 2 * time.Second
)

// pendingWatch asks the Enqueuer, if it can tell, whether a run that Wait
// sees pending has a worker serving its queue.
type pendingWatch struct {
	e      *Engine
	id     string
	sr     ServingReporter // nil: the Enqueuer cannot tell
	next   time.Time       // when observe checks next
	warned bool
}

func newPendingWatch(e *Engine, id string) *pendingWatch {
	sr, _ := e.cfg.Enqueuer.(ServingReporter)
	return &pendingWatch{e: e, id: id, sr: sr, next: time.Now().Add(servedWarnAfter)}
}

// queueOf is the queue run st's wake-ups go to.
func (w *pendingWatch) queueOf(st *runState) string {
	if st.Queue != "" {
		return st.Queue
	}
	return w.sr.Queue()
}

// served asks the reporter about queue, bounded by servedTimeout even when
// ctx ended. ok is false when it cannot tell.
func (w *pendingWatch) served(ctx context.Context, queue string) (served, ok bool) {
	if w.sr == nil {
		return false, false
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), servedTimeout)
	defer cancel()
	served, err := w.sr.ServesQueue(cctx, queue)
	return served, err == nil
}

// definitionWait reads the run's definition-wait note, bounded by
// servedTimeout even when ctx ended; nil when there is none (or it cannot
// be read).
func (w *pendingWatch) definitionWait(ctx context.Context) *DefinitionWait {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), servedTimeout)
	defer cancel()
	dw, _ := w.e.DefinitionWait(cctx, w.id)
	return dw
}

// observe warns, once, about a run that has been pending for a while on a
// queue no worker serves, or that the workers refuse for want of its
// definition.
func (w *pendingWatch) observe(ctx context.Context, st *runState) {
	if w.warned || time.Now().Before(w.next) {
		return
	}
	w.next = time.Now().Add(servedCheckEvery)
	if dw := w.definitionWait(ctx); dw != nil {
		w.warned = true
		w.e.log.WarnContext(ctx, "waiting for a run that the workers refuse: "+dw.String(),
			"event", "reactor.wait.definition", "run", w.id, "reactor", dw.Reactor, "wants", dw.Want.String(), "refused_by", dw.By)
		return
	}
	if w.sr == nil || st.Status != StatusPending {
		return
	}
	if served, ok := w.served(ctx, w.queueOf(st)); ok && !served {
		w.warned = true
		w.e.log.WarnContext(ctx, "waiting for a pending run that no worker can take: no worker serves its queue",
			"event", "reactor.wait.unserved", "run", w.id, "queue", w.queueOf(st))
	}
}

// notServed returns a *NotServedError when Wait ended on a pending run whose
// queue no worker serves, a *DefinitionWaitError when the workers that
// received the run refused it for want of its definition, else nil.
func (w *pendingWatch) notServed(ctx context.Context, st *runState, cause error) error {
	if dw := w.definitionWait(ctx); dw != nil {
		return &DefinitionWaitError{RunID: w.id, Wait: dw, Err: cause}
	}
	if st.Status != StatusPending || w.sr == nil {
		return nil
	}
	if served, ok := w.served(ctx, w.queueOf(st)); ok && !served {
		return &NotServedError{RunID: w.id, Queue: w.queueOf(st), Err: cause}
	}
	return nil
}

// Process executes a stored run as a worker does: hand-off points are passed
// through, and a context that ends (worker shutdown) leaves the run where it
// was for the next delivery instead of aborting it. It returns ErrRunLocked
// when another process holds the run, which a worker answers by snoozing.
func (e *Engine) process(ctx context.Context, id string) (*Result, error) {
	return e.resume(ctx, id, true)
}
