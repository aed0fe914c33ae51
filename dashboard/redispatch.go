package dashboard

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/sweeper"
)

// redispatchAction is the path and the audit name of a re-dispatch.
const redispatchAction = "redispatch"

// redispatchAccepted is the 202 answer to a re-dispatch.
type redispatchAccepted struct {
	RunID  string `json:"run_id"`
	Action string `json:"action"`
	// Stall is the stall the request was made for.
	Stall stallView `json:"stall"`
	// Dispatched counts what the sweeper's recovery enqueued; Total is
	// their sum. Zero when nothing was lost (Note says so).
	Dispatched dispatchedView `json:"dispatched"`
	Total      int            `json:"total"`
	// Queue is the run's queue; Warning, when set, says no worker serves
	// it (or its maps' task queues), so what was enqueued waits.
	Queue   string `json:"queue"`
	Warning string `json:"warning,omitempty"`
	Note    string `json:"note,omitempty"`
}

type dispatchedView struct {
	Run       int `json:"run"`
	Elements  int `json:"elements"`
	Rollbacks int `json:"rollbacks"`
	Claims    int `json:"claims"`
	Resumes   int `json:"resumes"`
}

// redispatch serves POST /api/runs/{id}/redispatch: the sweeper's recovery
// of run id, now (sweeper.Sweeper.RecoverRun), for a run the dashboard
// finds stalled. It needs no worker and no definitions: it re-enqueues the
// run's wake-up and its maps' lost tasks, which a worker then runs. 404 for
// an unknown run, 409 with the reason for a finished run or one that is not
// stalled (it made progress within StallAfter, a worker holds it, or it
// waits for a person), 503 while a sweeper pass holds the leader lock.
func (h *Handler) redispatch(w http.ResponseWriter, r *http.Request, id string) {
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
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	ctx := r.Context()
	run, err := h.engine.Get(ctx, id)
	switch {
	case errors.Is(err, reactor.ErrNotFound):
		writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, its retention expired, or a map element: re-dispatch its owner run)")
		return
	case err != nil:
		h.serverError(w, r, err)
		return
	}
	stall, why, err := h.stallOf(r, run)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if why != "" {
		writeJSON(w, http.StatusConflict, errorBody{Error: why, Status: string(run.Status)})
		return
	}
	rec, err := h.recovery.RecoverRun(ctx, id)
	switch {
	case errors.Is(err, sweeper.ErrNotLive):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error(), Status: string(run.Status)})
		return
	case errors.Is(err, sweeper.ErrBusy):
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	case err != nil && rec.Recovered() == 0:
		h.log.Error("dashboard re-dispatch failed", "event", "reactor.dashboard.error", "run", id, "error", err)
		writeError(w, http.StatusInternalServerError, "the re-dispatch of run "+id+" failed; the dashboard's log has the cause (event reactor.dashboard.error)")
		return
	case err != nil:
		// Some of it was enqueued: answered, and the rest logged.
		h.log.Warn("dashboard re-dispatch was partial", "event", "reactor.dashboard.error", "run", id, "error", err)
	}
	h.forgetStalls()
	out := redispatchAccepted{RunID: id, Action: redispatchAction, Stall: *stall, Queue: stall.Queue, Total: rec.Recovered(),
		Dispatched: dispatchedView{Elements: rec.Maps.Elements, Rollbacks: rec.Maps.Rollbacks, Claims: rec.Maps.Claims, Resumes: rec.Maps.Resumes}}
	if rec.Woken {
		out.Dispatched.Run = 1
	}
	if stall.Kind == stallNoWorker {
		out.Warning = stall.Why
	}
	if out.Total == 0 {
		out.Note = "nothing of run " + id + " was lost: its tasks are queued (or held), so nothing was enqueued"
		if rec.Locked {
			out.Note = "a worker holds run " + id + " now: nothing was enqueued"
		}
	}
	// The audit names no task: a recovery is several, each named by the
	// cause it re-delivers.
	h.recordRequest(r, id, reactor.OperatorRequest{Action: redispatchAction, Reason: body.Reason}, "")
	writeJSON(w, http.StatusAccepted, out)
}

// stallOf examines live run run now (not from the cache): its stall, or
// why a re-dispatch is refused.
func (h *Handler) stallOf(r *http.Request, run *reactor.Run) (*stallView, string, error) {
	if run.Status.Terminal() {
		return nil, fmt.Sprintf("run %s is %s: it has no work left to re-dispatch", run.ID, run.Status), nil
	}
	p, err := h.newProbe(r.Context())
	if err != nil {
		return nil, "", err
	}
	s, err := h.examineRun(r.Context(), p, run.ID, nil)
	if err != nil {
		return nil, "", err
	}
	if s == nil {
		return nil, fmt.Sprintf("run %s is not stalled: it made progress within the last %s (stall-after), or a worker holds it now; "+
			"nothing to re-dispatch", run.ID, roundAge(h.cfg.StallAfter)), nil
	}
	if !s.Stalled {
		return s, "run " + run.ID + " is " + s.Why + "; re-dispatch cannot help", nil
	}
	return s, "", nil
}

// redispatchView is the redispatch entry of a run detail's actions: offered
// while the run is stalled (stall), refused otherwise with why.
func redispatchView(status reactor.Status, stall *stallView, stallAfter time.Duration) actionView {
	switch {
	case status.Terminal():
		return actionView{Reason: "a finished run has no work left to re-dispatch"}
	case stall == nil:
		return actionView{Reason: "not stalled: the run made progress within " + roundAge(stallAfter) + " (stall-after), or a worker holds it"}
	case !stall.Stalled:
		return actionView{Reason: stall.Why + "; re-dispatch cannot help"}
	}
	return actionView{Allowed: true}
}
