package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// effects is the outside world of the booking reactor: what each run has
// booked and not undone, and which runs reached their notify step.
type effects struct {
	mu       sync.Mutex
	booked   map[string]bool
	notified map[string]bool
}

func (f *effects) set(m map[string]bool, id string, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m[id] = v
}

func (f *effects) get(m map[string]bool, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return m[id]
}

type holdIn struct {
	Hold bool `json:"hold"`
}

// booking books, then waits (a run with input hold waits for release and
// says so on holding), then notifies. Its booking has an Undo.
func booking(fx *effects, holding chan<- string, release <-chan struct{}) *reactor.Definition {
	return reactor.MustDefine("dash-booking",
		reactor.Input[bool]("hold"),
		reactor.Step("book", reactor.StepConfig[reactor.Args, string]{
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				id := runID(ctx)
				fx.set(fx.booked, id, true)
				return id, nil
			},
			Undo: func(_ context.Context, _ reactor.Args, id string) error {
				fx.set(fx.booked, id, false)
				return nil
			},
		}),
		reactor.Step("wait", reactor.StepConfig[holdIn, bool]{
			After: []string{"book"},
			Args:  reactor.Bindings{"hold": reactor.FromInput("hold")},
			Run: func(ctx context.Context, in holdIn) (bool, error) {
				if in.Hold {
					holding <- runID(ctx)
					<-release
				}
				return true, nil
			},
		}),
		reactor.Step("notify", reactor.StepConfig[reactor.Args, bool]{
			After: []string{"wait"},
			Run: func(ctx context.Context, _ reactor.Args) (bool, error) {
				fx.set(fx.notified, runID(ctx), true)
				return true, nil
			},
		}),
	)
}

// The actions are carried out by a worker: undo undoes a completed run's
// effects, cancel stops a long run at its next checkpoint (its later steps
// never run, what it did is undone), and a batch retry runs a failed run
// again under a new id linked both ways, all through the HTTP API.
func TestActionsAreCarriedOut(t *testing.T) {
	t.Parallel()
	const token = "carry-out"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	fx := &effects{booked: map[string]bool{}, notified: map[string]bool{}}
	holding, release := make(chan string, 1), make(chan struct{})
	book, bad := booking(fx, holding, release), failing("dash-declined")
	e.startControlWorker(book, bad)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	// A run enqueued records its queue, so its control tasks go there,
	// where its worker is: the answer names it and warns of nothing.
	done := func(queue, task, warning string) {
		t.Helper()
		require.Equal(t, e.queue, queue, "the control task goes to the queue the run recorded")
		require.Empty(t, warning, "a worker serves the queue")
		require.Eventually(t, func() bool {
			info, err := insp.GetTaskInfo(queue, task)
			return err == nil && info.State == asynq.TaskStateCompleted
		}, 20*time.Second, 10*time.Millisecond, "control task %s carried out", task)
	}

	e.enqueueAll(ctx, book, []string{"undo-me"}, map[string]any{"hold": false})
	e.enqueueAll(ctx, bad, []string{"retry-me"}, nil)
	require.True(t, fx.get(fx.booked, "undo-me"))

	// Undo: the completed run's booking is undone and it ends cancelled.
	var a accepted
	decodeInto(t, e.do(http.MethodPost, "/api/runs/undo-me/undo", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	done(a.Queue, a.TaskID, a.Warning)
	run, err := e.engine.Get(ctx, "undo-me")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, run.Status)
	require.False(t, fx.get(fx.booked, "undo-me"), "the booking was undone")

	// Cancel: a run held in its wait step is asked to cancel; the request
	// is carried out while the step runs, and honoured when it returns.
	_, err = e.engine.Enqueue(ctx, book, map[string]any{"hold": true}, reactor.WithRunID("cancel-me"))
	require.NoError(t, err)
	require.Equal(t, "cancel-me", <-holding)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/cancel-me/cancel", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	done(a.Queue, a.TaskID, a.Warning)
	close(release)
	res, err := e.engine.Wait(ctx, "cancel-me")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, res.Status)
	require.False(t, fx.get(fx.notified, "cancel-me"), "the step after the cancel never ran")
	require.False(t, fx.get(fx.booked, "cancel-me"), "what the run did was undone")

	// Retry, in the batch form: the failed run runs again, linked both ways.
	var br struct {
		Results []struct {
			RunID      string `json:"run_id"`
			StatusCode int    `json:"status_code"`
			TaskID     string `json:"task_id"`
			Queue      string `json:"queue"`
			Warning    string `json:"warning"`
		} `json:"results"`
	}
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, `{"action":"retry","ids":["retry-me"],"reason":"test"}`), http.StatusOK, &br)
	require.Len(t, br.Results, 1)
	require.Equal(t, http.StatusAccepted, br.Results[0].StatusCode)
	done(br.Results[0].Queue, br.Results[0].TaskID, br.Results[0].Warning)
	var orig struct {
		RetriedBy []string `json:"retried_by"`
	}
	e.get("/api/runs/retry-me", http.StatusOK, &orig)
	require.Len(t, orig.RetriedBy, 1)
	again, err := e.engine.Wait(ctx, orig.RetriedBy[0])
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, again.Status, "it ran again (and was declined again)")
	var retry struct {
		RetryOf string `json:"retry_of"`
		Reactor string `json:"reactor"`
	}
	e.get("/api/runs/"+orig.RetriedBy[0], http.StatusOK, &retry)
	require.Equal(t, "retry-me", retry.RetryOf)
	require.Equal(t, "dash-declined", retry.Reactor)
}

func runID(ctx context.Context) string {
	info, _ := reactor.RunInfoFrom(ctx)
	return info.RunID
}

// A rollback that left an effect in place shows as needs_human, entry by
// entry, with its audit trail (the failure's text only as a hash); the
// re-trigger action, carried out by a worker, retries that entry alone and
// the report of generation 2 reads reverted.
func TestRollbackStatusAuditAndReTrigger(t *testing.T) {
	t.Parallel()
	const token = "rb-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	var mu sync.Mutex
	calls := map[string]int{}
	undo := func(name string) func(context.Context, reactor.Args, string) error {
		return func(context.Context, reactor.Args, string) error {
			mu.Lock()
			defer mu.Unlock()
			calls[name]++
			if name == "refund" && calls[name] == 1 {
				return reactor.Permanent(errors.New("refund API down: secret-detail-42"))
			}
			return nil
		}
	}
	step := func(name string, fail bool, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{After: after,
			Run: func(context.Context, reactor.Args) (string, error) {
				if fail {
					return "", reactor.Permanent(errors.New("declined"))
				}
				return name, nil
			},
			Undo: undo(name)})
	}
	def := reactor.MustDefine("dash-rb", step("reserve", false), step("refund", false, "reserve"), step("ship", true, "refund"))
	e.startControlWorker(def)
	e.enqueueAll(ctx, def, []string{"rb-run"}, nil)

	type entry struct {
		Step   string `json:"step"`
		Status string `json:"status"`
		Action string `json:"action"`
		Reason string `json:"reason"`
	}
	var rep struct {
		RollbackID string `json:"rollback_id"`
		Generation int    `json:"generation"`
		Summary    struct {
			Outcome    string   `json:"outcome"`
			NeedsHuman []string `json:"needs_human"`
		} `json:"summary"`
		Entries []entry `json:"entries"`
	}
	e.get("/api/runs/rb-run/rollback-status", http.StatusOK, &rep)
	require.Equal(t, "rb-run:rb:1", rep.RollbackID)
	require.Equal(t, "needs_human", rep.Summary.Outcome)
	var statuses []string
	for _, en := range rep.Entries {
		statuses = append(statuses, en.Step+"="+en.Status)
	}
	require.Contains(t, statuses, "refund=compensation_failed")
	require.Contains(t, statuses, "reserve=compensated")

	res := e.do(http.MethodGet, "/api/runs/rb-run/audit", "", "")
	require.Equal(t, http.StatusOK, res.code)
	require.NotContains(t, string(res.body), "secret-detail-42", "free text is only hashed in the audit")
	var au struct {
		Entries []struct {
			Kind        string `json:"kind"`
			Step        string `json:"step"`
			MessageHash string `json:"message_sha256"`
			TraceID     string `json:"trace_id"`
		} `json:"entries"`
	}
	require.NoError(t, json.Unmarshal(res.body, &au))
	run, err := e.engine.Get(ctx, "rb-run")
	require.NoError(t, err)
	var kinds []string
	hashed := false
	for _, a := range au.Entries {
		kinds = append(kinds, a.Kind)
		require.Equal(t, run.TraceID, a.TraceID)
		if a.Kind == string(reactor.AuditCompensationFailed) && a.Step == "refund" {
			hashed = strings.HasPrefix(a.MessageHash, "sha256:")
		}
	}
	require.True(t, hashed, "the failure's reason is a hash: %v", kinds)
	require.Contains(t, kinds, string(reactor.AuditRollbackStarted))
	require.Contains(t, kinds, string(reactor.AuditRollbackCompleted))

	var a accepted
	decodeInto(t, e.do(http.MethodPost, "/api/runs/rb-run/rollback", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	insp := asynq.NewInspectorFromRedisClient(e.rdb)
	require.Eventually(t, func() bool {
		info, err := insp.GetTaskInfo(a.Queue, a.TaskID)
		return err == nil && info.State == asynq.TaskStateCompleted
	}, 20*time.Second, 10*time.Millisecond)
	e.get("/api/runs/rb-run/rollback-status", http.StatusOK, &rep)
	require.Equal(t, 2, rep.Generation)
	require.Equal(t, "reverted", rep.Summary.Outcome)
	mu.Lock()
	require.Equal(t, map[string]int{"reserve": 1, "refund": 2}, calls, "only the failed entry was retried")
	mu.Unlock()
	var eb errBody
	decodeInto(t, e.do(http.MethodPost, "/api/runs/rb-run/rollback", token, `{"reason":"test"}`), http.StatusConflict, &eb)
	require.Contains(t, eb.Error, reactor.ErrNothingToRetry.Error())
	decodeInto(t, e.do(http.MethodGet, "/api/runs/nope/rollback-status", "", ""), http.StatusNotFound, &eb)
}
