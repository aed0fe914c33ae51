package dashboard

import (
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
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
}

// scanBudget bounds the index entries one listing request examines: a page
// keeps reading past the entries its filters drop (an id search with a
// status, stale entries) until it is full, the index ends, or this many
// were examined.
var scanBudget = 2000

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

type listQuery struct {
	status  reactor.Status
	reactor string
	q       string
	limit   int
	cursor  string
}

func parseList(r *http.Request) (listQuery, error) {
	v := r.URL.Query()
	lq := listQuery{status: reactor.Status(v.Get("status")), reactor: v.Get("reactor"), q: v.Get("q"),
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
	return lq, nil
}

// listRuns serves GET /api/runs.
func (h *Handler) listRuns(w http.ResponseWriter, r *http.Request) {
	lq, err := parseList(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	var out runList
	if lq.q != "" {
		out, err = h.search(r, lq)
	} else {
		out, err = h.page(r, lq)
	}
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

type badRequest struct{ error }

// indexFor is the index a listing with these filters reads.
func (h *Handler) indexFor(lq listQuery) string {
	switch {
	case lq.reactor != "" && lq.status != "":
		return h.keys.ReactorStatus(lq.reactor, string(lq.status))
	case lq.reactor != "":
		return h.keys.Reactor(lq.reactor)
	case lq.status != "":
		return h.keys.Status(string(lq.status))
	}
	return h.keys.Runs()
}

// matches reports whether run r passes lq's filters: an index entry can be
// stale for a moment (a run between its state write and its index update)
// or left behind until the trimmer's next pass.
func (lq listQuery) matches(r *reactor.Run) bool {
	return r != nil && (lq.status == "" || r.Status == lq.status) && (lq.reactor == "" || r.Reactor == lq.reactor)
}

// page reads a page of an index after the cursor (one round trip), then
// its runs (one more), and reads on while entries its filters drop leave it
// short (scanBudget).
func (h *Handler) page(r *http.Request, lq listQuery) (runList, error) {
	ctx := r.Context()
	var c cursor
	if lq.cursor != "" {
		var err error
		if c, err = decodeCursor(lq.cursor); err != nil {
			return runList{}, badRequest{err}
		}
	}
	var out runList
	now := time.Now()
	for examined := 0; ; {
		args := []any{lq.limit + 1, "", ""}
		if c.member != "" {
			args = []any{lq.limit + 1, strconv.FormatFloat(c.score, 'f', -1, 64), c.member}
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
		more := len(entries) > lq.limit
		if more {
			entries = entries[:lq.limit]
		}
		ids := make([]string, len(entries))
		for i, e := range entries {
			ids[i] = e.member
		}
		runs, err := engine.Runs(h.engine, ctx, ids)
		if err != nil {
			return runList{}, err
		}
		for i, run := range runs {
			if lq.matches(run) {
				out.Runs = append(out.Runs, summarize(run, now))
			}
			if len(out.Runs) == lq.limit {
				if more || i < len(runs)-1 {
					out.NextCursor = entries[i].encode()
				}
				return out, nil
			}
		}
		examined += len(entries)
		if !more {
			return out, nil
		}
		c = entries[len(entries)-1]
		if examined >= scanBudget {
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
func (h *Handler) search(r *http.Request, lq listQuery) (runList, error) {
	ctx := r.Context()
	lo := "[" + lq.q
	if lq.cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(lq.cursor)
		if err != nil || len(b) == 0 || !strings.HasPrefix(string(b), lq.q) {
			return runList{}, badRequest{errors.New("cursor is not one this dashboard returned for this q (pass next_cursor back unchanged)")}
		}
		lo = "(" + string(b)
	}
	var out runList
	now := time.Now()
	first := lq.cursor == ""
	for examined := 0; ; {
		ids, err := h.rdb.ZRangeByLex(ctx, h.keys.IDs(), &redis.ZRangeBy{Min: lo, Max: "[" + lq.q + "\xff", Count: int64(lq.limit + 1)}).Result()
		if err != nil {
			return runList{}, fmt.Errorf("read the id index: %w", err)
		}
		more := len(ids) > lq.limit
		if more {
			ids = ids[:lq.limit]
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
		for i, run := range runs {
			if lq.matches(run) {
				out.Runs = append(out.Runs, summarize(run, now))
			}
			if len(out.Runs) == lq.limit {
				if more || i < len(runs)-1 {
					out.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(ids[i]))
				}
				return out, nil
			}
		}
		examined += len(ids)
		if !more {
			return out, nil
		}
		last := ids[len(ids)-1]
		lo = "(" + last
		if examined >= scanBudget {
			out.NextCursor, out.Partial = base64.RawURLEncoding.EncodeToString([]byte(last)), true
			return out, nil
		}
	}
}
