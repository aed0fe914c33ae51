package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/internal/lock"
	"github.com/goreactor/goreactor/internal/store"
)

// Errors of Engine.Retry (the Err of its *StatusError).
var (
	// ErrNotRetryable: retry of a run that is not failed or cancelled.
	ErrNotRetryable = errors.New("reactor: only a failed or cancelled run can be retried (everything it did was rolled back); " +
		"undo a completed, halted or aborted run first, and wait for a live one to finish")
	// ErrAlreadyRetried: retry of a run whose latest retry is still live,
	// or completed.
	ErrAlreadyRetried = errors.New("reactor: run already retried")
)

// Retry runs a failed or cancelled run again: a new run of the same
// reactor with the same inputs, on the same queue, stored pending and
// handed to workers (Config.Enqueuer is required), like Enqueue. It returns
// the new run's dispatched Result; Wait for its end. A deadline carries
// over as a budget: the new run gets as long as the original had, counted
// from the retry.
//
// The runs are linked both ways: the new run's RetryOf is id, and id's
// RetriedBy lists the new run. The new run's id is derived from the
// original's and the attempt ("<id>-retry-1", "<id>-retry-2"), and the
// attempt is recorded on the original before the new run is created, so a
// repeated or redelivered request never creates two runs: while the latest
// retry is live, or after it completed, Retry is refused with
// ErrAlreadyRetried naming it; once it failed or was cancelled, the
// original can be retried again (or the retry itself can).
//
// Only failed and cancelled runs are retryable: both were rolled back, so
// running them again from the start repeats nothing that still stands. A
// completed, halted or aborted run kept its effects (Undo it first); a live
// run is still running. Refusals are *StatusError (Op "retry") with
// ErrNotRetryable or ErrAlreadyRetried. Retry waits up to
// Config.UndoLockWait for the original's lock and returns ErrRunLocked if
// it stays held.
func (e *Engine) Retry(ctx context.Context, id string) (*Result, error) {
	if e.cfg.Enqueuer == nil {
		return nil, ErrNoEnqueuer
	}
	if err := validateRunID(id); err != nil {
		return nil, err
	}
	target := e.store.RunTarget(id)
	lease, err := e.locks.Acquire(ctx, target.Lock, e.cfg.UndoLockWait)
	if errors.Is(err, lock.ErrHeld) {
		return nil, fmt.Errorf("%w (run %s; waited %s)", ErrRunLocked, id, e.cfg.UndoLockWait)
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = lease.Release(context.WithoutCancel(ctx)) }()
	st, version, err := e.load(ctx, id)
	if err != nil {
		return nil, err
	}
	newID, record, err := e.retryPlan(ctx, st)
	if err != nil {
		return nil, err
	}
	// The new run starts under the reactor's current definition (its
	// highest version): a retry after a deploy runs the fixed reactor.
	def, err := e.lookup(st.Reactor)
	if err != nil {
		return nil, err
	}
	// Inputs the definition no longer accepts (a deploy changed them) are
	// refused before anything is recorded.
	if _, err := def.checkInputs(st.Inputs); err != nil {
		return nil, &StatusError{RunID: id, Status: st.Status, Op: string(OpRetry),
			Err: fmt.Errorf("%w: its inputs no longer fit reactor %q: %w", ErrNotRetryable, st.Reactor, err)}
	}
	if record {
		// Decide, save, then act: the attempt is on the original before
		// its run exists, so a request repeated after a crash finds it and
		// creates that run, not a second one.
		if err := e.recordRetry(ctx, st, version, lease.Token(), newID); err != nil {
			return nil, err
		}
		if hook := retryAfterRecord; hook != nil {
			if err := hook(id); err != nil {
				return nil, err
			}
		}
	}
	inputs := make(map[string]any, len(st.Inputs))
	for k, v := range st.Inputs {
		inputs[k] = v // Raw encodes as itself
	}
	opts := []RunOption{WithRunID(newID), func(o *runOptions) { o.retryOf, o.sensitive = id, st.Sensitive }}
	if st.Queue != "" {
		opts = append(opts, WithQueue(st.Queue))
	}
	if st.Deadline != 0 {
		budget := time.Duration(st.Deadline-st.CreatedAt) * time.Millisecond
		opts = append(opts, WithDeadline(e.now().Add(max(budget, time.Millisecond))))
	}
	res, err := e.Enqueue(ctx, def, inputs, opts...)
	if err != nil {
		return nil, fmt.Errorf("reactor: retry of run %s as %s: %w", id, newID, err)
	}
	e.log.InfoContext(ctx, "run retried", "event", "reactor.run.retried", "run", id, "retry", newID, "reactor", st.Reactor)
	return res, nil
}

// retryAfterRecord is a test-only failpoint (retry_export_test.go) between
// the record of a retry on the original and the retry's creation: an error
// stops Retry there, as a crash would.
var retryAfterRecord func(id string) error

// retryID is the id of the n-th retry of run id.
func retryID(id string, n int) string { return id + "-retry-" + strconv.Itoa(n) }

// retryPlan is Retry's status rule (Check shares it): the id the retry of
// st gets, and whether that attempt still has to be recorded on st (false
// when st lists it already but it was never created: a crash between the
// two).
func (e *Engine) retryPlan(ctx context.Context, st *runState) (string, bool, error) {
	refuse := func(err error) (string, bool, error) {
		return "", false, &StatusError{RunID: st.ID, Status: st.Status, Op: string(OpRetry), Err: err}
	}
	if treeRollingBack(st) {
		return refuse(ErrNotRetryable)
	}
	switch st.Status {
	case StatusFailed, StatusCancelled:
	default:
		return refuse(ErrNotRetryable)
	}
	if n := st.effectsInPlace(); n > 0 {
		// Its rollbacks left effects in place (an undo failed or was
		// blocked, a conflict waits for a person or was left applied, an
		// undo window had closed, or its map elements hold some): running
		// it again would repeat them on top of what still stands.
		return refuse(fmt.Errorf("%w: its rollback left %d effect(s) in place (see its rollback status); "+
			"retrying would repeat them", ErrNotRetryable, n))
	}
	if f := st.Failure; f != nil {
		if n := len(f.RollbackFailures) + f.RollbackFailuresOmitted; n > 0 {
			// Rollback failures of a run stored before the entry book.
			return refuse(fmt.Errorf("%w: its rollback left %d effect(s) in place (see its rollback failures); "+
				"retrying would repeat them", ErrNotRetryable, n))
		}
	}
	if st.RetryOf != "" {
		// One retry chain has one live copy at most: it grows from the
		// original, never from a retry.
		return refuse(fmt.Errorf("%w: it is a retry of %s; retry %s instead", ErrNotRetryable, st.RetryOf, st.RetryOf))
	}
	if n := len(st.RetriedBy); n > 0 {
		latest := st.RetriedBy[n-1]
		lst, _, err := e.load(ctx, latest)
		switch {
		case errors.Is(err, ErrNotFound):
			return latest, false, nil
		case err != nil:
			return "", false, err
		case !lst.Status.Terminal():
			return refuse(fmt.Errorf("%w as %s, which is %s: wait for it to finish", ErrAlreadyRetried, latest, lst.Status))
		case lst.Status == StatusCompleted:
			return refuse(fmt.Errorf("%w as %s, which completed", ErrAlreadyRetried, latest))
		}
	}
	// The next free retry id: one held by a run that is not this run's
	// retry (an earlier run under this id, since expired and reused, left
	// its retries behind) is passed over.
	for n := len(st.RetriedBy) + 1; n <= len(st.RetriedBy)+maxRetryIDProbes; n++ {
		id := retryID(st.ID, n)
		if err := validateRunID(id); err != nil {
			return refuse(fmt.Errorf("%w: its retry id would be invalid: %w", ErrNotRetryable, err))
		}
		old, _, err := e.load(ctx, id)
		switch {
		case errors.Is(err, ErrNotFound):
			return id, true, nil
		case err != nil:
			return "", false, err
		case old.RetryOf == st.ID && old.CreatedAt >= st.CreatedAt:
			// Ours, yet not recorded: impossible (recorded first), but
			// never create a second copy of it.
			return id, false, nil
		}
	}
	return refuse(fmt.Errorf("%w: the next %d retry ids are held by other runs", ErrNotRetryable, maxRetryIDProbes))
}

// maxRetryIDProbes bounds the retry ids Retry looks at past those recorded.
const maxRetryIDProbes = 8

// recordRetry adds newID to st's RetriedBy with a fenced write that keeps
// the finished run's expiry as it is: a retry neither shortens nor extends
// how long the original (and its tree, which expires with it) is kept.
func (e *Engine) recordRetry(ctx context.Context, st *runState, version int64, token, newID string) error {
	target := e.store.RunTarget(st.ID)
	ttl, err := e.cfg.Client.PTTL(ctx, target.State).Result()
	if err != nil {
		return fmt.Errorf("reactor: read the retention of run %s: %w", st.ID, err)
	}
	st.RetriedBy = append(st.RetriedBy, newID)
	data, err := codec.Marshal(st)
	if err != nil {
		return fmt.Errorf("reactor: encode run: %w", err)
	}
	// A positive retention is a terminal write (the state keeps expiring);
	// a state without an expiry stays without one.
	_, err = e.store.Write(ctx, target, token, version, data, store.WriteOptions{Retention: max(ttl, 0)})
	if err != nil {
		return fmt.Errorf("reactor: record retry %s on run %s: %w", newID, st.ID, err)
	}
	return nil
}
