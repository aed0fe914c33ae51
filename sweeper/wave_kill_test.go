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

// waveKillDefinition: three independent calls run at once (MaxConcurrency
// 3), then a step that consumes them. Each call notes its start in the
// list <prefix>:signal and counts it in the hash <prefix>:starts; in the
// first worker process every call hangs until the process is killed.
func waveKillDefinition(rdb redis.UniversalClient, prefix string, hang bool) *reactor.Definition {
	call := func(name string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				bg := context.Background()
				rdb.HIncrBy(bg, prefix+":starts", name, 1)
				rdb.RPush(bg, prefix+":signal", name)
				if hang {
					<-ctx.Done() // killed here
				}
				return name, nil
			},
			Undo: func(context.Context, reactor.Args, string) error { return nil },
		})
	}
	return reactor.MustDefine("wave-kill",
		reactor.MaxConcurrency(3),
		call("reserve"), call("authorize"), call("score"),
		reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"r": reactor.FromStep("reserve"), "a": reactor.FromStep("authorize"), "s": reactor.FromStep("score")},
			Run: func(context.Context, reactor.Args) (string, error) {
				rdb.HIncrBy(context.Background(), prefix+":starts", "confirm", 1)
				return "confirmed", nil
			},
		}),
	)
}

// A worker process killed (SIGKILL) with a wave of three steps in flight:
// none is lost. The sweeper recovers the run on a worker of this process,
// which runs each of the three again as a step cut short (at least once:
// each ran twice, never more), then the step that consumes them, and the
// run completes.
func TestWaveInFlightSurvivesAWorkerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	k := newKillEnv(t, 60*time.Second, func(rdb redis.UniversalClient, prefix string) *reactor.Definition {
		return waveKillDefinition(rdb, prefix, false)
	})
	rdb, prefix, queue, ctx, eng, def := k.rdb, k.prefix, k.queue, k.ctx, k.eng, k.def

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "wave-kill", concurrency: 2})
	_, err := eng.Enqueue(ctx, def, nil, reactor.WithRunID("wk-1"))
	require.NoError(t, err)
	got := map[string]bool{}
	for range 3 {
		got[first.await(ctx, rdb, prefix+":signal", 30*time.Second)] = true
	}
	require.Equal(t, map[string]bool{"reserve": true, "authorize": true, "score": true}, got, "three calls in flight at once")
	first.kill()

	k.startWorker(t, 0)
	sw := newEagerSweeper(t, ctx, eng)
	final, err := eng.Wait(ctx, "wk-1")
	require.NoError(t, err)
	sw.stop()
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	assert.Equal(t, map[string]string{"reserve": "2", "authorize": "2", "score": "2", "confirm": "1"},
		rdb.HGetAll(ctx, prefix+":starts").Val(), "each call in flight at the kill ran once more; the consumer once")
}
