package worker_test

import (
	"context"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// resourceStep is step with a Resource: what it changed is res.
func resourceStep(tr *trail, name, res string, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
		After: after,
		Run: func(context.Context, reactor.Args) (string, error) {
			tr.add("run:" + name)
			return name + "-done", nil
		},
		Undo: func(context.Context, reactor.Args, string) error {
			tr.add("undo:" + name)
			return nil
		},
		Resource: func(reactor.Args, string) string { return res },
	})
}

func ledgerSteps(es []*reactor.LedgerEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Step)
	}
	return out
}

// An undo of named steps requested through the Controller is carried out by
// a worker: the named steps are undone, newest first, the others stay
// applied and the run stays completed. The same set of steps requested
// again (in another order) is a duplicate; another set at the same version
// is another task.
func TestControlUndoStepsUndoesOnlyTheNamedSteps(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_steps", step(tr, "a", nil), step(tr, "b", nil, "a"), step(tr, "c", nil, "b"),
		step(tr, "d", nil, "c"))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, done.Status)
	c := f.controller()

	first, err := c.RequestUndoSteps(ctx, done.RunID, []string{"b", "d", "b"})
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	require.Equal(t, worker.ActionUndoSteps, first.Action)
	require.Equal(t, []string{"b", "d"}, first.Steps, "repeats dropped")
	require.Regexp(t, `^ctl:`+regexp.QuoteMeta(done.RunID)+`:undo_steps:\d+:[0-9a-f]{12}$`, first.TaskID)
	again, err := c.RequestUndoSteps(ctx, done.RunID, []string{"d", "b"})
	require.NoError(t, err)
	require.True(t, again.Duplicate, "the same set of steps is the same request")
	require.Equal(t, first.TaskID, again.TaskID)
	other, err := c.RequestUndoSteps(ctx, done.RunID, []string{"b"})
	require.NoError(t, err)
	require.False(t, other.Duplicate, "another set of steps at the same version is another request")
	require.NotEqual(t, first.TaskID, other.TaskID)
	pending, err := f.inspector.ListPendingTasks(f.queue)
	require.NoError(t, err)
	require.Len(t, pending, 2)

	f.startWorker(wk)
	f.awaitTaskState(first.TaskID, asynq.TaskStateCompleted)
	f.awaitTaskState(other.TaskID, asynq.TaskStateCompleted)
	run, err := api.Get(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status, "the run keeps its status")
	require.Equal(t, []string{"a", "c"}, ledgerSteps(run.Ledger), "the steps not named stay applied")
	// Whichever task ran first, b and d were each undone once, d before b
	// when they were undone together; the other request found b
	// compensated already (unresolved, not a fault).
	undos := []string{}
	for _, s := range tr.all() {
		if s[:5] == "undo:" {
			undos = append(undos, s)
		}
	}
	require.ElementsMatch(t, []string{"undo:b", "undo:d"}, undos)
	if undos[0] == "undo:b" {
		require.Equal(t, []string{"undo:b", "undo:d"}, undos, "b alone first, then d")
	} else {
		require.Equal(t, []string{"undo:d", "undo:b"}, undos, "newest first")
	}
	rep, err := api.RollbackReport(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.RollbackReverted, rep.Summary.Outcome)

	// The run changed: the first request made again is a new task, and
	// finds nothing left to undo.
	later, err := c.RequestUndoSteps(ctx, done.RunID, []string{"b", "d"})
	require.NoError(t, err)
	require.False(t, later.Duplicate)
	require.NotEqual(t, first.TaskID, later.TaskID)
	f.awaitTaskState(later.TaskID, asynq.TaskStateCompleted)
	require.Len(t, tr.all(), 6, "nothing undone twice")
}

// An undo_steps request the engine refuses when the worker takes it is
// archived at once with the engine's reason: a name that is no step of the
// definition, a newer entry on the same resource left out, a run undone
// meanwhile. Nothing is undone.
func TestControlUndoStepsRefusalsAreArchived(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	tr := &trail{}
	def := reactor.MustDefine("ctl_steps_refused", resourceStep(tr, "reserve", "seat:4C"),
		resourceStep(tr, "move", "seat:4C", "reserve"), step(tr, "mail", nil, "move"))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	one, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	two, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	c := f.controller()

	unknown, err := c.RequestUndoSteps(ctx, one.RunID, []string{"nope"})
	require.NoError(t, err, "the Controller holds no definitions: the worker judges the names")
	_, err = c.RequestUndoSteps(ctx, one.RunID, []string{"reserve"})
	require.ErrorIs(t, err, reactor.ErrResourceOrder, "judged from the stored run before anything is queued")
	stale, err := c.RequestUndoSteps(ctx, two.RunID, []string{"mail"})
	require.NoError(t, err)
	_, err = api.Undo(ctx, two.RunID) // someone undid the whole run first
	require.NoError(t, err)
	undosBefore := len(tr.all())

	f.startWorker(wk)
	info := f.awaitTaskState(unknown.TaskID, asynq.TaskStateArchived)
	require.Zero(t, info.Retried, "archived at once, not retried")
	require.Contains(t, info.LastErr, "no longer applies")
	require.Contains(t, info.LastErr, reactor.ErrUnknownStep.Error())
	require.Contains(t, info.LastErr, `"nope"`)

	var roe *reactor.ResourceOrderError
	_, err = wk.UndoSteps(ctx, one.RunID, []string{"reserve"})
	require.ErrorAs(t, err, &roe)
	require.Equal(t, "move", roe.Newer)

	info = f.awaitTaskState(stale.TaskID, asynq.TaskStateArchived)
	require.Zero(t, info.Retried)
	_, err = api.UndoSteps(ctx, two.RunID, []string{"mail"})
	var se *reactor.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, string(reactor.OpUndoSteps), se.Op)
	require.Contains(t, info.LastErr, err.Error())

	require.Len(t, tr.all(), undosBefore, "nothing was undone by the refused requests")
	run, err := api.Get(ctx, one.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status)
	require.Equal(t, []string{"reserve", "move", "mail"}, ledgerSteps(run.Ledger))
}

// RequestUndoSteps is validated before anything is queued: no steps, an
// empty name or path segment, an unknown run, a status that refuses it (the
// engine's StatusError, Op undo_steps, with its words). Request refuses
// ActionUndoSteps, which needs its steps.
func TestControlUndoStepsValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.engine("api")
	tr := &trail{}
	ok := reactor.MustDefine("ctl_steps_ok", step(tr, "a", nil))
	bad := reactor.MustDefine("ctl_steps_bad", step(tr, "a", nil), step(tr, "b", reactor.Permanent(errors.New("no")), "a"))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, ok, nil)
	require.NoError(t, err)
	failed, err := api.Run(ctx, bad, nil)
	require.NoError(t, err)
	c := f.controller()

	for _, steps := range [][]string{nil, {}, {""}, {"a", ""}, {"book/"}, {"/a"}, {"book//pay"}} {
		_, err := c.RequestUndoSteps(ctx, done.RunID, steps)
		require.ErrorIs(t, err, worker.ErrInvalidSteps, "%q", steps)
	}
	_, err = c.RequestUndoSteps(ctx, done.RunID, nil)
	require.ErrorIs(t, err, reactor.ErrNoStepsNamed)
	_, err = c.Request(ctx, done.RunID, worker.ActionUndoSteps)
	require.ErrorIs(t, err, worker.ErrInvalidSteps)
	require.ErrorContains(t, err, "RequestUndoSteps")
	_, err = c.RequestUndoSteps(ctx, "no-such-run", []string{"a"})
	require.ErrorIs(t, err, reactor.ErrNotFound)

	_, err = c.RequestUndoSteps(ctx, failed.RunID, []string{"a"})
	var se *reactor.StatusError
	require.ErrorAs(t, err, &se)
	require.Equal(t, string(reactor.OpUndoSteps), se.Op)
	require.ErrorIs(t, err, reactor.ErrNotUndoable)
	_, eerr := api.UndoSteps(ctx, failed.RunID, []string{"a"})
	require.EqualError(t, err, eerr.Error(), "the engine's own reason")

	a, err := worker.ParseAction("undo_steps")
	require.NoError(t, err)
	require.Equal(t, worker.ActionUndoSteps, a)
	pending, err := f.inspector.ListPendingTasks(f.queue)
	if !errors.Is(err, asynq.ErrQueueNotFound) {
		require.NoError(t, err)
	}
	require.Empty(t, pending, "nothing was queued")
}

// An undo_steps request on a run another process holds snoozes, and is
// carried out once the run is free.
func TestControlUndoStepsOnALockedRunSnoozes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api := f.engine("api")
	wk := f.engine("worker", func(c *reactor.Config) { c.UndoLockWait = 20 * time.Millisecond })
	tr := &trail{}
	def := reactor.MustDefine("ctl_steps_locked", step(tr, "a", nil), step(tr, "b", nil, "a"))
	require.NoError(t, wk.Register(def))
	ctx := ctxTimeout(t)
	done, err := api.Run(ctx, def, nil)
	require.NoError(t, err)
	req, err := f.controller().RequestUndoSteps(ctx, done.RunID, []string{"a"})
	require.NoError(t, err)
	lockKey := f.prefix + ":{run:" + done.RunID + "}:lock"
	require.NoError(t, f.rdb.Set(ctx, lockKey, "another-process", time.Minute).Err())
	f.startWorker(wk, func(c *worker.Config) { c.Snooze = 20 * time.Millisecond })

	info := f.awaitTaskState(req.TaskID, asynq.TaskStateRetry)
	require.Contains(t, info.LastErr, "snoozing")
	require.Zero(t, info.Retried, "a snooze is not a failure")
	require.Equal(t, []string{"run:a", "run:b"}, tr.all())

	require.NoError(t, f.rdb.Del(ctx, lockKey).Err())
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	run, err := api.Get(ctx, done.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status)
	require.Equal(t, []string{"run:a", "run:b", "undo:a"}, tr.all())
	require.Equal(t, []string{"b"}, ledgerSteps(run.Ledger))
}
