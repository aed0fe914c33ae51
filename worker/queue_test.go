package worker_test

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// A worker whose Config.Queues leaves out the queue its engine's Client
// enqueues on is refused at Start, naming both sides and the fix.
func TestStartRefusesQueuesWithoutTheClientsQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.newWorker(f.engine("worker"), func(c *worker.Config) { c.Queues = map[string]int{"other": 1, "more": 2} })
	err := w.Start(t.Context())
	var mismatch *worker.QueueMismatchError
	require.ErrorAs(t, err, &mismatch)
	require.Equal(t, f.queue, mismatch.Enqueues)
	require.Equal(t, []string{"more", "other"}, mismatch.Serves)
	require.ErrorContains(t, err, "add \""+f.queue+"\" to Config.Queues")

	// A zero priority does not serve the queue either (asynq ignores it).
	w = f.newWorker(f.engine("worker"), func(c *worker.Config) { c.Queues = map[string]int{f.queue: 0, "other": 1} })
	require.ErrorAs(t, w.Start(t.Context()), &mismatch)
}

// A worker with no Config.Queues serves its engine's Client's queue, not
// DefaultQueue: the client and the worker take the queue from one place.
func TestNewServesTheClientsQueueByDefault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var runs atomic.Int32
	def := counted("counted", &runs)
	wk := f.engine("worker")
	require.NoError(t, wk.Register(def))
	f.startWorker(wk, func(c *worker.Config) { c.Queues = nil })

	ctx := ctxTimeout(t)
	api := f.engine("api")
	res, err := api.Enqueue(ctx, def, nil)
	require.NoError(t, err)
	res, err = api.Wait(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, res.Status)
	require.Equal(t, int32(1), runs.Load())
	run, err := api.Get(ctx, res.RunID)
	require.NoError(t, err)
	require.Equal(t, f.queue, run.Queue, "the run records the queue it was enqueued on, not \"\"")
}

// Without a queue of their own, the Client, a Worker whose engine has no
// Client, and a Controller take the first queue GOREACTOR_QUEUE names, and
// the Controller the prefix GOREACTOR_PREFIX names; what a program sets
// explicitly wins.
func TestDefaultsFromTheEnvironment(t *testing.T) {
	t.Setenv("GOREACTOR_QUEUE", "critical:6, goreactor:3")
	t.Setenv("GOREACTOR_PREFIX", "shop")
	rdb := redistest.Client(t)
	require.Equal(t, "critical", worker.NewClient(rdb, "").Queue())
	require.Equal(t, "mine", worker.NewClient(rdb, "mine").Queue(), "explicit wins")
	require.Equal(t, map[string]int{"critical": 1}, worker.Config{}.WithDefaults().Queues)
	ctl := worker.ControllerConfig{}.WithDefaults()
	require.Equal(t, "critical", ctl.Queue)
	require.Equal(t, "shop", ctl.Prefix)
	ctl = worker.ControllerConfig{Queue: "q", Prefix: "p"}.WithDefaults()
	require.Equal(t, "q", ctl.Queue)
	require.Equal(t, "p", ctl.Prefix)

	t.Setenv("GOREACTOR_QUEUE", "")
	t.Setenv("GOREACTOR_PREFIX", "")
	require.Equal(t, worker.DefaultQueue, worker.NewClient(rdb, "").Queue())
	require.Equal(t, "goreactor", worker.ControllerConfig{}.WithDefaults().Prefix)
}
