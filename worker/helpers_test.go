package worker_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixture is one test's Redis key prefix and asynq queue, with a Client
// enqueuing on that queue and an Inspector to look at its tasks. Engines made
// by one fixture share the prefix, as the processes of one deployment do.
type fixture struct {
	t         *testing.T
	rdb       redis.UniversalClient
	prefix    string
	queue     string
	client    *worker.Client
	inspector *asynq.Inspector
	events    *recorder
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	rdb := redistest.Client(t)
	queue := redistest.Queue(t)
	return &fixture{
		t:         t,
		rdb:       rdb,
		prefix:    redistest.Prefix(t),
		queue:     queue,
		client:    worker.NewClient(rdb, queue),
		inspector: asynq.NewInspectorFromRedisClient(rdb),
		events:    &recorder{},
	}
}

// engine returns an engine on the fixture's prefix that hands runs to the
// fixture's queue; its events are recorded under name.
func (f *fixture) engine(name string, mod ...func(*reactor.Config)) *reactor.Engine {
	f.t.Helper()
	cfg := reactor.Config{
		Client:   f.rdb,
		Prefix:   f.prefix,
		Logger:   discard,
		Enqueuer: f.client,
		Hooks:    []reactor.Hook{f.events.hook(name)},
	}
	for _, m := range mod {
		m(&cfg)
	}
	e, err := reactor.NewEngine(context.Background(), cfg)
	require.NoError(f.t, err)
	return e
}

// newWorker returns a worker for e on the fixture's queue, stopped in
// t.Cleanup (after which asynq's goroutines are gone, for goleak).
func (f *fixture) newWorker(e *reactor.Engine, mod ...func(*worker.Config)) *worker.Worker {
	f.t.Helper()
	cfg := worker.Config{
		Queues:          map[string]int{f.queue: 1},
		ShutdownTimeout: 5 * time.Second,
		Logger:          discard,
	}
	for _, m := range mod {
		m(&cfg)
	}
	w := worker.New(e, f.rdb, cfg)
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := w.Stop(ctx); err != nil {
			f.t.Errorf("worker stop: %v", err)
		}
	})
	return w
}

// startWorker is newWorker, started.
func (f *fixture) startWorker(e *reactor.Engine, mod ...func(*worker.Config)) *worker.Worker {
	f.t.Helper()
	w := f.newWorker(e, mod...)
	require.NoError(f.t, w.Start(context.Background()))
	return w
}

// taskInfo returns the task's info, or nil when asynq no longer has it (a
// task that succeeded is deleted). It is safe off the test's goroutine.
func (f *fixture) taskInfo(id string) (*asynq.TaskInfo, error) {
	info, err := f.inspector.GetTaskInfo(f.queue, id)
	if errors.Is(err, asynq.ErrTaskNotFound) {
		return nil, nil
	}
	return info, err
}

// awaitTaskState waits until the task is in state and returns its info.
func (f *fixture) awaitTaskState(id string, state asynq.TaskState) *asynq.TaskInfo {
	f.t.Helper()
	var info *asynq.TaskInfo
	require.EventuallyWithT(f.t, func(c *assert.CollectT) {
		got, err := f.taskInfo(id)
		require.NoError(c, err)
		require.NotNil(c, got, "task %s is not in asynq", id)
		require.Equal(c, state, got.State, "task %s: last error %q", id, got.LastErr)
		info = got
	}, 5*time.Second, 2*time.Millisecond)
	return info
}

// awaitTaskGone waits until asynq has deleted the task (its handler
// succeeded).
func (f *fixture) awaitTaskGone(id string) {
	f.t.Helper()
	require.Eventually(f.t, func() bool {
		info, err := f.taskInfo(id)
		return err == nil && info == nil
	}, 5*time.Second, 2*time.Millisecond, "task %s is still in asynq", id)
}

func startTask(runID string) string { return "resume:" + runID + ":start" }

// recorder collects events from several engines, tagged by engine.
type recorder struct {
	mu     sync.Mutex
	events []tagged
}

type tagged struct {
	engine string
	ev     reactor.Event
}

func (r *recorder) hook(engine string) reactor.Hook {
	return reactor.HookFunc(func(_ context.Context, ev reactor.Event) {
		r.mu.Lock()
		r.events = append(r.events, tagged{engine, ev})
		r.mu.Unlock()
	})
}

// steps lists, in order, the steps for which engine emitted kind.
func (r *recorder) steps(engine string, kind reactor.EventKind) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		if e.engine == engine && e.ev.Kind == kind {
			out = append(out, e.ev.Step)
		}
	}
	return out
}

// ran reports whether any engine emitted kind for run id.
func (r *recorder) ran(id string, kind reactor.EventKind) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.events {
		if e.ev.RunID == id && e.ev.Kind == kind {
			return true
		}
	}
	return false
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

// step builds a step that records "run:name" and, with an undo,
// "undo:name"; fail makes its Run return fail.
func step(tr *trail, name string, fail error, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
		After: after,
		Run: func(context.Context, reactor.Args) (string, error) {
			tr.add("run:" + name)
			if fail != nil {
				return "", fail
			}
			return name + "-done", nil
		},
		Undo: func(context.Context, reactor.Args, string) error {
			tr.add("undo:" + name)
			return nil
		},
	})
}

// counted is a one-step definition returning how many times its step ran.
func counted(name string, runs *atomic.Int32) *reactor.Definition {
	return reactor.MustDefine(name,
		reactor.Step("count", reactor.StepConfig[reactor.Args, int32]{
			Run: func(context.Context, reactor.Args) (int32, error) { return runs.Add(1), nil },
		}),
		reactor.Returns(reactor.FromStep("count")),
	)
}

func ctxTimeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// mapThenDecline is an owner that holds something undoable, fans element out
// over its items, then fails: the map rolls back the way it ran.
func mapThenDecline(name string, element *reactor.Definition) *reactor.Definition {
	return mapThenDeclineBatch(name, element, 0)
}

// mapThenDeclineBatch is mapThenDecline with the map's batch size (0: the
// default).
func mapThenDeclineBatch(name string, element *reactor.Definition, batch int) *reactor.Definition {
	return reactor.MustDefine(name,
		reactor.Input[[]int]("items", reactor.Required()),
		reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
			Run:  func(context.Context, reactor.Args) (string, error) { return "held", nil },
			Undo: func(context.Context, reactor.Args, string) error { return nil },
		}),
		mapstep.Map("each", mapstep.Config{Element: element, Items: reactor.FromInput("items"), FanOut: true, BatchSize: batch,
			After: []string{"hold"}}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("declined"))
			},
		}),
	)
}
