package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/internal/version"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// busyWorkers is a real stack with two workers of one task at a time each,
// both busy: one runs run "hold-1" at its step "hold", the other element 0
// of run "fan-1"'s fan-out map "each", at the element's step "hold". Both
// steps wait for the test to end.
type busyWorkers struct {
	*realStack
	elementID string // fan-1's element run
}

func newBusyWorkers(t *testing.T) *busyWorkers {
	t.Helper()
	st := newRealStack(t, "", "-ctl")
	release := make(chan struct{})
	hold := func(ctx context.Context) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	plain := reactor.MustDefine("holder", reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) { return "", hold(ctx) },
	}))
	elem := reactor.MustDefine("fan-elem", reactor.Input[int]("item"), reactor.Step("hold", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) { return "", hold(ctx) },
	}))
	owner := reactor.MustDefine("fanner", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true}))
	require.NoError(t, st.engine.Register(plain, elem, owner))
	st.startWorker(1)
	st.startWorker(1)
	t.Cleanup(func() { close(release) }) // before the workers stop

	ctx := ctxFor(t, 30*time.Second)
	_, err := st.engine.Enqueue(ctx, plain, nil, reactor.WithRunID("hold-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := st.engine.Get(ctx, "hold-1")
		return err == nil && run.Current != nil && run.Current.Step == "hold"
	}, 20*time.Second, 10*time.Millisecond, "hold-1 runs its step")
	_, err = st.engine.Enqueue(ctx, owner, map[string]any{"items": []int{7}}, reactor.WithRunID("fan-1"))
	require.NoError(t, err)
	return &busyWorkers{realStack: st, elementID: mapstep.ElementID(mapstep.MapID("fan-1", "each"), 0)}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// workers GETs /api/workers?queue=q.
func (st *realStack) workers(t *testing.T, q string) workersView {
	t.Helper()
	res, err := http.Get(st.srv.URL + "/api/workers?queue=" + url.QueryEscape(q))
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s", b)
	var v workersView
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	return v
}

// GET /api/workers lists both workers of the queue, with their goreactor
// version, and what each runs in goreactor's terms: the run and its step,
// the element run with its owner and map.
func TestWorkersListsEachWorkerAndWhatItRuns(t *testing.T) {
	t.Parallel()
	st := newBusyWorkers(t)
	var v workersView
	// asynq lists a server's tasks on its next heartbeat (every 5 s).
	require.Eventually(t, func() bool {
		v = st.workers(t, st.queue)
		kinds := map[string]bool{}
		for _, w := range v.Workers {
			for _, t := range w.Tasks {
				kinds[t.Kind] = t.Step != ""
			}
		}
		return len(v.Workers) == 2 && kinds["run"] && kinds["element"]
	}, 20*time.Second, 100*time.Millisecond, "both workers busy: %+v", v)
	require.Len(t, v.Workers, 2, "%+v", v)
	require.Equal(t, st.queue, v.Queue)
	require.Equal(t, version.String(), v.Version)
	tasks := map[string]activeTask{}
	for _, w := range v.Workers {
		require.True(t, w.Goreactor)
		require.Equal(t, version.String(), w.Version, "from the worker's record")
		require.Equal(t, st.prefix, w.Prefix)
		require.Equal(t, []queuePriority{{Queue: st.queue, Priority: 1}}, w.Queues)
		require.Equal(t, 1, w.Concurrency)
		require.Equal(t, "active", w.Status)
		require.NotEmpty(t, w.ServerID)
		require.NotEmpty(t, w.Started)
		require.Len(t, w.Tasks, 1)
		tasks[w.Tasks[0].Kind] = w.Tasks[0]
	}
	run := tasks["run"]
	require.Equal(t, "hold-1", run.RunID)
	require.Equal(t, "holder", run.Reactor)
	require.Equal(t, "hold", run.Step)
	require.Equal(t, "running", run.Status)
	require.Equal(t, st.queue, run.Queue)
	require.NotEmpty(t, run.Started)
	require.NotEmpty(t, run.Deadline)
	el := tasks["element"]
	require.Equal(t, st.elementID, el.RunID)
	require.Equal(t, mapstep.MapID("fan-1", "each"), el.MapID)
	require.NotNil(t, el.Index)
	require.Equal(t, 0, *el.Index)
	require.Equal(t, "fan-elem", el.Reactor)
	require.Equal(t, "hold", el.Step)
	require.Equal(t, "fan-1", el.Owner)
	require.Equal(t, "each", el.MapStep)
	require.NotEqual(t, v.Workers[0].ServerID, v.Workers[1].ServerID)
}

// A server that published no record but polls the dashboard's control
// queue is a goreactor worker of an older goreactor; a task of another type
// is shown as foreign, without its payload.
func TestWorkersMarksOlderWorkersAndForeignTasks(t *testing.T) {
	t.Parallel()
	st := newRealStack(t, "", "-ctl")
	other := redistest.Queue(t)
	release := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(st.rdb, asynq.Config{Concurrency: 1,
		Queues: map[string]int{st.queue + "-ctl": 1, other: 2}, Logger: quietAsynq{}, LogLevel: asynq.ErrorLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("billing:invoice", func(ctx context.Context, _ *asynq.Task) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	require.NoError(t, srv.Start(mux))
	t.Cleanup(srv.Shutdown)
	t.Cleanup(func() { close(release) })
	_, err := asynq.NewClientFromRedisClient(st.rdb).Enqueue(asynq.NewTask("billing:invoice", []byte("secret card 4242")), asynq.Queue(other))
	require.NoError(t, err)

	var v workersView
	require.Eventually(t, func() bool {
		v = st.workers(t, other)
		return len(v.Workers) == 1 && len(v.Workers[0].Tasks) == 1
	}, 20*time.Second, 100*time.Millisecond, "the server and its task: %+v", v)
	w := v.Workers[0]
	require.True(t, w.Goreactor, "it polls the control queue")
	require.Equal(t, "unknown (before "+version.String()+")", w.Version)
	require.Empty(t, w.Prefix)
	require.Equal(t, []queuePriority{{Queue: other, Priority: 2}, {Queue: st.queue + "-ctl", Priority: 1}}, w.Queues)
	task := w.Tasks[0]
	require.Equal(t, "foreign", task.Kind)
	require.Equal(t, "billing:invoice", task.Type)
	require.Empty(t, task.RunID)

	// A queue no server polls: an empty list, never null.
	res, err := http.Get(st.srv.URL + "/api/workers?queue=" + url.QueryEscape(other+"-nobody"))
	require.NoError(t, err)
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Contains(t, string(b), `"workers":[]`)
}

// quietAsynq drops a plain asynq server's logs.
type quietAsynq struct{}

func (quietAsynq) Debug(...any) {}
func (quietAsynq) Info(...any)  {}
func (quietAsynq) Warn(...any)  {}
func (quietAsynq) Error(...any) {}
func (quietAsynq) Fatal(...any) {}
