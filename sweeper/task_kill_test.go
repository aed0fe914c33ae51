package sweeper_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// taskKillDefinition: a step that runs as its own task (StepConfig.Task),
// then a step that consumes it. The task step notes its start in the list
// <prefix>:signal and counts it in the hash <prefix>:starts; in the first
// worker process it hangs until the process is killed.
func taskKillDefinition(rdb redis.UniversalClient, prefix string, hang bool) *reactor.Definition {
	return reactor.MustDefine("task-kill",
		reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				bg := context.Background()
				rdb.HIncrBy(bg, prefix+":starts", "label", 1)
				id, _ := asynq.GetTaskID(ctx)
				rdb.RPush(bg, prefix+":ids", id)
				rdb.RPush(bg, prefix+":signal", "label")
				if hang {
					<-ctx.Done() // killed here
				}
				return "label-1", nil
			},
		}),
		reactor.Step("confirm", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"l": reactor.FromStep("label")},
			Run: func(_ context.Context, a reactor.Args) (string, error) {
				rdb.HIncrBy(context.Background(), prefix+":starts", "confirm", 1)
				return reactor.Arg[string](a, "l")
			},
		}),
		reactor.Returns(reactor.FromStep("confirm")),
	)
}

// A worker process killed (SIGKILL) while a step that runs as its own task
// is in flight: the step is not lost. Its lease lapses, the sweeper wakes
// the parked run, which enqueues the attempt again under a fresh task id
// (the dead worker's is spent), and a worker of this process runs it once
// more; then the consumer runs once and the run completes.
func TestTaskStepInFlightSurvivesAWorkerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("kills a worker process")
	}
	t.Parallel()
	k := newKillEnv(t, 60*time.Second, func(rdb redis.UniversalClient, prefix string) *reactor.Definition {
		return taskKillDefinition(rdb, prefix, false)
	})
	rdb, prefix, queue, ctx, eng, def := k.rdb, k.prefix, k.queue, k.ctx, k.eng, k.def

	first := startWorkerProcess(t, prefix, queue, workerSpec{set: "task-kill", concurrency: 2})
	_, err := eng.Enqueue(ctx, def, nil, reactor.WithRunID("tk-1"))
	require.NoError(t, err)
	require.Equal(t, "label", first.await(ctx, rdb, prefix+":signal", 30*time.Second))
	first.kill()

	k.startWorker(t, 0)
	sw := newEagerSweeper(t, ctx, eng)
	final, err := eng.Wait(ctx, "tk-1")
	require.NoError(t, err)
	sw.stop()
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "label-1", got)
	assert.Equal(t, map[string]string{"label": "2", "confirm": "1"}, rdb.HGetAll(ctx, prefix+":starts").Val(),
		"the step in flight at the kill ran once more; the consumer once")
	ids := rdb.LRange(ctx, prefix+":ids", 0, -1).Val()
	require.Len(t, ids, 2)
	assert.Equal(t, ids[0]+":r1", ids[1], "redelivered under a fresh id, not left to asynq's recovery of the spent one")
	tasks, err := eng.StepTasks(ctx, "tk-1")
	require.NoError(t, err)
	attempts := tasks["label"]
	require.Len(t, attempts, 2, "the killed delivery and the one that finished")
	assert.Zero(t, attempts[0].EndedAt, "the killed one never ended")
	assert.NotZero(t, attempts[1].EndedAt)
	assert.Equal(t, 1, attempts[1].Attempt, "an interrupted attempt runs again as itself")
	assert.NotEqual(t, attempts[0].Worker, attempts[1].Worker, "the killed process and this one")
}

// A run parked on a task step whose attempt a worker runs (its lease live)
// is not woken by the run sweeper, however long the step takes: the
// attempt resumes it. Once the step has its outcome, the run completes.
func TestSweeperLeavesARunWhoseTaskStepRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	running, release := make(chan struct{}), make(chan struct{})
	def := reactor.MustDefine("long-task",
		reactor.Step("render", reactor.StepConfig[reactor.Args, string]{
			Task: true,
			Run: func(context.Context, reactor.Args) (string, error) {
				close(running)
				<-release
				return "rendered", nil
			},
		}))
	require.NoError(t, e.engine.Register(def))
	e.startWorker()
	res, err := e.engine.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	<-running
	e.waitStale(ctx, res.RunID)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Examined)
	assert.Zero(t, rep.Woken, "its task step's attempt holds the lease")
	close(release)
	final, err := e.engine.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

// A run whose start task a worker has just taken (active) but whose lock
// that worker has not taken yet is not woken: the worker takes the lock a
// moment later. A run whose start task stays active with the lock free is
// woken: its worker is gone.
func TestSweeperWaitsForAJustTakenWakeUpToTakeItsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 30*time.Second)
	def := reactor.MustDefine("taken-start", reactor.Step("only", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "ok", nil },
	}))
	require.NoError(t, e.engine.Register(def))
	qkey := func(suffix string) string { return "asynq:{" + e.queue + "}:" + suffix }
	// take moves run id's start task to active, as asynq's dequeue does
	// when a worker takes it.
	take := func(id string) {
		start := "resume:" + id + ":start"
		require.EqualValues(t, 1, e.rdb.LRem(ctx, qkey("pending"), 0, start).Val())
		_, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.LPush(ctx, qkey("active"), start)
			p.HSet(ctx, qkey("t:"+start), "state", "active")
			p.HDel(ctx, qkey("t:"+start), "pending_since")
			p.ZAdd(ctx, qkey("lease"), redis.Z{Score: float64(time.Now().Add(30 * time.Second).Unix()), Member: start})
			return nil
		})
		require.NoError(t, err)
	}

	res, err := e.engine.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	take(res.RunID)
	e.waitStale(ctx, res.RunID)
	// Its worker takes the run's lock while the pass looks.
	var sweeping sync.WaitGroup
	sweeping.Go(func() {
		time.Sleep(50 * time.Millisecond) // the worker's moment between the task and the lock
		e.rdb.Set(ctx, e.lockKey(res.RunID), "worker", time.Minute)
	})
	rep, err := e.sweeper.Sweep(ctx)
	sweeping.Wait()
	require.NoError(t, err)
	assert.Equal(t, sweeper.RunReport{Examined: 1}, rep, "its worker took the lock")

	gone, err := e.engine.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	take(gone.RunID)
	run := e.waitStale(ctx, gone.RunID)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, rep.Woken, "%+v: the worker that took its task is gone", rep)
	assert.Contains(t, e.queued(), sweepTaskID(gone.RunID, run.Version))
}
