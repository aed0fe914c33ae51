package worker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/store"
	"github.com/goreactor/goreactor/reactor"
)

// stepLog records which run ran which step, in order.
type stepLog struct {
	mu  sync.Mutex
	got []string
}

func (l *stepLog) add(s string) {
	l.mu.Lock()
	l.got = append(l.got, s)
	l.mu.Unlock()
}

func (l *stepLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// A run lock (RunLimits(Lock)) is held from the run's first step to its
// end, across a pause at an interrupt with no process holding anything: a
// second run for the key starts nothing until the first ends; the paused
// holder's slot has no lease (parked) and the lock's key no expiry while
// it waits; the first run's end releases it and the second runs.
func TestRunLockIsHeldAcrossAPause(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var log stepLog
	step := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"account": reactor.FromInput("account"), "id": reactor.FromInput("id")},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				id, _ := reactor.Arg[string](a, "id")
				log.add(id + " " + name)
				return id, nil
			},
		})
	}
	def := reactor.MustDefine("transfer",
		reactor.Input[string]("account", reactor.Required()),
		reactor.Input[string]("id", reactor.Required()),
		reactor.RunLimits(reactor.Lock("account", func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "account") })),
		step("debit"),
		reactor.Interrupt("confirm", reactor.InterruptConfig[reactor.Args, string]{After: []string{"debit"}}),
		reactor.Step("credit", reactor.StepConfig[reactor.Args, string]{
			Args:  reactor.Bindings{"id": reactor.FromInput("id")},
			After: []string{"confirm"},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				id, _ := reactor.Arg[string](a, "id")
				log.add(id + " credit")
				return id, nil
			},
		}),
	)
	e := f.processes(2, 4, def)[0]
	lockKey := f.prefix + ":{lim:account:acme}"

	_, err := e.Enqueue(ctx, def, map[string]any{"account": "acme", "id": "first"}, reactor.WithRunID("first"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := e.Get(ctx, "first")
		return err == nil && run.Status == reactor.StatusPaused
	}, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool {
		zs := f.rdb.ZRangeWithScores(ctx, lockKey, 0, -1).Val()
		return len(zs) == 1 && zs[0].Score >= store.ParkedScore
	}, 10*time.Second, 5*time.Millisecond, "the paused run's slot is parked")
	assert.Equal(t, time.Duration(-1), f.rdb.PTTL(ctx, lockKey).Val(), "no expiry while a parked holder is in it")

	_, err = e.Enqueue(ctx, def, map[string]any{"account": "acme", "id": "second"}, reactor.WithRunID("second"))
	require.NoError(t, err)
	// The second run tries, and waits: recorded as a waiter of the lock.
	require.Eventually(t, func() bool {
		return f.rdb.ZScore(ctx, lockKey+":w", "second|(run)").Err() == nil
	}, 10*time.Second, 5*time.Millisecond, "the second run waits for the lock")
	assert.Equal(t, []string{"first debit"}, log.all(), "the second run started nothing")

	_, err = e.Continue(ctx, "first", "confirm", "ok")
	require.NoError(t, err)
	awaitCompleted(ctx, t, e, "first")
	require.Eventually(t, func() bool {
		run, err := e.Get(ctx, "second")
		return err == nil && run.Status == reactor.StatusPaused
	}, 10*time.Second, 5*time.Millisecond)
	_, err = e.Continue(ctx, "second", "confirm", "ok")
	require.NoError(t, err)
	awaitCompleted(ctx, t, e, "second")
	assert.Equal(t, []string{"first debit", "first credit", "second debit", "second credit"}, log.all())
	// Released after the run's terminal write, which Wait hears first.
	assert.Eventually(t, func() bool { return f.rdb.Exists(ctx, lockKey).Val() == 0 }, 10*time.Second, 5*time.Millisecond,
		"released: nobody holds the lock")
}

// The rollback of a finished run takes its run lock again: an Undo while
// another run of the key holds it (paused) is told the lock is full and
// changes nothing; once the holder ends, the Undo rolls the run back. A
// Cancel of the paused holder itself takes back what it holds.
func TestRunLockIsTakenByTheRollback(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var log stepLog
	def := reactor.MustDefine("booking",
		reactor.Input[string]("room", reactor.Required()),
		reactor.Input[string]("id", reactor.Required()),
		reactor.Input[bool]("wait"),
		reactor.RunLimits(reactor.Lock("room", func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "room") })),
		reactor.Step("book", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"id": reactor.FromInput("id")},
			Run:  func(_ context.Context, a reactor.Args) (string, error) { return reactor.Arg[string](a, "id") },
			Undo: func(_ context.Context, _ reactor.Args, id string) error { log.add("unbook " + id); return nil },
		}),
		reactor.Interrupt("hold", reactor.InterruptConfig[reactor.Args, string]{
			After: []string{"book"}, Args: reactor.Bindings{"wait": reactor.FromInput("wait")},
			Default: func(reactor.Args) (string, error) { return "", nil }, Timeout: time.Hour,
		}),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	paused := func(id string) {
		t.Helper()
		require.Eventually(t, func() bool {
			run, err := e.Get(ctx, id)
			return err == nil && run.Status == reactor.StatusPaused
		}, 10*time.Second, 5*time.Millisecond, "%s pauses", id)
	}

	// "done" books, pauses, is continued and completes, releasing the room.
	_, err := e.Enqueue(ctx, def, map[string]any{"room": "101", "id": "done"}, reactor.WithRunID("done"))
	require.NoError(t, err)
	paused("done")
	_, err = e.Continue(ctx, "done", "hold", "x")
	require.NoError(t, err)
	awaitCompleted(ctx, t, e, "done")

	// "holder" pauses holding the room.
	_, err = e.Enqueue(ctx, def, map[string]any{"room": "101", "id": "holder"}, reactor.WithRunID("holder"))
	require.NoError(t, err)
	paused("holder")

	_, err = e.Undo(ctx, "done")
	require.ErrorIs(t, err, reactor.ErrLimited, "the rollback waits for the room's lock")
	var le *reactor.LimitError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "room", le.Limit)
	assert.Equal(t, "101", le.Key)
	run, err := e.Get(ctx, "done")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusCompleted, run.Status, "nothing undone while the lock is held")
	assert.Empty(t, log.all())

	require.NoError(t, e.Cancel(ctx, "holder"), "the holder's own rollback takes back what it holds")
	run, err = e.Get(ctx, "holder")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusCancelled, run.Status)
	res, err := e.Undo(ctx, "done")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusCancelled, res.Status)
	assert.Equal(t, []string{"unbook holder", "unbook done"}, log.all())
}

// An ordered run lock: runs for a key execute one at a time in the order
// they were created (enqueued), whichever worker picks which up first: a
// run takes its place when it is enqueued, so the first run, enqueued
// with a start delay and so picked up last, still goes first.
func TestRunLockOrderedRunsInEnqueueOrder(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	var log stepLog
	gate := make(chan struct{})
	def := reactor.MustDefine("deploy",
		reactor.Input[string]("service", reactor.Required()),
		reactor.Input[string]("id", reactor.Required()),
		reactor.RunLimits(reactor.Limit{Name: "service", Concurrency: 1, Ordered: true,
			Key: func(a reactor.Args) (string, error) { return reactor.Arg[string](a, "service") }}),
		reactor.Step("roll", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"id": reactor.FromInput("id")},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				id, _ := reactor.Arg[string](a, "id")
				log.add(id)
				if id == "deploy-0" {
					select {
					case <-gate:
					case <-ctx.Done():
					}
				}
				return id, nil
			},
		}),
	)
	engines := f.processes(3, 4, def)
	var ids []string
	for i := range 6 {
		id := fmt.Sprintf("deploy-%d", i)
		opts := []reactor.RunOption{reactor.WithRunID(id)}
		if i == 0 {
			opts = append(opts, reactor.WithDelay(500*time.Millisecond))
		}
		_, err := engines[i%3].Enqueue(ctx, def, map[string]any{"service": "api", "id": id}, opts...)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	// The later runs, picked up first, wait: every one has tried.
	for _, id := range ids[1:] {
		require.Eventually(t, func() bool { return f.events.ran(id, reactor.EventLimitWaited) },
			10*time.Second, 5*time.Millisecond, "%s tried and waits", id)
	}
	assert.Empty(t, log.all(), "nobody runs before the first run")
	// The first run gets in when its delay ends, and holds the lock.
	require.Eventually(t, func() bool { return len(log.all()) == 1 }, 10*time.Second, 5*time.Millisecond)
	close(gate)
	awaitCompleted(ctx, t, engines[0], ids...)
	assert.Equal(t, ids, log.all(), "in enqueue order")
}

func TestRunLimitsDefinitionErrors(t *testing.T) {
	key := func(a reactor.Args) (string, error) { return "k", nil }
	leaf := reactor.MustDefine("leaf", reactor.RunLimits(reactor.Lock("l", key)),
		reactor.Step("s", reactor.StepConfig[reactor.Args, int]{Run: func(context.Context, reactor.Args) (int, error) { return 0, nil }}))
	for want, parts := range map[string][]reactor.Part{
		"Fair is for step limits":    {reactor.RunLimits(reactor.Limit{Name: "x", Concurrency: 2, Fair: true})},
		"OnFull is for step limits":  {reactor.RunLimits(reactor.Limit{Name: "x", Concurrency: 1, OnFull: reactor.CancelNewest})},
		"OncePer is for step limits": {reactor.RunLimits(reactor.Limit{Name: "x", OncePer: time.Hour})},
		"declared twice":             {reactor.RunLimits(reactor.Lock("x", key), reactor.Lock("x", key))},
		"limits nothing":             {reactor.RunLimits(reactor.Limit{Name: "x"})},
		"which the run holds already": {reactor.RunLimits(reactor.Lock("x", key)),
			reactor.Step("s", reactor.StepConfig[reactor.Args, int]{Limits: []reactor.Limit{reactor.Lock("x", key)},
				Run: func(context.Context, reactor.Args) (int, error) { return 0, nil }})},
		"declares run limits": {reactor.Compose("child", leaf, reactor.ComposeConfig{})},
	} {
		_, err := reactor.Define("bad", parts...)
		var de *reactor.DefinitionError
		require.ErrorAs(t, err, &de, want)
		assert.Contains(t, err.Error(), want)
	}
}

// A run waiting for its run lock (the holder paused) can be cancelled at
// once: it never ran under the lock, so its cancel does not wait for it;
// the holder keeps the lock.
func TestRunLockWaiterCanBeCancelled(t *testing.T) {
	f := newFixture(t)
	ctx := ctxTimeout(t)
	def := reactor.MustDefine("guarded-sync",
		reactor.Input[string]("id", reactor.Required()),
		reactor.RunLimits(reactor.Lock("sync", nil)),
		reactor.Interrupt("hold", reactor.InterruptConfig[reactor.Args, string]{}),
	)
	e := f.engine("w")
	require.NoError(t, e.Register(def))
	f.startWorker(e)
	_, err := e.Enqueue(ctx, def, map[string]any{"id": "holder"}, reactor.WithRunID("sync-holder"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := e.Get(ctx, "sync-holder")
		return err == nil && run.Status == reactor.StatusPaused
	}, 10*time.Second, 5*time.Millisecond)
	_, err = e.Enqueue(ctx, def, map[string]any{"id": "waiter"}, reactor.WithRunID("sync-waiter"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.events.ran("sync-waiter", reactor.EventLimitWaited) },
		10*time.Second, 5*time.Millisecond, "the second run waits for the lock")
	require.NoError(t, e.Cancel(ctx, "sync-waiter"))
	final, err := e.Wait(ctx, "sync-waiter")
	require.NoError(t, err)
	assert.Equal(t, reactor.StatusCancelled, final.Status)
	zs := f.rdb.ZRangeWithScores(ctx, f.prefix+":{lim:sync:}", 0, -1).Val()
	require.Len(t, zs, 1, "the holder keeps the lock")
	assert.Contains(t, zs[0].Member, "sync-holder|")
}
