package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// policyFixture: runs of "sync" prepare (undone into undone), then take
// the lock "sync" for their key with policy p and do their work; the run
// named held blocks in its work until release is closed.
type policyFixture struct {
	f       *fixture
	e       *reactor.Engine
	def     *reactor.Definition
	release chan struct{}
	mu      sync.Mutex
	undone  []string
	events  chan reactor.Event
}

func newPolicyFixture(t *testing.T, p reactor.FullPolicy, held string) *policyFixture {
	pf := &policyFixture{f: newFixture(t), release: make(chan struct{}), events: make(chan reactor.Event, 16)}
	note := func(what string) {
		pf.mu.Lock()
		pf.undone = append(pf.undone, what)
		pf.mu.Unlock()
	}
	pf.def = reactor.MustDefine("sync",
		reactor.Input[string]("key", reactor.Required()),
		reactor.Input[string]("run", reactor.Required()),
		reactor.Step("prepare", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"run": reactor.FromInput("run")},
			Run:  func(_ context.Context, a reactor.Args) (string, error) { return reactor.Arg[string](a, "run") },
			Undo: func(_ context.Context, _ reactor.Args, run string) error { note("prepare " + run); return nil },
		}),
		reactor.Step("sync", reactor.StepConfig[reactor.Args, string]{
			Args:   reactor.Bindings{"key": reactor.FromInput("key"), "run": reactor.FromInput("run")},
			Limits: []reactor.Limit{{Name: "sync", Concurrency: 1, OnFull: p, Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "key") }}},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				run, _ := reactor.Arg[string](a, "run")
				if run == held {
					select {
					case <-pf.release:
					case <-ctx.Done():
						return "", ctx.Err()
					}
				}
				return run, nil
			},
			Undo: func(_ context.Context, _ reactor.Args, run string) error { note("sync " + run); return nil },
		}),
	)
	pf.e = pf.f.engine("in-process", func(c *reactor.Config) {
		c.Hooks = append(c.Hooks, reactor.HookFunc(func(_ context.Context, e reactor.Event) {
			if e.Kind == reactor.EventLimitCancelled {
				pf.events <- e
			}
		}))
	})
	require.NoError(t, pf.e.Register(pf.def))
	return pf
}

// run runs id for key in this process to its end, resuming it while a
// full limit leaves it waiting at its checkpoint.
func (pf *policyFixture) run(ctx context.Context, id, key string) (*reactor.Result, error) {
	res, err := pf.e.Run(ctx, pf.def, map[string]any{"key": key, "run": id}, reactor.WithRunID(id))
	for errors.Is(err, reactor.ErrLimited) {
		res, err = pf.e.Resume(ctx, id)
	}
	return res, err
}

// start runs id in the background; the channel gets its result.
func (pf *policyFixture) start(ctx context.Context, t *testing.T, id, key string) <-chan *reactor.Result {
	out := make(chan *reactor.Result, 1)
	go func() {
		res, err := pf.run(ctx, id, key)
		assert.NoError(t, err, id)
		out <- res
	}()
	return out
}

// event is the next EventLimitCancelled.
func (pf *policyFixture) event(ctx context.Context, t *testing.T) reactor.Event {
	t.Helper()
	select {
	case ev := <-pf.events:
		return ev
	case <-ctx.Done():
		t.Fatal("no run was cancelled by a limit")
		return reactor.Event{}
	}
}

// result is the result a start's channel gets.
func result(ctx context.Context, t *testing.T, c <-chan *reactor.Result) *reactor.Result {
	t.Helper()
	select {
	case res := <-c:
		require.NotNil(t, res)
		return res
	case <-ctx.Done():
		t.Fatal("the run did not end")
		return nil
	}
}

func (pf *policyFixture) holding(ctx context.Context, key string) func() bool {
	return func() bool { return pf.f.rdb.ZCard(ctx, pf.f.prefix+":{lim:sync:"+key+"}").Val() == 1 }
}

// CancelNewest: a run that finds its key's lock held is cancelled at once:
// it rolls back what it completed and ends cancelled, saying why; the
// holder goes on, and a run for another key is not touched.
func TestLimitCancelNewestCancelsTheRunThatFindsItFull(t *testing.T) {
	ctx := ctxTimeout(t)
	pf := newPolicyFixture(t, reactor.CancelNewest, "first")
	first := pf.start(ctx, t, "first", "acme")
	require.Eventually(t, pf.holding(ctx, "acme"), 10*time.Second, time.Millisecond)

	res, err := pf.run(ctx, "second", "acme")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status)
	require.NotNil(t, res.Failure)
	assert.Contains(t, res.Failure.Message, `limit "sync" is full for key "acme"`)
	assert.Contains(t, res.Failure.Message, "CancelNewest")
	ev := pf.event(ctx, t)
	assert.Equal(t, "second", ev.RunID)
	other, err := pf.run(ctx, "other", "globex")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusCompleted, other.Status, "another key's lock is free")

	close(pf.release)
	assert.Equal(t, reactor.StatusCompleted, result(ctx, t, first).Status)
	pf.mu.Lock()
	defer pf.mu.Unlock()
	assert.Equal(t, []string{"prepare second"}, pf.undone, "the cancelled run's completed step is rolled back, the holder's not")
}

// CancelOldest: a newer run that finds its key's lock held cancels the
// holder and waits for the lock; the holder stops once its step returns,
// rolls back (its undo of the locked step waits its turn for the lock),
// and ends cancelled; the newer run completes.
func TestLimitCancelOldestCancelsTheHolderAndTakesItsTurn(t *testing.T) {
	ctx := ctxTimeout(t)
	pf := newPolicyFixture(t, reactor.CancelOldest, "old")
	old := pf.start(ctx, t, "old", "acme")
	require.Eventually(t, pf.holding(ctx, "acme"), 10*time.Second, time.Millisecond)

	newer := pf.start(ctx, t, "new", "acme")
	ev := pf.event(ctx, t)
	assert.Equal(t, "old", ev.RunID, "the holder is cancelled")
	assert.ErrorContains(t, ev.Err, "cancelled by run new")
	var le *reactor.LimitError
	require.ErrorAs(t, ev.Err, &le)
	assert.Equal(t, "new", le.RunID)
	close(pf.release)

	got := result(ctx, t, newer)
	assert.Equal(t, reactor.StatusCompleted, got.Status)
	res := result(ctx, t, old)
	assert.Equal(t, reactor.StatusCancelled, res.Status)
	pf.mu.Lock()
	defer pf.mu.Unlock()
	assert.Equal(t, []string{"sync old", "prepare old"}, pf.undone, "newest first")
	select {
	case ev := <-pf.events:
		t.Fatalf("one cancel only, got another: %+v", ev)
	default:
	}
}

func TestLimitOnFullDefinitionErrors(t *testing.T) {
	for want, l := range map[string]reactor.Limit{
		"acts when Concurrency is full": {Name: "x", OnFull: reactor.CancelNewest, Rates: []reactor.Rate{{N: 1, Per: time.Second}}},
		"choose one":                    {Name: "x", Concurrency: 1, OnFull: reactor.CancelOldest, Fair: true},
		"is not a policy":               {Name: "x", Concurrency: 1, OnFull: reactor.FullPolicy(9)},
		"Fair and Ordered":              {Name: "x", Concurrency: 2, Fair: true, Ordered: true},
		"Fair shares Concurrency":       {Name: "x", Fair: true, Rates: []reactor.Rate{{N: 1, Per: time.Second}}},
	} {
		_, err := reactor.Define("bad", reactor.Step("s", reactor.StepConfig[reactor.Args, int]{
			Limits: []reactor.Limit{l},
			Run:    func(context.Context, reactor.Args) (int, error) { return 0, nil },
		}))
		var de *reactor.DefinitionError
		require.ErrorAs(t, err, &de, want)
		assert.Contains(t, err.Error(), want)
	}
}
