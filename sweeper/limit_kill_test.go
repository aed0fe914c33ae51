package sweeper_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// limitKillLease is the lease of the lock the killed holder dies with.
const limitKillLease = 2 * time.Second

// limitKillDefinition takes the lock "kill-lock" in its one step, tells the
// parent (list <prefix>:signal) which process holds it, and, in the first
// worker process, hangs there until it is killed.
func limitKillDefinition(rdb redis.UniversalClient, prefix string, hang bool) *reactor.Definition {
	return reactor.MustDefine("limit-kill",
		reactor.Input[string]("who", reactor.Required()),
		reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
			Args:   reactor.Bindings{"who": reactor.FromInput("who")},
			Limits: []reactor.Limit{{Name: "kill-lock", Concurrency: 1, Lease: limitKillLease}},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				who, err := reactor.Arg[string](a, "who")
				if err != nil {
					return "", err
				}
				rdb.RPush(context.Background(), prefix+":signal", "holding:"+who)
				if hang {
					<-ctx.Done() // killed here
				}
				return who, nil
			},
		}),
	)
}

// killEnv is a kill test's Redis, prefix, queue and an engine in this
// process with def registered (the parent's side of startWorkerProcess).
type killEnv struct {
	rdb           redis.UniversalClient
	prefix, queue string
	ctx           context.Context
	eng           *reactor.Engine
	def           *reactor.Definition
}

func newKillEnv(t *testing.T, timeout time.Duration, def func(rdb redis.UniversalClient, prefix string) *reactor.Definition) *killEnv {
	t.Helper()
	k := &killEnv{rdb: redistest.Client(t), prefix: redistest.Prefix(t), queue: redistest.Queue(t), ctx: ctxTimeout(t, timeout)}
	var err error
	k.eng, err = reactor.NewEngine(k.ctx, reactor.Config{Client: k.rdb, Prefix: k.prefix, Enqueuer: worker.NewClient(k.rdb, k.queue), Logger: discard})
	require.NoError(t, err)
	k.def = def(k.rdb, k.prefix)
	require.NoError(t, k.eng.Register(k.def))
	return k
}

// startWorker starts a worker of conc slots (0: the default) in this
// process, stopped at the test's end.
func (k *killEnv) startWorker(t *testing.T, conc int) {
	t.Helper()
	w := worker.New(k.eng, k.rdb, worker.Config{Queues: map[string]int{k.queue: 1}, Concurrency: conc, Logger: discard})
	require.NoError(t, w.Start(k.ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
}

// A worker process killed (SIGKILL) while its step holds a limit's lock
// leaves the slot behind; it is reclaimed when its lease ends, and not
// before: a run of another process waiting for the lock gets it then.
func TestKilledHoldersLimitSlotIsReclaimedByItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	k := newKillEnv(t, 40*time.Second, func(rdb redis.UniversalClient, prefix string) *reactor.Definition {
		return limitKillDefinition(rdb, prefix, false)
	})
	rdb, prefix, queue, ctx, eng, def := k.rdb, k.prefix, k.queue, k.ctx, k.eng, k.def

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "limit-kill"})
	_, err := eng.Enqueue(ctx, def, map[string]any{"who": "first"}, reactor.WithRunID("lk-first"))
	require.NoError(t, err)
	require.Equal(t, "holding:first", first.await(ctx, rdb, prefix+":signal", 30*time.Second))
	slots := prefix + ":{lim:kill-lock:}"
	holders, err := rdb.ZRangeWithScores(ctx, slots, 0, -1).Result()
	require.NoError(t, err)
	require.Len(t, holders, 1, "the first process holds the lock")
	first.kill()
	killed, err := rdb.Time(ctx).Result()
	require.NoError(t, err)

	// A second run, on a worker of this process, waits for the lock.
	k.startWorker(t, 0)
	_, err = eng.Enqueue(ctx, def, map[string]any{"who": "second"}, reactor.WithRunID("lk-second"))
	require.NoError(t, err)
	got, err := rdb.BLPop(ctx, 20*time.Second, prefix+":signal").Result()
	require.NoError(t, err)
	require.Equal(t, "holding:second", got[1])
	took, err := rdb.Time(ctx).Result()
	require.NoError(t, err)
	leaseEnd := time.UnixMilli(int64(holders[0].Score))
	assert.False(t, took.Before(leaseEnd), "the dead holder's slot went only when its lease ended (%s after the kill)", leaseEnd.Sub(killed))
	assert.Less(t, took.Sub(leaseEnd), 3*time.Second, "and the waiting run got it soon after (a snooze or two)")
	final, err := eng.Wait(ctx, "lk-second")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

// orderedKillDefinition holds the ordered run lock "ordered-kill" (one run
// at a time, in creation order, lease limitKillLease) for its whole run;
// its one step records the run (list <prefix>:signal) and, in the first
// worker process, the run "ok-0" hangs there until the process is killed.
func orderedKillDefinition(rdb redis.UniversalClient, prefix string, hang bool) *reactor.Definition {
	return reactor.MustDefine("ordered-kill",
		reactor.Input[string]("who", reactor.Required()),
		reactor.RunLimits(reactor.Limit{Name: "ordered-kill", Concurrency: 1, Ordered: true, Lease: limitKillLease}),
		reactor.Step("apply", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"who": reactor.FromInput("who")},
			Run: func(ctx context.Context, a reactor.Args) (string, error) {
				who, err := reactor.Arg[string](a, "who")
				if err != nil {
					return "", err
				}
				rdb.RPush(context.Background(), prefix+":signal", who)
				if hang && who == "ok-0" {
					<-ctx.Done() // killed here
				}
				return who, nil
			},
		}),
	)
}

// An ordered run lock across a worker kill: the first run dies holding the
// lock (its process killed mid-step); the runs enqueued after it, on a
// worker of this process, wait in creation order, get the lock once the
// dead holder's lease ends, and run one at a time in that order; the
// sweeper recovers the first run, which takes the lock again, by its
// creation time ahead of the runs still waiting, and completes.
func TestOrderedRunLockAcrossAWorkerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	k := newKillEnv(t, 60*time.Second, func(rdb redis.UniversalClient, prefix string) *reactor.Definition {
		return orderedKillDefinition(rdb, prefix, false)
	})
	rdb, prefix, queue, ctx, eng, def := k.rdb, k.prefix, k.queue, k.ctx, k.eng, k.def

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "ordered-kill"})
	_, err := eng.Enqueue(ctx, def, map[string]any{"who": "ok-0"}, reactor.WithRunID("ok-0"))
	require.NoError(t, err)
	require.Equal(t, "ok-0", first.await(ctx, rdb, prefix+":signal", 30*time.Second))
	first.kill()

	ids := []string{"ok-0"}
	for i := 1; i <= 4; i++ {
		id := "ok-" + strconv.Itoa(i)
		_, err := eng.Enqueue(ctx, def, map[string]any{"who": id}, reactor.WithRunID(id))
		require.NoError(t, err)
		ids = append(ids, id)
	}
	k.startWorker(t, 8)
	sw := newEagerSweeper(t, ctx, eng)

	var got []string
	for len(got) < 5 {
		v, err := rdb.BLPop(ctx, 30*time.Second, prefix+":signal").Result()
		require.NoError(t, err, "ran so far: %v", got)
		got = append(got, v[1])
	}
	for _, id := range ids {
		final, err := eng.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, final.Status, "%s: %v", id, final.Err())
	}
	sw.stop()
	t.Logf("ran, in order: %v", got)
	// ok-0 ran again once recovered; the others ran once each, in order.
	var later []string
	zero := 0
	for _, g := range got {
		if g == "ok-0" {
			zero++
			continue
		}
		later = append(later, g)
	}
	assert.Equal(t, 1, zero, "ok-0 ran once more, after its recovery: %v", got)
	assert.Equal(t, ids[1:], later, "the runs after it in creation order: %v", got)
	// Released after each run's terminal write, which Wait hears first.
	assert.Eventually(t, func() bool { return rdb.Exists(ctx, prefix+":{lim:ordered-kill:}").Val() == 0 }, 10*time.Second,
		5*time.Millisecond, "the lock is free at the end")
}
