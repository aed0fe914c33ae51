package dashboard

import (
	"context"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/internal/engine"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/reactor"
)

var (
	//go:embed lua/page.lua
	pageSrc    string
	pageScript = redis.NewScript(pageSrc)
)

// Listing limits.
const (
	defaultLimit = 50
	maxLimit     = 500
)

// runSummary is a run in a listing (RunSummary in docs/dashboard-api.md).
type runSummary struct {
	ID        string          `json:"id"`
	Reactor   string          `json:"reactor"`
	Status    reactor.Status  `json:"status"`
	CreatedAt string          `json:"created_at"`
	UpdatedAt string          `json:"updated_at"`
	ElapsedMS int64           `json:"elapsed_ms"`
	Failure   *failureSummary `json:"failure"`
}

type failureSummary struct {
	Step    string `json:"step"`
	Message string `json:"message"`
}

type runList struct {
	Runs       []runSummary `json:"runs"`
	NextCursor string       `json:"next_cursor"`
	// Partial is true when the page holds fewer runs than asked for
	// although the listing goes on (next_cursor): the filters matched none
	// of the scanBudget entries this request examined beyond them.
	Partial bool `json:"partial,omitempty"`
	// Examined is how many index entries the request read: with a filter
	// the index cannot apply (failure text, a status under sort=created, a
	// time range with q) it says how far a partial page searched.
	Examined int `json:"examined"`
}

// scanBudget bounds the index entries one listing request examines: a page
// keeps reading past the entries its filters drop (an id search with a
// status, a failure text, stale entries) until it is full, the index ends,
// or this many were examined.
var scanBudget = 2000

// filteredChunk is how many index entries a page reads per round trip when
// a filter the index cannot apply drops runs (failure text, status under
// sort=created): fewer round trips for the same scanBudget.
const filteredChunk = 250

// stamp formats t as RFC 3339 with milliseconds, in UTC ("" for zero).
func stamp(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// elapsed is how long the run has taken: to its last write once finished,
// to now while live.
func elapsed(r *reactor.Run, now time.Time) int64 {
	end := r.UpdatedAt
	if !r.Status.Terminal() {
		end = now
	}
	return max(0, end.Sub(r.CreatedAt).Milliseconds())
}

func summarize(r *reactor.Run, now time.Time) runSummary {
	s := runSummary{ID: r.ID, Reactor: r.Reactor, Status: r.Status, CreatedAt: stamp(r.CreatedAt),
		UpdatedAt: stamp(r.UpdatedAt), ElapsedMS: elapsed(r, now)}
	if r.Failure != nil {
		s.Failure = &failureSummary{Step: r.Failure.Step, Message: r.Failure.Message}
	}
	return s
}

// cursor is the last entry a page showed: its score and member.
type cursor struct {
	score  float64
	member string
}

func (c cursor) encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatFloat(c.score, 'f', -1, 64) + ":" + c.member))
}

func decodeCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return cursor{}, errors.New("cursor is not one this dashboard returned (pass next_cursor back unchanged)")
	}
	sc, member, ok := strings.Cut(string(b), ":")
	score, perr := strconv.ParseFloat(sc, 64)
	if !ok || perr != nil || member == "" {
		return cursor{}, errors.New("cursor is not one this dashboard returned (pass next_cursor back unchanged)")
	}
	return cursor{score: score, member: member}, nil
}

// The orders a listing can have (parameter sort).
const (
	// sortCreated is newest created first (P:idx:runs, P:idx:reactor:<n>).
	sortCreated = "created"
	// sortEntered is newest entry into the status first (P:idx:status:<s>,
	// P:idx:rs:<n>:<s>): for a finished run, the time of its last write.
	sortEntered = "entered"
)

type listQuery struct {
	status  reactor.Status
	reactor string
	q       string
	// failure is a case-insensitive text the run's failure (step, code or
	// message) must contain; lowered.
	failure string
	// from and to bound the listing's order key (ms, inclusive): the
	// creation time, or the time the run entered its status (sort).
	from, to *int64
	sort     string
	limit    int
	cursor   string
}

// maxFailureText bounds the failure text of a search.
const maxFailureText = 200

func parseList(r *http.Request) (listQuery, error) { return parseListValues(r.URL.Query()) }

// parseListValues reads a listing's parameters: GET /api/runs's query, or
// a matching batch's filter (filter.values).
func parseListValues(v url.Values) (listQuery, error) {
	lq := listQuery{status: reactor.Status(v.Get("status")), reactor: v.Get("reactor"), q: v.Get("q"),
		failure: strings.ToLower(strings.TrimSpace(v.Get("failure"))), sort: v.Get("sort"),
		limit: defaultLimit, cursor: v.Get("cursor")}
	if lq.status != "" && !slices.Contains(reactor.Statuses(), lq.status) {
		names := make([]string, 0, 9)
		for _, s := range reactor.Statuses() {
			names = append(names, string(s))
		}
		return lq, fmt.Errorf("status %q is not a run status (one of %s)", lq.status, strings.Join(names, ", "))
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		switch {
		case err != nil || n < 1:
			return lq, fmt.Errorf("limit %q is not a positive number", s)
		case n > maxLimit:
			return lq, fmt.Errorf("limit %d is over the maximum of %d; page with next_cursor instead", n, maxLimit)
		}
		lq.limit = n
	}
	if lq.q != "" {
		if err := keys.ValidateID(lq.q); err != nil {
			return lq, fmt.Errorf("q: %v", err)
		}
	}
	if len(lq.failure) > maxFailureText {
		return lq, fmt.Errorf("failure text is over %d bytes", maxFailureText)
	}
	switch lq.sort {
	case "":
		lq.sort = sortCreated
		if lq.status != "" {
			lq.sort = sortEntered
		}
	case sortCreated:
	case sortEntered:
		if lq.status == "" {
			return lq, errors.New("sort=entered orders by the time runs entered a status: give a status too, or sort=created")
		}
	default:
		return lq, fmt.Errorf("sort %q is not created or entered (no index orders runs by their last update: see docs/dashboard-api.md)", lq.sort)
	}
	for _, p := range []struct {
		name string
		to   **int64
	}{{"from", &lq.from}, {"to", &lq.to}} {
		s := v.Get(p.name)
		if s == "" {
			continue
		}
		ms, err := parseTime(s)
		if err != nil {
			return lq, fmt.Errorf("%s %q is not an RFC 3339 time (2026-12-01T10:00:00Z) or Unix milliseconds", p.name, s)
		}
		*p.to = &ms
	}
	if lq.from != nil && lq.to != nil && *lq.from > *lq.to {
		return lq, errors.New("from is after to: the time range is empty")
	}
	return lq, nil
}

// parseTime reads an RFC 3339 time or Unix milliseconds.
func parseTime(s string) (int64, error) {
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		return ms, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}

// values is lq as the query of a listing (the filters, not the page).
func (lq listQuery) values() url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("status", string(lq.status))
	set("reactor", lq.reactor)
	set("q", lq.q)
	set("failure", lq.failure)
	set("sort", lq.sort)
	if lq.from != nil {
		v.Set("from", strconv.FormatInt(*lq.from, 10))
	}
	if lq.to != nil {
		v.Set("to", strconv.FormatInt(*lq.to, 10))
	}
	return v
}

// listRuns serves GET /api/runs.
func (h *Handler) listRuns(w http.ResponseWriter, r *http.Request) {
	lq, err := parseList(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	out, err := h.list(r.Context(), lq)
	var bad badRequest
	if errors.As(err, &bad) {
		writeError(w, http.StatusBadRequest, bad.Error())
		return
	}
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if out.Runs == nil {
		out.Runs = []runSummary{}
	}
	writeJSON(w, http.StatusOK, out)
}

// list is one page of the listing lq names.
func (h *Handler) list(ctx context.Context, lq listQuery) (runList, error) {
	if lq.q != "" {
		return h.search(ctx, lq)
	}
	return h.page(ctx, lq)
}

type badRequest struct{ error }

// indexFor is the index a listing with these filters reads: one ordered by
// creation (sort=created), or by entry into the status.
func (h *Handler) indexFor(lq listQuery) string {
	status := lq.status
	if lq.sort == sortCreated {
		status = "" // read in creation order; matches drops the other statuses
	}
	switch {
	case lq.reactor != "" && status != "":
		return h.keys.ReactorStatus(lq.reactor, string(status))
	case lq.reactor != "":
		return h.keys.Reactor(lq.reactor)
	case status != "":
		return h.keys.Status(string(status))
	}
	return h.keys.Runs()
}

// postFiltered reports whether lq's page drops entries of its index that
// are current (not stale): their run fails a filter the index cannot apply.
func (lq listQuery) postFiltered() bool {
	return lq.failure != "" || (lq.status != "" && lq.sort == sortCreated)
}

// matches reports whether run r passes lq's filters: an index entry can be
// stale for a moment (a run between its state write and its index update)
// or left behind until the trimmer's next pass; a failure text, and a
// status under sort=created, are not in the index at all. A time range is
// the index's score range, except for an id search (the id index has no
// time): there it bounds the creation time.
func (lq listQuery) matches(r *reactor.Run) bool {
	if r == nil || (lq.status != "" && r.Status != lq.status) || (lq.reactor != "" && r.Reactor != lq.reactor) {
		return false
	}
	if lq.failure != "" {
		f := r.Failure
		if f == nil || !(strings.Contains(strings.ToLower(f.Message), lq.failure) ||
			strings.Contains(strings.ToLower(f.Step), lq.failure) || strings.Contains(strings.ToLower(f.Code), lq.failure)) {
			return false
		}
	}
	if lq.q != "" {
		c := r.CreatedAt.UnixMilli()
		if (lq.from != nil && c < *lq.from) || (lq.to != nil && c > *lq.to) {
			return false
		}
	}
	return true
}

// scoreRange is lq's time range as page.lua's score bounds.
func (lq listQuery) scoreRange() (hi, lo string) {
	hi, lo = "+inf", "-inf"
	if lq.to != nil {
		hi = strconv.FormatInt(*lq.to, 10)
	}
	if lq.from != nil {
		lo = strconv.FormatInt(*lq.from, 10)
	}
	return hi, lo
}

// take adds to out the runs of a chunk that lq matches, in order, and
// counts the entries it examined. It reports true once the page is full,
// with out's cursor after the last run taken (cursorAt) when the listing
// goes on: entries after it in this chunk, or more chunks.
func (lq listQuery) take(out *runList, runs []*reactor.Run, now time.Time, more bool, cursorAt func(i int) string) bool {
	for i, run := range runs {
		if lq.matches(run) {
			out.Runs = append(out.Runs, summarize(run, now))
		}
		if len(out.Runs) == lq.limit {
			out.Examined += i + 1
			if more || i < len(runs)-1 {
				out.NextCursor = cursorAt(i)
			}
			return true
		}
	}
	out.Examined += len(runs)
	return false
}

// page reads a page of an index after the cursor (one round trip), then
// its runs (one more), and reads on while entries its filters drop leave it
// short (scanBudget).
func (h *Handler) page(ctx context.Context, lq listQuery) (runList, error) {
	var c cursor
	if lq.cursor != "" {
		var err error
		if c, err = decodeCursor(lq.cursor); err != nil {
			return runList{}, badRequest{err}
		}
	}
	chunk := lq.limit
	if lq.postFiltered() {
		chunk = max(chunk, min(filteredChunk, scanBudget))
	}
	hi, lo := lq.scoreRange()
	var out runList
	now := time.Now()
	for {
		args := []any{chunk + 1, "", "", hi, lo}
		if c.member != "" {
			args = []any{chunk + 1, strconv.FormatFloat(c.score, 'f', -1, 64), c.member, hi, lo}
		}
		flat, err := pageScript.Run(ctx, h.rdb, []string{h.indexFor(lq)}, args...).StringSlice()
		if err != nil {
			return runList{}, fmt.Errorf("read the listing index: %w", err)
		}
		entries := make([]cursor, 0, len(flat)/2)
		for i := 0; i+1 < len(flat); i += 2 {
			score, _ := strconv.ParseFloat(flat[i+1], 64)
			e := cursor{score: score, member: flat[i]}
			if c.member != "" && (e.score > c.score || (e.score == c.score && e.member >= c.member)) {
				continue // at or before the cursor: shown already
			}
			entries = append(entries, e)
		}
		more := len(entries) > chunk
		if more {
			entries = entries[:chunk]
		}
		ids := make([]string, len(entries))
		for i, e := range entries {
			ids[i] = e.member
		}
		runs, err := engine.Runs(h.engine, ctx, ids)
		if err != nil {
			return runList{}, err
		}
		if lq.take(&out, runs, now, more, func(i int) string { return entries[i].encode() }) {
			return out, nil
		}
		if !more {
			return out, nil
		}
		c = entries[len(entries)-1]
		if out.Examined >= scanBudget {
			out.NextCursor, out.Partial = c.encode(), true
			return out, nil
		}
	}
}

// search finds runs by id or id prefix: the lexicographic id index, in id
// order, with the last id examined as the cursor, reading on while the
// filters leave the page short (scanBudget). An exact id that the index
// does not hold (a run stored before the index existed) is found by its
// state on the first page.
func (h *Handler) search(ctx context.Context, lq listQuery) (runList, error) {
	lo := "[" + lq.q
	if lq.cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(lq.cursor)
		if err != nil || len(b) == 0 || !strings.HasPrefix(string(b), lq.q) {
			return runList{}, badRequest{errors.New("cursor is not one this dashboard returned for this q (pass next_cursor back unchanged)")}
		}
		lo = "(" + string(b)
	}
	chunk := lq.limit
	if lq.postFiltered() || lq.from != nil || lq.to != nil {
		chunk = max(chunk, min(filteredChunk, scanBudget))
	}
	var out runList
	now := time.Now()
	first := lq.cursor == ""
	for {
		ids, err := h.rdb.ZRangeByLex(ctx, h.keys.IDs(), &redis.ZRangeBy{Min: lo, Max: "[" + lq.q + "\xff", Count: int64(chunk + 1)}).Result()
		if err != nil {
			return runList{}, fmt.Errorf("read the id index: %w", err)
		}
		more := len(ids) > chunk
		if more {
			ids = ids[:chunk]
		}
		// The exact id sorts first among the ids it prefixes: absent from
		// the first batch, it is absent from the index.
		if first && !slices.Contains(ids, lq.q) {
			ids = append([]string{lq.q}, ids...)
		}
		first = false
		runs, err := engine.Runs(h.engine, ctx, ids)
		if err != nil {
			return runList{}, err
		}
		if lq.take(&out, runs, now, more, func(i int) string { return base64.RawURLEncoding.EncodeToString([]byte(ids[i])) }) {
			return out, nil
		}
		if !more {
			return out, nil
		}
		last := ids[len(ids)-1]
		lo = "(" + last
		if out.Examined >= scanBudget {
			out.NextCursor, out.Partial = base64.RawURLEncoding.EncodeToString([]byte(last)), true
			return out, nil
		}
	}
}
