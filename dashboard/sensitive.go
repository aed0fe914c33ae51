package dashboard

import (
	"net/http"

	"github.com/goreactor/goreactor/reactor"
)

// Sensitive runs. A run whose inputs were declared reactor.Sensitive is
// shown like any other, except that its inputs and the values of its
// guarded undo (the states before and after a step, and what a conflicting
// undo read) are shown only to a request carrying the dashboard's token
// (Config.Token, "Authorization: Bearer <token>"), the one the actions need.
// Without it (or with no token configured, when nobody holds one) they are
// replaced with reactor.RedactedValue, and the answer says so
// (inputs_redacted, values_redacted). Fingerprints, step names, resources
// and the rest are shown as for any run. A wrong token is not refused: the
// answer is the redacted one.

// shownReport is rep as request r may see it: redacted for a sensitive run
// unless r carries the token.
func (h *Handler) shownReport(r *http.Request, rep *reactor.RollbackReport) *reactor.RollbackReport {
	if rep == nil || !rep.Sensitive || h.tokenHolder(r) {
		return rep
	}
	return rep.Redacted()
}

// mayReadValues reports whether r may read run's inputs: the run is not
// sensitive, or r carries the token.
func (h *Handler) mayReadValues(r *http.Request, run *reactor.Run) bool {
	return !run.Sensitive || h.tokenHolder(r)
}
