package dashboard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

const xss = "<script>alert('x')</script>"

type noteIn struct {
	Note string `json:"note"`
}

func echo(name string) *reactor.Definition {
	return reactor.MustDefine(name, reactor.Input[string]("note"), reactor.Step("echo", reactor.StepConfig[noteIn, string]{
		Args: reactor.Bindings{"note": reactor.FromInput("note")},
		Run:  func(_ context.Context, in noteIn) (string, error) { return in.Note, nil },
	}))
}

func failing(name string) *reactor.Definition {
	return reactor.MustDefine(name, reactor.Step("pay", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New(xss + " card declined"))
		},
	}))
}

// enqueueAll enqueues the runs on the worker and waits for every result
// and for its listing index entries (waitIndexed).
func (e *env) enqueueAll(ctx context.Context, def *reactor.Definition, ids []string, inputs map[string]any) {
	e.t.Helper()
	for _, id := range ids {
		_, err := e.engine.Enqueue(ctx, def, inputs, reactor.WithRunID(id))
		require.NoError(e.t, err)
	}
	for _, id := range ids {
		res, err := e.engine.Wait(ctx, id)
		require.NoError(e.t, err)
		e.waitIndexed(ctx, id, res.Status)
	}
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%02d", prefix, i)
	}
	return out
}

func runIDs(l runList) []string {
	out := make([]string, len(l.Runs))
	for i, r := range l.Runs {
		out[i] = r.ID
	}
	return out
}

// Listing, filters, id search, 404s, bad input and the XSS probe, on runs a
// real worker executed.
func TestListFiltersAndSearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	alpha, beta := echo("alpha"), failing("beta"+xss)
	e.startWorker(alpha, beta)
	e.enqueueAll(ctx, alpha, ids("a-", 6), map[string]any{"note": xss})
	e.enqueueAll(ctx, beta, ids("b-", 4), nil)

	var all runList
	e.get("/api/runs", http.StatusOK, &all)
	require.Len(t, all.Runs, 10)
	require.Empty(t, all.NextCursor)
	for i := 1; i < len(all.Runs); i++ {
		require.GreaterOrEqual(t, all.Runs[i-1].CreatedAt, all.Runs[i].CreatedAt, "newest first")
	}
	require.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, all.Runs[0].CreatedAt)

	cases := []struct {
		query string
		want  []string
	}{
		{"status=failed", ids("b-", 4)},
		{"status=completed", ids("a-", 6)},
		{"reactor=alpha", ids("a-", 6)},
		{"reactor=" + url.QueryEscape("beta"+xss) + "&status=failed", ids("b-", 4)},
		{"reactor=alpha&status=failed", nil},
		{"status=running", nil},
		{"q=a-", ids("a-", 6)},
		{"q=b-02", []string{"b-02"}},
		{"q=b-0&status=failed&limit=2", []string{"b-00", "b-01"}},
		{"q=zzz", nil},
	}
	for _, c := range cases {
		var l runList
		e.get("/api/runs?"+c.query, http.StatusOK, &l)
		require.ElementsMatch(t, c.want, runIDs(l), c.query)
	}
	var failed runList
	e.get("/api/runs?status=failed&limit=1", http.StatusOK, &failed)
	require.Len(t, failed.Runs, 1)
	require.NotEmpty(t, failed.NextCursor)
	require.Equal(t, "pay", failed.Runs[0].Failure.Step)

	// A prefix search pages by id.
	var page1, page2 runList
	e.get("/api/runs?q=a-&limit=4", http.StatusOK, &page1)
	require.Equal(t, []string{"a-00", "a-01", "a-02", "a-03"}, runIDs(page1))
	e.get("/api/runs?q=a-&limit=4&cursor="+page1.NextCursor, http.StatusOK, &page2)
	require.Equal(t, []string{"a-04", "a-05"}, runIDs(page2))
	require.Empty(t, page2.NextCursor)

	// The XSS probe: a reactor name, an input and an error carrying
	// <script> come back as escaped JSON data.
	for _, path := range []string{"/api/runs", "/api/runs/a-00", "/api/runs/b-00", "/api/runs?reactor=" + url.QueryEscape("beta"+xss)} {
		res := e.get(path, http.StatusOK, nil)
		require.NotContains(t, string(res.body), "<script>", path)
		require.Contains(t, string(res.body), `\u003cscript\u003e`, path)
		require.Equal(t, "default-src 'none'; frame-ancestors 'none'", res.header.Get("Content-Security-Policy"))
		require.Equal(t, "nosniff", res.header.Get("X-Content-Type-Options"))
		require.Equal(t, "no-store", res.header.Get("Cache-Control"))
	}
	var d runDetail
	e.get("/api/runs/a-00", http.StatusOK, &d)
	require.Equal(t, xss, d.Inputs["note"])
	require.Equal(t, "alpha", d.Reactor)
	require.Equal(t, "completed", d.Status)
	require.Len(t, d.Steps, 1)
	require.Equal(t, "echo", d.Steps[0].Name)
	require.Equal(t, "completed", d.Steps[0].Status)
	require.Equal(t, xss, d.Steps[0].Result)
	require.NotEmpty(t, d.Steps[0].StartedAt)
	require.Nil(t, d.Rollback, "rollback progress only while rolling_back")
	require.Empty(t, d.RetryOf)
	require.Empty(t, d.RetriedBy)
	e.get("/api/runs/b-00", http.StatusOK, &d)
	require.Equal(t, "failed", d.Status)
	require.Equal(t, "pay", d.Failure.Step)
	require.Contains(t, d.Failure.Message, xss)

	// 404s, 405s and 400s, all JSON.
	var eb struct{ Error string }
	e.get("/api/runs/nope", http.StatusNotFound, &eb)
	require.Contains(t, eb.Error, "nope")
	e.get("/api/runs/a-00/maps/none/elements", http.StatusNotFound, &eb)
	e.get("/api/nothing", http.StatusNotFound, &eb)
	home := e.do(http.MethodGet, "/", "", "")
	require.Equal(t, http.StatusOK, home.code, "the handler serves the HTML view outside /api/")
	require.Contains(t, home.header.Get("Content-Type"), "text/html")
	require.Equal(t, http.StatusNotFound, e.do(http.MethodGet, "/no/such/page", "", "").code)
	for _, q := range []string{"limit=501", "limit=0", "limit=x", "status=bogus", "cursor=%21%21", "q=" + url.QueryEscape("a{b}")} {
		e.get("/api/runs?"+q, http.StatusBadRequest, &eb)
		require.NotEmpty(t, eb.Error, q)
	}
	res := e.do(http.MethodPost, "/api/runs", "", "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	require.Equal(t, "GET, HEAD", res.header.Get("Allow"))
	res = e.do(http.MethodGet, "/api/runs/a-00/undo", "", "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	require.Equal(t, "POST", res.header.Get("Allow"))
	require.Equal(t, "application/json", res.header.Get("Content-Type"))
}

// Paging to the end while runs are being added: every run that existed
// when the first page was read is seen exactly once, and no run twice,
// whatever the page size and however many runs share a millisecond.
func TestPaginationWhileAdding(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	def := echo("pager")
	require.NoError(t, e.engine.Register(def))
	const initial = 120
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, id := range ids("p-", initial) {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			_, err := e.engine.Run(ctx, def, map[string]any{"note": id}, reactor.WithRunID(id))
			require.NoError(t, err)
		}()
	}
	wg.Wait()

	stop := make(chan struct{})
	adderDone := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				adderDone <- n
				return
			default:
			}
			id := fmt.Sprintf("new-%04d", n)
			if _, err := e.engine.Run(ctx, def, map[string]any{"note": id}, reactor.WithRunID(id)); err != nil {
				t.Errorf("run %s: %v", id, err)
			}
			n++
		}
	}()
	for _, q := range []string{"limit=7", "limit=1&reactor=pager", "limit=13&status=completed", "limit=50&reactor=pager&status=completed"} {
		seen := map[string]int{}
		cur := ""
		pages := 0
		for {
			var l runList
			path := "/api/runs?" + q
			if cur != "" {
				path += "&cursor=" + cur
			}
			e.get(path, http.StatusOK, &l)
			for _, r := range l.Runs {
				seen[r.ID]++
			}
			pages++
			if l.NextCursor == "" {
				break
			}
			cur = l.NextCursor
			require.Less(t, pages, 1000, q)
		}
		for id, n := range seen {
			require.Equal(t, 1, n, "%s: run %s seen %d times", q, id, n)
		}
		for _, id := range ids("p-", initial) {
			require.Contains(t, seen, id, "%s: run %s skipped", q, id)
		}
	}
	close(stop)
	require.Positive(t, <-adderDone, "runs were added while paging")
}

// A page's cursor entry that leaves its index (its run moved to another
// status) does not make the next page skip or repeat.
func TestPaginationCursorEntryGone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	def := echo("mover")
	require.NoError(t, e.engine.Register(def))
	for _, id := range ids("m-", 12) {
		_, err := e.engine.Run(ctx, def, map[string]any{"note": id}, reactor.WithRunID(id))
		require.NoError(t, err)
	}
	var p1 runList
	e.get("/api/runs?status=completed&limit=5", http.StatusOK, &p1)
	require.Len(t, p1.Runs, 5)
	last := p1.Runs[4].ID
	require.NoError(t, e.rdb.ZRem(ctx, e.prefix+":idx:status:completed", last).Err())
	seen := runIDs(p1)
	cur := p1.NextCursor
	for cur != "" {
		var l runList
		e.get("/api/runs?status=completed&limit=5&cursor="+cur, http.StatusOK, &l)
		seen = append(seen, runIDs(l)...)
		cur = l.NextCursor
	}
	require.ElementsMatch(t, ids("m-", 12), seen)
	require.Equal(t, 12, len(seen))
	require.False(t, strings.Contains(strings.Join(seen[5:], ","), last))
}
