package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
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

// The workers story in Chromium: from the overview's nav to the Workers
// page, where the queue's two workers are listed with their version and
// what each runs (the run at its step, the element with its owner), the
// run links open the run's page, the page holds at 390 px, and a queue no
// worker polls says how to start one.
func TestBrowserWorkersStory(t *testing.T) {
	t.Parallel()
	bctx := newBrowser(t)
	st := newBusyWorkers(t)
	ctx, cancel := context.WithTimeout(bctx, 90*time.Second)
	defer cancel()
	console := watchConsole(t, ctx)
	poll := pollUntil(t, ctx)
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	eval := func(what, js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, what)
		return v
	}
	shots := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		shots = d
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, name)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name), png, 0o644))
	}
	cspClean := func(where string) {
		t.Helper()
		require.Equal(t, "[]", eval("read the policy violations", `JSON.stringify(window.__csp || ['no recorder'])`), "%s: the CSP blocked something", where)
	}

	// The nav leads to the page, which lists every server on the Redis
	// (other tests' too): at least this test's two.
	do("open the overview", chromedp.Navigate(st.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("nav-workers")))
	do("follow the nav", chromedp.Click(chromedp.ID("nav-workers")), chromedp.WaitVisible(chromedp.CSS(`body[data-page="workers"] #workers`)))
	poll("the workers page lists servers", `document.body.dataset.page === 'workers' &&
		document.querySelectorAll('#workers .worker-card').length >= 2`)

	// Filtered to the queue: exactly the two, each running one task, as
	// asynq lists them on its next heartbeat.
	do("open the queue's workers", chromedp.Navigate(st.srv.URL+"/workers?queue="+url.QueryEscape(st.queue)))
	poll("both workers show what they run", `(() => {
		const cards = [...document.querySelectorAll('#workers .worker-card')];
		return cards.length === 2 && cards.every(c => c.querySelectorAll('.worker-task').length === 1 &&
			c.querySelector('.task-step') !== null);
	})()`)
	require.Contains(t, eval("the filter line", `document.getElementById('workers-filter').textContent`), st.queue)
	cards := eval("read the cards", `JSON.stringify([...document.querySelectorAll('#workers .worker-card')].map(c => ({
		name: c.querySelector('.worker-name').textContent,
		version: c.querySelector('.worker-version').textContent,
		queues: c.querySelector('.worker-queues').textContent,
		busy: c.querySelector('.worker-busy').textContent,
		kind: c.querySelector('.worker-task').dataset.kind,
		run: c.querySelector('.worker-task').dataset.run,
		links: [...c.querySelectorAll('.worker-task a')].map(a => a.textContent),
		step: c.querySelector('.task-step').textContent,
	})))`)
	var got []struct {
		Name, Version, Queues, Busy, Kind, Run, Step string
		Links                                        []string
	}
	require.NoError(t, json.Unmarshal([]byte(cards), &got), cards)
	host, _ := os.Hostname()
	byKind := map[string]int{}
	for i, c := range got {
		require.Equal(t, host+":"+strconv.Itoa(os.Getpid()), c.Name)
		require.Equal(t, "goreactor "+version.String(), c.Version)
		require.Equal(t, "queues "+st.queue+" (1)", c.Queues)
		require.Equal(t, "1 / 1 busy", c.Busy)
		require.Equal(t, "step hold", c.Step)
		byKind[c.Kind] = i
	}
	require.Len(t, byKind, 2, cards)
	run, el := got[byKind["run"]], got[byKind["element"]]
	require.Equal(t, "hold-1", run.Run)
	require.Equal(t, []string{"hold-1"}, run.Links)
	require.Equal(t, st.elementID, el.Run)
	require.Equal(t, []string{st.elementID, "fan-1"}, el.Links, "the element and its owner")
	shot("workers.png")
	cspClean("workers")

	// A run link opens the run's page.
	do("open the run", chromedp.Click(chromedp.CSS(`.worker-task[data-kind="run"] a`)),
		chromedp.WaitVisible(chromedp.CSS(`body[data-page="run"] #run[data-run-id="hold-1"]`)))
	poll("the run page shows hold-1 running", `document.body.dataset.page === 'run' && document.querySelector('#run').dataset.runId === 'hold-1'`)

	// 390 px wide: the nav link stays, nothing runs off the side.
	do("narrow the window", chromedp.EmulateViewport(390, 844),
		chromedp.Navigate(st.srv.URL+"/workers?queue="+url.QueryEscape(st.queue)))
	poll("the cards are drawn", `document.querySelectorAll('#workers .worker-task').length === 2`)
	require.Equal(t, "true", eval("the nav link is visible", `String(document.getElementById('nav-workers').getBoundingClientRect().width > 0)`))
	require.Equal(t, "true", eval("no horizontal overflow", `String(document.documentElement.scrollWidth <= 390)`),
		"page width %s", eval("width", `String(document.documentElement.scrollWidth)`))
	shot("workers-390.png")

	// A queue no worker polls: the empty state says how to start one.
	do("open an unserved queue", chromedp.Navigate(st.srv.URL+"/workers?queue="+url.QueryEscape(st.queue+"-none")))
	poll("the empty state", `!document.getElementById('workers-empty').hidden`)
	require.Equal(t, "No worker polls queue "+st.queue+"-none: start cmd/worker -queue "+st.queue+"-none (or GOREACTOR_QUEUE="+st.queue+"-none) against this Redis.",
		eval("the empty text", `document.getElementById('workers-empty').textContent`))
	do("wide again", chromedp.EmulateViewport(1366, 768))
	cspClean("empty")
	console.check(t)
}
