package engine

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RunOption configures one Run or Enqueue call. An option that makes no
// sense for the call it is given to (WithDelay on Run) makes the call fail
// with an error naming the option, before anything is stored.
type RunOption func(*runOptions)

// runOptions is what the options of one call asked for.
type runOptions struct {
	id    string
	queue string
	// trace is the trace id of a run the call creates (from its context).
	trace string
	// deadline is the run's deadline (zero: none); with several deadline
	// options, the earliest.
	deadline time.Time
	// delay and startAt postpone the start wake-up (Enqueue only).
	delay   time.Duration
	startAt time.Time
	// enqueueOnly names the options given that only Enqueue takes.
	enqueueOnly []string
	// errs are the options given with an invalid value.
	errs []error
	// noWait: Run returns where the run leaves this process (NoWait,
	// run_wait.go).
	noWait bool
	// retryOf is the run a new run retries (Engine.Retry, retry_run.go).
	retryOf string
	// spawnedBy is the run and step that spawned the new run (Spawn).
	spawnedBy *SpawnLink
	// sensitive makes the new run a sensitive run whatever its definition
	// says (the retry of a sensitive run).
	sensitive bool
	// fresh: the engine generated id, so no other process can know it
	// yet: the start takes the run's lock in the create (engine.go).
	fresh bool
}

// callKind is the call a set of options was given to.
type callKind string

const (
	callRun     callKind = "Run"
	callEnqueue callKind = "Enqueue"
)

func (o *runOptions) bad(format string, args ...any) {
	o.errs = append(o.errs, fmt.Errorf("reactor: "+format, args...))
}

func (o *runOptions) setDeadline(t time.Time) {
	if o.deadline.IsZero() || t.Before(o.deadline) {
		o.deadline = t
	}
}

// WithRunID runs under a caller-chosen id. Starting the same id again is
// idempotent: a finished run returns its stored result, and an unfinished
// one that no process holds is resumed from its last checkpoint.
func WithRunID(id string) RunOption { return func(o *runOptions) { o.id = id } }

// WithQueue puts the run's wake-ups on the asynq queue name instead of the
// Enqueuer's own: the start task of Enqueue, and every later wake-up of the
// run (a hand-off, a scheduled retry, a run sweeper's wake), since the queue
// is stored with the run. Start workers on that queue (worker.Config.Queues).
// The tasks of its fan-out maps (element tasks, rollback jobs, the owner's
// resume after a map) stay on the Enqueuer's queue.
func WithQueue(name string) RunOption {
	return func(o *runOptions) {
		if strings.TrimSpace(name) == "" {
			o.bad("WithQueue: the queue name is empty")
			return
		}
		o.queue = name
	}
}

// WithDelay postpones the start of an enqueued run by d: the run is stored
// pending at once, and its start task is scheduled d from now. Enqueue only.
func WithDelay(d time.Duration) RunOption {
	return func(o *runOptions) {
		o.enqueueOnly = append(o.enqueueOnly, "WithDelay")
		if d < 0 {
			o.bad("WithDelay: negative delay %s", d)
			return
		}
		o.delay = d
	}
}

// WithStartAt starts an enqueued run at t (at once when t has passed): the
// run is stored pending at once, and its start task is scheduled for t.
// Enqueue only.
func WithStartAt(t time.Time) RunOption {
	return func(o *runOptions) {
		o.enqueueOnly = append(o.enqueueOnly, "WithStartAt")
		if t.IsZero() {
			o.bad("WithStartAt: zero time")
			return
		}
		o.startAt = t
	}
}

// WithDeadline gives the run a deadline, stored with it: once it has passed,
// the run fails with ErrDeadlineExceeded at its next checkpoint (before its
// next step, or its first when it starts late) and rolls back like any
// failure. The context of each step's Run carries the deadline, so a step
// that honours its context stops at it; its error then becomes the
// deadline's and the step is not retried. Undo and Compensate are not bound
// by it: a rollback runs to its end. With several deadline options, the
// earliest applies. A restart of a stored id keeps the stored deadline.
func WithDeadline(t time.Time) RunOption {
	return func(o *runOptions) {
		if t.IsZero() {
			o.bad("WithDeadline: zero time")
			return
		}
		o.setDeadline(t)
	}
}

// WithTimeout is WithDeadline(time.Now().Add(d)), counted from the call
// that starts the run (Enqueue counts from the enqueue, not from when a
// worker takes the run).
func WithTimeout(d time.Duration) RunOption {
	return func(o *runOptions) {
		if d <= 0 {
			o.bad("WithTimeout: non-positive timeout %s", d)
			return
		}
		o.setDeadline(time.Now().Add(d))
	}
}

// collectOptions applies opts for call and checks them.
func collectOptions(call callKind, opts []RunOption) (runOptions, error) {
	var o runOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if len(o.errs) > 0 {
		return o, errors.Join(o.errs...)
	}
	if call != callEnqueue && len(o.enqueueOnly) > 0 {
		return o, fmt.Errorf("reactor: %s applies to Enqueue only: %s starts the run at once in this process", o.enqueueOnly[0], call)
	}
	if o.id == "" {
		o.id, o.fresh = NewRunID(), true
	}
	if err := validateRunID(o.id); err != nil {
		return o, err
	}
	if o.id == "." || o.id == ".." {
		// A URL cannot address it: /runs/.. is /, for browsers and proxies.
		return o, fmt.Errorf("reactor: run id %q is a path's dot segment, which no URL can name (the dashboard's run page, its API)", o.id)
	}
	return o, nil
}

// startDelay is how long the start wake-up waits.
func (o runOptions) startDelay(now time.Time) time.Duration {
	d := o.delay
	if !o.startAt.IsZero() {
		d = max(d, o.startAt.Sub(now))
	}
	return max(d, 0)
}

// applyTo stores what the options ask of a new run on its state.
func (o runOptions) applyTo(st *runState) {
	st.Queue, st.Trace, st.RetryOf, st.SpawnedBy = o.queue, o.trace, o.retryOf, o.spawnedBy
	st.Sensitive = st.Sensitive || o.sensitive
	if !o.deadline.IsZero() {
		st.Deadline = o.deadline.UnixMilli()
	}
}

// NewRunID returns a random run id.
func NewRunID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
