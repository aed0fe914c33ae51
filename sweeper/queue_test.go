package sweeper_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// A run started on a queue of its own (reactor.WithQueue) is looked for on
// that queue: its delayed start task there keeps it from being woken early,
// and once that task is lost the sweep wake-up goes to the same queue.
func TestSweepLooksForARunsTasksOnItsQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := ctxTimeout(t, 20*time.Second)
	tr := &trail{}
	other := redistest.Queue(t)
	const id = "own-queue"
	def := reactor.MustDefine("own_queue", step(tr, "a", nil))
	_, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID(id), reactor.WithQueue(other), reactor.WithDelay(time.Hour))
	require.NoError(t, err)
	start := "resume:" + id + ":start"
	info, err := e.insp.GetTaskInfo(other, start)
	require.NoError(t, err)
	require.Equal(t, asynq.TaskStateScheduled, info.State)

	e.waitStale(ctx, id)
	rep, err := e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1}, rep, "its scheduled start is found on its queue")

	require.NoError(t, e.insp.DeleteTask(other, start))
	run := e.waitStale(ctx, id)
	rep, err = e.sweeper.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.RunReport{Examined: 1, Woken: 1}, rep)
	info, err = e.insp.GetTaskInfo(other, sweepTaskID(id, run.Version))
	require.NoError(t, err, "the sweep wake-up is on the run's queue")
	require.Equal(t, asynq.TaskStatePending, info.State)
	require.Empty(t, e.queued(), "nothing on the sweeper's own queue")
	require.Empty(t, tr.all())
}
