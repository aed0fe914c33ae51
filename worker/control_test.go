package worker_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// controller returns a Controller on the fixture's prefix and queue: it
// holds no definitions, as a dashboard does not.
func (f *fixture) controller() *worker.Controller {
	f.t.Helper()
	c, err := worker.NewController(context.Background(), worker.ControllerConfig{
		Client: f.rdb, Prefix: f.prefix, Queue: f.queue, Logger: discard,
	})
	require.NoError(f.t, err)
	return c
}

// gate is a step that blocks until released, telling the test it started.
type gate struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{started: make(chan struct{}), release: make(chan struct{})} }

func (g *gate) wait(ctx context.Context) {
	g.once.Do(func() { close(g.started) })
	select {
	case <-g.release:
	case <-ctx.Done():
	}
}

// A cancel requested through the Controller while a worker executes a long
// step stops the run at its next checkpoint: the later steps never run and
// what completed is undone.
func TestControlCancelStopsALongRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	g := newGate()
	def := reactor.MustDefine("ctl_long",
		step(tr, "reserve", nil),
		reactor.Step("slow", reactor.StepConfig[reactor.Args, string]{
			After: []string{"reserve"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				tr.add("run:slow")
				g.wait(ctx)
				return "slow-done", nil
			},
			Undo: func(context.Context, reactor.Args, string) error { tr.add("undo:slow"); return nil },
		}),
		step(tr, "ship", nil, "slow"),
		step(tr, "notify", nil, "ship"),
	)
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	<-g.started
	req, err := f.controller().Request(ctx, res.RunID, worker.ActionCancel)
	require.NoError(t, err)
	require.Equal(t, worker.Request{RunID: res.RunID, Action: worker.ActionCancel, TaskID: req.TaskID, Queue: f.queue}, req,
		"the control task goes to the queue the run recorded")
	require.Regexp(t, `^ctl:`+res.RunID+`:cancel:\d+$`, req.TaskID)
	// The worker stored the request (the run is held by its executor).
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	close(g.release)

	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	require.ErrorIs(t, final.Failure, reactor.ErrCancelled)
	require.Equal(t, []string{"run:reserve", "run:slow", "undo:slow", "undo:reserve"}, tr.all(), "ship and notify never ran")
}

// A cancel reaches an inline map between its elements: the elements after
// the one in progress never run, and those that completed are undone.
func TestControlCancelStopsAnInlineMapBetweenElements(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	g := newGate()
	var slowStarted time.Time
	type in struct {
		Item int `json:"item"`
	}
	element := reactor.MustDefine("ctl_inline_elem",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("work", reactor.StepConfig[in, int]{
			Args: reactor.Bindings{"item": reactor.FromInput("item")},
			Run: func(ctx context.Context, a in) (int, error) {
				tr.add("run:" + strconv.Itoa(a.Item))
				if a.Item == 1 {
					slowStarted = time.Now()
					g.wait(ctx)
				}
				return a.Item, nil
			},
			Undo: func(_ context.Context, a in, _ int) error { tr.add("undo:" + strconv.Itoa(a.Item)); return nil },
		}),
	)
	owner := reactor.MustDefine("ctl_inline_owner",
		reactor.Input[[]int]("items", reactor.Required()),
		step(tr, "hold", nil),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), After: []string{"hold"}}),
		step(tr, "after", nil, "each"),
	)
	require.NoError(t, wk.Register(owner))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2, 3, 4}})
	require.NoError(t, err)
	<-g.started
	req, err := f.controller().Request(ctx, res.RunID, worker.ActionCancel)
	require.NoError(t, err)
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	// The map reads the request between elements at most every
	// mapstep.CancelCheckInterval, and after any element that took longer:
	// hold element 1 that long, so the read before element 2 is due.
	<-time.After(mapstep.CancelCheckInterval - time.Since(slowStarted))
	close(g.release)

	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	require.Equal(t, []string{"run:hold", "run:0", "run:1", "undo:1", "undo:0", "undo:hold"}, tr.all(),
		"elements 2-4 and the step after the map never ran")
}

// An undo through the Controller is carried out by a worker: the run's
// undo functions ran, newest first, and it ends cancelled.
func TestControlUndoUndoesACompletedRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_undo", step(tr, "reserve", nil), step(tr, "charge", nil, "reserve"))
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	done, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, done.Status)

	req, err := f.controller().Request(ctx, res.RunID, worker.ActionUndo)
	require.NoError(t, err)
	require.False(t, req.Duplicate)
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, run.Status)
	require.Equal(t, []string{"run:reserve", "run:charge", "undo:charge", "undo:reserve"}, tr.all())
}

// A retry through the Controller runs the failed run again on a worker
// with the same inputs, under a new id linked both ways.
func TestControlRetryRunsAgainLinkedBothWays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	var mu sync.Mutex
	var seen []string
	declined := true
	type in struct {
		Card string `json:"card"`
	}
	def := reactor.MustDefine("ctl_retry",
		reactor.Input[string]("card", reactor.Required()),
		reactor.Step("charge", reactor.StepConfig[in, string]{
			Args: reactor.Bindings{"card": reactor.FromInput("card")},
			Run: func(_ context.Context, a in) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				seen = append(seen, a.Card)
				if declined {
					declined = false
					return "", reactor.Permanent(errors.New("declined"))
				}
				return "charged " + a.Card, nil
			},
		}),
		reactor.Returns(reactor.FromStep("charge")),
	)
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, map[string]any{"card": "4242"})
	require.NoError(t, err)
	failed, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, failed.Status)

	req, err := f.controller().Request(ctx, res.RunID, worker.ActionRetry)
	require.NoError(t, err)
	require.False(t, req.Duplicate)
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	orig, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, orig.RetriedBy, 1)
	retryID := orig.RetriedBy[0]
	final, err := api.Wait(ctx, retryID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status)
	v, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	require.Equal(t, "charged 4242", v)
	retry, err := api.Get(ctx, retryID)
	require.NoError(t, err)
	require.Equal(t, res.RunID, retry.RetryOf)
	require.Equal(t, orig.Inputs, retry.Inputs)
	mu.Lock()
	require.Equal(t, []string{"4242", "4242"}, seen)
	mu.Unlock()
}

// Two requests for the same thing queue one task: the second is a
// duplicate, also after a worker carried the first out (the completed task
// is retained).
func TestControlDoubleClickQueuesOneTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_double", step(tr, "reserve", nil))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	c := f.controller()

	first, err := c.Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	second, err := c.Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	require.True(t, second.Duplicate)
	require.Equal(t, first.TaskID, second.TaskID)
	pending, err := f.inspector.ListPendingTasks(f.queue)
	require.NoError(t, err)
	require.Len(t, pending, 1)

	// A run held by its executor: a cancel is stored without a write, so
	// the run's version (and the request's task id) stays the same after
	// the worker carried the cancel out.
	g := newGate()
	long := reactor.MustDefine("ctl_double_long", reactor.Step("slow", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) { g.wait(ctx); return "", nil },
	}), step(tr, "after", nil, "slow"))
	require.NoError(t, wk.Register(long))
	f.startWorker(wk)
	f.awaitTaskState(first.TaskID, asynq.TaskStateCompleted)
	res, err := api.Enqueue(ctx, long, nil)
	require.NoError(t, err)
	<-g.started
	one, err := c.Request(ctx, res.RunID, worker.ActionCancel)
	require.NoError(t, err)
	f.awaitTaskState(one.TaskID, asynq.TaskStateCompleted)
	two, err := c.Request(ctx, res.RunID, worker.ActionCancel)
	require.NoError(t, err)
	require.True(t, two.Duplicate, "a click after the first was carried out is still the same request")
	require.Equal(t, one.TaskID, two.TaskID)
	close(g.release)
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	require.Equal(t, []string{"run:reserve", "undo:reserve"}, tr.all())
}

// Requests are validated before anything is queued: an unknown run is
// ErrNotFound, a wrong status the engine's StatusError with its words.
func TestControlRequestValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.engine("api")
	tr := &trail{}
	ok := reactor.MustDefine("ctl_valid_ok", step(tr, "a", nil))
	bad := reactor.MustDefine("ctl_valid_bad", step(tr, "a", reactor.Permanent(errors.New("no"))))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, ok, nil)
	require.NoError(t, err)
	failed, err := api.Run(ctx, bad, nil)
	require.NoError(t, err)
	c := f.controller()

	for _, a := range []worker.Action{worker.ActionUndo, worker.ActionCancel, worker.ActionRetry, worker.ActionRollback} {
		_, err := c.Request(ctx, "no-such-run", a)
		require.ErrorIs(t, err, reactor.ErrNotFound, a)
	}

	cases := []struct {
		run    string
		action worker.Action
		engine func() error
		want   error
	}{
		{done.RunID, worker.ActionCancel, func() error { return api.Cancel(ctx, done.RunID) }, reactor.ErrAlreadyFinished},
		{done.RunID, worker.ActionRetry, func() error { _, err := api.Retry(ctx, done.RunID); return err }, reactor.ErrNotRetryable},
		{failed.RunID, worker.ActionUndo, func() error { _, err := api.Undo(ctx, failed.RunID); return err }, reactor.ErrNotUndoable},
		{failed.RunID, worker.ActionCancel, func() error { return api.Cancel(ctx, failed.RunID) }, reactor.ErrAlreadyFinished},
		{done.RunID, worker.ActionRollback, func() error { _, err := api.RetryRollback(ctx, done.RunID); return err }, reactor.ErrNoRollbackToRetry},
		{failed.RunID, worker.ActionRollback, func() error { _, err := api.RetryRollback(ctx, failed.RunID); return err }, reactor.ErrNothingToRetry},
	}
	for _, tc := range cases {
		_, err := c.Request(ctx, tc.run, tc.action)
		var se *reactor.StatusError
		require.ErrorAs(t, err, &se, tc.action)
		require.ErrorIs(t, err, tc.want)
		require.EqualError(t, err, tc.engine().Error(), "the engine's own reason")
	}
	_, err = worker.ParseAction("resolve")
	require.ErrorContains(t, err, `unknown action "resolve"`)
	pending, err := f.inspector.ListPendingTasks(f.queue)
	if !errors.Is(err, asynq.ErrQueueNotFound) {
		require.NoError(t, err)
	}
	require.Empty(t, pending, "nothing was queued")
}

// A request that no longer applies when a worker takes it (the run was
// undone meanwhile) is archived with the engine's reason, not retried; a
// malformed control payload is archived too.
func TestControlInvalidatedAndMalformedRequestsAreArchived(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_stale", step(tr, "a", nil))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	req, err := f.controller().Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	_, err = api.Undo(ctx, done.RunID) // someone else undid it first
	require.NoError(t, err)

	client := asynq.NewClientFromRedisClient(f.rdb)
	_, err = client.Enqueue(asynq.NewTask(worker.TypeControl, []byte("not msgpack")), asynq.TaskID("ctl:garbage"), asynq.Queue(f.queue))
	require.NoError(t, err)
	body, err := codec.Marshal(map[string]any{"run": done.RunID, "action": "resolve", "v": 1})
	require.NoError(t, err)
	_, err = client.Enqueue(asynq.NewTask(worker.TypeControl, body), asynq.TaskID("ctl:unknown-action"), asynq.Queue(f.queue))
	require.NoError(t, err)
	f.startWorker(wk)

	info := f.awaitTaskState(req.TaskID, asynq.TaskStateArchived)
	require.Zero(t, info.Retried, "archived at once, not retried")
	require.Contains(t, info.LastErr, "no longer applies")
	require.Contains(t, info.LastErr, reactor.ErrNotUndoable.Error())
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all(), "undone once")
	info = f.awaitTaskState("ctl:garbage", asynq.TaskStateArchived)
	require.Contains(t, info.LastErr, "malformed control payload")
	info = f.awaitTaskState("ctl:unknown-action", asynq.TaskStateArchived)
	require.Contains(t, info.LastErr, `unknown action "resolve"`)
}

// A control request whose run another process holds snoozes, without
// spending asynq's retry budget, and is carried out once the run is free.
func TestControlRequestOnALockedRunSnoozes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.engine("api")
	wk := f.engine("worker", func(c *reactor.Config) { c.UndoLockWait = 20 * time.Millisecond })
	tr := &trail{}
	def := reactor.MustDefine("ctl_locked", step(tr, "a", nil))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	req, err := f.controller().Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	lockKey := f.prefix + ":{run:" + done.RunID + "}:lock"
	require.NoError(t, f.rdb.Set(ctx, lockKey, "another-process", time.Minute).Err())
	f.startWorker(wk, func(c *worker.Config) { c.Snooze = 20 * time.Millisecond })

	info := f.awaitTaskState(req.TaskID, asynq.TaskStateRetry)
	require.Contains(t, info.LastErr, "snoozing")
	require.Zero(t, info.Retried, "a snooze is not a failure")
	require.Equal(t, []string{"run:a"}, tr.all())

	require.NoError(t, f.rdb.Del(ctx, lockKey).Err())
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	run, err := api.Get(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, run.Status)
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all())
}

// A request whose earlier task was archived (it failed for good, say on
// workers without the run's definition) is queued again when it is made
// again: not reported as a duplicate of a task that will never run.
func TestControlRequestAfterAnArchivedOneIsQueuedAgain(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_rearm", step(tr, "a", nil))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	c := f.controller()
	first, err := c.Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	require.NoError(t, f.inspector.ArchiveTask(f.queue, first.TaskID))

	again, err := c.Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	require.False(t, again.Duplicate, "the archived request does not swallow this one")
	require.Equal(t, first.TaskID, again.TaskID)
	info, err := f.inspector.GetTaskInfo(f.queue, again.TaskID)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStatePending, info.State)
	dup, err := c.Request(ctx, done.RunID, worker.ActionUndo)
	require.NoError(t, err)
	require.True(t, dup.Duplicate, "a pending request is a duplicate")

	f.startWorker(wk)
	f.awaitTaskState(again.TaskID, asynq.TaskStateCompleted)
	require.Equal(t, []string{"run:a", "undo:a"}, tr.all(), "undone once")
}
