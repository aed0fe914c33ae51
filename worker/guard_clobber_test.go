package worker_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The clobber scenario end to end through a worker: a run enqueued on the
// API side changes a record twice (two guarded steps on one resource), a
// support agent changes it again, and the run fails. The worker's rollback
// leaves the agent's value, never calls Restore, marks the newest entry
// needs_human and the older one blocked (zero attempts). A re-triggered
// rollback, queued as an operator's control task, still refuses them; once
// a person resolves the conflict manually_reverted, the next one undoes
// the older entry.
func TestGuardedUndoClobberScenarioThroughAWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	ctx := ctxTimeout(t)
	key := f.prefix + ":user:42/email"
	get := func(ctx context.Context, k string) (string, error) {
		v, err := f.rdb.Get(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil
		}
		return v, err
	}
	var restores atomic.Int32
	guard := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: get,
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			restores.Add(1)
			return reactor.RestoreWritten, f.rdb.Set(ctx, k, before, 0).Err()
		},
		Retry: reactor.Retry{MaxAttempts: 10},
	})
	set := func(name, value string, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			After: after,
			Guard: guard,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				before, err := get(ctx, key)
				if err != nil {
					return "", err
				}
				if err := f.rdb.Set(ctx, key, value, 0).Err(); err != nil {
					return "", err
				}
				return value, reactor.RecordEffect(ctx, reactor.Effect{Resource: key, Before: before, After: value, Label: name})
			},
		})
	}
	def := reactor.MustDefine("clobber-worker", set("fix1", "ada@new.test"), set("fix2", "ada@newer.test", "fix1"),
		reactor.Step("notify", reactor.StepConfig[reactor.Args, string]{
			After: []string{"fix2"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				// The support desk corrects the address meanwhile.
				if err := f.rdb.Set(ctx, key, "ada@corrected.test", 0).Err(); err != nil {
					return "", err
				}
				return "", reactor.Permanent(errors.New("mail server refused"))
			},
		}))
	require.NoError(t, f.rdb.Set(ctx, key, "ada@old.test", 0).Err())
	require.NoError(t, wk.Register(def))
	f.startWorker(wk)

	res, err := api.Enqueue(ctx, def, nil, reactor.WithRunID("clobber"))
	require.NoError(t, err)
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	v, err := get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "ada@corrected.test", v, "the store is untouched by the rollback")
	require.Zero(t, restores.Load(), "Restore is never called")
	statuses := func() map[string]reactor.RollbackEntry {
		t.Helper()
		rep, err := api.RollbackReport(ctx, "clobber")
		require.NoError(t, err)
		out := map[string]reactor.RollbackEntry{}
		for _, e := range rep.Entries {
			out[e.Step] = e
		}
		return out
	}
	st := statuses()
	require.Equal(t, reactor.RollbackNeedsPerson, st["fix2"].Status)
	require.Equal(t, reactor.RollbackBlocked, st["fix1"].Status)
	require.Zero(t, st["fix1"].Attempts)
	require.Equal(t, 1, st["fix2"].Attempts, "a conflict is attempted once, with 10 retries configured")

	// An operator re-triggers the rollback: still refused.
	ctl := f.controller()
	req, err := ctl.Request(ctx, "clobber", worker.ActionRollback)
	require.NoError(t, err)
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	st = statuses()
	require.Equal(t, reactor.RollbackBlocked, st["fix1"].Status)
	require.Zero(t, st["fix1"].Attempts)
	require.Zero(t, restores.Load())

	// A person puts fix2's before state back and says so.
	require.NoError(t, f.rdb.Set(ctx, key, "ada@new.test", 0).Err())
	require.NoError(t, api.Resolve(ctx, "clobber", st["fix2"].ID, reactor.ResolvedManuallyReverted, "restored fix1's address by hand"))
	req, err = ctl.Request(ctx, "clobber", worker.ActionRollback)
	require.NoError(t, err)
	f.awaitTaskState(req.TaskID, asynq.TaskStateCompleted)
	st = statuses()
	require.Equal(t, reactor.RollbackCompensated, st["fix1"].Status)
	require.Equal(t, reactor.RollbackManuallyReverted, st["fix2"].Status)
	v, err = get(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "ada@old.test", v)
	require.Equal(t, int32(1), restores.Load())
}
