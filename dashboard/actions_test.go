package dashboard_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

type accepted struct {
	RunID     string `json:"run_id"`
	Action    string `json:"action"`
	TaskID    string `json:"task_id"`
	Duplicate bool   `json:"duplicate"`
	Queue     string `json:"queue"`
	Warning   string `json:"warning"`
}

type errBody struct {
	Error  string `json:"error"`
	Status string `json:"status"`
}

func decodeInto(t *testing.T, res response, code int, out any) {
	t.Helper()
	require.Equal(t, code, res.code, "%s", res.body)
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
	require.NoError(t, json.Unmarshal(res.body, out), "%s", res.body)
}

// The token rules, the body limits, and each action's answers (202, a
// duplicate, 404, 409 with the engine's reason and the run's status), single
// and in a batch.
func TestActions(t *testing.T) {
	t.Parallel()
	const token = "s3cret-token"
	e := newEnv(t, token)
	ctx := ctxTimeout(t, 30*time.Second)
	ok, bad := echo("act-ok"), failing("act-bad")
	e.startWorker(ok, bad)
	e.enqueueAll(ctx, ok, []string{"done-1"}, map[string]any{"note": "x"})
	e.enqueueAll(ctx, bad, []string{"failed-1"}, nil)
	// Then no worker serves the runs' queue: the runs stay as they are, so
	// a repeated request is a duplicate, and each 202 warns that nothing
	// will carry it out (TestActionsAreCarriedOut serves it).
	e.stopWorkers()

	var eb errBody
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/undo", "", `{"reason":"test"}`), http.StatusUnauthorized, &eb)
	require.Contains(t, eb.Error, "bearer token")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/undo", "wrong", `{"reason":"test"}`), http.StatusUnauthorized, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/undo", token+"x", `{"reason":"test"}`), http.StatusUnauthorized, &eb)
	res := e.do(http.MethodGet, "/api/runs/done-1/undo", token, "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code, "no mutation by GET")
	require.Equal(t, "POST", res.header.Get("Allow"))

	var a accepted
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/undo", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	require.Equal(t, accepted{RunID: "done-1", Action: "undo", TaskID: a.TaskID, Queue: e.queue, Warning: a.Warning}, a,
		"the control task goes to the queue the run recorded")
	require.NotEmpty(t, a.TaskID)
	require.Contains(t, a.Warning, fmt.Sprintf("no worker serves queue %q, where this request was queued", e.queue))
	require.Contains(t, a.Warning, "GOREACTOR_QUEUE="+e.queue, "says what to do")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/undo", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	require.True(t, a.Duplicate, "a double click queues one action")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/failed-1/retry", token, `{"reason":"test"}`), http.StatusAccepted, &a)
	require.Equal(t, "retry", a.Action)

	decodeInto(t, e.do(http.MethodPost, "/api/runs/nope/cancel", token, `{"reason":"test"}`), http.StatusNotFound, &eb)
	require.Contains(t, eb.Error, "not found")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/done-1/cancel", token, `{"reason":"test"}`), http.StatusConflict, &eb)
	require.Equal(t, "completed", eb.Status)
	require.Contains(t, eb.Error, reactor.ErrAlreadyFinished.Error())
	decodeInto(t, e.do(http.MethodPost, "/api/runs/failed-1/undo", token, `{"reason":"test"}`), http.StatusConflict, &eb)
	require.Equal(t, "failed", eb.Status)
	require.Contains(t, eb.Error, reactor.ErrNotUndoable.Error())
	decodeInto(t, e.do(http.MethodPost, "/api/runs/a%7Bb/undo", token, `{"reason":"test"}`), http.StatusBadRequest, &eb)

	// The batch form: one answer per id, in order.
	var br struct {
		Results []struct {
			RunID      string `json:"run_id"`
			StatusCode int    `json:"status_code"`
			TaskID     string `json:"task_id"`
			Duplicate  bool   `json:"duplicate"`
			Error      string `json:"error"`
			Queue      string `json:"queue"`
			Warning    string `json:"warning"`
		} `json:"results"`
	}
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, `{"action":"cancel","ids":["done-1","nope","failed-1"],"reason":"test"}`), http.StatusOK, &br)
	require.Len(t, br.Results, 3)
	require.Equal(t, []int{409, 404, 409}, []int{br.Results[0].StatusCode, br.Results[1].StatusCode, br.Results[2].StatusCode})
	require.Equal(t, "nope", br.Results[1].RunID)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, `{"action":"undo","ids":["done-1"],"reason":"test"}`), http.StatusOK, &br)
	require.Equal(t, http.StatusAccepted, br.Results[0].StatusCode)
	require.True(t, br.Results[0].Duplicate)
	require.Equal(t, e.queue, br.Results[0].Queue)
	require.Contains(t, br.Results[0].Warning, "no worker serves queue")

	many := make([]string, 501)
	for i := range many {
		many[i] = fmt.Sprintf("%q", fmt.Sprint("r", i))
	}
	for _, body := range []string{
		`{"action":"explode","ids":["done-1"],"reason":"test"}`,
		`{"action":"undo","ids":[],"reason":"test"}`,
		`{"action":"undo","ids":[` + strings.Join(many, ",") + `]}`,
		`{"action":"undo","ids":["done-1"],"extra":1}`,
		`not json`,
	} {
		decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, body), http.StatusBadRequest, &eb)
		require.NotEmpty(t, eb.Error)
	}
	huge := `{"action":"undo","ids":["` + strings.Repeat("x", 70<<10) + `"]}`
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, huge), http.StatusRequestEntityTooLarge, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", "", `{"action":"undo","ids":["done-1"],"reason":"test"}`), http.StatusUnauthorized, &eb)
}

// With no token configured every action is refused with how to enable
// them.
func TestActionsDisabled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	var eb errBody
	for _, path := range []string{"/api/runs/x/undo", "/api/runs/x/cancel", "/api/runs/x/retry", "/api/runs/actions", "/api/runs/x/undo-steps", "/api/runs/x/entries/a%231/resolve"} {
		decodeInto(t, e.do(http.MethodPost, path, "anything", `{"action":"undo","ids":["x"],"reason":"test"}`), http.StatusForbidden, &eb)
		require.Contains(t, eb.Error, "dashboard actions are disabled: set GOREACTOR_DASHBOARD_TOKEN")
	}
}
