package dashboard_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/reactor"
)

// approval is the payload of approvalFlow's interrupt.
type approval struct {
	By string `json:"by"`
	OK bool   `json:"ok"`
}

// approvalFlow reserves, waits at interrupt approve (correlation: the
// order) for an approval naming who approves, then ships.
func approvalFlow(name string) *reactor.Definition {
	return reactor.MustDefine(name,
		reactor.Input[string]("order", reactor.Required()),
		reactor.Step("reserve", reactor.StepConfig[reactor.Args, bool]{
			Run: func(context.Context, reactor.Args) (bool, error) { return true, nil },
		}),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			After: []string{"reserve"},
			Correlation: func(in reactor.Args) (string, error) {
				return reactor.Arg[string](in, "order")
			},
			Validate: func(a approval) error {
				if a.By == "" {
					return errors.New("an approval names who approves (by)")
				}
				return nil
			},
			Timeout: time.Hour,
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{
			Args: reactor.Bindings{"by": reactor.FromStep("approve", "by")},
			Run: func(_ context.Context, in reactor.Args) (string, error) {
				by, err := reactor.Arg[string](in, "by")
				return "shipped, approved by " + by, err
			},
		}),
		reactor.Returns(reactor.FromStep("ship")),
	)
}

// pausedItem is a run of GET /api/paused, and the interrupt of a detail.
type pausedItem struct {
	ID          string          `json:"id"`
	Reactor     string          `json:"reactor"`
	Step        string          `json:"step"`
	Correlation string          `json:"correlation"`
	Since       string          `json:"since"`
	PausedMS    int64           `json:"paused_ms"`
	Deadline    string          `json:"deadline"`
	TimeLeftMS  *int64          `json:"time_left_ms"`
	Accepts     int             `json:"accepts"`
	Received    int             `json:"received"`
	PayloadType string          `json:"payload_type"`
	Example     json.RawMessage `json:"example"`
	Refused     string          `json:"refused"`
	Payloads    []struct {
		Payload json.RawMessage `json:"payload"`
		At      string          `json:"at"`
		By      string          `json:"by"`
	} `json:"payloads"`
}

type pausedDetail struct {
	Status    string      `json:"status"`
	Interrupt *pausedItem `json:"interrupt"`
	Actions   map[string]struct {
		Allowed bool   `json:"allowed"`
		Reason  string `json:"reason"`
	} `json:"actions"`
	Stall *struct {
		Kind    string `json:"kind"`
		Stalled bool   `json:"stalled"`
	} `json:"stall"`
	Steps []struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	} `json:"steps"`
}

// awaitPausedListed waits until run id is paused and listed by GET
// /api/paused, and returns its entry.
func (e *env) awaitPausedListed(id string) pausedItem {
	e.t.Helper()
	var got pausedItem
	require.EventuallyWithT(e.t, func(c *assert.CollectT) {
		var page struct {
			Runs []pausedItem `json:"runs"`
		}
		res := e.do(http.MethodGet, "/api/paused", "", "")
		require.Equal(c, http.StatusOK, res.code, "%s", res.body)
		require.NoError(c, json.Unmarshal(res.body, &page))
		for _, r := range page.Runs {
			if r.ID == id {
				got = r
				return
			}
		}
		c.Errorf("run %s not listed: %s", id, res.body)
	}, 15*time.Second, 10*time.Millisecond)
	return got
}

// A dashboard given the definitions lists the paused run with its expected
// payload and continues it: a continue needs the token and a reason,
// refuses a payload that does not fit with 422 (nothing recorded), answers
// 409 with when for a duplicate, and the run completes through the worker,
// with the operator on the payload and in the audit.
func TestContinueFromTheDashboard(t *testing.T) {
	t.Parallel()
	const token = "alice-token-0123456789"
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	def := approvalFlow("dash-approval")
	e.startWorker(def)
	dash, err := dashboard.New(dashboard.Config{Client: e.rdb, Prefix: e.prefix, Operators: map[string]string{token: "alice"},
		Queues: []string{e.queue}, ControlQueue: e.ctl, Logger: discard, Definitions: []*reactor.Definition{def},
		StallAfter: time.Millisecond})
	require.NoError(t, err)
	e.dash, e.srv = dash, httptest.NewServer(dash)
	t.Cleanup(e.srv.Close)

	_, err = e.engine.Enqueue(ctx, def, map[string]any{"order": "o-77"}, reactor.WithRunID("pz-1"))
	require.NoError(t, err)
	p := e.awaitPausedListed("pz-1")
	assert.Equal(t, "dash-approval", p.Reactor)
	assert.Equal(t, "approve", p.Step)
	assert.Equal(t, "o-77", p.Correlation)
	assert.Equal(t, 1, p.Accepts)
	assert.Equal(t, 0, p.Received)
	assert.Equal(t, "dashboard_test.approval", p.PayloadType)
	assert.JSONEq(t, `{"by":"","ok":false}`, string(p.Example))
	require.NotEmpty(t, p.Deadline)
	require.NotNil(t, p.TimeLeftMS)
	assert.Greater(t, *p.TimeLeftMS, int64(50*time.Minute/time.Millisecond))

	var other struct {
		Runs []pausedItem `json:"runs"`
	}
	e.get("/api/paused?reactor=dash-approval&limit=1", http.StatusOK, &other)
	require.Len(t, other.Runs, 1)
	e.get("/api/paused?reactor=another", http.StatusOK, &other)
	assert.Empty(t, other.Runs)
	e.get("/api/paused?status=failed", http.StatusBadRequest, nil)
	e.get("/api/paused?limit=501", http.StatusBadRequest, nil)

	// The detail shows the interrupt and offers continue; the paused run
	// is waiting, not stalled.
	var d pausedDetail
	e.get("/api/runs/pz-1", http.StatusOK, &d)
	require.Equal(t, "paused", d.Status)
	require.NotNil(t, d.Interrupt)
	assert.Equal(t, "approve", d.Interrupt.Step)
	assert.Empty(t, d.Interrupt.Payloads)
	assert.True(t, d.Actions["continue"].Allowed, "%+v", d.Actions)
	steps := map[string]string{}
	for _, s := range d.Steps {
		steps[s.Name] = s.Status
	}
	assert.Equal(t, map[string]string{"reserve": "completed", "approve": "paused"}, steps)
	require.NotNil(t, d.Stall)
	assert.Equal(t, "waiting_for_payload", d.Stall.Kind)
	assert.False(t, d.Stall.Stalled)
	assert.False(t, d.Actions["redispatch"].Allowed)

	path := "/api/runs/pz-1/continue"
	good := `{"step":"approve","payload":{"by":"ann","ok":true},"reason":"approved on ticket 4711"}`
	// The same rules as every action.
	assert.Equal(t, http.StatusUnauthorized, e.do(http.MethodPost, path, "", good).code)
	assert.Equal(t, http.StatusUnauthorized, e.do(http.MethodPost, path, "wrong-token-0123456789", good).code)
	assert.Equal(t, http.StatusMethodNotAllowed, e.do(http.MethodGet, path, token, "").code)
	res := e.do(http.MethodPost, path, token, `{"step":"approve","payload":{"by":"ann"},"reason":"  "}`)
	assert.Equal(t, http.StatusBadRequest, res.code)
	assert.Contains(t, string(res.body), "reason is required")
	assert.Equal(t, http.StatusBadRequest, e.do(http.MethodPost, path, token, `{"payload":{"by":"ann"},"reason":"r"}`).code)
	assert.Equal(t, http.StatusBadRequest, e.do(http.MethodPost, path, token, `{"step":"approve","reason":"r"}`).code)
	assert.Equal(t, http.StatusBadRequest, e.do(http.MethodPost, path, token, `{"step":"approve","payload":{},"reason":"r","x":1}`).code)
	// A payload the step refuses: 422 with why, nothing recorded.
	res = e.do(http.MethodPost, path, token, `{"step":"approve","payload":{"by":""},"reason":"r"}`)
	require.Equal(t, http.StatusUnprocessableEntity, res.code, "%s", res.body)
	assert.Contains(t, string(res.body), "an approval names who approves")
	res = e.do(http.MethodPost, path, token, `{"step":"approve","payload":"yes","reason":"r"}`)
	require.Equal(t, http.StatusUnprocessableEntity, res.code, "%s", res.body)
	assert.Contains(t, string(res.body), "does not decode")
	// Not the step it waits at: 409.
	var conflict struct {
		Error, Status, Reason, At string
	}
	decodeInto(t, e.do(http.MethodPost, path, token, `{"step":"ship","payload":{"by":"ann"},"reason":"r"}`), http.StatusConflict, &conflict)
	assert.Equal(t, "not_paused", conflict.Reason)
	assert.Equal(t, http.StatusNotFound, e.do(http.MethodPost, "/api/runs/no-such-run/continue", token, good).code)

	var c struct {
		RunID    string `json:"run_id"`
		Step     string `json:"step"`
		At       string `json:"at"`
		Received int    `json:"received"`
		Accepts  int    `json:"accepts"`
		Woken    bool   `json:"woken"`
		Checked  bool   `json:"checked"`
		Queue    string `json:"queue"`
		Warning  string `json:"warning"`
	}
	decodeInto(t, e.do(http.MethodPost, path, token, good), http.StatusAccepted, &c)
	assert.Equal(t, "approve", c.Step)
	assert.Equal(t, 1, c.Received)
	assert.True(t, c.Woken)
	assert.True(t, c.Checked)
	assert.Equal(t, e.queue, c.Queue)
	assert.Empty(t, c.Warning)

	// A duplicate: 409, saying when the first came.
	conflict = struct{ Error, Status, Reason, At string }{}
	decodeInto(t, e.do(http.MethodPost, path, token, `{"step":"approve","payload":{"by":"bob"},"reason":"again"}`), http.StatusConflict, &conflict)
	assert.Equal(t, "already_continued", conflict.Reason)
	assert.Equal(t, c.At, conflict.At)
	assert.Contains(t, conflict.Error, "already continued")

	final, err := e.engine.Wait(ctx, "pz-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[string](final)
	require.NoError(t, err)
	assert.Equal(t, "shipped, approved by ann", got)

	// Finished: 409 still, and continue is no longer offered.
	conflict = struct{ Error, Status, Reason, At string }{}
	decodeInto(t, e.do(http.MethodPost, path, token, good), http.StatusConflict, &conflict)
	assert.Contains(t, []string{"already_continued", "finished"}, conflict.Reason)
	d = pausedDetail{}
	e.get("/api/runs/pz-1", http.StatusOK, &d)
	assert.Nil(t, d.Interrupt)
	assert.False(t, d.Actions["continue"].Allowed)
	assert.NotEmpty(t, d.Actions["continue"].Reason)

	// The audit: the payload with its sender, and the operator's request.
	entries, err := e.engine.Audit(ctx, "pz-1")
	require.NoError(t, err)
	var sent, asked bool
	for _, a := range entries {
		switch {
		case a.Kind == reactor.AuditContinued:
			sent = true
			assert.Equal(t, "alice", a.Operator)
		case a.Kind == reactor.AuditOperatorRequest && a.Request == "continue":
			asked = true
			assert.Equal(t, "alice", a.Operator)
			assert.Equal(t, "approved on ticket 4711", a.Note)
		}
	}
	assert.True(t, sent, "the audit records the payload: %+v", entries)
	assert.True(t, asked, "the audit records the operator's request: %+v", entries)
}

// A dashboard without the definitions records a payload unchecked; the
// worker refuses one that does not fit, the run stays paused and its page
// shows the refusal, and a good payload then continues it.
func TestContinueUncheckedShowsTheWorkersRefusal(t *testing.T) {
	t.Parallel()
	const token = "shared-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	def := approvalFlow("dash-approval-unchecked")
	e.startWorker(def)
	_, err := e.engine.Enqueue(ctx, def, map[string]any{"order": "o-78"}, reactor.WithRunID("pz-2"))
	require.NoError(t, err)
	p := e.awaitPausedListed("pz-2")
	assert.Empty(t, p.PayloadType, "the dashboard has no definitions")
	assert.Equal(t, "null", string(p.Example))

	path := "/api/runs/pz-2/continue"
	var c struct {
		Checked bool `json:"checked"`
		Woken   bool `json:"woken"`
	}
	decodeInto(t, e.do(http.MethodPost, path, token, `{"step":"approve","payload":{"by":""},"reason":"try"}`), http.StatusAccepted, &c)
	assert.False(t, c.Checked)
	assert.True(t, c.Woken)
	var d pausedDetail
	require.EventuallyWithT(t, func(col *assert.CollectT) {
		d = pausedDetail{}
		res := e.do(http.MethodGet, "/api/runs/pz-2", "", "")
		require.Equal(col, http.StatusOK, res.code)
		require.NoError(col, json.Unmarshal(res.body, &d))
		require.NotNil(col, d.Interrupt)
		require.Contains(col, d.Interrupt.Refused, "an approval names who approves")
	}, 15*time.Second, 10*time.Millisecond)
	assert.Equal(t, "paused", d.Status)
	assert.True(t, d.Actions["continue"].Allowed, "%+v", d.Actions)

	decodeInto(t, e.do(http.MethodPost, path, token, `{"step":"approve","payload":{"by":"ann","ok":true},"reason":"fixed"}`), http.StatusAccepted, &c)
	final, err := e.engine.Wait(ctx, "pz-2")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
}

// An interrupt that takes two payloads stays paused after the first, shows
// it with its sender, and still offers continue; a sensitive run's payloads
// show only to the token holder.
func TestPausedRunShowsItsPayloadsRedactedWhenSensitive(t *testing.T) {
	t.Parallel()
	const token = "two-approvers"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 60*time.Second)
	def := reactor.MustDefine("dash-two-approvers",
		reactor.Input[string]("card", reactor.Sensitive()),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, approval]{Accepts: 2}),
		reactor.Returns(reactor.FromStep("approve")),
	)
	e.startWorker(def)
	_, err := e.engine.Enqueue(ctx, def, map[string]any{"card": "4242"}, reactor.WithRunID("pz-3"))
	require.NoError(t, err)
	p := e.awaitPausedListed("pz-3")
	require.Equal(t, 2, p.Accepts)
	require.Nil(t, p.TimeLeftMS, "no timeout: no time left")
	assert.Empty(t, p.Deadline)

	var c struct {
		Received int  `json:"received"`
		Woken    bool `json:"woken"`
	}
	decodeInto(t, e.do(http.MethodPost, "/api/runs/pz-3/continue", token, `{"step":"approve","payload":{"by":"ann","ok":true},"reason":"first"}`),
		http.StatusAccepted, &c)
	assert.Equal(t, 1, c.Received)
	assert.False(t, c.Woken, "one of two: nothing to wake")

	detail := func(tok string) pausedDetail {
		t.Helper()
		var d pausedDetail
		decodeInto(t, e.do(http.MethodGet, "/api/runs/pz-3", tok, ""), http.StatusOK, &d)
		return d
	}
	d := detail(token)
	require.NotNil(t, d.Interrupt)
	assert.Equal(t, 1, d.Interrupt.Received)
	require.Len(t, d.Interrupt.Payloads, 1)
	assert.JSONEq(t, `{"by":"ann","ok":true}`, string(d.Interrupt.Payloads[0].Payload))
	assert.Equal(t, "dashboard", d.Interrupt.Payloads[0].By, "the shared token's holder has no name")
	assert.NotEmpty(t, d.Interrupt.Payloads[0].At)
	assert.True(t, d.Actions["continue"].Allowed)

	d = detail("")
	require.Len(t, d.Interrupt.Payloads, 1)
	assert.Equal(t, `"`+reactor.RedactedValue+`"`, string(d.Interrupt.Payloads[0].Payload))

	decodeInto(t, e.do(http.MethodPost, "/api/runs/pz-3/continue", token, `{"step":"approve","payload":{"by":"bob","ok":true},"reason":"second"}`),
		http.StatusAccepted, &c)
	assert.Equal(t, 2, c.Received)
	assert.True(t, c.Woken)
	final, err := e.engine.Wait(ctx, "pz-3")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	got, err := reactor.ValueOf[[]approval](final)
	require.NoError(t, err)
	assert.Equal(t, []approval{{By: "ann", OK: true}, {By: "bob", OK: true}}, got)
}
