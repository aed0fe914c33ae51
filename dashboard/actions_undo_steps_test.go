package dashboard_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// undone records which undo functions ran, in order.
type undone struct {
	mu  sync.Mutex
	log []string
}

func (u *undone) add(s string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.log = append(u.log, s)
}

func (u *undone) all() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.log)
}

// resStep is a step with an Undo that changed resource res.
func resStep(u *undone, name, res string, after ...string) reactor.Part {
	return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{
		After: after,
		Run:   func(context.Context, reactor.Args) (string, error) { return name, nil },
		Undo: func(context.Context, reactor.Args, string) error {
			u.add(name)
			return nil
		},
		Resource: func(reactor.Args, string) string { return res },
	})
}

// trip books a seat, changes it, and pays inside composed child book: the
// seat's two entries share a resource.
func trip(u *undone) *reactor.Definition {
	child := reactor.MustDefine("dash-trip-book", resStep(u, "hold", "hold"), resStep(u, "pay", "card", "hold"))
	return reactor.MustDefine("dash-trip", resStep(u, "seat", "seat:4C"), resStep(u, "upgrade", "seat:4C", "seat"),
		resStep(u, "b", "b", "upgrade"), reactor.Compose("book", child, reactor.ComposeConfig{After: []string{"b"}}))
}

type ledgerEntry struct {
	Step     string `json:"step"`
	Ordinal  int    `json:"ordinal"`
	Resource string `json:"resource"`
	Status   string `json:"status"`
}

type detailLedger struct {
	Status string        `json:"status"`
	Ledger []ledgerEntry `json:"ledger"`
}

func ledgerPaths(d detailLedger) []string {
	out := []string{}
	for _, e := range d.Ledger {
		out = append(out, e.Step)
	}
	return out
}

// POST /api/runs/{id}/undo-steps: the token rules, 400 on a bad body or an
// empty list, 404, 409 with the engine's reason, 202 with the request id
// (a duplicate for the same steps, another task for other steps); carried
// out by a worker, the named steps are undone and the rest stay applied,
// and a request the engine refuses there (a resource-order conflict) is
// archived with its reason. The run detail lists the undo stack.
func TestUndoStepsAction(t *testing.T) {
	t.Parallel()
	const token = "steps-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	u := &undone{}
	def, bad := trip(u), failing("dash-trip-declined")
	e.startWorker(def, bad)
	e.enqueueAll(ctx, def, []string{"trip-1"}, nil)
	e.enqueueAll(ctx, bad, []string{"trip-bad"}, nil)
	e.stopWorkers() // the requests stay queued until a worker serves the runs' queue again

	var d detailLedger
	e.get("/api/runs/trip-1", http.StatusOK, &d)
	require.Equal(t, "completed", d.Status)
	require.Equal(t, []string{"seat", "upgrade", "b", "book/hold", "book/pay"}, ledgerPaths(d), "the undo stack, flattened, oldest first")
	require.Equal(t, ledgerEntry{Step: "seat", Ordinal: d.Ledger[0].Ordinal, Resource: "seat:4C", Status: "pending"}, d.Ledger[0])
	var failedDetail detailLedger
	e.get("/api/runs/trip-bad", http.StatusOK, &failedDetail)
	require.NotNil(t, failedDetail.Ledger)
	require.Empty(t, failedDetail.Ledger)

	const path = "/api/runs/trip-1/undo-steps"
	var eb errBody
	decodeInto(t, e.do(http.MethodPost, path, "", `{"steps":["b"],"reason":"test"}`), http.StatusUnauthorized, &eb)
	decodeInto(t, e.do(http.MethodPost, path, "wrong", `{"steps":["b"],"reason":"test"}`), http.StatusUnauthorized, &eb)
	res := e.do(http.MethodGet, path, token, "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	require.Equal(t, "POST", res.header.Get("Allow"))
	for _, body := range []string{``, `not json`, `{}`, `{"steps":[],"reason":"test"}`, `{"steps":null}`, `{"steps":"b"}`, `{"steps":["b"],"x":1}`,
		`{"steps":[""],"reason":"test"}`, `{"steps":["book/"],"reason":"test"}`, `{"steps":[1],"reason":"test"}`} {
		decodeInto(t, e.do(http.MethodPost, path, token, body), http.StatusBadRequest, &eb)
		require.NotEmpty(t, eb.Error, body)
	}
	decodeInto(t, e.do(http.MethodPost, path, token, `{"steps":[],"reason":"test"}`), http.StatusBadRequest, &eb)
	require.Contains(t, eb.Error, "steps is empty")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/a%7Bb/undo-steps", token, `{"steps":["b"],"reason":"test"}`), http.StatusBadRequest, &eb)
	huge := `{"steps":["` + strings.Repeat("x", 70<<10) + `"],"reason":"test"}`
	decodeInto(t, e.do(http.MethodPost, path, token, huge), http.StatusRequestEntityTooLarge, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/nope/undo-steps", token, `{"steps":["b"],"reason":"test"}`), http.StatusNotFound, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/trip-bad/undo-steps", token, `{"steps":["pay"],"reason":"test"}`), http.StatusConflict, &eb)
	require.Equal(t, "failed", eb.Status)
	_, engineErr := e.engine.UndoSteps(ctx, "trip-bad", []string{"pay"})
	require.Error(t, engineErr)
	require.Equal(t, engineErr.Error(), eb.Error, "the engine's own reason")
	require.Contains(t, eb.Error, "undo_steps refused")

	type stepsAccepted struct {
		accepted
		Steps []string `json:"steps"`
	}
	var a, dup, other, conflict stepsAccepted
	decodeInto(t, e.do(http.MethodPost, path, token, `{"steps":["b","book/pay"],"reason":"test"}`), http.StatusAccepted, &a)
	require.Equal(t, "trip-1", a.RunID)
	require.Equal(t, "undo_steps", a.Action)
	require.Equal(t, []string{"b", "book/pay"}, a.Steps)
	require.False(t, a.Duplicate)
	require.True(t, strings.HasPrefix(a.TaskID, "ctl:trip-1:undo_steps:"), a.TaskID)
	decodeInto(t, e.do(http.MethodPost, path, token, `{"steps":["book/pay","b"],"reason":"test"}`), http.StatusAccepted, &dup)
	require.True(t, dup.Duplicate, "the same steps again: one task")
	require.Equal(t, a.TaskID, dup.TaskID)
	// Refused before anything is queued: seat without the newer upgrade
	// on the same resource.
	resp := e.do(http.MethodPost, path, token, `{"steps":["seat"],"reason":"test"}`)
	require.Equal(t, http.StatusConflict, resp.code, string(resp.body))
	require.Contains(t, string(resp.body), `without step \"upgrade\"`)
	require.Contains(t, string(resp.body), "seat:4C")
	_ = conflict

	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	await := func(task string, state asynq.TaskState) *asynq.TaskInfo {
		t.Helper()
		var info *asynq.TaskInfo
		require.Eventually(t, func() bool {
			got, err := insp.GetTaskInfo(e.queue, task) // the queue the run recorded
			info = got
			return err == nil && got.State == state
		}, 20*time.Second, 10*time.Millisecond, "control task %s reaches %s", task, state)
		return info
	}
	e.startWorker() // now carry the requests out
	await(a.TaskID, asynq.TaskStateCompleted)
	require.Equal(t, []string{"pay", "b"}, u.all(), "the named steps undone, newest first (book's pay, then b); nothing else")

	e.get("/api/runs/trip-1", http.StatusOK, &d)
	require.Equal(t, "completed", d.Status, "the run keeps its status")
	require.Equal(t, []string{"seat", "upgrade", "book/hold"}, ledgerPaths(d), "the steps not named stay applied")
	var rep struct {
		Entries []struct {
			Step   string `json:"step"`
			Status string `json:"status"`
		} `json:"entries"`
	}
	e.get("/api/runs/trip-1/rollback-status", http.StatusOK, &rep)
	var got []string
	for _, en := range rep.Entries {
		got = append(got, en.Step+"="+en.Status)
	}
	require.ElementsMatch(t, []string{"b=compensated", "book/pay=compensated"}, got)

	// Another set of steps at the new version: both seat entries together
	// are allowed.
	decodeInto(t, e.do(http.MethodPost, path, token, `{"steps":["seat","upgrade"],"reason":"test"}`), http.StatusAccepted, &other)
	await(other.TaskID, asynq.TaskStateCompleted)
	require.Equal(t, []string{"pay", "b", "upgrade", "seat"}, u.all())
	e.get("/api/runs/trip-1", http.StatusOK, &d)
	require.Equal(t, []string{"book/hold"}, ledgerPaths(d))
	require.Equal(t, "completed", d.Status)
}
