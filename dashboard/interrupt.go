package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

// Interrupts: a run paused at an interrupt step waits for payloads from
// outside (reactor.Engine.Continue). The dashboard lists the paused runs
// (GET /api/paused), shows the interrupt on the run's page, and lets an
// operator send a payload (POST /api/runs/{id}/continue) under the same
// rules as the other actions: a token or the trusted proxy's operator, a
// reason, and the request recorded in the run's audit.

// continueAction is the path and the audit name of a continue.
const continueAction = "continue"

// interruptView is the interrupt a paused run waits at (Interrupt in
// docs/dashboard-api.md).
type interruptView struct {
	Step        string `json:"step"`
	Correlation string `json:"correlation"`
	// Since is when the run paused, PausedMS how long ago.
	Since    string `json:"since"`
	PausedMS int64  `json:"paused_ms"`
	// Deadline is when the interrupt times out ("" for never), and
	// TimeLeftMS how long until then (null for never, 0 once past).
	Deadline   string `json:"deadline"`
	TimeLeftMS *int64 `json:"time_left_ms"`
	Accepts    int    `json:"accepts"`
	Received   int    `json:"received"`
	// PayloadType names the payload's Go type and Example is its zero
	// value as JSON: "" and null when the dashboard lacks the run's
	// definition (Config.Definitions).
	PayloadType string          `json:"payload_type"`
	Example     json.RawMessage `json:"example"`
	// Refused is why the run refused the last payload it refused, and
	// RefusedAt when ("" for none).
	Refused   string `json:"refused"`
	RefusedAt string `json:"refused_at"`
	// Payloads are the payloads received (a run's detail only), with when
	// and from whom; PayloadsRedacted says their values were replaced (a
	// sensitive run, a request without the token).
	Payloads         []payloadView `json:"payloads,omitempty"`
	PayloadsRedacted bool          `json:"payloads_redacted,omitempty"`
}

// payloadView is one payload an interrupt holds.
type payloadView struct {
	Payload json.RawMessage `json:"payload"`
	At      string          `json:"at"`
	By      string          `json:"by"`
}

// interruptOf renders info as of now; the payloads are left out unless
// withPayloads, and redacted unless showValues.
func interruptOf(info *reactor.InterruptInfo, now time.Time, withPayloads, showValues bool) *interruptView {
	v := &interruptView{Step: info.Step, Correlation: info.Correlation, Since: stamp(info.Since),
		PausedMS: max(0, now.Sub(info.Since).Milliseconds()), Deadline: stamp(info.Deadline), Accepts: info.Accepts,
		Received: info.Received, PayloadType: info.PayloadType, Refused: info.Refused, RefusedAt: stamp(info.RefusedAt)}
	if len(info.Example) > 0 {
		v.Example = info.Example
	}
	if !info.Deadline.IsZero() {
		left := max(0, info.Deadline.Sub(now).Milliseconds())
		v.TimeLeftMS = &left
	}
	if withPayloads {
		v.Payloads = make([]payloadView, 0, len(info.Payloads))
		redacted, _ := json.Marshal(reactor.RedactedValue)
		for _, p := range info.Payloads {
			pv := payloadView{Payload: p.Payload, At: stamp(p.At), By: p.By}
			if !showValues {
				pv.Payload, v.PayloadsRedacted = redacted, true
			}
			v.Payloads = append(v.Payloads, pv)
		}
	}
	return v
}

// continueView is the continue entry of a run detail's actions: offered
// while the run is paused at an interrupt that still waits for payloads.
func continueView(run *reactor.Run, intr *interruptView) actionView {
	switch {
	case run.Element != nil:
		return actionView{Reason: "a map element's run cannot pause at an interrupt"}
	case run.Status != reactor.StatusPaused || intr == nil:
		return actionView{Reason: fmt.Sprintf("run %s is %s, not paused at an interrupt: there is nothing to continue", run.ID, run.Status)}
	case intr.Received >= intr.Accepts:
		return actionView{Reason: fmt.Sprintf("the interrupt at step %s holds every payload it accepts (%d); the run goes on when a worker takes them",
			intr.Step, intr.Accepts)}
	}
	return actionView{Allowed: true}
}

// interruptDetail reads the interrupt run waits at for its detail: nil when
// it waits at none (it went on since it was read).
func (h *Handler) interruptDetail(ctx context.Context, r *http.Request, run *reactor.Run) (*interruptView, error) {
	if run.Status != reactor.StatusPaused || run.Element != nil {
		return nil, nil
	}
	info, err := h.engine.Interrupt(ctx, run.ID)
	if errors.Is(err, reactor.ErrNotPaused) || errors.Is(err, reactor.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return interruptOf(info, time.Now(), true, h.mayReadValues(r, run)), nil
}

// pausedRun is one run of GET /api/paused.
type pausedRun struct {
	ID      string `json:"id"`
	Reactor string `json:"reactor"`
	*interruptView
}

// pausedPage is GET /api/paused.
type pausedPage struct {
	Runs       []pausedRun `json:"runs"`
	NextCursor string      `json:"next_cursor"`
	// Examined is how many index entries the request read.
	Examined int `json:"examined"`
}

// pausedRuns serves GET /api/paused?reactor=&limit=&cursor=: the runs
// paused at an interrupt, newest pause first, from the status index of
// paused (a page of it, as GET /api/runs?status=paused reads), each with
// its interrupt: the step, correlation id, since, deadline and time left,
// payloads received of accepted, the expected payload and the last refusal.
// Reading each run's interrupt is two reads, so a page is bounded by limit
// (default 50, at most 500).
func (h *Handler) pausedRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k := range q {
		if k != "reactor" && k != "limit" && k != "cursor" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("parameter %q is not one of reactor, limit, cursor (GET /api/runs?status=paused filters more)", k))
			return
		}
	}
	v := url.Values{"status": {string(reactor.StatusPaused)}, "sort": {sortEntered}}
	for _, k := range []string{"reactor", "limit", "cursor"} {
		if s := q.Get(k); s != "" {
			v.Set(k, s)
		}
	}
	lq, err := parseListValues(v)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	list, err := h.page(ctx, lq)
	var bad badRequest
	if errors.As(err, &bad) {
		writeError(w, http.StatusBadRequest, bad.Error())
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	out := pausedPage{Runs: []pausedRun{}, NextCursor: list.NextCursor, Examined: list.Examined}
	now := time.Now()
	for _, s := range list.Runs {
		info, err := h.engine.Interrupt(ctx, s.ID)
		if errors.Is(err, reactor.ErrNotPaused) || errors.Is(err, reactor.ErrNotFound) {
			continue // went on, or gone, since it was listed
		}
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		out.Runs = append(out.Runs, pausedRun{ID: s.ID, Reactor: s.Reactor, interruptView: interruptOf(info, now, false, false)})
	}
	writeJSON(w, http.StatusOK, out)
}

// continueRequest is the body of POST /api/runs/{id}/continue.
type continueRequest struct {
	Step    string          `json:"step"`
	Payload json.RawMessage `json:"payload"`
	Reason  string          `json:"reason"`
}

// continueAccepted is the 202 answer to a continue.
type continueAccepted struct {
	RunID  string `json:"run_id"`
	Action string `json:"action"`
	Step   string `json:"step"`
	// At is when the payload was recorded (the Redis server's time);
	// Received and Accepts count the interrupt's payloads, this one in.
	At       string `json:"at"`
	Received int    `json:"received"`
	Accepts  int    `json:"accepts"`
	// Woken is true when this was the last payload the interrupt waited
	// for and the run's wake-up was enqueued; Checked when the dashboard
	// checked the payload against the step (Config.Definitions) before
	// recording it, else the worker checks it.
	Woken   bool   `json:"woken"`
	Checked bool   `json:"checked"`
	Queue   string `json:"queue,omitempty"`
	Warning string `json:"warning,omitempty"`
}

// continueConflict is the 409 answer to a continue.
type continueConflict struct {
	Error  string `json:"error"`
	Status string `json:"status,omitempty"`
	// Reason is why: already_continued (At: when the first payload came),
	// not_paused, timed_out or finished.
	Reason string `json:"reason"`
	At     string `json:"at,omitempty"`
}

// continueRun serves POST /api/runs/{id}/continue: body {"step", "payload",
// "reason"}, the payload recorded for the interrupt run id waits at
// (reactor.Engine.Continue, sent by the operator), the run woken on its
// queue when it was the last one the interrupt waited for. 202 with the
// continuation; 404 for an unknown run; 409 when it is already continued
// (with when), not paused there, timed out or finished; 422 with why when
// the payload does not fit the step (checked here with Config.Definitions,
// else by the worker: the run page then shows the refusal).
func (h *Handler) continueRun(w http.ResponseWriter, r *http.Request, id string) {
	if !h.authorized(w, r) {
		return
	}
	var req continueRequest
	if !decodeBody(w, r, &req, `{"step": "approve", "payload": {...}, "reason": "why you ask"}`) {
		return
	}
	if msg := checkReason(req.Reason); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	switch {
	case keys.ValidateID(id) != nil:
		writeError(w, http.StatusBadRequest, "run id: "+keys.ValidateID(id).Error())
		return
	case strings.TrimSpace(req.Step) == "":
		writeError(w, http.StatusBadRequest, `step is empty: name the interrupt step the run waits at ("approve", or "book/approve" inside a composed child; the run's page shows it)`)
		return
	case len(req.Payload) == 0 || string(req.Payload) == "null":
		writeError(w, http.StatusBadRequest, `payload is missing: send the JSON value the interrupt step takes ("payload": {...})`)
		return
	}
	ctx := r.Context()
	who, _ := h.operator(r)
	sender := who
	if sender == "" {
		sender = "dashboard"
	}
	c, err := h.continuer.Continue(ctx, id, req.Step, req.Payload, reactor.ContinueBy(sender))
	var (
		ce  *reactor.ContinueError
		ace *reactor.AlreadyContinuedError
		pe  *reactor.PayloadError
	)
	switch {
	case c != nil:
		// Recorded (err, if any, says the wake-up failed: the sweeper
		// wakes the run).
	case errors.Is(err, reactor.ErrNotFound):
		writeError(w, http.StatusNotFound, "no run "+id+" is stored (unknown id, or its retention expired)")
		return
	case errors.As(err, &ace):
		writeJSON(w, http.StatusConflict, continueConflict{Error: fmt.Sprintf("run %s was already continued at step %s: its first payload came at %s",
			id, ace.Step, stamp(ace.At)), Reason: "already_continued", At: stamp(ace.At)})
		return
	case errors.As(err, &pe):
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("the payload does not fit step %s: %v; nothing was recorded and the run stays paused", pe.Step, pe.Err))
		return
	case errors.As(err, &ce):
		reason := "not_paused"
		switch {
		case errors.Is(ce, reactor.ErrInterruptTimedOut):
			reason = "timed_out"
		case errors.Is(ce, reactor.ErrAlreadyFinished):
			reason = "finished"
		}
		writeJSON(w, http.StatusConflict, continueConflict{Error: err.Error(), Status: string(ce.Status), Reason: reason})
		return
	default:
		if ctx.Err() == nil {
			h.log.Error("dashboard continue failed", "event", "reactor.dashboard.error", "run", id, "step", req.Step, "error", err)
		}
		writeError(w, http.StatusInternalServerError, fmt.Sprintf("the continue of run %s could not be recorded; the dashboard's log has the cause (event reactor.dashboard.error)", id))
		return
	}
	out := continueAccepted{RunID: id, Action: continueAction, Step: c.Step, At: stamp(c.At), Received: c.Received,
		Accepts: c.Accepts, Woken: c.Woken, Checked: c.Checked}
	if err != nil {
		h.log.Warn("a continue was recorded but its run's wake-up failed", "event", "reactor.dashboard.error", "run", id, "error", err)
		out.Warning = "the payload is recorded, but the run's wake-up could not be enqueued: the run sweeper wakes it on its next pass"
	}
	if c.Woken {
		if run, gerr := h.engine.Get(context.WithoutCancel(ctx), id); gerr == nil {
			out.Queue = run.Queue
			if out.Queue == "" {
				out.Queue = h.cfg.ControlQueue
			}
			if out.Warning == "" {
				out.Warning = h.unservedWarning(ctx, id, continueAction, out.Queue)
			}
		}
	}
	h.recordRequest(r, id, reactor.OperatorRequest{Action: continueAction, Reason: req.Reason, Steps: []string{c.Step}}, "")
	writeJSON(w, http.StatusAccepted, out)
}
