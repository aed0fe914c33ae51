package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// stallAfter is the tests' Config.StallAfter: short, so that a run stalls
// within the test.
const stallAfter = 300 * time.Millisecond

// newStallEnv is newEnv with a short StallAfter, and no caching of the
// stall examination or the server registry; the dashboard's control queue
// is the worker's queue, as in a deployment where the workers and the
// dashboard share GOREACTOR_QUEUE (the sweeper's recovery enqueues there).
func newStallEnv(t *testing.T, token string) *env {
	t.Helper()
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix,
		Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	dash, err := dashboard.New(dashboard.Config{Client: rdb, Prefix: prefix, Token: token, Queues: []string{queue},
		ControlQueue: queue, StallAfter: stallAfter, Logger: discard})
	require.NoError(t, err)
	dashboard.ForgetStalls(dash, time.Millisecond)
	dashboard.ForgetServed(dash, time.Millisecond)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	return &env{t: t, rdb: rdb, prefix: prefix, queue: queue, ctl: queue, engine: engine, dash: dash, srv: srv}
}

type stall struct {
	RunID        string   `json:"run_id"`
	Reactor      string   `json:"reactor"`
	Status       string   `json:"status"`
	ProgressAt   string   `json:"progress_at"`
	IdleMS       int64    `json:"idle_ms"`
	Queue        string   `json:"queue"`
	QueueDefault bool     `json:"queue_default"`
	Kind         string   `json:"kind"`
	Why          string   `json:"why"`
	Details      []string `json:"details"`
	Stalled      bool     `json:"stalled"`
}

type stallsPage struct {
	StallAfterMS int64          `json:"stall_after_ms"`
	Stalled      int            `json:"stalled"`
	Waiting      int            `json:"waiting_for_person"`
	ByKind       map[string]int `json:"by_kind"`
	Active       int64          `json:"active"`
	Examined     int            `json:"examined"`
	Truncated    bool           `json:"truncated"`
	Runs         []stall        `json:"runs"`
}

func (p stallsPage) find(id string) *stall {
	for i := range p.Runs {
		if p.Runs[i].RunID == id {
			return &p.Runs[i]
		}
	}
	return nil
}

// waitStall polls /api/stalls until run id is listed with kind.
func (e *env) waitStall(id, kind string) stall {
	e.t.Helper()
	var last stallsPage
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		last = stallsPage{}
		e.get("/api/stalls", http.StatusOK, &last)
		if s := last.find(id); s != nil && s.Kind == kind {
			return *s
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("run %s not listed as a %s stall: %+v", id, kind, last)
	return stall{}
}

func quickDef(name string) *reactor.Definition {
	return reactor.MustDefine(name, reactor.Step("only", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "ok", nil },
	}))
}

// A run whose queue no worker serves is stalled, with that reason and
// what waits there; one that a worker executes (its lock held) is not; a
// live run waiting for a person is listed as such, not counted stalled.
// The gauge says the same.
func TestStallsSayWhy(t *testing.T) {
	t.Parallel()
	e := newStallEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	unserved := quickDef("stall-unserved")
	_, err := e.engine.Enqueue(ctx, unserved, nil, reactor.WithRunID("nobody-1"))
	require.NoError(t, err)
	s := e.waitStall("nobody-1", "no_worker")
	require.True(t, s.Stalled)
	require.Equal(t, e.queue, s.Queue)
	require.False(t, s.QueueDefault)
	require.Equal(t, "pending", s.Status)
	require.Contains(t, s.Why, `no worker serves queue "`+e.queue+`"`)
	require.Contains(t, s.Why, "1 task pending on it, the oldest for")
	require.GreaterOrEqual(t, s.IdleMS, stallAfter.Milliseconds())

	// A person's turn: seeded as the engine indexes a conflicted undo.
	_, err = e.engine.Enqueue(ctx, unserved, nil, reactor.WithRunID("person-1"))
	require.NoError(t, err)
	require.NoError(t, e.rdb.ZAdd(ctx, keys.New(e.prefix).NeedsHuman(), redis.Z{Score: 1, Member: "person-1"}).Err())
	p := e.waitStall("person-1", "waiting_for_person")
	require.False(t, p.Stalled)
	require.Contains(t, p.Why, "waiting for a person")
	require.Contains(t, strings.Join(p.Details, "\n"), "no worker serves queue", "the other causes are listed too")

	var page stallsPage
	e.get("/api/stalls", http.StatusOK, &page)
	require.Equal(t, 1, page.Stalled)
	require.Equal(t, 1, page.Waiting)
	require.Equal(t, stallAfter.Milliseconds(), page.StallAfterMS)
	require.Equal(t, map[string]int{"no_worker": 1, "waiting_for_person": 1}, page.ByKind)
	var only stallsPage
	e.get("/api/stalls?kind=waiting_for_person", http.StatusOK, &only)
	require.Len(t, only.Runs, 1)
	require.Equal(t, "person-1", only.Runs[0].RunID)
	e.get("/api/stalls?kind=bogus", http.StatusBadRequest, nil)

	metrics := e.do(http.MethodGet, "/metrics", "", "")
	require.Equal(t, http.StatusOK, metrics.code)
	require.Contains(t, string(metrics.body), `goreactor_dashboard_stalled_runs{kind="no_worker"} 1`)
	require.Contains(t, string(metrics.body), `goreactor_dashboard_stalled_runs{kind="waiting_for_person"} 1`)
	require.Contains(t, string(metrics.body), `goreactor_dashboard_stalled_runs{kind="lost"} 0`)

	// A worker executes a long step: its lock is held, so it is not
	// stalled however long the step takes. The worker serves the queue
	// now, so nobody-1 runs and leaves the list.
	started, release := make(chan struct{}), make(chan struct{})
	long := reactor.MustDefine("stall-long", reactor.Step("wait", reactor.StepConfig[reactor.Args, string]{
		Run: func(ctx context.Context, _ reactor.Args) (string, error) {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
			return "done", nil
		},
	}))
	e.startWorker(unserved, long)
	_, err = e.engine.Enqueue(ctx, long, nil, reactor.WithRunID("long-1"))
	require.NoError(t, err)
	<-started
	_, err = e.engine.Wait(ctx, "nobody-1")
	require.NoError(t, err)
	time.Sleep(2 * stallAfter)
	page = stallsPage{}
	e.get("/api/stalls", http.StatusOK, &page)
	require.Nil(t, page.find("long-1"), "a run its worker holds is not stalled: %+v", page)
	require.Nil(t, page.find("nobody-1"), "a finished run is not stalled")
	var d struct {
		Stall   *stall `json:"stall"`
		Actions map[string]struct {
			Allowed bool   `json:"allowed"`
			Reason  string `json:"reason"`
		} `json:"actions"`
	}
	e.get("/api/runs/long-1", http.StatusOK, &d)
	require.Nil(t, d.Stall)
	require.False(t, d.Actions["redispatch"].Allowed)
	require.Contains(t, d.Actions["redispatch"].Reason, "not stalled")
	close(release)
	_, err = e.engine.Wait(ctx, "long-1")
	require.NoError(t, err)
}

// A run that recorded no queue shows the effective one, the control queue,
// marked as the default, instead of a blank.
func TestRunDetailShowsTheDefaultQueue(t *testing.T) {
	t.Parallel()
	e := newStallEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	def := quickDef("inproc")
	// An engine without an Enqueuer: its in-process runs record no queue.
	local, err := reactor.NewEngine(ctx, reactor.Config{Client: e.rdb, Prefix: e.prefix, Logger: discard})
	require.NoError(t, err)
	require.NoError(t, local.Register(def))
	_, err = local.Run(ctx, def, nil, reactor.WithRunID("inproc-1"))
	require.NoError(t, err)
	var d struct {
		Queue        string `json:"queue"`
		QueueDefault bool   `json:"queue_default"`
	}
	e.get("/api/runs/inproc-1", http.StatusOK, &d)
	require.Equal(t, e.ctl, d.Queue)
	require.True(t, d.QueueDefault)
}

type redispatched struct {
	RunID      string `json:"run_id"`
	Action     string `json:"action"`
	Stall      stall  `json:"stall"`
	Dispatched struct {
		Run, Elements, Rollbacks, Claims, Resumes int
	} `json:"dispatched"`
	Total   int    `json:"total"`
	Queue   string `json:"queue"`
	Warning string `json:"warning"`
	Note    string `json:"note"`
}

func (e *env) redispatch(id, token string) (int, redispatched, string) {
	e.t.Helper()
	res := e.do(http.MethodPost, "/api/runs/"+id+"/redispatch", token, `{"reason": "stalled, see ticket 25"}`)
	var out redispatched
	if res.code == http.StatusAccepted {
		require.NoError(e.t, json.Unmarshal(res.body, &out), "%s", res.body)
	}
	return res.code, out, string(res.body)
}

// A run whose task was lost (deleted from its queue) is stalled as lost
// once a worker serves the queue; re-dispatch wakes it and the worker
// finishes it. The request is in the run's audit with the reason.
// Re-dispatch is refused for a finished run, and without a token.
func TestRedispatchWakesALostRun(t *testing.T) {
	t.Parallel()
	const token = "stall-token-0123456789"
	e := newStallEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	def := quickDef("lost-run")
	_, err := e.engine.Enqueue(ctx, def, nil, reactor.WithRunID("lost-1"))
	require.NoError(t, err)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	n, err := insp.DeleteAllPendingTasks(e.queue)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	e.startWorker(def)
	s := e.waitStall("lost-1", "lost")
	require.Contains(t, s.Why, "its tasks were lost")

	code, _, body := e.redispatch("lost-1", "")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, out, body := e.redispatch("lost-1", token)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Equal(t, 1, out.Dispatched.Run)
	require.Equal(t, 1, out.Total)
	require.Equal(t, "lost", out.Stall.Kind)
	require.Empty(t, out.Warning)
	run, err := e.engine.Wait(ctx, "lost-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status)
	audit, err := e.engine.Audit(ctx, "lost-1")
	require.NoError(t, err)
	var noted bool
	for _, ev := range audit {
		if ev.Request == "redispatch" && ev.Note == "stalled, see ticket 25" {
			noted = true
		}
	}
	require.True(t, noted, "the re-dispatch is in the audit: %+v", audit)

	code, _, body = e.redispatch("lost-1", token)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "completed")
	code, _, body = e.redispatch("nope-1", token)
	require.Equal(t, http.StatusNotFound, code, body)
}

// A run that progresses is not re-dispatched: 409 with why.
func TestRedispatchRefusesARunThatIsNotStalled(t *testing.T) {
	t.Parallel()
	const token = "stall-token-0123456789"
	e := newStallEnv(t, token)
	ctx := ctxTimeout(t, 30*time.Second)
	_, err := e.engine.Enqueue(ctx, quickDef("fresh"), nil, reactor.WithRunID("fresh-1"))
	require.NoError(t, err)
	code, _, body := e.redispatch("fresh-1", token)
	require.Equal(t, http.StatusConflict, code, body)
	require.Contains(t, body, "is not stalled")
}

// The defect behind the stalls: a fan-out map's rollback whose queue lost
// its worker, and its tasks with it. The dashboard says it stalled (no
// worker serves its queue); a worker starting is not enough, as the
// rollback jobs are gone (it stalls again, as lost); re-dispatch
// re-enqueues them and the worker completes the rollback.
func TestRedispatchCompletesALostRollback(t *testing.T) {
	t.Parallel()
	const token = "stall-token-0123456789"
	e := newStallEnv(t, token)
	ctx := ctxTimeout(t, 90*time.Second)
	owner, elem, hold := stuckRollbackDefs("rb-stuck")
	e.startWorker(owner, elem)
	items := make([]int, 30)
	for i := range items {
		items[i] = i
	}
	_, err := e.engine.Enqueue(ctx, owner, map[string]any{"items": items}, reactor.WithRunID("rbs-1"))
	require.NoError(t, err)
	hold.waitHeld(t, ctx)
	// The worker goes away mid-rollback, and its queued tasks are lost.
	e.stopWorkers()
	dashboard.ForgetServed(e.dash, time.Millisecond)
	dropTasks(t, e.rdb, e.queue)
	run, err := e.engine.Get(ctx, "rbs-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusRollingBack, run.Status)
	s := e.waitStall("rbs-1", "no_worker")
	require.Equal(t, "rolling_back", s.Status)
	require.Contains(t, s.Why, `no worker serves queue "`+e.queue+`"`)

	hold.open()
	e.serve(map[string]int{e.queue: 1}, owner, elem)
	s = e.waitStall("rbs-1", "lost")
	require.Equal(t, "rolling_back", s.Status)

	code, out, body := e.redispatch("rbs-1", token)
	require.Equal(t, http.StatusAccepted, code, body)
	require.Positive(t, out.Dispatched.Rollbacks, "%+v", out)
	final, err := e.engine.Wait(ctx, "rbs-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	var page stallsPage
	e.get("/api/stalls", http.StatusOK, &page)
	require.Nil(t, page.find("rbs-1"))
}

// rollbackHold holds a map's element undos until opened, and says when
// one is held.
type rollbackHold struct {
	held    chan struct{}
	release chan struct{}
}

func (h *rollbackHold) open() { close(h.release) }

func (h *rollbackHold) waitHeld(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-h.held:
	case <-ctx.Done():
		t.Fatal("no element undo started")
	}
}

// stuckRollbackDefs is an owner whose fan-out map (batches of 5) rolls back
// after its last step fails; the element undos wait on the hold (a worker
// stopping meanwhile interrupts them).
func stuckRollbackDefs(name string) (owner, elem *reactor.Definition, hold *rollbackHold) {
	hold = &rollbackHold{held: make(chan struct{}, 1000), release: make(chan struct{})}
	elem = reactor.MustDefine(name+"-elem", reactor.Input[int]("item"), reactor.Step("reserve", reactor.StepConfig[realItemT, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run:  func(_ context.Context, in realItemT) (int, error) { return in.Item, nil },
		Undo: func(ctx context.Context, _ realItemT, _ int) error {
			select {
			case hold.held <- struct{}{}:
			default:
			}
			select {
			case <-hold.release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	}))
	owner = reactor.MustDefine(name, reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 5}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("card declined"))
			},
		}))
	return owner, elem, hold
}

type realItemT struct {
	Item int `json:"item"`
}

// dropTasks deletes every task waiting on queue: what a lost queue (a
// flushed or failed-over Redis) leaves.
func dropTasks(t *testing.T, rdb redis.UniversalClient, queue string) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for _, del := range []func(string) (int, error){insp.DeleteAllPendingTasks, insp.DeleteAllScheduledTasks, insp.DeleteAllRetryTasks} {
		_, err := del(queue)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			require.NoError(t, err)
		}
	}
}
