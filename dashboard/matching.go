package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// "Select all N matching": a batch action on every run a listing's filters
// match, not only the rows a page shows. The server resolves the filter
// with the listing's own code (list), so the runs acted on are the runs the
// list shows, and it acts only if their number is still the one the
// operator confirmed (expect). The alternative, the page fetching up to
// 5,000 ids and sending them in chunks of maxBatch, would ferry the ids
// through the browser and could not tell a confirmed count from a changed
// one between its chunks.

// maxMatching bounds the runs one matching batch acts on (and a count
// reports exactly): past it the operator narrows the filter (a time range).
var maxMatching = 5000

// matchScanBudget bounds the index entries one resolution examines (the
// listing's scanBudget, per request): a filter the index cannot apply (a
// failure text) that matches few of many entries stops here.
var matchScanBudget = 20000

// matchWorkers is how many of a matching batch's requests run at once.
const matchWorkers = 8

// matchFilter is a listing's filters in a matching batch's body (the
// parameters of GET /api/runs, less the page's).
type matchFilter struct {
	Status  string `json:"status"`
	Reactor string `json:"reactor"`
	Q       string `json:"q"`
	Failure string `json:"failure"`
	From    string `json:"from"`
	To      string `json:"to"`
	Sort    string `json:"sort"`
}

func (f matchFilter) query() (listQuery, error) {
	v := map[string]string{"status": f.Status, "reactor": f.Reactor, "q": f.Q, "failure": f.Failure,
		"from": f.From, "to": f.To, "sort": f.Sort}
	q := make(map[string][]string, len(v))
	for k, s := range v {
		if s != "" {
			q[k] = []string{s}
		}
	}
	return parseListValues(q)
}

// matched is what a filter matches: the ids, in listing order, of up to
// maxMatching runs.
type matched struct {
	IDs []string
	// Complete is false when the resolution stopped before the listing's
	// end: more than maxMatching runs match, or matchScanBudget entries
	// were examined (Why says which).
	Complete bool
	Why      string
	Examined int
}

// resolveMatching lists every run lq matches, page after page (list), up to the
// bounds.
func (h *Handler) resolveMatching(ctx context.Context, lq listQuery) (matched, error) {
	lq.limit, lq.cursor = maxLimit, ""
	var m matched
	seen := map[string]bool{}
	for {
		out, err := h.list(ctx, lq)
		if err != nil {
			return m, err
		}
		m.Examined += out.Examined
		for _, r := range out.Runs {
			if seen[r.ID] {
				continue // a run that moved ahead of the cursor
			}
			if len(m.IDs) == maxMatching {
				m.Why = fmt.Sprintf("more than %d runs match: narrow the filter (a time range) and act on each part", maxMatching)
				return m, nil
			}
			seen[r.ID] = true
			m.IDs = append(m.IDs, r.ID)
		}
		if out.NextCursor == "" {
			m.Complete = true
			return m, nil
		}
		if m.Examined >= matchScanBudget {
			m.Why = fmt.Sprintf("the filter was checked against %d runs without reaching the end of the listing: "+
				"narrow it (a status, a reactor, a time range) so that the index does more of the work", m.Examined)
			return m, nil
		}
		lq.cursor = out.NextCursor
	}
}

// pinned is lq with its time range ending now if it had no end: runs that
// arrive after a count (new failures) are not among the runs it counted,
// and the batch the count is confirmed for sends this end back.
func pinned(lq listQuery, now time.Time) listQuery {
	if lq.to == nil {
		ms := now.UnixMilli()
		lq.to = &ms
	}
	return lq
}

// matchCount is the answer to GET /api/matching.
type matchCount struct {
	Count    int  `json:"count"`
	Complete bool `json:"complete"`
	// Reason says why the count is not complete.
	Reason string `json:"reason,omitempty"`
	Max    int    `json:"max"`
	// Filter is the filter counted, its time range ended at the time of
	// the count when it had no end: send it back in the batch.
	Filter   matchFilter `json:"filter"`
	Examined int         `json:"examined"`
}

// matching serves GET /api/matching: how many runs a listing's filters
// match (up to maxMatching), for "select all N matching".
func (h *Handler) matching(w http.ResponseWriter, r *http.Request) {
	lq, err := parseList(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	lq = pinned(lq, time.Now())
	m, err := h.resolveMatching(r.Context(), lq)
	if err != nil {
		h.listError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, matchCount{Count: len(m.IDs), Complete: m.Complete, Reason: m.Why, Max: maxMatching,
		Filter: filterOf(lq), Examined: m.Examined})
}

// filterOf is lq's filters as a batch's body carries them.
func filterOf(lq listQuery) matchFilter {
	f := matchFilter{Status: string(lq.status), Reactor: lq.reactor, Q: lq.q, Failure: lq.failure, Sort: lq.sort}
	if lq.from != nil {
		f.From = stamp(time.UnixMilli(*lq.from))
	}
	if lq.to != nil {
		f.To = stamp(time.UnixMilli(*lq.to))
	}
	return f
}

// matchRefused is the 409 answer to a matching batch whose filter no
// longer matches the confirmed count.
type matchRefused struct {
	Error    string `json:"error"`
	Count    int    `json:"count"`
	Complete bool   `json:"complete"`
}

// batchMatching carries out a batch on the runs filter matches (req.Filter,
// req.Expect; batchAction checked the rest).
func (h *Handler) batchMatching(w http.ResponseWriter, r *http.Request, req batchRequest) {
	lq, err := req.Filter.query()
	if err != nil {
		writeError(w, http.StatusBadRequest, "filter: "+err.Error())
		return
	}
	if req.Expect == nil || *req.Expect < 1 {
		writeError(w, http.StatusBadRequest, "expect is missing: send the count the operator confirmed (GET /api/matching's count)")
		return
	}
	m, err := h.resolveMatching(r.Context(), lq)
	if err != nil {
		h.listError(w, r, err)
		return
	}
	switch {
	case !m.Complete:
		writeJSON(w, http.StatusConflict, matchRefused{Error: "nothing was requested: " + m.Why, Count: len(m.IDs)})
		return
	case len(m.IDs) != *req.Expect:
		writeJSON(w, http.StatusConflict, matchRefused{Error: fmt.Sprintf("nothing was requested: the filter matches %d runs now, "+
			"not the %d confirmed; count again and confirm the new number", len(m.IDs), *req.Expect), Count: len(m.IDs), Complete: true})
		return
	}
	out := batchResponse{Results: make([]batchResult, len(m.IDs)), Matched: len(m.IDs)}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(matchWorkers, len(m.IDs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out.Results[i], _ = h.request(r, m.IDs[i], req.Action, req.Reason)
			}
		}()
	}
	for i := range m.IDs {
		next <- i
	}
	close(next)
	wg.Wait()
	h.log.Info("an operator's batch on the runs of a filter", "event", "reactor.dashboard.batch_matching",
		"action", req.Action, "runs", len(m.IDs), "filter", lq.values().Encode(), "accepted", strconv.Itoa(accepted(out.Results)))
	writeJSON(w, http.StatusOK, out)
}

func accepted(rs []batchResult) int {
	n := 0
	for _, r := range rs {
		if r.StatusCode == http.StatusAccepted {
			n++
		}
	}
	return n
}

// listError answers a listing's error: 400 for a bad request (a cursor),
// else 500.
func (h *Handler) listError(w http.ResponseWriter, r *http.Request, err error) {
	var bad badRequest
	if errors.As(err, &bad) {
		writeError(w, http.StatusBadRequest, bad.Error())
		return
	}
	h.serverError(w, r, err)
}
