package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// approval is the payload of the interrupt steps below.
type approval struct {
	By string `json:"by"`
	OK bool   `json:"ok"`
}

func validApproval(a approval) error {
	if a.By == "" {
		return errors.New("an approval names who approves (by)")
	}
	return nil
}

// approvalFlow reserves (undoable), waits for an approval, then ships
// with the approver's name. Its interrupt claims the order as its
// correlation id, with timeout (0: none).
func approvalFlow(name string, tr *trail, timeout time.Duration, deflt func(reactor.Args) (approval, error)) *reactor.Definition {
	return reactor.MustDefine(name,
		reactor.Input[string]("order", reactor.Required()),
		step(tr, "reserve", nil),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			After: []string{"reserve"},
			Correlation: func(in reactor.Args) (string, error) {
				return reactor.Arg[string](in, "order")
			},
			Validate: validApproval,
			Timeout:  timeout,
			Default:  deflt,
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep("approve", "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				by, err := reactor.Arg[string](in, "by")
				tr.add("run:ship")
				return "shipped, approved by " + by, err
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
}

// serve returns an engine with defs registered, and a worker on it.
func (f *fixture) serve(defs ...*reactor.Definition) *reactor.Engine {
	f.t.Helper()
	e := f.engine("w")
	require.NoError(f.t, e.Register(defs...))
	f.startWorker(e)
	return e
}

// awaitPaused waits until run id is paused and returns it.
func awaitPaused(t *testing.T, e *reactor.Engine, id string) *reactor.Run {
	t.Helper()
	var run *reactor.Run
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		r, err := e.Get(context.Background(), id)
		require.NoError(c, err)
		require.Equal(c, reactor.StatusPaused, r.Status)
		run = r
	}, 10*time.Second, 5*time.Millisecond)
	return run
}

// activeTasks counts the queue's tasks a worker is executing.
func (f *fixture) activeTasks() int {
	f.t.Helper()
	q, err := f.inspector.GetQueueInfo(f.queue)
	require.NoError(f.t, err)
	return q.Active
}

func TestInterruptContinueByRunID(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, 0, nil)
	e := f.serve(def)

	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-1"}, reactor.WithRunID("ap-1"))
	require.NoError(t, err)
	run := awaitPaused(t, e, res.RunID)
	require.NotNil(t, run.Paused)
	assert.Equal(t, "approve", run.Paused.Step)
	assert.Equal(t, "o-1", run.Paused.Correlation)
	assert.Equal(t, []string{"reserve"}, run.Completed)
	// The worker is free: nothing executes while the run waits.
	f.awaitTaskGone(startTask(res.RunID))
	assert.Equal(t, 0, f.activeTasks())

	info, err := e.Interrupt(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, "worker_test.approval", info.PayloadType)
	assert.JSONEq(t, `{"by":"","ok":false}`, string(info.Example))
	assert.Equal(t, 0, info.Received)

	// Not at that step: a clear error, nothing recorded.
	_, err = e.Continue(ctx, res.RunID, "ship", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrNotPaused)

	c, err := e.Continue(ctx, res.RunID, "approve", approval{By: "ann", OK: true}, reactor.ContinueBy("ops:ann"))
	require.NoError(t, err)
	assert.True(t, c.Woken)
	assert.True(t, c.Checked)
	assert.Equal(t, 1, c.Received)

	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by ann", got)
	assert.Equal(t, []string{"run:reserve", "run:ship"}, tr.all())

	// The payload is the step's result.
	done, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Nil(t, done.Paused)
	var step reactor.StepInfo
	for _, s := range done.Steps {
		if s.Name == "approve" {
			step = s
		}
	}
	a, err := reactor.ValueOf[approval](&reactor.Result{Value: step.Value})
	require.NoError(t, err)
	assert.Equal(t, approval{By: "ann", OK: true}, a)

	// A duplicate is told when the first came.
	_, err = e.Continue(ctx, res.RunID, "approve", approval{By: "bob"})
	var already *reactor.AlreadyContinuedError
	require.ErrorAs(t, err, &already)
	assert.Equal(t, c.At, already.At)
	assert.ErrorIs(t, err, reactor.ErrAlreadyContinued)

	// The audit has the pause and the continue, with its sender.
	entries, err := e.Audit(ctx, res.RunID)
	require.NoError(t, err)
	var kinds []reactor.AuditKind
	var sender string
	for _, en := range entries {
		kinds = append(kinds, en.Kind)
		if en.Kind == reactor.AuditContinued {
			sender = en.Operator
			assert.Equal(t, reactor.HashMessage(`{"by":"ann","ok":true}`), en.MessageHash)
		}
	}
	assert.Contains(t, kinds, reactor.AuditPaused)
	assert.Contains(t, kinds, reactor.AuditContinued)
	assert.Equal(t, "ops:ann", sender)
}

func TestInterruptContinueByCorrelation(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, 0, nil)
	e := f.serve(def)

	first, err := e.Enqueue(ctx, def, map[string]any{"order": "o-7"}, reactor.WithRunID("corr-1"))
	require.NoError(t, err)
	awaitPaused(t, e, first.RunID)

	// A second live run cannot claim the same id: its step fails clearly,
	// and it rolls back what it did.
	clash, err := e.Enqueue(ctx, def, map[string]any{"order": "o-7"}, reactor.WithRunID("corr-2"))
	require.NoError(t, err)
	res, err := e.Wait(ctx, clash.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, res.Status)
	// (A stored failure keeps its sentinel and message, not its type.)
	require.ErrorIs(t, res.Err(), reactor.ErrCorrelationTaken)
	assert.Contains(t, res.Err().Error(), `correlation id "o-7" is held by run corr-1, paused at step approve`)

	_, err = e.ContinueByCorrelation(ctx, "o-404", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrNoCorrelation)

	c, err := e.ContinueByCorrelation(ctx, "o-7", approval{By: "cy", OK: true})
	require.NoError(t, err)
	assert.Equal(t, "corr-1", c.RunID)
	assert.Equal(t, "approve", c.Step)
	final, err := e.Wait(ctx, first.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())

	// A partner retrying its webhook is told it was taken, and when.
	_, err = e.ContinueByCorrelation(ctx, "o-7", approval{By: "cy", OK: true})
	var already *reactor.AlreadyContinuedError
	require.ErrorAs(t, err, &already)
	assert.Equal(t, c.At.UnixMilli(), already.At.UnixMilli())

	// The id is free again for a new run once the first took its payload.
	again, err := e.Enqueue(ctx, def, map[string]any{"order": "o-7"}, reactor.WithRunID("corr-3"))
	require.NoError(t, err)
	awaitPaused(t, e, again.RunID)
	c, err = e.ContinueByCorrelation(ctx, "o-7", approval{By: "di"})
	require.NoError(t, err)
	assert.Equal(t, "corr-3", c.RunID)
	final, err = e.Wait(ctx, again.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

func TestInterruptConcurrentContinuesOneWins(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := approvalFlow("approval", &trail{}, 0, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-50"})
	require.NoError(t, err)
	awaitPaused(t, e, res.RunID)

	// 50 senders, each through an engine of its own (as 50 webhook
	// handlers would be), half by run id and half by correlation id.
	const n = 50
	var wins atomic.Int32
	var winner atomic.Value
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		sender := f.engine(fmt.Sprintf("s%d", i))
		require.NoError(t, sender.Register(def))
		wg.Go(func() {
			<-start
			p := approval{By: fmt.Sprintf("sender-%d", i), OK: true}
			var c *reactor.Continuation
			var err error
			if i%2 == 0 {
				c, err = sender.Continue(ctx, res.RunID, "approve", p)
			} else {
				c, err = sender.ContinueByCorrelation(ctx, "o-50", p)
			}
			if err == nil {
				wins.Add(1)
				winner.Store(p.By)
				_ = c
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, int32(1), wins.Load(), "exactly one continue wins")
	var firstAt time.Time
	for _, err := range errs {
		if err == nil {
			continue
		}
		var already *reactor.AlreadyContinuedError
		require.ErrorAs(t, err, &already, "every loser is told it was already continued")
		if firstAt.IsZero() {
			firstAt = already.At
		}
		assert.Equal(t, firstAt, already.At, "all losers are told the same first payload's time")
	}
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by "+winner.Load().(string), got)
}

func TestInterruptContinueWhileLockedIsNotLost(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := approvalFlow("approval", &trail{}, 0, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-lock"})
	require.NoError(t, err)
	awaitPaused(t, e, res.RunID)

	// Someone holds the run (an operator's cancel being judged, a sweep):
	// the continue is recorded all the same.
	lockKey := f.prefix + ":{run:" + res.RunID + "}:lock"
	require.NoError(t, f.rdb.Set(ctx, lockKey, "someone-else", time.Minute).Err())
	c, err := e.Continue(ctx, res.RunID, "approve", approval{By: "ann"})
	require.NoError(t, err)
	require.True(t, c.Woken)
	// The wake-up finds the run held and waits for it (snoozed, not lost).
	wake := "resume:" + res.RunID + ":continue:approve:1:1"
	require.Eventually(t, func() bool {
		info, err := f.taskInfo(wake)
		return err == nil && info != nil && info.State == asynq.TaskStateRetry
	}, 10*time.Second, 5*time.Millisecond, "the continue's wake-up is snoozed while the run is held")
	run, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusPaused, run.Status)

	require.NoError(t, f.rdb.Del(ctx, lockKey).Err())
	// Deliver the snoozed wake-up now rather than after its backoff.
	require.NoError(t, f.inspector.RunTask(f.queue, wake))
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

func TestInterruptTimeoutFiresOnceAfterAWorkerRestart(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, time.Second, nil)
	e := f.engine("first")
	require.NoError(t, e.Register(def))
	w := f.startWorker(e)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-late"})
	require.NoError(t, err)
	run := awaitPaused(t, e, res.RunID)
	require.False(t, run.Paused.Deadline.IsZero())
	assert.Equal(t, time.Second, run.Paused.Deadline.Sub(run.Paused.Since))
	// The worker goes away while the run waits; its timer is in Redis.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	require.NoError(t, w.Stop(stopCtx))
	cancel()

	e2 := f.engine("second")
	require.NoError(t, e2.Register(def))
	f.startWorker(e2)
	final, err := e2.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.ErrorIs(t, final.Err(), reactor.ErrInterruptTimedOut)
	assert.Contains(t, final.Err().Error(), `step "approve": no payload within 1s (0 of 1 received)`)
	assert.Equal(t, []string{"run:reserve", "undo:reserve"}, tr.all(), "what completed is rolled back, once")
	assert.Len(t, f.events.steps("second", reactor.EventInterruptTimedOut), 1, "the timeout fires once")
	assert.Empty(t, f.events.steps("first", reactor.EventInterruptTimedOut))

	// A payload after the timeout is refused.
	_, err = e2.Continue(ctx, res.RunID, "approve", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrAlreadyFinished)
}

func TestInterruptTimeoutTakesTheDefaultPath(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, time.Second, func(reactor.Args) (approval, error) {
		return approval{By: "auto-approved"}, nil
	})
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-auto"})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by auto-approved", got)
	assert.Len(t, f.events.steps("w", reactor.EventInterruptTimedOut), 1)
}

func TestInterruptBadPayloadLeavesTheRunPaused(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := approvalFlow("approval", &trail{}, 0, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-bad"})
	require.NoError(t, err)
	awaitPaused(t, e, res.RunID)

	// Where the definition is known, a bad payload is refused at once and
	// nothing is recorded.
	_, err = e.Continue(ctx, res.RunID, "approve", approval{OK: true})
	var pe *reactor.PayloadError
	require.ErrorAs(t, err, &pe)
	assert.Contains(t, pe.Error(), "names who approves")
	_, err = e.Continue(ctx, res.RunID, "approve", json.RawMessage(`{"by": 12}`))
	require.ErrorAs(t, err, &pe)
	_, err = e.Continue(ctx, res.RunID, "approve", json.RawMessage(`{"by":`))
	require.Error(t, err)

	// A script's engine has no definitions: the payload is recorded
	// unchecked, and the worker refuses it; the run stays paused with the
	// refusal on record.
	script := f.engine("script")
	c, err := script.Continue(ctx, res.RunID, "approve", map[string]any{"ok": true})
	require.NoError(t, err)
	assert.False(t, c.Checked)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		info, err := script.Interrupt(ctx, res.RunID)
		require.NoError(ct, err)
		require.Contains(ct, info.Refused, "names who approves")
		require.Equal(ct, 0, info.Received)
	}, 10*time.Second, 5*time.Millisecond)
	run, err := e.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusPaused, run.Status)
	assert.Len(t, f.events.steps("w", reactor.EventPayloadRefused), 1)

	// A good one after it goes through.
	_, err = script.Continue(ctx, res.RunID, "approve", map[string]any{"by": "eve"})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

// reviewedOrder charges, then composes approvalFlow as its step "review",
// returning the child's value.
func reviewedOrder(tr *trail) *reactor.Definition {
	return reactor.MustDefine("order",
		reactor.Input[string]("order", reactor.Required()),
		step(tr, "charge", nil),
		reactor.Compose("review", approvalFlow("approval", tr, 0, nil), reactor.ComposeConfig{
			Args: reactor.Bindings{"order": reactor.FromInput("order")}, After: []string{"charge"}}),
		reactor.Returns(reactor.FromStep("review")),
	)
}

func TestInterruptInAComposedChild(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	parent := reviewedOrder(tr)
	e := f.serve(parent)
	res, err := e.Enqueue(ctx, parent, map[string]any{"order": "o-child"})
	require.NoError(t, err)
	run := awaitPaused(t, e, res.RunID)
	assert.Equal(t, "review/approve", run.Paused.Step)

	_, err = e.Continue(ctx, res.RunID, "approve", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrNotPaused, "the step is named by its path")
	_, err = e.Continue(ctx, res.RunID, "review/approve", approval{By: "ann"})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by ann", got)
	assert.Equal(t, []string{"run:charge", "run:reserve", "run:ship"}, tr.all())
}

func TestInterruptCancelOfAPausedRunRollsBack(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	parent := reviewedOrder(tr)
	e := f.serve(parent)
	res, err := e.Enqueue(ctx, parent, map[string]any{"order": "o-cancel"})
	require.NoError(t, err)
	awaitPaused(t, e, res.RunID)

	require.NoError(t, e.Cancel(ctx, res.RunID))
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	assert.Equal(t, []string{"run:charge", "run:reserve", "undo:reserve", "undo:charge"}, tr.all())

	// The interrupt is closed: a late payload is refused, and the
	// correlation id is free for another run.
	_, err = e.Continue(ctx, res.RunID, "review/approve", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrAlreadyFinished)
	_, err = e.ContinueByCorrelation(ctx, "o-cancel", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrNoCorrelation)
}

func TestInterruptAcceptsSeveralPayloads(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := reactor.MustDefine("two-approvers",
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{Accepts: 2, Validate: validApproval}),
		reactor.Returns(reactor.FromStep("approve")),
	)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	awaitPaused(t, e, res.RunID)
	c, err := e.Continue(ctx, res.RunID, "approve", approval{By: "ann"})
	require.NoError(t, err)
	assert.False(t, c.Woken, "one of two: the run waits on")
	assert.Equal(t, 1, c.Received)
	c, err = e.Continue(ctx, res.RunID, "approve", approval{By: "bob"})
	require.NoError(t, err)
	assert.True(t, c.Woken)
	_, err = e.Continue(ctx, res.RunID, "approve", approval{By: "cy"})
	require.Error(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	got, err := reactor.ValueOf[[]approval](final)
	require.NoError(t, err)
	assert.Equal(t, []approval{{By: "ann"}, {By: "bob"}}, got)
}

func TestInterruptInAnInlineMapElementIsRefusedAtDefine(t *testing.T) {
	element := approvalFlow("approval", &trail{}, 0, nil)
	_, err := reactor.Define("inline",
		reactor.Input[[]string]("orders"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("orders"), Input: "order"}),
	)
	var de *reactor.DefinitionError
	require.ErrorAs(t, err, &de)
	assert.Contains(t, err.Error(), `interrupt step "approve"`)
	assert.Contains(t, err.Error(), "set FanOut")
}

// 200 elements of a fan-out map each wait for a payload of their own: no
// worker is held while they wait, and each element's continue resumes that
// element, whose settle completes the map.
func TestInterruptInFanOutMapElements(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	const n = 200
	var shipped atomic.Int32
	element := reactor.MustDefine("approve-one",
		reactor.Input[string]("order", reactor.Required()),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Args:        reactor.Bindings{"order": reactor.FromInput("order")},
			Correlation: func(in reactor.Args) (string, error) { return reactor.Arg[string](in, "order") },
			Validate:    validApproval,
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep("approve", "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				shipped.Add(1)
				return reactor.Arg[string](in, "by")
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
	owner := reactor.MustDefine("approve-all",
		reactor.Input[[]string]("orders"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("orders"), Input: "order",
			FanOut: true, BatchSize: n}),
		reactor.Returns(reactor.FromStep("each")),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(owner))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 8 })
	orders := make([]string, n)
	for i := range orders {
		orders[i] = fmt.Sprintf("fan-%d", i)
	}
	res, err := e.Enqueue(ctx, owner, map[string]any{"orders": orders})
	require.NoError(t, err)

	// Every element pauses, and no task is active while they wait.
	script := f.engine("script")
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		q, err := f.inspector.GetQueueInfo(f.queue)
		require.NoError(c, err)
		require.Zero(c, q.Pending+q.Active+q.Scheduled+q.Retry, "queue still busy: %+v", q)
		for i := range n {
			info, err := script.Interrupt(ctx, fmt.Sprintf("%s.%d", mapIDOf(t, e, res.RunID), i))
			require.NoError(c, err)
			require.Equal(c, "approve", info.Step)
		}
	}, 20*time.Second, 20*time.Millisecond)
	assert.Equal(t, 0, f.activeTasks(), "no worker is held while 200 elements wait")
	assert.Zero(t, shipped.Load())

	// A bad payload for one element is refused there, and it stays paused.
	_, err = script.ContinueByCorrelation(ctx, "fan-7", map[string]any{"ok": true})
	require.NoError(t, err)
	elem7 := fmt.Sprintf("%s.%d", mapIDOf(t, e, res.RunID), 7)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		info, err := script.Interrupt(ctx, elem7)
		require.NoError(c, err)
		require.NotEmpty(c, info.Refused)
	}, 10*time.Second, 5*time.Millisecond)

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				_, err := script.ContinueByCorrelation(ctx, orders[i], approval{By: "by-" + orders[i], OK: true})
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	assert.Equal(t, int32(n), shipped.Load(), "each element went on once")
	mr, err := reactor.ValueOf[mapstep.Result](final)
	require.NoError(t, err)
	els, err := mapstep.ReadWith[string](e, mr).All(ctx)
	require.NoError(t, err)
	require.Len(t, els, n)
	for i, el := range els {
		require.True(t, el.OK, "element %d: %v", i, el.Failure)
		require.Equal(t, "by-"+orders[i], el.Value)
	}
}

// mapIDOf is the id of the map run id's step "each" started.
func mapIDOf(_ require.TestingT, _ *reactor.Engine, id string) string {
	return mapstep.MapID(id, "each")
}

// A run's deadline binds a run that no process executes: paused at an
// interrupt that has no timeout of its own, the run fails at its deadline
// (a durable timer) and rolls back what it completed.
func TestDeadlineBindsAPausedRun(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, 0, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-dl"}, reactor.WithTimeout(time.Second))
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.ErrorIs(t, final.Err(), reactor.ErrDeadlineExceeded)
	assert.Equal(t, []string{"run:reserve", "undo:reserve"}, tr.all())
	_, err = e.ContinueByCorrelation(ctx, "o-dl", approval{By: "late"})
	require.ErrorIs(t, err, reactor.ErrNoCorrelation, "the interrupt was closed and its claim released")
}

// The same timer binds a run parked on a fan-out map: its deadline passes
// while the elements still run, and the run starts rolling back then, not
// when the map settles.
func TestDeadlineBindsARunParkedOnAFanOutMap(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	release := make(chan struct{})
	var started atomic.Int32
	element := reactor.MustDefine("slow-element",
		reactor.Input[int]("item"),
		reactor.Step("work", reactor.StepConfig[reactor.Args, int]{
			Run: func(ctx context.Context, _ reactor.Args) (int, error) {
				started.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return 1, nil
			},
			Undo: func(context.Context, reactor.Args, int) error { return nil },
		}),
	)
	owner := reactor.MustDefine("parked",
		reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true}),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(owner))
	f.startWorker(e, func(c *worker.Config) { c.Concurrency = 4 })
	res, err := e.Enqueue(ctx, owner, map[string]any{"items": []int{1, 2}}, reactor.WithTimeout(1500*time.Millisecond))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return started.Load() == 2 }, 10*time.Second, 5*time.Millisecond)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		run, err := e.Get(ctx, res.RunID)
		require.NoError(c, err)
		require.NotNil(c, run.Rollback, "the deadline started the rollback while the elements ran")
		require.ErrorIs(c, run.Rollback.Failure, reactor.ErrDeadlineExceeded)
	}, 10*time.Second, 10*time.Millisecond)
	close(release)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.ErrorIs(t, final.Err(), reactor.ErrDeadlineExceeded)
}

// A cancel of a paused run that some process holds for a moment is not
// left waiting: the run is woken again, and cancels once it is free.
func TestInterruptCancelWhileHeldIsActedOn(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, 0, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-held"})
	require.NoError(t, err)
	run := awaitPaused(t, e, res.RunID)

	lockKey := f.prefix + ":{run:" + res.RunID + "}:lock"
	require.NoError(t, f.rdb.Set(ctx, lockKey, "someone-else", time.Minute).Err())
	require.NoError(t, e.Cancel(ctx, res.RunID))
	wake := fmt.Sprintf("resume:%s:cancel:%d", res.RunID, 1)
	require.Eventually(t, func() bool {
		info, err := f.taskInfo(wake)
		return err == nil && info != nil && info.State == asynq.TaskStateRetry
	}, 10*time.Second, 5*time.Millisecond, "the cancel's wake-up waits while the run is held")
	require.NoError(t, f.rdb.Del(ctx, lockKey).Err())
	require.NoError(t, f.inspector.RunTask(f.queue, wake))
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	assert.Equal(t, []string{"run:reserve", "undo:reserve"}, tr.all())
	assert.Equal(t, "approve", run.Paused.Step)
}

// Cancelling an owner whose fan-out elements wait at an interrupt rolls the
// map back the way it ran: each paused element is undone by its rollback
// job (its interrupt closed), and the owner ends cancelled.
func TestInterruptCancelOfAnOwnerWithPausedElements(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	element := reactor.MustDefine("approve-one",
		reactor.Input[string]("order", reactor.Required()),
		step(tr, "reserve", nil),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Args:        reactor.Bindings{"order": reactor.FromInput("order")},
			After:       []string{"reserve"},
			Correlation: func(in reactor.Args) (string, error) { return reactor.Arg[string](in, "order") },
		}),
	)
	owner := reactor.MustDefine("approve-all",
		reactor.Input[[]string]("orders"),
		step(tr, "hold", nil),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("orders"), Input: "order",
			FanOut: true, After: []string{"hold"}}),
	)
	e := f.serve(owner)
	orders := []string{"c-0", "c-1", "c-2"}
	res, err := e.Enqueue(ctx, owner, map[string]any{"orders": orders})
	require.NoError(t, err)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for i := range orders {
			info, err := e.Interrupt(ctx, fmt.Sprintf("%s.%d", mapIDOf(t, e, res.RunID), i))
			require.NoError(c, err)
			require.Equal(c, "approve", info.Step)
		}
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, e.Cancel(ctx, res.RunID))
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status, "%v", final.Err())
	undos := 0
	for _, s := range tr.all() {
		if s == "undo:reserve" {
			undos++
		}
	}
	assert.Equal(t, len(orders), undos, "every paused element's completed step is undone once")
	assert.Contains(t, tr.all(), "undo:hold")
	_, err = e.ContinueByCorrelation(ctx, "c-1", approval{By: "late"})
	require.Error(t, err, "a paused element's interrupt is closed with its map's rollback")
}

// A payload that comes after the deadline is late even when the timer has
// not fired yet (asynq schedules to the second; the workers may be busy):
// the continue times the interrupt out, and the timer's delivery then
// fails the run.
func TestInterruptPayloadPastTheDeadlineIsLate(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	def := approvalFlow("approval", tr, time.Hour, nil)
	e := f.serve(def)
	res, err := e.Enqueue(ctx, def, map[string]any{"order": "o-late-payload"})
	require.NoError(t, err)
	run := awaitPaused(t, e, res.RunID)
	// The deadline passes (on the server's clock the record keeps).
	require.NoError(t, f.rdb.HSet(ctx, f.prefix+":{run:"+res.RunID+"}:ctx", "idl", 1).Err())
	_, err = e.Continue(ctx, res.RunID, "approve", approval{By: "ann"})
	require.ErrorIs(t, err, reactor.ErrInterruptTimedOut)
	// The timer is enqueued after the paused run's save, as its worker
	// leaves it.
	require.Eventually(t, func() bool {
		info, err := f.taskInfo(run.Wake)
		return err == nil && info != nil
	}, 10*time.Second, 5*time.Millisecond, "the timer is scheduled")
	require.NoError(t, f.inspector.RunTask(f.queue, run.Wake), "deliver the timer now")
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	require.ErrorIs(t, final.Err(), reactor.ErrInterruptTimedOut)
	assert.Equal(t, []string{"run:reserve", "undo:reserve"}, tr.all())
}

// A fan-out element's interrupt timer is its own task, delayed to the
// deadline: with a Default, the elements go on without any payload and the
// map completes.
func TestInterruptTimeoutOfFanOutElements(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	element := reactor.MustDefine("approve-or-default",
		reactor.Input[string]("order", reactor.Required()),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Timeout: time.Second,
			Default: func(reactor.Args) (approval, error) { return approval{By: "nobody"}, nil },
		}),
		reactor.Returns(reactor.FromStep("approve", "by")),
	)
	owner := reactor.MustDefine("approve-all",
		reactor.Input[[]string]("orders"),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("orders"), Input: "order", FanOut: true}),
		reactor.Returns(reactor.FromStep("each")),
	)
	e := f.serve(owner)
	res, err := e.Enqueue(ctx, owner, map[string]any{"orders": []string{"t-0", "t-1", "t-2"}})
	require.NoError(t, err)
	final, err := e.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	mr, err := reactor.ValueOf[mapstep.Result](final)
	require.NoError(t, err)
	els, err := mapstep.ReadWith[string](e, mr).All(ctx)
	require.NoError(t, err)
	require.Len(t, els, 3)
	for _, el := range els {
		assert.Equal(t, "nobody", el.Value)
	}
	assert.Len(t, f.events.steps("w", reactor.EventInterruptTimedOut), 3)
}

// An interrupt's Undo receives the payloads it took: when a later step
// fails, and when the finished run is undone.
func TestInterruptUndoGetsThePayloads(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	tr := &trail{}
	withUndo := func(name string, fail bool) *reactor.Definition {
		return reactor.MustDefine(name,
			reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
				Undo: func(_ context.Context, _ reactor.Args, got []approval) error {
					for _, a := range got {
						tr.add("undo:approve:" + a.By)
					}
					return nil
				},
			}),
			reactor.Step("after", reactor.StepConfig[reactor.Args, string]{
				After: []string{"approve"},
				Run: func(context.Context, reactor.Args) (string, error) {
					if fail {
						return "", reactor.Permanent(errors.New("declined later"))
					}
					return "ok", nil
				},
			}),
		)
	}
	failing, passing := withUndo("undo-on-failure", true), withUndo("undo-on-request", false)
	e := f.serve(failing, passing)
	for _, def := range []*reactor.Definition{failing, passing} {
		res, err := e.Enqueue(ctx, def, nil)
		require.NoError(t, err)
		awaitPaused(t, e, res.RunID)
		_, err = e.Continue(ctx, res.RunID, "approve", approval{By: def.Name()})
		require.NoError(t, err)
		final, err := e.Wait(ctx, res.RunID)
		require.NoError(t, err)
		if def == passing {
			require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
			final, err = e.Undo(ctx, res.RunID)
			require.NoError(t, err)
			require.Equal(t, reactor.StatusCancelled, final.Status)
		} else {
			require.Equal(t, reactor.StatusFailed, final.Status)
		}
	}
	assert.Equal(t, []string{"undo:approve:undo-on-failure", "undo:approve:undo-on-request"}, tr.all())
}
