package sweeper_test

import (
	"context"
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

// A worker process killed (SIGKILL) while its step holds a limit's lock
// leaves the slot behind; it is reclaimed when its lease ends, and not
// before: a run of another process waiting for the lock gets it then.
func TestKilledHoldersLimitSlotIsReclaimedByItsLease(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	ctx := ctxTimeout(t, 40*time.Second)
	eng, err := reactor.NewEngine(ctx, reactor.Config{Client: rdb, Prefix: prefix, Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	def := limitKillDefinition(rdb, prefix, false)
	require.NoError(t, eng.Register(def))

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "limit-kill"})
	_, err = eng.Enqueue(ctx, def, map[string]any{"who": "first"}, reactor.WithRunID("lk-first"))
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
	w := worker.New(eng, rdb, worker.Config{Queues: map[string]int{queue: 1}, Logger: discard})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { _ = w.Stop(context.Background()) })
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
