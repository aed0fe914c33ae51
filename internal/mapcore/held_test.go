package mapcore_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/goreactor/goreactor/internal/keys"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/mapcore"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/worker"
)

// heldFixture: map elements that set one account each with a guarded
// step; somebody else changes some accounts before (or while) a run rolls
// back, and the plain step of some elements fails its first undo.
type heldFixture struct {
	rdb    redis.UniversalClient
	engine *engine.Engine
	prefix string
	// failNote makes the note step's undo of item n fail while the
	// counter is above zero.
	failNote [8]atomic.Int32
}

func newHeldFixture(t *testing.T, fanOut bool, mod func(*engine.Config)) *heldFixture {
	t.Helper()
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := engine.Config{Client: rdb, Prefix: redistest.Prefix(t), Enqueuer: worker.NewClient(rdb, queue), Logger: logger,
		Retention: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	e, err := engine.NewEngine(context.Background(), cfg)
	require.NoError(t, err)
	hf := &heldFixture{rdb: rdb, engine: e, prefix: cfg.Prefix}
	if fanOut {
		w := worker.New(e, rdb, worker.Config{Queues: map[string]int{queue: 1}, Concurrency: 4, Logger: logger})
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(func() { _ = w.Stop(context.Background()) })
	}
	return hf
}

func (hf *heldFixture) key(n int) string { return fmt.Sprintf("%s:acct:%d", hf.prefix, n) }

func (hf *heldFixture) get(ctx context.Context, k string) (string, error) {
	v, err := hf.rdb.Get(ctx, k).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// defs builds the element (guarded upgrade, then a plain note; it fails
// itself, after clobbering its own account, for items in failSelf) and an
// owner mapping it, whose last step clobbers the accounts in clobber and
// fails (none: it completes).
func (hf *heldFixture) defs(name string, fanOut, partial bool, failSelf, clobber []int) (*engine.Definition, *engine.Definition) {
	type in struct {
		N int `json:"n"`
	}
	guard := engine.Guarded(engine.GuardConfig[string]{
		Probe: hf.get,
		Restore: func(ctx context.Context, k, before, _ string) (engine.RestoreResult, error) {
			return engine.RestoreWritten, hf.rdb.Set(ctx, k, before, 0).Err()
		},
	})
	has := func(xs []int, n int) bool {
		for _, x := range xs {
			if x == n {
				return true
			}
		}
		return false
	}
	element := engine.MustDefine(name+"-el",
		engine.Input[int]("item", engine.Required()),
		engine.Step("upgrade", engine.StepConfig[in, string]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			Guard: guard,
			Run: func(ctx context.Context, in in) (string, error) {
				k := hf.key(in.N)
				before, err := hf.get(ctx, k)
				if err != nil {
					return "", err
				}
				if err := hf.rdb.Set(ctx, k, "gold", 0).Err(); err != nil {
					return "", err
				}
				return "gold", engine.RecordEffect(ctx, engine.Effect{Resource: k, Before: before, After: "gold", Label: "tier"})
			},
		}),
		engine.Step("note", engine.StepConfig[in, string]{
			Args:  engine.Bindings{"n": engine.FromInput("item")},
			After: []string{"upgrade"},
			Run: func(ctx context.Context, in in) (string, error) {
				if has(failSelf, in.N) {
					if err := hf.rdb.Set(ctx, hf.key(in.N), "platinum (support desk)", 0).Err(); err != nil {
						return "", err
					}
					return "", engine.Permanent(fmt.Errorf("item %d refused", in.N))
				}
				return "noted", nil
			},
			Undo: func(ctx context.Context, in in, _ string) error {
				if hf.failNote[in.N].Add(-1) >= 0 {
					return fmt.Errorf("note of %d could not be withdrawn", in.N)
				}
				return nil
			},
		}))
	parts := []engine.Part{
		engine.Input[[]int]("items", engine.Required()),
		mapcore.Map("each", mapcore.Config{Element: element, Items: engine.FromInput("items"), FanOut: fanOut, Partial: partial, BatchSize: 2}),
	}
	if clobber != nil {
		parts = append(parts, engine.Step("decline", engine.StepConfig[engine.Args, string]{
			After: []string{"each"},
			Run: func(ctx context.Context, _ engine.Args) (string, error) {
				for _, n := range clobber {
					if err := hf.rdb.Set(ctx, hf.key(n), "platinum (support desk)", 0).Err(); err != nil {
						return "", err
					}
				}
				return "", engine.Permanent(errors.New("declined"))
			},
		}))
	}
	return engine.MustDefine(name, parts...), element
}

// finish waits for a run handed to workers.
func (hf *heldFixture) finish(t *testing.T, ctx context.Context, res *engine.Result) *engine.Result {
	t.Helper()
	if res.Status.Terminal() {
		return res
	}
	out, err := hf.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	return out
}

func (hf *heldFixture) ttl(ctx context.Context, kind, id string) time.Duration {
	if kind == "elem" {
		return hf.rdb.PTTL(ctx, keys.New(hf.prefix).ElemState(id)).Val()
	}
	return hf.rdb.PTTL(ctx, hf.prefix+":{"+kind+":"+id+"}:ctx").Val()
}

func reasons(f *engine.Failure) []string {
	var out []string
	if f != nil {
		for _, rf := range f.RollbackFailures {
			out = append(out, rf.Step+"="+rf.Reason)
		}
	}
	return out
}

// An owner's RetryRollback keeps what its elements still hold: element 1's
// conflict stays on the owner's failure, listed, kept and waited for, and
// Retry stays refused, after the retry undid element 2's failed entry; a
// left_applied resolution then gives the tree its retention back and Retry
// stays refused (issue 21, case 2). Inline and fanned out alike.
func TestOwnerRetryRollbackKeepsItsElementsConflicts(t *testing.T) {
	t.Parallel()
	for _, fanOut := range []bool{false, true} {
		t.Run(fmt.Sprintf("fanout=%v", fanOut), func(t *testing.T) {
			t.Parallel()
			hf := newHeldFixture(t, fanOut, nil)
			ctx := ctxT(t)
			name := fmt.Sprintf("held-retry-%v", fanOut)
			owner, element := hf.defs(name, fanOut, false, nil, []int{1})
			require.NoError(t, hf.engine.Register(owner, element))
			hf.failNote[2].Store(1)
			id := name + "-run"
			var res *engine.Result
			var err error
			if fanOut {
				res, err = hf.engine.Enqueue(ctx, owner, map[string]any{"items": []int{0, 1, 2}}, engine.WithRunID(id))
			} else {
				res, err = hf.engine.Run(ctx, owner, map[string]any{"items": []int{0, 1, 2}}, engine.WithRunID(id))
			}
			require.NoError(t, err)
			res = hf.finish(t, ctx, res)
			require.Equal(t, engine.StatusFailed, res.Status)
			require.ElementsMatch(t, []string{"each[1]/upgrade=" + engine.ReasonConflict, "each[2]/note="}, reasons(res.Failure))
			elem1 := mapcore.MapID(id, "each") + ".1"
			trail, err := hf.engine.Audit(ctx, id)
			require.NoError(t, err)
			var mapReasons []string
			for _, a := range trail {
				if a.Step == "each" && a.Status == engine.RollbackFailed {
					mapReasons = append(mapReasons, a.Reason)
				}
			}
			require.Equal(t, []string{engine.ReasonConflict}, mapReasons, "the owner's audit says what holds its map entry")

			res, err = hf.engine.RetryRollback(ctx, id)
			require.NoError(t, err)
			res = hf.finish(t, ctx, res)
			require.Equal(t, engine.StatusFailed, res.Status)
			require.Equal(t, []string{"each[1]/upgrade=" + engine.ReasonConflict}, reasons(res.Failure),
				"the conflict is not forgotten by the generation that undid element 2")
			require.Equal(t, engine.Held{Waiting: 1}, res.Held)
			rep, err := hf.engine.RollbackReport(ctx, id)
			require.NoError(t, err)
			require.Equal(t, engine.RollbackNeedsHuman, rep.Summary.Outcome)
			require.Len(t, rep.ActionRequired, 1)
			require.Equal(t, elem1, rep.ActionRequired[0].Run)
			require.Equal(t, engine.Held{Waiting: 1}, rep.ElementsHeld)
			waiting, err := hf.engine.NeedsHuman(ctx, 10)
			require.NoError(t, err)
			require.Contains(t, waiting, id)
			require.Contains(t, waiting, elem1)
			require.Eventually(t, func() bool { return hf.ttl(ctx, "run", id) == -1 }, 5*time.Second, 5*time.Millisecond,
				"the owner's tree is kept while its element waits")
			require.Equal(t, time.Duration(-1), hf.ttl(ctx, "elem", elem1))
			_, err = hf.engine.Check(ctx, id, engine.OpRetry)
			require.ErrorIs(t, err, engine.ErrNotRetryable)
			v, err := hf.get(ctx, hf.key(1))
			require.NoError(t, err)
			require.Equal(t, "platinum (support desk)", v, "nothing was restored over the other writer")

			require.NoError(t, hf.engine.Resolve(ctx, elem1, "upgrade#1", engine.ResolvedLeftApplied, "support keeps platinum"))
			waiting, err = hf.engine.NeedsHuman(ctx, 10)
			require.NoError(t, err)
			require.NotContains(t, waiting, id)
			require.NotContains(t, waiting, elem1)
			require.Greater(t, hf.ttl(ctx, "run", id), time.Duration(0), "resolved: the tree's retention applies again")
			require.Greater(t, hf.ttl(ctx, "elem", elem1), time.Duration(0))
			run, err := hf.engine.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, engine.Held{LeftApplied: 1}, run.Held)
			_, err = hf.engine.Check(ctx, id, engine.OpRetry)
			require.ErrorIs(t, err, engine.ErrNotRetryable, "an effect a person left applied still stands")

			// Another generation of the owner does not drop the marker.
			res, err = hf.engine.RetryRollback(ctx, id)
			if err == nil {
				require.Equal(t, engine.StatusFailed, hf.finish(t, ctx, res).Status)
			} else {
				require.ErrorIs(t, err, engine.ErrNothingToRetry)
			}
			run, err = hf.engine.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, engine.Held{LeftApplied: 1}, run.Held)
			_, err = hf.engine.Check(ctx, id, engine.OpRetry)
			require.ErrorIs(t, err, engine.ErrNotRetryable)
			rep, err = hf.engine.RollbackReport(ctx, id)
			require.NoError(t, err)
			require.Equal(t, engine.RollbackKeptInPlace, rep.Summary.Outcome)
		})
	}
}

// A Partial map's owner completes, with no failure, while an element that
// failed rolled itself back into a conflict: the owner is kept and listed
// until a person resolves it (issue 21, case 3).
func TestPartialMapOwnerWaitsForItsElementsConflict(t *testing.T) {
	t.Parallel()
	hf := newHeldFixture(t, false, nil)
	ctx := ctxT(t)
	owner, element := hf.defs("held-partial", false, true, []int{1}, nil)
	require.NoError(t, hf.engine.Register(owner, element))
	res, err := hf.engine.Run(ctx, owner, map[string]any{"items": []int{0, 1, 2}}, engine.WithRunID("held-partial-run"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusCompleted, res.Status)
	require.Nil(t, res.Failure)
	require.Equal(t, engine.Held{Waiting: 1}, res.Held)
	elem1 := mapcore.MapID("held-partial-run", "each") + ".1"
	waiting, err := hf.engine.NeedsHuman(ctx, 10)
	require.NoError(t, err)
	require.Contains(t, waiting, "held-partial-run")
	require.Contains(t, waiting, elem1)
	require.Equal(t, time.Duration(-1), hf.ttl(ctx, "run", "held-partial-run"))
	require.Equal(t, time.Duration(-1), hf.ttl(ctx, "elem", elem1))

	v, err := hf.get(ctx, hf.key(1))
	require.NoError(t, err)
	require.Equal(t, "platinum (support desk)", v)
	require.NoError(t, hf.rdb.Set(ctx, hf.key(1), "", 0).Err(), "the person puts it back")
	require.NoError(t, hf.engine.Resolve(ctx, elem1, "upgrade#1", engine.ResolvedManuallyReverted, "set back to nothing"))
	waiting, err = hf.engine.NeedsHuman(ctx, 10)
	require.NoError(t, err)
	require.NotContains(t, waiting, "held-partial-run")
	require.Greater(t, hf.ttl(ctx, "run", "held-partial-run"), time.Duration(0))
	run, err := hf.engine.Get(ctx, "held-partial-run")
	require.NoError(t, err)
	require.True(t, run.Held.IsZero(), "%+v", run.Held)
}

// Conflicts past MaxRollbackFailures are only counted on the owner's
// failure, yet every one keeps the owner waiting until the last is
// resolved (issue 21, case 3).
func TestConflictsPastTheFailureCapKeepTheOwnerWaiting(t *testing.T) {
	t.Parallel()
	hf := newHeldFixture(t, false, func(c *engine.Config) { c.MaxRollbackFailures = 1 })
	ctx := ctxT(t)
	owner, element := hf.defs("held-cap", false, false, nil, []int{0, 1, 2})
	require.NoError(t, hf.engine.Register(owner, element))
	res, err := hf.engine.Run(ctx, owner, map[string]any{"items": []int{0, 1, 2}}, engine.WithRunID("held-cap-run"))
	require.NoError(t, err)
	require.Equal(t, engine.StatusFailed, res.Status)
	require.Len(t, res.Failure.RollbackFailures, 1)
	require.Equal(t, 2, res.Failure.RollbackFailuresOmitted)
	require.Equal(t, engine.Held{Waiting: 3}, res.Held)
	rep, err := hf.engine.RollbackReport(ctx, "held-cap-run")
	require.NoError(t, err)
	require.Len(t, rep.ActionRequired, 1)
	require.Equal(t, 3, rep.ElementsHeld.Waiting)
	require.Contains(t, engine.FormatActionRequired(rep), "2 more conflict(s) of map element runs")
	mapID := mapcore.MapID("held-cap-run", "each")
	for i := range 3 {
		waiting, err := hf.engine.NeedsHuman(ctx, 10)
		require.NoError(t, err)
		require.Contains(t, waiting, "held-cap-run", "%d of 3 resolved: the owner still waits", i)
		require.Equal(t, time.Duration(-1), hf.ttl(ctx, "run", "held-cap-run"))
		require.NoError(t, hf.engine.Resolve(ctx, fmt.Sprintf("%s.%d", mapID, i), "upgrade#1", engine.ResolvedLeftApplied, "kept"))
	}
	waiting, err := hf.engine.NeedsHuman(ctx, 10)
	require.NoError(t, err)
	require.NotContains(t, waiting, "held-cap-run")
	require.Greater(t, hf.ttl(ctx, "run", "held-cap-run"), time.Duration(0))
	run, err := hf.engine.Get(ctx, "held-cap-run")
	require.NoError(t, err)
	require.Equal(t, engine.Held{LeftApplied: 3}, run.Held)
}
