package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// Guarded undo through workers, in a fan-out map: each element sets one
// account's tier and records the effect. Somebody else changes account 2
// before the owner fails. The rollback, run by element rollback jobs,
// restores every account but 2, which is left as the other writer made it
// (Restore never called on it); its element's entry needs a person. Once a
// person resolves it (manually_reverted after putting the value back), the
// owner's rollback is settled: nothing to retry, nothing undone twice,
// everything reverted. Resources are scoped to their element run: the
// conflict on account 2 blocks nothing in the other elements.
func TestGuardedUndoInAFanOutMapThroughWorkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	api, wk := f.engine("api"), f.engine("worker")
	ctx := ctxTimeout(t)
	tt := newTiers(f, "tier", 2)
	key, get, restored, owner, element := tt.key, tt.get, &tt.restored, tt.owner, tt.element
	for n := range 5 {
		require.NoError(t, f.rdb.Set(ctx, key(n), "basic", 0).Err())
	}
	require.NoError(t, wk.Register(owner, element))
	f.startWorker(wk)

	res, err := api.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2, 3, 4}}, reactor.WithRunID("tiers"))
	require.NoError(t, err)
	final, err := api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	for n := range 5 {
		v, err := get(ctx, key(n))
		require.NoError(t, err)
		if n == 2 {
			require.Equal(t, "platinum (support desk)", v, "the other writer's change survived the rollback")
			require.Zero(t, restored[n].Load(), "Restore was never called on it")
			continue
		}
		require.Equal(t, "basic", v, "account %d restored", n)
	}
	var conflicted []string
	for _, rf := range final.Failure.RollbackFailures {
		if rf.Reason == reactor.ReasonConflict {
			conflicted = append(conflicted, rf.Step)
		}
	}
	require.Len(t, conflicted, 1, "one element's conflict reached the owner: %+v", final.Failure.RollbackFailures)

	// The element run holds the entry a person must resolve.
	var elemID string
	for i := range 5 {
		id := fmt.Sprintf("%s.%d", mapstep.MapID("tiers", "each"), i)
		rep, err := api.RollbackReport(ctx, id)
		require.NoError(t, err)
		if len(rep.ActionRequired) > 0 {
			elemID = id
			require.Equal(t, key(2), rep.ActionRequired[0].Resource)
			require.Equal(t, "upgrade#1", rep.ActionRequired[0].ID)
		}
	}
	require.NotEmpty(t, elemID)
	require.NoError(t, f.rdb.Set(ctx, key(2), "basic", 0).Err(), "the person puts the value back")
	require.NoError(t, api.Resolve(ctx, elemID, "upgrade#1", reactor.ResolvedManuallyReverted, "support agreed; set back to basic"))

	// The element had nothing else in place: its owner's map entry is
	// settled by the resolution, nothing is left to retry, and the run may
	// be retried.
	_, err = api.RetryRollback(ctx, res.RunID)
	require.ErrorIs(t, err, reactor.ErrNothingToRetry)
	again, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, again.Status)
	require.Empty(t, again.Failure.RollbackFailures, "the resolved element has nothing left to undo")
	require.True(t, again.Held.IsZero(), "%+v", again.Held)
	rep, err := api.RollbackReport(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.RollbackReverted, rep.Summary.Outcome)
	_, err = api.Check(ctx, res.RunID, reactor.OpRetry)
	require.NoError(t, err)
	for n := range 5 {
		if n != 2 {
			require.Equal(t, int32(1), restored[n].Load(), "account %d restored once", n)
		}
	}
	require.Zero(t, restored[2].Load())
}

// tiers is the fixture of the guarded fan-out tests: an element reactor
// whose guarded step sets one account's tier to gold (recording a verified
// effect), and an owner that maps it over the accounts, then fails after
// somebody else changed account clobbered.
type tiers struct {
	f              *fixture
	restored       [5]atomic.Int32
	owner, element *reactor.Definition
}

func newTiers(f *fixture, name string, clobbered int) *tiers {
	tt := &tiers{f: f}
	guard := reactor.Guarded(reactor.GuardConfig[string]{
		Probe: tt.get,
		Restore: func(ctx context.Context, k, before, _ string) (reactor.RestoreResult, error) {
			var n int
			if _, err := fmt.Sscanf(k, f.prefix+":acct:%d:tier", &n); err == nil {
				tt.restored[n].Add(1)
			}
			return reactor.RestoreWritten, f.rdb.Set(ctx, k, before, 0).Err()
		},
	})
	type in struct {
		N int `json:"n"`
	}
	tt.element = reactor.MustDefine(name+"-el",
		reactor.Input[int]("item", reactor.Required()),
		reactor.Step("upgrade", reactor.StepConfig[in, string]{
			Args:  reactor.Bindings{"n": reactor.FromInput("item")},
			Guard: guard,
			Run: func(ctx context.Context, in in) (string, error) {
				k := tt.key(in.N)
				before, err := tt.get(ctx, k)
				if err != nil {
					return "", err
				}
				if err := f.rdb.Set(ctx, k, "gold", 0).Err(); err != nil {
					return "", err
				}
				return "gold", reactor.RecordVerifiedEffect(ctx, reactor.Effect{Resource: k, Before: before, After: "gold", Label: "tier upgrade"})
			},
		}))
	// The other writer acts before the owner's last step fails.
	tt.owner = reactor.MustDefine(name+"-owner",
		reactor.Input[[]int]("items", reactor.Required()),
		mapstep.Map("each", mapstep.Config{Element: tt.element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 2}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if err := f.rdb.Set(ctx, tt.key(clobbered), "platinum (support desk)", 0).Err(); err != nil {
					return "", err
				}
				return "", reactor.Permanent(errors.New("declined"))
			},
		}))
	return tt
}

func (tt *tiers) key(n int) string { return fmt.Sprintf("%s:acct:%d:tier", tt.f.prefix, n) }

func (tt *tiers) get(ctx context.Context, k string) (string, error) {
	v, err := tt.f.rdb.Get(ctx, k).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}
