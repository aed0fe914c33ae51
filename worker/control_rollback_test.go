package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/codec"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// undoCalls counts undo calls by name; the names in failOnce fail their
// first call.
type undoCalls struct {
	mu       sync.Mutex
	n        map[string]int
	failOnce map[string]bool
}

func newUndoCalls(failOnce ...string) *undoCalls {
	u := &undoCalls{n: map[string]int{}, failOnce: map[string]bool{}}
	for _, s := range failOnce {
		u.failOnce[s] = true
	}
	return u
}

func (u *undoCalls) call(name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.n[name]++
	if u.failOnce[name] && u.n[name] == 1 {
		return errors.New(name + ": the service was down")
	}
	return nil
}

func (u *undoCalls) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[name]
}

func (u *undoCalls) step(name string, fail bool, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
		After: after,
		Run: func(context.Context, reactor.Args) (string, error) {
			if fail {
				return "", reactor.Permanent(errors.New(name + " failed"))
			}
			return name, nil
		},
		Undo: func(context.Context, reactor.Args, string) error { return u.call(name) },
	})
}

// A rollback re-triggered through the Controller retries, on a worker, only
// the entry whose undo failed; the request delivered again (same payload,
// another task) is archived as no longer applying, and a new request is
// refused with the engine's reason.
func TestControlRollbackRetriesOnlyTheFailedEntry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	u := newUndoCalls("b")
	def := reactor.MustDefine("ctl_rollback", u.step("a", false), u.step("b", false, "a"), u.step("c", true, "b"))
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)
	ctx := ctxTimeout(t)

	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	failed, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, failed.Status)
	require.Len(t, failed.Failure.RollbackFailures, 1)

	c := f.controller()
	req, err := c.Request(ctx, res.RunID, worker.ActionRollback)
	require.NoError(t, err)
	dup, err := c.Request(ctx, res.RunID, worker.ActionRollback)
	require.NoError(t, err)
	require.True(t, dup.Duplicate, "a double click queues one task")
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, run.Status)
	require.Empty(t, run.Failure.RollbackFailures)
	require.Equal(t, 2, run.RollbackGeneration)
	require.Equal(t, 1, u.count("a"))
	require.Equal(t, 2, u.count("b"))

	// The same request delivered again: it names generation 1, retried.
	body, err := codec.Marshal(map[string]any{"run": res.RunID, "action": "rollback", "v": 1, "g": 1})
	require.NoError(t, err)
	_, err = asynq.NewClientFromRedisClient(f.rdb).Enqueue(asynq.NewTask(worker.TypeControl, body),
		asynq.TaskID("ctl:again"), asynq.Queue(f.queue))
	require.NoError(t, err)
	info := f.awaitTaskState("ctl:again", asynq.TaskStateArchived)
	require.Contains(t, info.LastErr, reactor.ErrRollbackRetried.Error())
	require.Equal(t, 2, u.count("b"), "retried once")

	_, err = c.Request(ctx, res.RunID, worker.ActionRollback)
	require.ErrorIs(t, err, reactor.ErrNothingToRetry)
}
