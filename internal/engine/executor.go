package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/store"
)

// errAborted: the caller's context ended while the run executed forward.
var errAborted = errors.New("reactor: run aborted: its context ended")

// execution is one process's turn at executing a root run while holding its
// lock. Every state write goes through save, fenced by the lease's token and
// the version last written.
type execution struct {
	e       *Engine
	def     *Definition
	st      *runState
	target  store.Target
	lease   *lock.Lease
	version int64
	indexed Status // the status the listing indexes hold for this run
	cancel  bool   // a cancel was requested (seen on a fenced write)
	// undoing: the execution is an undo on request (Cancel, Undo); a run
	// that never took its run limits undoes without them (runlimits.go).
	undoing bool
	// inWorker: executing as a worker does; hand-off points are passed
	// through, and an ended context leaves the run for redelivery.
	inWorker bool
	// element: the run is an element of a construct (a map element): it
	// is not indexed, and nested constructs run inline.
	element bool
	// created: this execution created the run's state (its intent, if any,
	// is this execution's and no Run has been called yet).
	created bool
	// revive: the run was finished (an Undo): its tree carries the
	// retention, taken off just before the first write makes the run live
	// again (see save).
	revive bool
	// pendingAudit are the audit entries of state changes not stored yet:
	// the next fenced write appends them in its script (audit.go).
	pendingAudit []auditRec
	// clockAt is the latest Redis server time this execution read (a
	// write's, or a clock reading), in Unix ms, and clockMono when it
	// arrived: stamp interpolates from them (window.go).
	clockAt   int64
	clockMono time.Time
	// windowNow is a server time read (and checked) by a call before it
	// started the rollback, used to judge its undo windows.
	windowNow int64
	// endingTargeted: the terminal write ends an UndoSteps; a cancel
	// request that came in meanwhile does not turn it into a rollback.
	endingTargeted bool
	// recheckWaiting: the run's terminal write must update its entry in
	// the index of runs waiting for a person (a conflict was settled).
	recheckWaiting bool
}

// frame is a definition executing over its state: the root run, or a
// composed child embedded in it.
type frame struct {
	def  *Definition
	st   *runState
	path string // "" for the root, "compose/" for a child
	// key is where the frame's entries sit in the run tree's order
	// (entryRec.Key): nil for the root, the compose entry's ordinal (to
	// be) for a child.
	key  []int
	root bool
	// notStarted: this execution set st.Intent and has not called that
	// step's Run yet, so a rollback from here has nothing of it to
	// compensate. An intent read back from Redis is never known not started.
	notStarted bool
	// prefetch holds the first attempts of a wave's steps, called at once
	// and not recorded yet; undoPre the outcomes of a group of undos
	// called at once, by ledger ordinal (concurrent.go).
	prefetch map[string]*prefetched
	undoPre  map[int]*undone
}

// frameResult is how a frame ended when it did not hit an infrastructure
// error.
type frameResult struct {
	status  Status
	value   Raw
	failure *Failure
	reason  string
}

// execute runs the root frame to its end, then reports the result, inside
// the execution's reactor.run span.
func (x *execution) execute(ctx context.Context, started EventKind) (*Result, error) {
	return x.traceRun(ctx, func(ctx context.Context) (*Result, error) { return x.executeTraced(ctx, started) })
}

func (x *execution) executeTraced(ctx context.Context, started EventKind) (*Result, error) {
	// The started (or resumed) event carries the status the execution
	// began from: pending on a stored run's first execution, which is how
	// a hook (package metrics) tells a worker's first pick-up of an
	// enqueued run from a later resume.
	from := x.st.Status
	if x.st.Status == StatusPending {
		x.st.Status = StatusRunning // saved with the first checkpoint
		// Only Enqueue stores a pending run: this is its first execution,
		// and it starts, whoever picked it up.
		started = EventRunStarted
	}
	runCtx := x.lease.Keep(ctx)
	defer x.lease.Stop() // also when a hook or middleware panics
	x.emit(ctx, Event{Kind: started, RunID: x.st.ID, Reactor: x.st.Reactor, Status: from})
	_, err := x.runFrame(runCtx, &frame{def: x.def, st: x.st, root: true, notStarted: x.created})
	x.lease.Stop()
	return x.conclude(ctx, err)
}

// conclude turns the end of an execution into the caller's answer and
// releases what is left to release.
func (x *execution) conclude(ctx context.Context, err error) (*Result, error) {
	bg := context.WithoutCancel(ctx)
	var ho *errHandOff
	var pz *errPause
	var lim *errLimited
	switch {
	case err == nil:
		// The terminal write released the lock.
		return x.st.result(), nil
	case errors.Is(err, ErrLockLost):
		// Not ours any more: write nothing, release nothing.
		x.emit(ctx, Event{Kind: EventRunLockLost, RunID: x.st.ID, Reactor: x.st.Reactor, Err: err})
		return nil, err
	case isDispatch(err):
		// A construct handed its work to workers after saving its
		// decision; the owner is resumed when the work settles.
		// Everything up to here was checkpointed (SaveState included).
		_ = x.lease.Release(bg)
		x.bindDeadline(ctx)
		return x.st.result(), nil
	case handedOff(err) != nil:
		// Saved under the lock before the construct marked the hand-off;
		// the construct's workers resume the owner when they settle.
		_ = x.lease.Release(bg)
		return x.st.result(), nil
	case errors.As(err, &pz):
		// Saved paused: nothing waits here; a continue or the timer wakes
		// the run on a worker.
		_ = x.lease.Release(bg)
		x.bindDeadline(ctx)
		if pz.timer != nil {
			if eerr := x.e.cfg.Enqueuer.Enqueue(ctx, *pz.timer); eerr != nil {
				// The run sweeper acts on a paused run past its deadline.
				x.e.log.Warn("paused run's timeout wake-up not enqueued; the run sweeper will act on its deadline",
					"event", "reactor.interrupt.timer", "run", x.st.ID, "error", eerr)
			}
		}
		return x.st.result(), nil
	case errors.As(err, &lim):
		// Saved at its checkpoint, waiting for room in a limit.
		_ = x.lease.Release(bg)
		return nil, lim.le
	case errors.As(err, &ho):
		// Saved (with its wake-up id) before the lock goes: a crash before
		// the enqueue leaves a running, unlocked run for the sweeper.
		_ = x.lease.Release(bg)
		w := Wake{ID: x.st.Wake, RunID: x.st.ID, Reactor: x.st.Reactor, Queue: x.st.Queue, Delay: ho.delay}
		if eerr := x.e.cfg.Enqueuer.Enqueue(ctx, w); eerr != nil {
			return nil, fmt.Errorf("reactor: hand off run %s (saved; the run sweeper will wake it): %w", x.st.ID, eerr)
		}
		return x.st.result(), nil
	case errors.Is(err, errAborted) && x.st.Status != StatusRollingBack && !x.inWorker:
		x.st.Status = StatusAborted
		x.st.Reason = "the caller's context ended: " + context.Cause(ctx).Error()
		if serr := x.save(bg, true); serr != nil {
			_ = x.lease.Release(bg)
			return nil, errors.Join(err, serr)
		}
		x.emit(ctx, Event{Kind: EventRunAborted, RunID: x.st.ID, Reactor: x.st.Reactor, Status: StatusAborted})
		return x.st.result(), nil
	default:
		// A rollback interrupted by the caller, or Redis trouble: the state
		// stays at its last checkpoint for a resume.
		_ = x.lease.Release(bg)
		return nil, err
	}
}

// save writes the root state, fenced. A terminal write carries the retention.
// An element's terminal write releases its lock in the same script; a root
// run's keeps the lock until its index entries and its tree's retention are
// written, so that nobody (an Undo, a resume) can make the run live again
// between the terminal write and a late index removal that would hide it
// from the sweeper.
func (x *execution) save(ctx context.Context, terminal bool) error {
	now := x.e.now()
	x.st.UpdatedAt = now.UnixMilli()
	if err := checkStatuses(x.st, ""); err != nil {
		return err
	}
	x.auditEligible(x.st, "")
	x.st.Clock = max(x.st.Clock, x.clockAt)
	audit, err := x.auditFields()
	if err != nil {
		return err
	}
	data, err := codec.Marshal(x.st)
	if err != nil {
		return fmt.Errorf("reactor: encode run: %w", err)
	}
	opts := store.WriteOptions{}
	if terminal {
		// A run that would finish with its effects kept (completed,
		// halted) while a cancel is pending rolls back instead.
		// (Not the end of an UndoSteps: the run had finished before it.)
		guard := !x.element && (x.st.Status == StatusCompleted || x.st.Status == StatusHalted) && !x.endingTargeted
		opts = store.WriteOptions{Retention: x.e.cfg.Retention, Release: x.element, UnlessCancelled: guard}
		if x.st.waitsForPerson() {
			// A person must resolve a conflicted undo: the run (and its
			// tree) stays until then.
			opts.KeepForever = true
		}
		if x.element {
			// An element run expires with its owner's tree, never on its
			// own clock: a rollback of the map may still need it.
			opts.Retention = 0
		}
	}
	reindex := x.st.Status != x.indexed && !x.element
	if reindex && !terminal {
		// Into the active index before the write that makes the run live
		// again (an undo of a finished run): a crash between the two must
		// not leave a live run where the sweeper cannot see it.
		if err := x.e.store.MarkStatus(ctx, x.st.ID, x.st.Reactor, string(x.indexed), string(x.st.Status), false, now); err != nil {
			return err
		}
		x.indexed = x.st.Status
	}
	if x.revive && !terminal {
		// After the run is back in the active index, before the write
		// that makes it live: a crash in between leaves a finished run in
		// the active index, whose tree the sweeper gives the retention
		// again (under the run's lock), never a live run whose tree still
		// expires under it.
		if err := x.e.expireTree(ctx, x.def, x.st.ID, 0); err != nil {
			return err
		}
		x.revive = false
	}
	if terminal && opts.KeepForever {
		// Listed before the write that finishes the run: whoever sees it
		// finished (a Wait) finds it in the list; a crash in between
		// lists a run that does not wait, which readers skip.
		if err := x.e.store.MarkNeedsHuman(ctx, x.st.ID, true, now); err != nil {
			return err
		}
	}
	opts.Audit = audit
	res, err := x.write(ctx, data, terminal, opts) // element_run.go
	if errors.Is(err, store.ErrCancelPending) {
		x.cancel = true
		return errCancelPending
	}
	var conflict *store.VersionConflictError
	if errors.Is(err, store.ErrLockNotHeld) || errors.As(err, &conflict) {
		return fmt.Errorf("%w: %v", ErrLockLost, err)
	}
	if err != nil {
		return err
	}
	x.version = res.Version
	x.observeClock(res.At)
	x.pendingAudit = nil // stored with the write
	if terminal && !opts.KeepForever && (len(x.st.conflicts()) > 0 || len(x.st.Held) > 0 || x.recheckWaiting) {
		// Off the list after the write that settled it.
		if err := x.e.store.MarkNeedsHuman(ctx, x.st.ID, false, now); err != nil {
			x.e.log.Warn("a run that no longer needs a person is still listed as such", "event", "reactor.index.stale", "run", x.st.ID, "error", err)
		}
	}
	x.cancel = x.cancel || res.CancelRequested
	if !terminal || x.element {
		return nil
	}
	// The run is finished and saved. What follows only tidies up; a failure
	// here leaves the run in the active index, where the sweeper finishes
	// the job. It must not turn a finished run into an error.
	retention := x.e.cfg.Retention
	if opts.KeepForever {
		retention = 0 // no expiry
	}
	if err := x.e.expireTree(ctx, x.def, x.st.ID, retention); err != nil {
		x.e.log.Warn("run finished but the retention of its maps and elements was not set; the sweeper retries",
			"event", "reactor.retention.pending", "run", x.st.ID, "error", err)
	} else if reindex {
		if err := x.reindexAndRelease(ctx, now); err != nil {
			x.e.log.Warn("run finished but its index entry was not updated", "event", "reactor.index.stale", "run", x.st.ID, "error", err)
		} else {
			x.indexed = x.st.Status
		}
		return nil
	}
	_ = x.lease.Release(ctx)
	return nil
}

// reindexAndRelease moves a finished run to its final status in the indexes
// and then releases its lock. Both happen after the terminal write and in
// this order: a writer that takes the lock next (an Undo) re-indexes the
// run after this process's index update, never before it, so a live run
// cannot lose its active entry. On one Redis they share a round trip (a
// pipeline runs in order there); on a cluster the release follows the
// index update's round trip.
func (x *execution) reindexAndRelease(ctx context.Context, now time.Time) error {
	st := x.e.store
	if !st.Ordered() {
		defer func() { _ = x.lease.Release(ctx) }()
		return st.MarkStatus(ctx, x.st.ID, x.st.Reactor, string(x.indexed), string(x.st.Status), true, now)
	}
	var release *redis.Cmd
	cmds, err := st.Pipelined(ctx, func(p redis.Pipeliner) {
		st.QueueMarkStatus(ctx, p, x.st.ID, x.st.Reactor, string(x.indexed), string(x.st.Status), true, now)
		release = x.lease.QueueRelease(ctx, p)
	})
	if len(cmds) == 0 {
		_ = x.lease.Release(ctx)
		return fmt.Errorf("store: index status: %w", err)
	}
	if release.Err() != nil {
		// A lost script cache, or a failed round trip: the lock goes
		// the ordinary way (or expires).
		_ = x.lease.Release(ctx)
	}
	for _, c := range cmds {
		if c != release && c.Err() != nil {
			return fmt.Errorf("store: index status: %w", c.Err())
		}
	}
	return nil
}

// checkpoint saves progress mid-run.
func (x *execution) checkpoint(ctx context.Context) error {
	if lock.Lost(ctx) {
		return ErrLockLost
	}
	return x.save(context.WithoutCancel(ctx), false)
}

// interrupted reports why the run must not execute more user code, if it
// must not.
func interrupted(ctx context.Context) error {
	if lock.Lost(ctx) {
		return ErrLockLost
	}
	if ctx.Err() != nil {
		return errAborted
	}
	return nil
}

// runFrame executes f's remaining steps in dependency order, then finishes
// it. For the root frame, finishing means the terminal write.
func (x *execution) runFrame(ctx context.Context, f *frame) (*frameResult, error) {
	if f.st.Status == StatusRollingBack {
		return x.rollback(ctx, f, nil)
	}
	pending := 0
	for _, s := range f.def.order {
		if _, done := f.st.Steps[s.name]; !done {
			pending++
		}
	}
	// Task steps dispatched and not settled (StepConfig.Task): with
	// MaxConcurrency above 1 the steps that do not need them go on.
	var parked []string
	for _, s := range f.def.order {
		if _, done := f.st.Steps[s.name]; done {
			continue
		}
		if len(parked) > 0 && !f.depsDone(s) {
			continue // waits for a parked task step, directly or through another
		}
		if in := f.st.takeInflight(s.name); in != nil {
			// A wave's step whose outcome a crash kept from the record:
			// run again as a step cut short (its interruption counted).
			f.st.Intent, f.notStarted = in, false
		}
		if err := interrupted(ctx); err != nil {
			// Cut short between steps: the next step's intent was this
			// execution's and its Run was never called, so an aborted run
			// saved from here has nothing of it to compensate.
			if f.notStarted {
				f.st.Intent = nil
			}
			return nil, err
		}
		if x.cancel {
			return x.startRollback(ctx, f, TriggerUndo, "", newCancelFailure("cancelled on request"), nil)
		}
		if x.pastDeadline(0) {
			// No step is failing, so none is compensated as the trigger;
			// an intent read back from Redis is rolled back as a step cut
			// short.
			return x.startRollback(ctx, f, TriggerFailure, "", x.deadlineFailure(), nil)
		}
		if s.handoff == HandOffBefore && x.canHandOff() {
			// The worker taking over records its own intent: a run handed
			// off before s never called s here.
			if f.notStarted {
				f.st.Intent = nil
			}
			if err := x.handOff(ctx, s.name, "before"); err != nil {
				return nil, err
			}
			// The hand-off's checkpoint saw a cancel request: honour it
			// here instead of handing off.
			return x.startRollback(ctx, f, TriggerUndo, "", newCancelFailure("cancelled on request"), nil)
		}
		if w := x.wave(f, s); w != nil {
			res, started, stop, err := x.runWave(ctx, f, w, &pending)
			if stop || err != nil {
				return res, err
			}
			if started {
				continue
			}
		}
		res, stop, err := x.stepInFrame(ctx, f, s, &pending, false)
		if isDispatch(err) && f.def.maxConc > 1 && isTaskStep(s) {
			parked = append(parked, s.name)
			continue
		}
		if stop || err != nil {
			return res, err
		}
	}
	if len(parked) > 0 {
		// Everything that could run ran: the run waits for its task steps
		// (each wakes it when it settles).
		return nil, errDispatch
	}
	f.st.Status = StatusCompleted
	if f.def.returns != nil {
		v, err := resolveRef(f.def, *f.def.returns, f.st)
		if err != nil {
			return x.startRollback(ctx, f, TriggerFailure, "", newFailure("", Permanent(fmt.Errorf("reactor: resolve return value: %w", err))), nil)
		}
		f.st.Value = v
	}
	return x.finish(ctx, f, EventRunCompleted)
}

// stepInFrame runs step s of frame f and records its outcome; pending
// counts f's steps not done. stop (or an error) ends the frame with res.
// batch leaves a success's checkpoint to the next step's.
func (x *execution) stepInFrame(ctx context.Context, f *frame, s *stepDef, pending *int, batch bool) (res *frameResult, stop bool, err error) {
	if f.prefetch[s.name] == nil {
		f.st.stepStarted(s.name, x.e.now())
	}
	out, err := x.runStep(ctx, f, s)
	if err != nil {
		return nil, true, err
	}
	*pending--
	if out.kind == outOK || out.kind == outSkip {
		now := x.e.now()
		f.st.stepFinished(s.name, now)
		// The next step's intent rides on this step's checkpoint, and
		// so does its start (the dashboard's timeline).
		f.st.Intent, f.notStarted = nextIntent(f), true
		if f.st.Intent != nil {
			f.st.stepStarted(f.st.Intent.Step, now)
		}
	}
	if out.kind == outOK && s.handoff == HandOffAfter && *pending > 0 && x.canHandOff() {
		f.st.Intent = nil
		if err := x.handOff(ctx, s.name, "after"); err != nil {
			return nil, true, err
		}
		res, err := x.startRollback(ctx, f, TriggerUndo, "", newCancelFailure("cancelled on request"), nil)
		return res, true, err
	}
	switch out.kind {
	case outOK, outSkip:
		// The last step's record rides on the terminal write.
		if (*pending > 0 || !f.root) && !batch {
			if err := x.checkpoint(ctx); err != nil {
				return nil, true, err
			}
		}
	case outHalt:
		f.st.stopped(s.name, StopHalted)
		f.st.Intent = nil
		f.st.Status, f.st.Reason = StatusHalted, out.reason
		res, err := x.finish(ctx, f, EventRunHalted)
		return res, true, err
	case outCancel:
		res, err := x.startRollback(ctx, f, TriggerUndo, "", out.failure, nil)
		return res, true, err
	case outFail:
		// The failing step is compensated as the rollback's trigger.
		f.st.stopped(s.name, StopFailed)
		f.st.Intent = nil
		res, err := x.startRollback(ctx, f, TriggerFailure, s.name, out.failure, out.err)
		return res, true, err
	}
	return nil, false, nil
}

func (x *execution) canHandOff() bool { return !x.inWorker && x.e.cfg.Enqueuer != nil }

// handOff saves the run with the id of the wake-up about to be enqueued and
// returns the signal that unwinds the execution (conclude releases the lock
// and enqueues). It returns nil when the save reported a cancel request.
func (x *execution) handOff(ctx context.Context, step, where string) error {
	x.st.Wake = wakeID(x.st.ID, fmt.Sprintf("handoff:%s:%s:%d", step, where, x.version))
	if err := x.checkpoint(ctx); err != nil {
		return err
	}
	if x.cancel {
		x.st.Wake = ""
		return nil // the caller rolls back instead
	}
	return &errHandOff{step: step}
}

// errCancelPending: the terminal write of a completed or halted run found
// a cancel request (it came in during the last step).
var errCancelPending = errors.New("reactor: a cancel was requested before the run finished")

// finish ends a frame in its current (terminal) status. A root run that
// completed or halted while a cancel request came in (during its last
// step, which no checkpoint followed) honours the request: it rolls back
// and ends cancelled instead.
func (x *execution) finish(ctx context.Context, f *frame, ev EventKind) (*frameResult, error) {
	if f.root {
		err := x.save(context.WithoutCancel(ctx), true)
		if errors.Is(err, errCancelPending) {
			f.st.Status, f.st.Value, f.st.Reason = StatusRunning, nil, ""
			return x.startRollback(ctx, f, TriggerUndo, "", newCancelFailure("cancelled on request"), nil)
		}
		if err != nil {
			return nil, err
		}
	}
	x.emit(ctx, Event{Kind: ev, RunID: x.st.ID, Reactor: f.def.name, Step: trimPath(f.path), Status: f.st.Status, Err: f.st.Failure.errOrNil()})
	return &frameResult{status: f.st.Status, value: f.st.Value, failure: f.st.Failure, reason: f.st.Reason}, nil
}

func (f *Failure) errOrNil() error {
	if f == nil {
		return nil
	}
	return f
}

func trimPath(p string) string {
	if p == "" {
		return ""
	}
	return p[:len(p)-1]
}

type outKind uint8

const (
	outOK outKind = iota
	outSkip
	outHalt
	outFail
	outCancel
)

type stepOutcome struct {
	kind    outKind
	reason  string
	failure *Failure
	err     error
}

// runStep runs one step with its retries and records a success on the
// frame's state. It returns an error only when the run must stop without
// treating the step as failed (lost lock, ended context).
func (x *execution) runStep(ctx context.Context, f *frame, s *stepDef) (stepOutcome, error) {
	path := f.path + s.name
	args, err := resolveArgs(f.def, s, f.st)
	if err != nil {
		err = Permanent(fmt.Errorf("reactor: step %q: %w", s.name, err))
		return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
	}
	switch s.kind {
	case kindCompose:
		return x.runCompose(ctx, f, s, args)
	case kindConstruct:
		return x.runConstruct(ctx, f, s, args)
	case kindInterrupt:
		return x.runInterrupt(ctx, f, s, args)
	}
	attempts := s.retry.attempts()
	first := 1
	if in := f.st.Intent; in != nil && in.Step == s.name && in.Attempt > 1 {
		// Failed attempts are durable: a resume goes on from the attempt
		// the run was on, never from 1.
		first = in.Attempt
	}
	switch in := f.st.Intent; {
	case in == nil || in.Step != s.name:
		// Decide, save, then act: the intent is on record before Run is
		// called (usually the previous step's checkpoint carried it).
		f.st.Intent, f.notStarted = &intentRec{Step: s.name, Attempt: first}, true
		if err := x.checkpoint(ctx); err != nil {
			return stepOutcome{}, err
		}
		if x.cancel {
			return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
		}
	case in.Scheduled:
		in.Scheduled = false // a scheduled retry's wake-up: nothing was cut short
	case !f.notStarted:
		// Read back from Redis: an earlier execution may have died inside
		// the step. A crash does not spend an attempt, but a step that
		// kills every process running it must not be retried for ever.
		in.Interrupted++
		if in.Interrupted > maxInterruptions {
			err := Permanent(fmt.Errorf("%w: step %q was cut short %d times (its process died or its delivery ended each time); giving up",
				ErrStepInterrupted, path, in.Interrupted-1))
			x.emit(ctx, Event{Kind: EventStepFailed, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: first, Err: err})
			return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
		}
		if err := x.checkpoint(ctx); err != nil { // the count is on record before the step runs again
			return stepOutcome{}, err
		}
		// Still not known unstarted: a cancel found by that checkpoint
		// rolls the step back as cut short (the dead execution may have
		// had its effect), never discards it.
		if x.cancel {
			return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
		}
	}
	for attempt := first; ; attempt++ {
		holds, err := x.takeLimits(ctx, f, s, args, false)
		if oh, ok := errors.AsType[*onceHeld](err); ok {
			return stepOutcome{kind: outHalt, reason: oh.reason}, nil
		}
		if lc, ok := errors.AsType[*limitCancel](err); ok {
			return stepOutcome{kind: outCancel, failure: newCancelFailure(lc.reason)}, nil
		}
		if le, ok := errors.AsType[*LimitError](err); ok {
			// Full: wait at the checkpoint, the attempt not started (a
			// scheduled intent, so the resume counts no interruption).
			f.st.Intent = &intentRec{Step: s.name, Attempt: attempt, Scheduled: true}
			if err := x.checkpoint(ctx); err != nil {
				return stepOutcome{}, err
			}
			if x.cancel {
				return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
			}
			return stepOutcome{}, &errLimited{le: le}
		}
		if err != nil {
			if ierr := interrupted(ctx); ierr != nil {
				return stepOutcome{}, ierr
			}
			if IsPermanent(err) {
				return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
			}
			return stepOutcome{}, err
		}
		pre := f.prefetch[s.name]
		delete(f.prefetch, s.name)
		if pre == nil {
			x.emit(ctx, Event{Kind: EventStepStarted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: attempt})
		}
		began := time.Now()
		startedAt := x.e.now()
		var val Raw
		f.notStarted = false
		var effects *effectRecorder
		if pre != nil {
			// Called in a wave (concurrent.go): its first attempt's outcome.
			val, err, began, startedAt = pre.val, pre.err, pre.began, pre.startedAt
		} else {
			if hook := failpoints.beforeStepRun; hook != nil {
				hook(x.st.ID, path, attempt)
			}
			if s.guard != nil {
				effects = &effectRecorder{guard: s.guard}
			}
			err = x.call(ctx, Call{Kind: CallRun, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: attempt}, s.timeout, func(cctx context.Context) error {
				if effects != nil {
					cctx = context.WithValue(cctx, effectKey{}, effects)
				}
				var rerr error
				val, rerr = s.run(cctx, args)
				return rerr
			})
		}
		holds.release(ctx)
		// After a lost lock nothing the step returned counts: no record, no
		// compensation. Another process owns the run.
		if lock.Lost(ctx) {
			return stepOutcome{}, ErrLockLost
		}
		var halt *haltError
		var skip *skipError
		// The attempt as its log keeps it (attempts.go).
		try := attemptRec{N: attempt, Start: startedAt.UnixMilli(), Dur: max(0, x.e.now().Sub(startedAt).Milliseconds())}
		switch {
		case err == nil:
			f.st.Steps[s.name] = &stepRec{State: stepDone, Value: val, Attempts: attempt}
			f.st.Intent = nil
			onLedger := s.undo != nil
			if s.undo != nil {
				f.st.Seq++
				f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: s.name, Args: args, Result: val, Status: RollbackPending,
					At: x.stamp(ctx, f.def), Resource: s.resourceOf(args, val)})
			}
			if effects != nil {
				// A guarded step is on the ledger only when it recorded
				// the effect it had: nothing else is there to undo.
				if res, ef := effects.taken(); ef != nil {
					f.st.Seq++
					f.st.Ledger = append(f.st.Ledger, &LedgerEntry{Ordinal: f.st.Seq, Step: s.name, Args: args, Result: val, Status: RollbackPending,
						At: x.stamp(ctx, f.def), Resource: res, Effect: ef})
					onLedger = true
				}
			}
			f.st.Steps[s.name].Log = f.st.completedLog(s.name, try, args, !onLedger)
			if s.spawn != nil {
				x.noteSpawned(path, val)
			}
			x.emit(ctx, Event{Kind: EventStepCompleted, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: attempt, Duration: time.Since(began)})
			return stepOutcome{kind: outOK}, nil
		case errors.As(err, &skip):
			f.st.Steps[s.name] = &stepRec{State: stepSkipped, Attempts: attempt, Log: f.st.completedLog(s.name, try, args, true)}
			f.st.Intent = nil
			x.emit(ctx, Event{Kind: EventStepSkipped, RunID: x.st.ID, Reactor: f.def.name, Step: path})
			return stepOutcome{kind: outSkip}, nil
		case errors.As(err, &halt):
			f.st.attempted(s.name, try, args, true) // saved with the halt
			return stepOutcome{kind: outHalt, reason: halt.reason}, nil
		case ctx.Err() != nil:
			// The caller's context ended: the step did not fail, the run
			// was cut short. Its intent stays: the step may have had its
			// effect.
			return stepOutcome{}, errAborted
		}
		delay := s.retry.delay(attempt)
		switch {
		case x.pastDeadline(0):
			// Stopped by the run's deadline (its context carried it), or
			// failed after it: either way the run is out of time.
			err = x.deadlineError(path, err)
		case s.timeout > 0 && errors.Is(err, context.DeadlineExceeded):
			err = fmt.Errorf("%w: %w", &TimeoutError{Step: path, Timeout: s.timeout.String()}, err)
		}
		if !IsPermanent(err) && attempt < attempts && x.pastDeadline(delay) {
			// The next attempt would start past the deadline.
			err = x.deadlineError(path, err)
		}
		try.Err, try.Retry = attemptError(err), !IsPermanent(err)
		// On record with the checkpoint that follows: the retry's below,
		// or the one that starts the failed step's rollback.
		f.st.attempted(s.name, try, args, true)
		if IsPermanent(err) || attempt >= attempts {
			x.emit(ctx, Event{Kind: EventStepFailed, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: attempt, Err: err, Duration: time.Since(began)})
			return stepOutcome{kind: outFail, failure: newFailure(path, err), err: err}, nil
		}
		x.emit(ctx, Event{Kind: EventStepRetrying, RunID: x.st.ID, Reactor: f.def.name, Step: path, Attempt: attempt, Err: err, Delay: delay})
		// The failed attempt is on record before the next one, so a crash
		// cannot hand the step a fresh set of attempts.
		f.st.Intent = &intentRec{Step: s.name, Attempt: attempt + 1}
		if delay > maxHeldBackoff && x.canSchedule() {
			// A long backoff is a scheduled wake-up, not a sleep holding
			// the run's lock and a worker slot.
			f.st.Intent.Scheduled = true
			x.st.Wake = wakeID(x.st.ID, fmt.Sprintf("retry:%s:%d", path, attempt+1))
			if err := x.checkpoint(ctx); err != nil {
				return stepOutcome{}, err
			}
			if x.cancel {
				return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
			}
			return stepOutcome{}, &errHandOff{step: s.name, delay: delay}
		}
		if err := x.checkpoint(ctx); err != nil {
			return stepOutcome{}, err
		}
		if x.cancel {
			return stepOutcome{kind: outCancel, failure: newCancelFailure("cancelled on request")}, nil
		}
		if err := x.e.sleep(ctx, delay); err != nil {
			if ierr := interrupted(ctx); ierr != nil {
				return stepOutcome{}, ierr
			}
			return stepOutcome{}, err
		}
	}
}

// maxInterruptions is how many executions of a step may be cut short (its
// process dies, its delivery ends) before the step fails: a step that kills
// its worker (out of memory, a crash in its own goroutine) would otherwise
// be redelivered for ever, whatever its Retry.
const maxInterruptions = 5

// maxHeldBackoff is the longest retry backoff a worker sleeps through
// holding the run's lock; a longer one becomes a scheduled wake-up.
const maxHeldBackoff = time.Second

// canSchedule reports whether the run can be left and woken later by a
// delayed task: a worker's run (not a map element, whose wake-ups are its
// map's) with an Enqueuer. An in-process run's caller is waiting for it, so
// it sleeps instead.
func (x *execution) canSchedule() bool {
	return x.inWorker && !x.element && x.e.cfg.Enqueuer != nil
}

// nextIntent is the intent for the first step of f not done yet: only plain
// steps carry one (a compose child and a construct keep their own state).
func nextIntent(f *frame) *intentRec {
	for _, s := range f.def.order {
		if _, done := f.st.Steps[s.name]; done {
			continue
		}
		if s.kind != kindPlain {
			return nil
		}
		return &intentRec{Step: s.name, Attempt: 1}
	}
	return nil
}

// call invokes a step function through the middleware chain, with an
// optional timeout, turning a panic into a *PanicError. The context carries
// the engine and the call's RunInfo, and a Run's carries the run's deadline.
func (x *execution) call(ctx context.Context, c Call, timeout time.Duration, fn func(context.Context) error) (err error) {
	ctx, span := x.startCall(ctx, c)
	defer func() { endCall(span, err) }()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	if dl := x.deadline(); !dl.IsZero() && c.Kind == CallRun {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	ctx = context.WithValue(ctx, engineKey{}, x.e)
	ctx = context.WithValue(ctx, runInfoKey{}, x.runInfo(c))
	return x.e.invoke(ctx, c, fn)
}

// invoke calls fn through the engine's middleware; a panic in fn or in a
// middleware fails the call, not the process.
func (e *Engine) invoke(ctx context.Context, c Call, fn func(context.Context) error) (err error) {
	next := func(ctx context.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = &PanicError{Value: fmt.Sprint(r), Stack: string(debug.Stack())}
			}
		}()
		return fn(ctx)
	}
	mws := e.cfg.Middleware
	for i := len(mws) - 1; i >= 0; i-- {
		mw, inner := mws[i], next
		next = func(ctx context.Context) error { return mw(ctx, c, inner) }
	}
	if len(mws) > 0 { // a panicking middleware fails the call, not the run
		defer func() {
			if r := recover(); r != nil {
				err = &PanicError{Value: fmt.Sprint(r), Stack: string(debug.Stack())}
			}
		}()
	}
	return next(ctx)
}

func newCancelFailure(msg string) *Failure {
	return &Failure{Code: codeCancelled, Message: msg, err: ErrCancelled}
}

type engineKey struct{}

// EngineFrom returns the engine executing the step whose context ctx is (for
// helpers such as mapstep's result reader), or nil outside a step.
func engineFrom(ctx context.Context) *Engine {
	e, _ := ctx.Value(engineKey{}).(*Engine)
	return e
}
