package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// spawnKillDefinition: a spawn step starting a run of a reactor whose one
// step counts its runs in the hash <prefix>:starts, then a step that reads
// the spawn's result.
func spawnKillDefinition(rdb redis.UniversalClient, prefix string) *reactor.Definition {
	child := reactor.MustDefine("spawn-kill-child",
		reactor.Step("send", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) {
				rdb.HIncrBy(context.Background(), prefix+":starts", "send", 1)
				return "sent", nil
			},
		}))
	return reactor.MustDefine("spawn-kill",
		reactor.Spawn("notify", child, reactor.SpawnConfig{}),
		reactor.Step("after", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"n": reactor.FromStep("notify")},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				sp, err := reactor.Arg[reactor.Spawned](a, "n")
				return sp.RunID, err
			},
		}),
		reactor.Returns(reactor.FromStep("after")))
}

// spawnThenHang lets the spawn step start its run, then holds the step
// (its outcome unrecorded) until the process is killed: the window between
// a spawn's effect and its record.
func spawnThenHang(rdb redis.UniversalClient, prefix string) reactor.Middleware {
	return func(ctx context.Context, c reactor.Call, next func(context.Context) error) error {
		err := next(ctx)
		if c.Step == "notify" && c.Kind == reactor.CallRun {
			rdb.RPush(context.Background(), prefix+":signal", "spawned")
			<-ctx.Done() // killed here
		}
		return err
	}
}

// A worker process killed (SIGKILL) after a spawn step started its run and
// before the step was recorded: the recovered run runs the spawn step
// again, which finds the run it started (same id) instead of starting
// another; the spawned run runs once, and the spawning run completes with
// one link to it.
func TestSpawnStepRunAgainAfterAKillStartsNoSecondRun(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	k := newKillEnv(t, 60*time.Second, spawnKillDefinition)
	rdb, prefix, queue, ctx, eng, def := k.rdb, k.prefix, k.queue, k.ctx, k.eng, k.def

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "spawn-kill", concurrency: 2})
	_, err := eng.Enqueue(ctx, def, nil, reactor.WithRunID("sk-1"))
	require.NoError(t, err)
	require.Equal(t, "spawned", first.await(ctx, rdb, prefix+":signal", 30*time.Second))
	first.kill()

	k.startWorker(t, 0)
	sw := newEagerSweeper(t, ctx, eng)
	final, err := eng.Wait(ctx, "sk-1")
	require.NoError(t, err)
	childID := reactor.SpawnID("sk-1", "notify")
	spawned, err := eng.Wait(ctx, childID)
	require.NoError(t, err)
	sw.stop()
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	require.Equal(t, reactor.StatusCompleted, spawned.Status, "%v", spawned.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, childID, got)
	assert.Equal(t, "1", rdb.HGet(ctx, prefix+":starts", "send").Val(), "the spawned run ran once")
	run, err := eng.Get(ctx, "sk-1")
	require.NoError(t, err)
	assert.Len(t, run.Spawned, 1)
}
