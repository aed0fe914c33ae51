package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

// seq is the seeded run ids from hi down to lo (seedRuns), newest first.
func seq(hi, lo int, keep func(int) bool) []string {
	var out []string
	for i := hi; i >= lo; i-- {
		if keep == nil || keep(i) {
			out = append(out, fmt.Sprintf("run-%07d", i))
		}
	}
	return out
}

func failedSeed(i int) bool { return i%10 == 0 }

// listAll follows next_cursor from path to the end of the listing.
func (e *env) listAll(path string) []string {
	e.t.Helper()
	var all []string
	cursor := ""
	for range 100 {
		var l runList
		p := path
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		e.get(p, http.StatusOK, &l)
		all = append(all, runIDs(l)...)
		if cursor = l.NextCursor; cursor == "" {
			return all
		}
	}
	e.t.Fatalf("%s: no end after 100 pages", path)
	return nil
}

// A time range is the score range of the index the listing reads: the
// creation time (no status, or sort=created), or the time the run entered
// its status (a status; sort=entered). Sort by created with a status reads
// the creation index and drops the other statuses; a failure text filters
// the runs the page reads. An id search bounds the creation time. Bad
// parameters are 400s that say what to send.
func TestListTimeRangeSortAndFailureText(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	seedRuns(t, e, 100, base) // run-0000000..99 (every tenth failed) and tpl-ok, tpl-bad (now)
	ms := func(d int) string {
		return strconv.FormatInt(base.Add(time.Duration(d)*time.Millisecond).UnixMilli(), 10)
	}
	rfc := func(d int) string {
		return url.QueryEscape(base.Add(time.Duration(d) * time.Millisecond).UTC().Format(time.RFC3339Nano))
	}

	// Created between base+10ms and base+19ms: runs 20..39 (two a ms),
	// newest first, in one page or paged.
	var l runList
	e.get("/api/runs?from="+rfc(10)+"&to="+ms(19), http.StatusOK, &l)
	require.Equal(t, seq(39, 20, nil), runIDs(l))
	require.Empty(t, l.NextCursor)
	require.Equal(t, seq(39, 20, nil), e.listAll("/api/runs?limit=7&from="+ms(10)+"&to="+rfc(19)))
	require.Equal(t, seq(39, 20, failedSeed), e.listAll("/api/runs?reactor=bench-bad&limit=1&from="+ms(10)+"&to="+ms(19)))

	// Run 0 enters failed again, late: first by entry into the status,
	// last by creation.
	st, err := store.New(ctx, e.rdb, keys.New(e.prefix))
	require.NoError(t, err)
	require.NoError(t, st.MarkStatus(ctx, "run-0000000", "bench-bad", "failed", "failed", true, base.Add(time.Second)))
	byEntry := append([]string{"tpl-bad", "run-0000000"}, seq(99, 10, failedSeed)...)
	byCreation := append([]string{"tpl-bad"}, seq(99, 0, failedSeed)...)
	require.Equal(t, byEntry, e.listAll("/api/runs?status=failed&limit=4"))
	require.Equal(t, byEntry, e.listAll("/api/runs?status=failed&sort=entered&limit=4"))
	require.Equal(t, byCreation, e.listAll("/api/runs?status=failed&sort=created&limit=4"))
	require.Equal(t, byCreation, e.listAll("/api/runs?status=failed&reactor=bench-bad&sort=created&limit=3"))
	// Entered failed between base+50ms and base+70ms (40 ms after their
	// creation): runs 20 to 61; run 0 entered at base+1s.
	require.Equal(t, seq(60, 20, failedSeed), e.listAll("/api/runs?status=failed&from="+ms(50)+"&to="+ms(70)))
	require.Equal(t, []string{"run-0000000"}, e.listAll("/api/runs?status=failed&reactor=bench-bad&from="+ms(1000)+"&to="+ms(1000)))
	// By creation, the same range is runs created in it.
	require.Equal(t, seq(40, 20, failedSeed), e.listAll("/api/runs?status=failed&sort=created&from="+ms(10)+"&to="+ms(20)))

	// Failure text: case-insensitive, in the step, code or message.
	require.Equal(t, byCreation, e.listAll("/api/runs?failure=CARD+DECLINED&limit=5"))
	require.Equal(t, byEntry, e.listAll("/api/runs?failure=%3Cscript&status=failed"))
	require.Equal(t, seq(79, 20, failedSeed), e.listAll("/api/runs?failure=declined&from="+ms(10)+"&to="+ms(39)))
	require.Len(t, e.listAll("/api/runs?failure=pay"), 11, "the step's name matches too")
	var found struct {
		runList
		Partial  bool `json:"partial"`
		Examined int  `json:"examined"`
	}
	e.get("/api/runs?failure=no+such+text", http.StatusOK, &found)
	require.Empty(t, found.Runs)
	require.Empty(t, found.NextCursor, "the listing ended: nothing more to search")
	require.False(t, found.Partial)
	require.Equal(t, 102, found.Examined, "every entry was read")

	// An id search with a time range bounds the creation time, in id order.
	require.Equal(t, []string{"run-0000000", "run-0000001", "run-0000002", "run-0000003"},
		e.listAll("/api/runs?q=run-00000&from="+ms(0)+"&to="+ms(1)))

	for path, msg := range map[string]string{
		"/api/runs?sort=entered":                        "give a status too",
		"/api/runs?sort=updated":                        "no index orders runs by their last update",
		"/api/runs?from=yesterday":                      "not an RFC 3339 time",
		"/api/runs?from=" + ms(10) + "&to=" + ms(9):     "from is after to",
		"/api/runs?failure=" + strings.Repeat("x", 201): "over 200 bytes",
		"/api/matching?sort=updated":                    "no index orders runs",
	} {
		res := e.do(http.MethodGet, path, "", "")
		require.Equal(t, http.StatusBadRequest, res.code, path)
		require.Contains(t, string(res.body), msg, path)
	}
}

type matchCount struct {
	Count    int               `json:"count"`
	Complete bool              `json:"complete"`
	Reason   string            `json:"reason"`
	Max      int               `json:"max"`
	Filter   map[string]string `json:"filter"`
}

// "Select all N matching": GET /api/matching counts the runs a filter
// matches with the listing's code and ends its time range at the count;
// POST /api/runs/actions with that filter and the confirmed count acts on
// every one of them, and refuses (nothing requested) when the count
// changed or the filter matches more than the bound.
func TestMatchingBatch(t *testing.T) {
	t.Parallel()
	const token = "match-token"
	e := newEnv(t, token)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	seedRuns(t, e, 100, base)

	var c matchCount
	e.get("/api/matching?status=failed", http.StatusOK, &c)
	require.Equal(t, 11, c.Count)
	require.True(t, c.Complete)
	require.Equal(t, 5000, c.Max)
	require.Equal(t, "failed", c.Filter["status"])
	require.Equal(t, "entered", c.Filter["sort"])
	require.NotEmpty(t, c.Filter["to"], "the range ends at the count")
	e.get("/api/matching?failure=declined&from="+url.QueryEscape(base.UTC().Format(time.RFC3339)), http.StatusOK, &c)
	require.Equal(t, 11, c.Count)
	e.get("/api/matching?status=completed&reactor=bench-ok", http.StatusOK, &c)
	require.Equal(t, 91, c.Count, "90 seeded and the template")

	e.get("/api/matching?status=failed", http.StatusOK, &c)
	filter, err := json.Marshal(c.Filter)
	require.NoError(t, err)
	post := func(body string) response {
		return e.do(http.MethodPost, "/api/runs/actions", token, body)
	}
	body := func(expect int) string {
		return fmt.Sprintf(`{"action":"retry","filter":%s,"reason":"the provider is back","expect":%d}`, filter, expect)
	}
	res := post(body(10))
	require.Equal(t, http.StatusConflict, res.code, "%s", res.body)
	require.Contains(t, string(res.body), "matches 11 runs now, not the 10 confirmed")

	res = post(body(11))
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
	var out struct {
		Matched int `json:"matched"`
		Results []struct {
			RunID      string `json:"run_id"`
			StatusCode int    `json:"status_code"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal(res.body, &out))
	require.Equal(t, 11, out.Matched)
	var got []string
	for _, r := range out.Results {
		require.Equal(t, http.StatusAccepted, r.StatusCode, r.RunID)
		got = append(got, r.RunID)
	}
	require.Equal(t, e.listAll("/api/runs?status=failed"), got, "in listing order")
	audit, err := e.engine.Audit(context.Background(), "run-0000050")
	require.NoError(t, err)
	require.NotEmpty(t, audit)

	for b, msg := range map[string]string{
		`{"action":"retry","ids":["a"],"filter":{"status":"failed"},"reason":"x","expect":1}`: "ids or filter, not both",
		`{"action":"retry","ids":["a"],"reason":"x","expect":1}`:                              "expect goes with filter",
		`{"action":"retry","filter":{"status":"failed"},"reason":"x"}`:                        "expect is missing",
		`{"action":"retry","filter":{"status":"nope"},"reason":"x","expect":1}`:               "filter: status",
		`{"action":"retry","filter":{"status":"failed"},"expect":11}`:                         "reason",
	} {
		res := post(b)
		require.Equal(t, http.StatusBadRequest, res.code, "%s: %s", b, res.body)
		require.Contains(t, string(res.body), msg, b)
	}
	res = e.do(http.MethodPost, "/api/runs/actions", "", body(11))
	require.Equal(t, http.StatusUnauthorized, res.code)
}

// Past the bounds a count says it is not complete and why, and a batch on
// the filter is refused whole. Not parallel: it sets the package's bounds.
func TestMatchingBounds(t *testing.T) {
	const token = "bounds-token"
	e := newEnv(t, token)
	seedRuns(t, e, 1200, time.Now().Add(-time.Hour))
	dashboard.SetMaxMatching(t, 5)
	var c matchCount
	e.get("/api/matching?status=failed", http.StatusOK, &c)
	require.False(t, c.Complete)
	require.Equal(t, 5, c.Count)
	require.Contains(t, c.Reason, "more than 5 runs match")
	res := e.do(http.MethodPost, "/api/runs/actions", token,
		`{"action":"retry","filter":{"status":"failed"},"reason":"x","expect":5}`)
	require.Equal(t, http.StatusConflict, res.code, "%s", res.body)
	require.Contains(t, string(res.body), "nothing was requested: more than 5 runs match")

	// A failure text the budget cannot get through in one request: the
	// page says partial and how far it read; the count says why it stops.
	dashboard.SetMaxMatching(t, 5000)
	dashboard.SetScanBudget(t, 20)
	var p struct {
		runList
		Partial  bool `json:"partial"`
		Examined int  `json:"examined"`
	}
	e.get("/api/runs?failure=no+such+text&limit=10", http.StatusOK, &p)
	require.True(t, p.Partial)
	require.NotEmpty(t, p.NextCursor)
	require.GreaterOrEqual(t, p.Examined, 20)
	dashboard.SetMatchScanBudget(t, 30)
	e.get("/api/matching?failure=no+such+text", http.StatusOK, &c)
	require.False(t, c.Complete)
	require.Contains(t, c.Reason, "without reaching the end of the listing")
}
