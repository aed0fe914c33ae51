package worker_test

import (
	"github.com/goreactor/goreactor/internal/keys"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// An element whose guarded undo conflicted must not expire before a person
// resolves it; after Resolve it must not outlive its owner's tree.
func TestConflictedElementKeepsItsOwnerUntilResolved(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ret := func(c *reactor.Config) { c.Retention = time.Hour }
	api, wk := f.engine("api", ret), f.engine("worker", ret)
	ctx := ctxTimeout(t)
	tt := newTiers(f, "tier2", 1)
	key, owner, element := tt.key, tt.owner, tt.element
	for n := range 2 {
		require.NoError(t, f.rdb.Set(ctx, key(n), "basic", 0).Err())
	}
	require.NoError(t, wk.Register(owner, element))
	f.startWorker(wk)
	res, err := api.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1}}, reactor.WithRunID("tiers2"))
	require.NoError(t, err)
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	elemID := mapstep.MapID("tiers2", "each") + ".1"
	elemKey := keys.New(f.prefix).ElemState(elemID)
	ownerKey := f.prefix + ":{run:tiers2}:ctx"
	require.Eventually(t, func() bool {
		_, err := f.rdb.ZScore(ctx, f.prefix+":idx:active", "tiers2").Result()
		return err != nil
	}, 10*time.Second, 10*time.Millisecond, "the owner's tidy-up (tree retention, index) is done")
	waiting, err := api.NeedsHuman(ctx, 10)
	require.NoError(t, err)
	require.Contains(t, waiting, elemID)
	require.Contains(t, waiting, "tiers2", "the owner waits with its element")
	require.Equal(t, time.Duration(-1), f.rdb.PTTL(ctx, ownerKey).Val(), "the owner keeps its tree while a person must look")
	require.Equal(t, time.Duration(-1), f.rdb.PTTL(ctx, elemKey).Val())
	_, err = api.Check(ctx, "tiers2", reactor.OpRetry)
	require.ErrorIs(t, err, reactor.ErrNotRetryable)
	rep, err := api.RollbackReport(ctx, "tiers2")
	require.NoError(t, err)
	require.Len(t, rep.ActionRequired, 1, "the owner lists its element's conflict")
	require.Equal(t, elemID, rep.ActionRequired[0].Run)
	require.Equal(t, "upgrade#1", rep.ActionRequired[0].ID)
	require.Contains(t, reactor.FormatActionRequired(rep), elemID)

	require.NoError(t, api.Resolve(ctx, elemID, "upgrade#1", reactor.ResolvedLeftApplied, "keep the other writer's value"))
	ownerTTL := f.rdb.PTTL(ctx, ownerKey).Val()
	require.Greater(t, ownerTTL, time.Duration(0), "resolved: the owner's retention applies again")
	elemTTL := f.rdb.PTTL(ctx, elemKey).Val()
	require.Greater(t, elemTTL, time.Duration(0), "and the element goes with its owner's tree")
	require.LessOrEqual(t, elemTTL, time.Hour)
	waiting, err = api.NeedsHuman(ctx, 10)
	require.NoError(t, err)
	require.NotContains(t, waiting, elemID)
	require.NotContains(t, waiting, "tiers2")
	run, err := api.Get(ctx, "tiers2")
	require.NoError(t, err)
	require.Len(t, run.Failure.RollbackFailures, 1)
	require.Equal(t, reactor.ReasonLeftApplied, run.Failure.RollbackFailures[0].Reason, "settled: left applied, nobody waits")
	_, err = api.Check(ctx, "tiers2", reactor.OpRetry)
	require.ErrorIs(t, err, reactor.ErrNotRetryable, "an effect a person left applied still stands: no retry")
}
