package dashboard

import (
	"errors"
	"net/http"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// rollbackStatus serves GET /api/runs/{id}/rollback-status: the run's latest
// rollback, entry by entry, with its summary (reactor.RollbackReport) and
// what a person must act on, as a list and as text (rollbackStatusView).
func (h *Handler) rollbackStatus(w http.ResponseWriter, r *http.Request, id string) {
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	rep, err := h.engine.RollbackReport(r.Context(), id)
	switch {
	case errors.Is(err, reactor.ErrNotFound):
		writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, or its retention expired)")
	case errors.Is(err, reactor.ErrNoRollback):
		writeError(w, http.StatusNotFound, err.Error())
	case err != nil:
		h.serverError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, viewOf(h.shownReport(r, rep)))
	}
}

// auditPage is GET /api/runs/{id}/audit.
type auditPage struct {
	RunID   string               `json:"run_id"`
	Entries []reactor.AuditEntry `json:"entries"`
}

// audit serves GET /api/runs/{id}/audit: the run's audit trail, oldest
// first.
func (h *Handler) audit(w http.ResponseWriter, r *http.Request, id string) {
	if err := keys.ValidateID(id); err != nil {
		writeError(w, http.StatusBadRequest, "run id: "+err.Error())
		return
	}
	ctx := r.Context()
	if _, err := h.engine.Get(ctx, id); errors.Is(err, reactor.ErrNotFound) {
		if _, eerr := h.engine.RollbackReport(ctx, id); errors.Is(eerr, reactor.ErrNotFound) {
			writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, or its retention expired)")
			return
		}
	}
	entries, err := h.engine.Audit(ctx, id)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if entries == nil {
		entries = []reactor.AuditEntry{}
	}
	writeJSON(w, http.StatusOK, auditPage{RunID: id, Entries: entries})
}
