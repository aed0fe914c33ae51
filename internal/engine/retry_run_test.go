package engine_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
)

// wakeLog is an Enqueuer that records the wake-ups it is given; the test
// executes them itself (Resume), as a worker would.
type wakeLog struct {
	mu    sync.Mutex
	wakes []engine.Wake
}

func (q *wakeLog) Enqueue(_ context.Context, w engine.Wake) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.wakes = append(q.wakes, w)
	return nil
}

func (q *wakeLog) last() engine.Wake {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.wakes[len(q.wakes)-1]
}

// flaky is a reactor whose one step fails while fail is set, recording the
// input it saw.
func flaky(name string, fail *atomic.Bool, seen *[]int, mu *sync.Mutex) *engine.Definition {
	type in struct {
		N int `json:"n"`
	}
	return engine.MustDefine(name,
		engine.Input[int]("n", engine.Required()),
		engine.Step("charge", engine.StepConfig[in, int]{
			Args: engine.Bindings{"n": engine.FromInput("n")},
			Run: func(_ context.Context, a in) (int, error) {
				mu.Lock()
				*seen = append(*seen, a.N)
				mu.Unlock()
				if fail.Load() {
					return 0, engine.Permanent(errors.New("card declined"))
				}
				return a.N * 2, nil
			},
		}),
		engine.Returns(engine.FromStep("charge")),
	)
}

// A failed run is retried under a derived id with the same inputs, on the
// same queue, with the same deadline budget, linked both ways; the
// original's expiry is left as it was.
func TestRetryRunsTheFailedRunAgainLinkedBothWays(t *testing.T) {
	t.Parallel()
	q := &wakeLog{}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	ctx := ctxTimeout(t)
	var fail atomic.Bool
	var seen []int
	var mu sync.Mutex
	fail.Store(true)
	def := flaky("retry_flaky", &fail, &seen, &mu)

	res, err := env.engine.Run(ctx, def, map[string]any{"n": 21}, engine.WithQueue("billing"), engine.WithTimeout(time.Hour))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	orig, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	stateKey := env.prefix + ":{run:" + res.RunID + "}:ctx"
	ttlBefore, err := env.rdb.PTTL(ctx, stateKey).Result()
	require.NoError(t, err)
	require.Positive(t, ttlBefore)

	retried, err := env.engine.Retry(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, res.RunID+"-retry-1", retried.RunID)
	require.Equal(t, engine.StatusPending, retried.Status)
	require.Equal(t, engine.OutcomeDispatched, retried.Outcome())
	w := q.last()
	require.Equal(t, retried.RunID, w.RunID)
	require.Equal(t, "billing", w.Queue, "the retry's wake-ups go to the original's queue")

	after, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{retried.RunID}, after.RetriedBy)
	require.Equal(t, engine.StatusFailed, after.Status)
	ttlAfter, err := env.rdb.PTTL(ctx, stateKey).Result()
	require.NoError(t, err)
	require.Positive(t, ttlAfter, "the original still expires")
	require.LessOrEqual(t, ttlAfter, ttlBefore, "the retry did not extend the original's retention")

	nr, err := env.engine.Get(ctx, retried.RunID)
	require.NoError(t, err)
	require.Equal(t, res.RunID, nr.RetryOf)
	require.Equal(t, orig.Inputs, nr.Inputs)
	require.Equal(t, "billing", nr.Queue)
	budget := orig.Deadline.Sub(orig.CreatedAt)
	require.WithinDuration(t, nr.CreatedAt.Add(budget), nr.Deadline, 2*time.Second, "the deadline carries over as a budget")

	fail.Store(false)
	final, err := env.engine.Resume(ctx, retried.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, final.Status)
	v, err := engine.ValueOf[int](final)
	require.NoError(t, err)
	require.Equal(t, 42, v)
	mu.Lock()
	require.Equal(t, []int{21, 21}, seen, "the retry ran with the original's inputs")
	mu.Unlock()
}

// The retry rules: only failed and cancelled runs; not while the latest
// retry is live or after it completed; again once it failed. Check gives
// the same answer, word for word, without a definition.
func TestRetryRules(t *testing.T) {
	t.Parallel()
	q := &wakeLog{}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	ctx := ctxTimeout(t)
	// A process that holds no definitions (a dashboard) checks.
	reader, err := engine.NewEngine(ctx, engine.Config{Client: env.rdb, Prefix: env.prefix})
	require.NoError(t, err)
	var fail atomic.Bool
	var seen []int
	var mu sync.Mutex
	def := flaky("retry_rules", &fail, &seen, &mu)

	refused := func(id string, want error, status engine.Status) {
		t.Helper()
		_, rerr := env.engine.Retry(ctx, id)
		var se *engine.StatusError
		require.ErrorAs(t, rerr, &se)
		require.ErrorIs(t, rerr, want)
		require.Equal(t, status, se.Status)
		require.Equal(t, "retry", se.Op)
		_, cerr := reader.Check(ctx, id, engine.OpRetry)
		require.Error(t, cerr)
		require.Equal(t, rerr.Error(), cerr.Error(), "Check says what Retry says")
	}

	done, err := env.engine.Run(ctx, def, map[string]any{"n": 1})
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, done.Status)
	refused(done.RunID, engine.ErrNotRetryable, engine.StatusCompleted)

	halted, err := env.engine.Run(ctx, engine.MustDefine("retry_halts",
		engine.Step("stop", engine.StepConfig[engine.Args, int]{
			Run: func(context.Context, engine.Args) (int, error) { return 0, engine.Halt("enough") },
		})), nil)
	require.NoError(t, err)
	refused(halted.RunID, engine.ErrNotRetryable, engine.StatusHalted)

	fail.Store(true)
	failed, err := env.engine.Run(ctx, def, map[string]any{"n": 2})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, failed.Status)
	_, err = reader.Check(ctx, failed.RunID, engine.OpRetry)
	require.NoError(t, err)
	first, err := env.engine.Retry(ctx, failed.RunID)
	require.NoError(t, err)

	// A second request while the first retry is pending creates nothing.
	_, err = env.engine.Retry(ctx, failed.RunID)
	require.ErrorContains(t, err, "already retried as "+first.RunID+", which is pending")
	refused(failed.RunID, engine.ErrAlreadyRetried, engine.StatusFailed)

	// The retry fails too: the original may be retried again, attempt 2.
	res, err := env.engine.Resume(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	second, err := env.engine.Retry(ctx, failed.RunID)
	require.NoError(t, err)
	require.Equal(t, failed.RunID+"-retry-2", second.RunID)
	orig, err := env.engine.Get(ctx, failed.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{first.RunID, second.RunID}, orig.RetriedBy)

	// Once a retry completed, the original is settled.
	fail.Store(false)
	res, err = env.engine.Resume(ctx, second.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	_, err = env.engine.Retry(ctx, failed.RunID)
	require.ErrorContains(t, err, "already retried as "+second.RunID+", which completed")
	refused(failed.RunID, engine.ErrAlreadyRetried, engine.StatusFailed)

	// A cancelled run (undone: everything rolled back) is retryable.
	undone, err := env.engine.Undo(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCancelled, undone.Status)
	again, err := env.engine.Retry(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, done.RunID+"-retry-1", again.RunID)

	_, err = env.engine.Retry(ctx, "no-such-run")
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = reader.Check(ctx, "no-such-run", engine.OpRetry)
	require.ErrorIs(t, err, engine.ErrNotFound)
	_, err = reader.Retry(ctx, failed.RunID)
	require.ErrorIs(t, err, engine.ErrNoEnqueuer)
}

// A retry recorded on the original whose run was never created (the
// process died in between) is created under the recorded id by the next
// request, never under a second one. Not parallel: it sets a failpoint.
func TestRetryAfterACrashCreatesTheRecordedAttempt(t *testing.T) {
	q := &wakeLog{}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	ctx := ctxTimeout(t)
	var fail atomic.Bool
	var seen []int
	var mu sync.Mutex
	fail.Store(true)
	def := flaky("retry_crash", &fail, &seen, &mu)
	res, err := env.engine.Run(ctx, def, map[string]any{"n": 3})
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)

	crash := errors.New("process died")
	engine.SetRetryAfterRecord(func(string) error { return crash })
	_, err = env.engine.Retry(ctx, res.RunID)
	engine.SetRetryAfterRecord(nil)
	require.ErrorIs(t, err, crash)
	orig, err := env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{res.RunID + "-retry-1"}, orig.RetriedBy, "decided and saved before acting")
	_, err = env.engine.Get(ctx, res.RunID+"-retry-1")
	require.ErrorIs(t, err, engine.ErrNotFound)

	retried, err := env.engine.Retry(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, res.RunID+"-retry-1", retried.RunID)
	orig, err = env.engine.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, []string{retried.RunID}, orig.RetriedBy)
	nr, err := env.engine.Get(ctx, retried.RunID)
	require.NoError(t, err)
	require.Equal(t, res.RunID, nr.RetryOf)
}

// Check applies Undo's and Cancel's own rules, with their words.
func TestCheckSharesUndoAndCancelRules(t *testing.T) {
	t.Parallel()
	env := newEnv(t)
	ctx := ctxTimeout(t)
	reader, err := engine.NewEngine(ctx, engine.Config{Client: env.rdb, Prefix: env.prefix})
	require.NoError(t, err)
	failing := engine.MustDefine("check_fails", simple(env.trail, "a", engine.Permanent(errors.New("no"))))
	ok := engine.MustDefine("check_ok", simple(env.trail, "a", nil))
	failed, err := env.engine.Run(ctx, failing, nil)
	require.NoError(t, err)
	done, err := env.engine.Run(ctx, ok, nil)
	require.NoError(t, err)

	_, uerr := env.engine.Undo(ctx, failed.RunID)
	require.ErrorIs(t, uerr, engine.ErrNotUndoable)
	_, cerr := reader.Check(ctx, failed.RunID, engine.OpUndo)
	require.EqualError(t, cerr, uerr.Error())

	kerr := env.engine.Cancel(ctx, done.RunID)
	require.ErrorIs(t, kerr, engine.ErrAlreadyFinished)
	run, cerr := reader.Check(ctx, done.RunID, engine.OpCancel)
	require.EqualError(t, cerr, kerr.Error())
	require.Equal(t, done.RunID, run.ID)

	run, err = reader.Check(ctx, done.RunID, engine.OpUndo)
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, run.Status)
	_, err = reader.Check(ctx, done.RunID, engine.Op("resolve"))
	require.ErrorContains(t, err, `unknown operation "resolve"`)
}

// Retries never repeat what still stands, never fork a chain, and never
// adopt a stranger: a run whose rollback left an effect in place is
// refused, a retry is retried through its original only, and a retry id
// held by an unrelated run (an earlier run under the original's id left it
// behind) is passed over.
func TestRetrySafetyRules(t *testing.T) {
	t.Parallel()
	q := &wakeLog{}
	env := newEnv(t, func(c *engine.Config) { c.Enqueuer = q })
	ctx := ctxTimeout(t)
	var charges atomic.Int32
	leaky := engine.MustDefine("retry_leaky",
		engine.Step("charge", engine.StepConfig[engine.Args, string]{
			Run: func(context.Context, engine.Args) (string, error) { charges.Add(1); return "ch-1", nil },
			Undo: func(context.Context, engine.Args, string) error {
				return engine.Permanent(errors.New("refund failed"))
			},
		}),
		simple(env.trail, "ship", engine.Permanent(errors.New("no courier")), "charge"),
	)
	res, err := env.engine.Run(ctx, leaky, nil, engine.WithRunID("leaky-1"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	_, err = env.engine.Retry(ctx, "leaky-1")
	var se *engine.StatusError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, engine.ErrNotRetryable)
	require.ErrorContains(t, err, "left 1 effect(s) in place")
	_, cerr := env.engine.Check(ctx, "leaky-1", engine.OpRetry)
	require.EqualError(t, cerr, err.Error(), "Check says the same")
	require.Equal(t, int32(1), charges.Load(), "nothing was charged again")

	var fail atomic.Bool
	var seen []int
	var mu sync.Mutex
	fail.Store(true)
	def := flaky("retry_chain", &fail, &seen, &mu)
	res, err = env.engine.Run(ctx, def, map[string]any{"n": 1}, engine.WithRunID("chain"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	first, err := env.engine.Retry(ctx, "chain")
	require.NoError(t, err)
	failed, err := env.engine.Resume(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, failed.Status)
	_, err = env.engine.Retry(ctx, first.RunID)
	require.ErrorIs(t, err, engine.ErrNotRetryable)
	require.ErrorContains(t, err, "it is a retry of chain; retry chain instead")

	// A stranger holds chain-retry-2 (as if left by an earlier "chain").
	_, err = env.engine.Run(ctx, def, map[string]any{"n": 7}, engine.WithRunID("chain-retry-2"))
	require.NoError(t, err)
	second, err := env.engine.Retry(ctx, "chain")
	require.NoError(t, err)
	require.Equal(t, "chain-retry-3", second.RunID, "the held id is passed over")
	nr, err := env.engine.Get(ctx, second.RunID)
	require.NoError(t, err)
	require.Equal(t, "chain", nr.RetryOf)
	orig, err := env.engine.Get(ctx, "chain")
	require.NoError(t, err)
	require.Equal(t, []string{first.RunID, "chain-retry-3"}, orig.RetriedBy)
}
