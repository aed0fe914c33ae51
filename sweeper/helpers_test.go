package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
	"github.com/goreactor/goreactor/worker"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// env is one test's engine, asynq queue and run sweeper on the shared Redis,
// under a prefix and a queue of its own.
type env struct {
	t       *testing.T
	rdb     redis.UniversalClient
	prefix  string
	queue   string
	client  *worker.Client
	engine  *reactor.Engine
	insp    *asynq.Inspector
	sweeper *sweeper.RunSweeper
	stale   time.Duration
}

const testStaleAfter = 50 * time.Millisecond

func newEnv(t *testing.T, mod ...func(*sweeper.RunConfig)) *env {
	t.Helper()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	queue := redistest.Queue(t)
	client := worker.NewClient(rdb, queue)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{
		Client: rdb, Prefix: prefix, Enqueuer: client, Logger: discard,
		// A lost lock is noticed within a third of this.
		LockExpiry: 600 * time.Millisecond,
	})
	require.NoError(t, err)
	cfg := sweeper.RunConfig{Engine: engine, Client: rdb, Enqueuer: client, Queue: queue,
		StaleAfter: testStaleAfter, Logger: discard}
	for _, m := range mod {
		m(&cfg)
	}
	sw, err := sweeper.NewRunSweeper(cfg)
	require.NoError(t, err)
	return &env{t: t, rdb: rdb, prefix: prefix, queue: queue, client: client, engine: engine,
		insp: asynq.NewInspectorFromRedisClient(rdb), sweeper: sw, stale: cfg.WithDefaults().StaleAfter}
}

func (e *env) lockKey(id string) string { return e.prefix + ":{run:" + id + "}:lock" }
func (e *env) activeKey() string        { return e.prefix + ":idx:active" }

// sweepTaskID is the id of the wake-up a sweep enqueues for a run at version.
func sweepTaskID(id string, version int64) string {
	return fmt.Sprintf("resume:%s:sweep:%d", id, version)
}

// waitStale waits until run id and its active-index entry are older than the
// sweeper's StaleAfter, so that the next pass examines it: its UpdatedAt, and
// the server time of its last write (the state's `at`, which the sweeper
// reads, a moment after UpdatedAt) by the server's clock.
func (e *env) waitStale(ctx context.Context, id string) *reactor.Run {
	e.t.Helper()
	var run *reactor.Run
	require.Eventually(e.t, func() bool {
		var err error
		run, err = e.engine.Get(ctx, id)
		require.NoError(e.t, err)
		score, err := e.rdb.ZScore(ctx, e.activeKey(), id).Result()
		require.NoError(e.t, err)
		srv, err := e.rdb.Time(ctx).Result()
		require.NoError(e.t, err)
		at, err := e.rdb.HGet(ctx, e.prefix+":{run:"+id+"}:ctx", "at").Int64()
		if errors.Is(err, redis.Nil) {
			at = 0
		} else {
			require.NoError(e.t, err)
		}
		return time.Since(run.UpdatedAt) > e.stale && time.Since(time.UnixMilli(int64(score))) > e.stale &&
			srv.Sub(time.UnixMilli(at)) > e.stale
	}, 5*time.Second, 5*time.Millisecond)
	return run
}

// waitPast waits until the clock has passed t by the sweeper's StaleAfter.
func (e *env) waitPast(t time.Time) {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return time.Since(t) > e.stale }, 5*time.Second, 5*time.Millisecond)
}

// queued returns the ids of the queue's tasks in every state but completed.
func (e *env) queued() map[string]asynq.TaskState {
	e.t.Helper()
	out := map[string]asynq.TaskState{}
	lists := []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		e.insp.ListPendingTasks, e.insp.ListActiveTasks, e.insp.ListScheduledTasks,
		e.insp.ListRetryTasks, e.insp.ListArchivedTasks,
	}
	for _, list := range lists {
		tasks, err := list(e.queue)
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return out
		}
		require.NoError(e.t, err)
		for _, ti := range tasks {
			out[ti.ID] = ti.State
		}
	}
	return out
}

// startWorker starts a worker on the env's queue, stopped in t.Cleanup.
func (e *env) startWorker() {
	e.t.Helper()
	w := worker.New(e.engine, e.rdb, worker.Config{Queues: map[string]int{e.queue: 1}, Concurrency: 4, Logger: discard})
	require.NoError(e.t, w.Start(context.Background()))
	e.t.Cleanup(func() { require.NoError(e.t, w.Stop(context.Background())) })
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// trail records what user code ran, in order.
type trail struct {
	mu  sync.Mutex
	log []string
}

func (tr *trail) add(s string) {
	tr.mu.Lock()
	tr.log = append(tr.log, s)
	tr.mu.Unlock()
}

func (tr *trail) all() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.log)
}

// step builds a step that records "run:<name>" and then calls body, if any.
func step(tr *trail, name string, body func(ctx context.Context) error, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
		After: after,
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			tr.add("run:" + name)
			if body != nil {
				if err := body(ctx); err != nil {
					return "", err
				}
			}
			return name + "-done", nil
		},
	})
}
