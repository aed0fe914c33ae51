package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// rollbackStatusView is the JSON of GET /api/runs/{id}/rollback-status: the
// engine's report with its action_required list rendered as text
// (reactor.FormatActionRequired), for a ticket or a chat.
type rollbackStatusView struct {
	*reactor.RollbackReport
	// ActionRequired shadows the report's, to be [] rather than absent
	// when nothing is required.
	ActionRequired     []reactor.ActionItem `json:"action_required"`
	ActionRequiredText string               `json:"action_required_text"`
}

func viewOf(rep *reactor.RollbackReport) rollbackStatusView {
	v := rollbackStatusView{RollbackReport: rep, ActionRequired: rep.ActionRequired, ActionRequiredText: reactor.FormatActionRequired(rep)}
	if v.ActionRequired == nil {
		v.ActionRequired = []reactor.ActionItem{}
	}
	return v
}

// resolveRequest is the body of POST /api/runs/{id}/entries/{entry}/resolve.
type resolveRequest struct {
	Kind reactor.Resolution `json:"kind"`
	Note string             `json:"note"`
}

// maxEntryID bounds an entry id in a path.
const maxEntryID = 1024

// resolve serves POST /api/runs/{id}/entries/{entry}/resolve: what a person
// did about an entry whose guarded undo conflicted (reactor.Engine.Resolve,
// which needs no definitions, so it is carried out here, not by a worker).
// The answer is the run's rollback status after it.
func (h *Handler) resolve(w http.ResponseWriter, r *http.Request, id, entry string) {
	if !h.authorized(w, r) {
		return
	}
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	if entry == "" || len(entry) > maxEntryID {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("entry id must be 1 to %d bytes (the id of an action_required item, path-escaped: book%%2Fpay%%232 for book/pay#2)", maxEntryID))
		return
	}
	var req resolveRequest
	if !decodeBody(w, r, &req, `{"kind": "manually_reverted|left_applied", "note": "what you did"}`) {
		return
	}
	switch {
	case req.Kind != reactor.ResolvedManuallyReverted && req.Kind != reactor.ResolvedLeftApplied:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("kind %q is not %q (you put the resource back to its before state) or %q (it stays as it is)",
			req.Kind, reactor.ResolvedManuallyReverted, reactor.ResolvedLeftApplied))
		return
	case strings.TrimSpace(req.Note) == "":
		writeError(w, http.StatusBadRequest, "note is empty: "+reactor.ErrEmptyNote.Error())
		return
	}
	ctx := r.Context()
	err := h.engine.Resolve(ctx, id, entry, req.Kind, req.Note)
	var se *reactor.StatusError
	switch {
	case err == nil:
	case errors.Is(err, reactor.ErrNotFound):
		writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, or its retention expired)")
		return
	case errors.Is(err, reactor.ErrNoSuchConflict):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, reactor.ErrEmptyNote):
		writeError(w, http.StatusBadRequest, err.Error())
		return
	case errors.As(err, &se):
		writeJSON(w, http.StatusConflict, errorBody{Error: err.Error(), Status: string(se.Status)})
		return
	case errors.Is(err, reactor.ErrAlreadyResolved), errors.Is(err, reactor.ErrRunLocked):
		writeError(w, http.StatusConflict, err.Error())
		return
	default:
		if ctx.Err() == nil {
			h.log.Error("dashboard resolve failed", "event", "reactor.dashboard.error", "run", id, "entry", entry, "error", err)
		}
		writeError(w, http.StatusInternalServerError,
			fmt.Sprintf("the resolution of %s of run %s could not be recorded; the dashboard's log has the cause (event reactor.dashboard.error)", entry, id))
		return
	}
	who, _ := h.operator(r)
	if err := h.engine.RecordRequest(context.WithoutCancel(ctx), id, reactor.OperatorRequest{Action: "resolve", Operator: who,
		Reason: req.Note, Steps: []string{entry}}); err != nil {
		h.log.Error("a resolution was recorded but not its operator", "event", "reactor.dashboard.audit_failed",
			"run", id, "entry", entry, "operator", who, "error", err)
	}
	h.log.Info("a conflicted undo was resolved from the dashboard", "event", "reactor.dashboard.resolve", "run", id, "entry", entry,
		"resolution", string(req.Kind), "operator", who)
	rep, err := h.engine.RollbackReport(context.WithoutCancel(ctx), id)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(h.shownReport(r, rep)))
}

// needsHumanRun is one run of GET /api/needs-human.
type needsHumanRun struct {
	ID      string `json:"id"`
	Reactor string `json:"reactor"`
	Status  string `json:"status"`
	// Element is set for a map element run ("<mapID>.<i>").
	Element        *elementOf           `json:"element,omitempty"`
	UpdatedAt      string               `json:"updated_at"`
	RollbackID     string               `json:"rollback_id"`
	ActionRequired []reactor.ActionItem `json:"action_required"`
	// Sensitive marks a sensitive run; ValuesRedacted says its items'
	// values were replaced (the request did not carry the token).
	Sensitive      bool `json:"sensitive,omitempty"`
	ValuesRedacted bool `json:"values_redacted,omitempty"`
}

// needsHumanPage is GET /api/needs-human.
type needsHumanPage struct {
	Runs []needsHumanRun `json:"runs"`
	// More is true when more runs wait than limit.
	More bool `json:"more"`
}

// needsHuman serves GET /api/needs-human?limit=: the runs (root or map
// element runs) with a conflicted undo no person resolved, newest first,
// each with what its rollback status says must be done.
func (h *Handler) needsHuman(w http.ResponseWriter, r *http.Request) {
	limit := 50
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxBatch {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q must be a number from 1 to %d", s, maxBatch))
			return
		}
		limit = n
	}
	ctx := r.Context()
	ids, err := h.engine.NeedsHuman(ctx, limit+1)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	page := needsHumanPage{Runs: []needsHumanRun{}}
	if len(ids) > limit {
		ids, page.More = ids[:limit], true
	}
	listed := map[string]bool{}
	for _, id := range ids {
		listed[id] = true
	}
	for _, id := range ids {
		run, err := h.engine.Get(ctx, id)
		if errors.Is(err, reactor.ErrNotFound) {
			run, err = engine.Element(h.engine, ctx, id)
		}
		if errors.Is(err, reactor.ErrNotFound) {
			continue // gone since it was listed
		}
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		rep, err := h.engine.RollbackReport(ctx, id)
		if errors.Is(err, reactor.ErrNotFound) || errors.Is(err, reactor.ErrNoRollback) {
			continue
		}
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		if len(rep.ActionRequired) == 0 {
			continue // resolved since it was listed
		}
		rep = h.shownReport(r, rep)
		item := needsHumanRun{ID: id, Reactor: run.Reactor, Status: string(run.Status), UpdatedAt: stamp(run.UpdatedAt),
			RollbackID: rep.RollbackID, ActionRequired: rep.ActionRequired, Sensitive: rep.Sensitive, ValuesRedacted: rep.ValuesRedacted}
		if el := run.Element; el != nil {
			if listed[el.Owner] {
				// Its owner is listed, and the owner's report carries the
				// element's entries: one conflict, listed once.
				continue
			}
			item.Element = &elementOf{Owner: el.Owner, Step: el.Step, Index: el.Index}
		}
		page.Runs = append(page.Runs, item)
	}
	writeJSON(w, http.StatusOK, page)
}
