package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The actions an operator can request.
var actions = []string{"undo", "cancel", "retry", "rollback"}

// maxBatch bounds the ids of one batch action.
const maxBatch = 500

func isAction(s string) bool {
	for _, a := range actions {
		if s == a {
			return true
		}
	}
	return false
}

// actionAccepted is the 202 answer to an action.
type actionAccepted struct {
	RunID     string `json:"run_id"`
	Action    string `json:"action"`
	TaskID    string `json:"task_id"`
	Duplicate bool   `json:"duplicate"`
	// Queue is the asynq queue the control task went to.
	Queue string `json:"queue"`
	// Warning, when set, is why the request may never be carried out:
	// no worker serves Queue.
	Warning string `json:"warning,omitempty"`
}

// undoStepsRequest is the body of POST /api/runs/{id}/undo-steps.
type undoStepsRequest struct {
	Steps  []string `json:"steps"`
	Reason string   `json:"reason"`
}

// undoStepsAccepted is the 202 answer to an undo of named steps.
type undoStepsAccepted struct {
	actionAccepted
	Steps []string `json:"steps"`
}

type batchRequest struct {
	Action string   `json:"action"`
	IDs    []string `json:"ids"`
	Reason string   `json:"reason"`
	// Filter, instead of IDs, names the runs a listing's filters match
	// (matching.go); Expect is their count as the operator confirmed it.
	Filter *matchFilter `json:"filter"`
	Expect *int         `json:"expect"`
}

type batchResult struct {
	RunID      string `json:"run_id"`
	StatusCode int    `json:"status_code"`
	TaskID     string `json:"task_id"`
	Duplicate  bool   `json:"duplicate"`
	Error      string `json:"error"`
	Queue      string `json:"queue,omitempty"`
	Warning    string `json:"warning,omitempty"`
}

type batchResponse struct {
	Results []batchResult `json:"results"`
	// Matched is how many runs a filter matched (a matching batch only).
	Matched int `json:"matched,omitempty"`
}

// tokenHelp is the 403 answer while no token is configured.
const tokenHelp = "dashboard actions are disabled: set GOREACTOR_DASHBOARD_TOKEN (or dashboard.Config.Token) " +
	"and send it as \"Authorization: Bearer <token>\" to enable undo, cancel and retry"

// authorized answers 403 or 401 unless r may act (operator): a configured
// token, or the trusted proxy's header. The comparison takes the same time
// whatever the token's first wrong byte.
func (h *Handler) authorized(w http.ResponseWriter, r *http.Request) bool {
	if !h.actionsEnabled() {
		writeError(w, http.StatusForbidden, tokenHelp)
		return false
	}
	if _, ok := h.operator(r); !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="goreactor dashboard"`)
		msg := "missing or wrong bearer token: send \"Authorization: Bearer <token>\" with the dashboard's GOREACTOR_DASHBOARD_TOKEN or your operators-file token"
		if !h.tokensConfigured() {
			msg = "no operator: this dashboard takes who acts from the " + h.cfg.OperatorHeader + " header its proxy sets, and the request has none"
		}
		writeError(w, http.StatusUnauthorized, msg)
		return false
	}
	return true
}

// tokenHolder reports whether r may act (operator), and so may read a
// sensitive run's values. It answers nothing: a read without a token is
// served, with a sensitive run's values redacted (sensitive.go).
func (h *Handler) tokenHolder(r *http.Request) bool {
	if !h.actionsEnabled() {
		return false
	}
	_, ok := h.operator(r)
	return ok
}

// bearer is r's bearer credential. The scheme is case-insensitive (RFC
// 9110 section 11.1): "bearer x" and "BEARER x" are "Bearer x".
func bearer(r *http.Request) (string, bool) {
	scheme, cred, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(cred), true
}

// request asks for action on run id and maps the outcome to an answer: its
// status code, and for a 409 the run's status.
func (h *Handler) request(r *http.Request, id, action, reason string) (batchResult, reactor.Status) {
	return h.answer(r, id, reactor.OperatorRequest{Action: action, Reason: reason},
		func() (queued, error) { return h.requester.Request(r.Context(), id, action) })
}

// answer validates run id, makes the request with ask and maps its outcome
// to an answer: its status code, and for a 409 the run's status. An
// accepted request carries a warning when no worker serves its queue.
//
// An accepted request that was not queued already is recorded in the run's
// audit with who asked and why (req; Engine.RecordRequest).
func (h *Handler) answer(r *http.Request, id string, req reactor.OperatorRequest, ask func() (queued, error)) (batchResult, reactor.Status) {
	ctx, action := r.Context(), req.Action
	res := batchResult{RunID: id}
	if err := keys.ValidateID(id); err != nil {
		res.StatusCode, res.Error = http.StatusBadRequest, "run id: "+err.Error()
		return res, ""
	}
	q, err := ask()
	var se *reactor.StatusError
	switch {
	case err == nil:
		res.StatusCode, res.TaskID, res.Duplicate, res.Queue = http.StatusAccepted, q.TaskID, q.Duplicate, q.Queue
		res.Warning = h.unservedWarning(ctx, id, action, q.Queue)
		if !q.Duplicate {
			h.recordRequest(r, id, req, q.TaskID)
		}
	case errors.Is(err, reactor.ErrNotFound):
		res.StatusCode, res.Error = http.StatusNotFound, err.Error()
	case errors.Is(err, worker.ErrInvalidSteps), errors.Is(err, reactor.ErrUnknownStep):
		res.StatusCode, res.Error = http.StatusBadRequest, err.Error()
	case errors.Is(err, reactor.ErrResourceOrder):
		// The request would leave a newer change on the same resource
		// applied: refused before anything is queued.
		res.StatusCode, res.Error = http.StatusConflict, err.Error()
	case errors.As(err, &se):
		res.StatusCode, res.Error = http.StatusConflict, err.Error()
		return res, se.Status
	default:
		h.log.Error("dashboard action failed", "event", "reactor.dashboard.error", "run", id, "action", action, "error", err)
		res.StatusCode, res.Error = http.StatusInternalServerError,
			fmt.Sprintf("%s of run %s could not be requested; the dashboard's log has the cause (event reactor.dashboard.error)", action, id)
	}
	return res, ""
}

// recordRequest writes an accepted request to run id's audit: who asked
// (operator), why, and the task carrying it out. The request is queued
// already: a failed write is logged for the operator, not answered.
func (h *Handler) recordRequest(r *http.Request, id string, req reactor.OperatorRequest, taskID string) {
	req.Operator, _ = h.operator(r)
	req.TaskID = taskID
	if err := h.engine.RecordRequest(context.WithoutCancel(r.Context()), id, req); err != nil {
		h.log.Error("an operator's request was queued but not recorded in the run's audit", "event", "reactor.dashboard.audit_failed",
			"run", id, "action", req.Action, "operator", req.Operator, "task", taskID, "error", err)
		return
	}
	h.log.Info("an operator's request was queued", "event", "reactor.dashboard.request", "run", id, "action", req.Action,
		"operator", req.Operator, "task", taskID)
}

// unservedWarning is the warning for a request queued on queue when no
// worker serves it, else "". A registry that cannot be read gives no
// warning (the request is queued all the same) and a log line.
func (h *Handler) unservedWarning(ctx context.Context, id, action, queue string) string {
	served, err := h.served.queues(ctx)
	if err != nil {
		h.log.Warn("cannot tell whether a worker serves the queue of a request", "event", "reactor.dashboard.served_unknown",
			"run", id, "action", action, "queue", queue, "error", err)
		return ""
	}
	if served[queue] {
		return ""
	}
	return notServedWarning(queue, ", where this request was queued", "it waits")
}

// action serves POST /api/runs/{id}/{undo,cancel,retry}.
func (h *Handler) action(w http.ResponseWriter, r *http.Request, id, action string) {
	if !h.authorized(w, r) {
		return
	}
	var body reasonBody
	if !decodeBody(w, r, &body, `{"reason": "why you ask"}`) {
		return
	}
	if msg := checkReason(body.Reason); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	res, status := h.request(r, id, action, body.Reason)
	switch res.StatusCode {
	case http.StatusAccepted:
		writeJSON(w, res.StatusCode, actionAccepted{RunID: id, Action: action, TaskID: res.TaskID, Duplicate: res.Duplicate,
			Queue: res.Queue, Warning: res.Warning})
	case http.StatusConflict:
		writeJSON(w, res.StatusCode, errorBody{Error: res.Error, Status: string(status)})
	default:
		writeError(w, res.StatusCode, res.Error)
	}
}

// batchAction serves POST /api/runs/actions: one action on up to maxBatch
// runs, each answered in order with the code its own request would get.
func (h *Handler) batchAction(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(w, r) {
		return
	}
	var req batchRequest
	if !decodeBody(w, r, &req, `{"action": "undo|cancel|retry|rollback", "ids": [...], "reason": "why you ask"}`+
		` (or "filter": {...}, "expect": N instead of "ids")`) {
		return
	}
	if msg := checkReason(req.Reason); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	switch {
	case !isAction(req.Action):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("action %q is not one of %s", req.Action, strings.Join(actions, ", ")))
		return
	case req.Filter != nil && len(req.IDs) > 0:
		writeError(w, http.StatusBadRequest, "send ids or filter, not both")
		return
	case req.Filter != nil:
		h.batchMatching(w, r, req)
		return
	case req.Expect != nil:
		writeError(w, http.StatusBadRequest, "expect goes with filter: a batch by ids acts on the ids it names")
		return
	case len(req.IDs) == 0:
		writeError(w, http.StatusBadRequest, "ids is empty: name the runs to act on")
		return
	case len(req.IDs) > maxBatch:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%d ids is over the maximum of %d per request; split the selection", len(req.IDs), maxBatch))
		return
	}
	out := batchResponse{Results: make([]batchResult, 0, len(req.IDs))}
	for _, id := range req.IDs {
		res, _ := h.request(r, id, req.Action, req.Reason)
		out.Results = append(out.Results, res)
	}
	writeJSON(w, http.StatusOK, out)
}

// undoStepsAction is the action name of an undo of named steps (its path is
// undo-steps).
const undoStepsAction = "undo_steps"

// undoSteps serves POST /api/runs/{id}/undo-steps: body {"steps": [...]},
// an undo of the named completed steps of a finished run, carried out by a
// worker (reactor.Engine.UndoSteps).
func (h *Handler) undoSteps(w http.ResponseWriter, r *http.Request, id string) {
	if !h.authorized(w, r) {
		return
	}
	var req undoStepsRequest
	if !decodeBody(w, r, &req, `{"steps": ["charge", "book/reserve", ...], "reason": "why you ask"}`) {
		return
	}
	if msg := checkReason(req.Reason); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	switch {
	case len(req.Steps) == 0:
		writeError(w, http.StatusBadRequest, "steps is empty: name the steps to undo (\"charge\", or \"book/reserve\" for a step of composed child book)")
		return
	case len(req.Steps) > maxBatch:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%d steps is over the maximum of %d per request", len(req.Steps), maxBatch))
		return
	}
	res, status := h.answer(r, id, reactor.OperatorRequest{Action: undoStepsAction, Reason: req.Reason, Steps: req.Steps}, func() (queued, error) {
		return h.requester.RequestUndoSteps(r.Context(), id, req.Steps)
	})
	switch res.StatusCode {
	case http.StatusAccepted:
		writeJSON(w, res.StatusCode, undoStepsAccepted{actionAccepted: actionAccepted{RunID: id, Action: undoStepsAction,
			TaskID: res.TaskID, Duplicate: res.Duplicate, Queue: res.Queue, Warning: res.Warning}, Steps: req.Steps})
	case http.StatusConflict:
		writeJSON(w, res.StatusCode, errorBody{Error: res.Error, Status: string(status)})
	default:
		writeError(w, res.StatusCode, res.Error)
	}
}

// decodeBody decodes a JSON request body into v, refusing unknown fields.
// It answers 413 for a body over maxBody and 400, with the expected shape,
// for anything else it cannot decode, and then reports false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any, shape string) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// One value and nothing after it: `{"steps": ["a"]} garbage` is not
		// a request someone meant.
		if _, more := dec.Token(); more != io.EOF {
			err = errors.New("unexpected data after the JSON value")
		}
	}
	if err == nil {
		return true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over %d bytes", maxBody))
		return false
	}
	writeError(w, http.StatusBadRequest, "body must be JSON "+shape+": "+err.Error())
	return false
}
