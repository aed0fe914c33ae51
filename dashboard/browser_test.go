package dashboard

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// The browser test drives the HTML view in headless Chromium through the
// acceptance story of the dashboard. The story (runBrowserStory) knows only a
// base URL, a few run ids and a hook that moves a rollback forward, so it runs
// unchanged against the real handler with a real worker; here it runs against
// fakeAPI, which serves the JSON API's documented shapes from Go values.

// browserStory is what runBrowserStory needs from the dashboard under test.
type browserStory struct {
	Token       string // the bearer token the dashboard was started with
	RollingBack string // a run that is rolling back with a fan-out map
	Pages       bool   // the run list has more than one page
	Markup      string // a reactor name of a failed run that holds markup, if any
	RetryOf     string // the run RollingBack is a retry of, if any
	// Running, if set, is a run whose fan-out map RunningStep is under way;
	// AdvanceRunning settles more of its elements.
	Running        string
	RunningStep    string
	AdvanceRunning func(t *testing.T)
	MapStep        string // that map's step
	Refusal        string // a substring of the 409 reason for cancelling RollingBack
	// Advance moves RollingBack's rollback forward (more elements undone), so
	// that the next poll shows a changed grid and progress bar.
	Advance func(t *testing.T)
	ShotDir string // where screenshots go
	// RunShot, if set, also receives the run-detail screenshot.
	RunShot string
}

const chromiumPath = "/usr/bin/chromium"

// newBrowser starts headless Chromium for one test. A missing browser fails
// the test (it is part of the acceptance), unless GOREACTOR_SKIP_BROWSER=1.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if os.Getenv("GOREACTOR_SKIP_BROWSER") == "1" {
		t.Skip("GOREACTOR_SKIP_BROWSER=1: browser test skipped")
	}
	exe := chromiumPath
	if p := os.Getenv("GOREACTOR_CHROMIUM"); p != "" {
		exe = p
	}
	if _, err := os.Stat(exe); err != nil {
		t.Fatalf("the browser test needs Chromium at %s (Debian package chromium: apt-get install chromium; "+
			"or point GOREACTOR_CHROMIUM at it, or set GOREACTOR_SKIP_BROWSER=1 to skip): %v", exe, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.WindowSize(1366, 768),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx) // closes the browser and waits for it
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(1366, 768)))
	return ctx
}

func TestBrowserDashboardStory(t *testing.T) {
	ctx := newBrowser(t)
	api := newFakeAPI("s3cret-token")
	mux := http.NewServeMux()
	mux.Handle("/api/", api)
	mux.Handle("/", newUI())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	shots := t.TempDir()
	if dir := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); dir != "" { // to look at them
		shots = dir
	}
	story := browserStory{
		Token:          api.token,
		RollingBack:    fakeRollingBackID,
		MapStep:        "ship_items",
		Pages:          true,
		Markup:         fakeMarkupReactor,
		RetryOf:        "ord-20261201-0038",
		Running:        fakeRunningID,
		RunningStep:    "load_rows",
		AdvanceRunning: func(*testing.T) { api.advanceForward(60) },
		Refusal:        "rollback already in progress",
		Advance:        func(*testing.T) { api.advanceRollback(450) },
		ShotDir:        shots,
	}
	if os.Getenv("GOREACTOR_UPDATE_SCREENSHOT") == "1" {
		story.RunShot = filepath.Join("..", "docs", "dashboard-run.png")
	}
	runBrowserStory(t, ctx, srv.URL, story)

	// The fake saw what the page sent: the cancel first with a wrong token,
	// then with the right one, and a batch retry of the failed runs.
	calls := api.calls()
	require.GreaterOrEqual(t, len(calls), 3, "%v", calls)
	require.Equal(t, fakeCall{Path: "/api/runs/" + fakeRollingBackID + "/cancel", Auth: "Bearer not-the-token", Code: 401}, calls[0])
	require.Equal(t, fakeCall{Path: "/api/runs/" + fakeRollingBackID + "/cancel", Auth: "Bearer " + api.token, Code: 409,
		Reason: "customer asked, ticket 4711"}, calls[1])
	require.Equal(t, "/api/runs/actions", calls[2].Path)
	require.Equal(t, "retry", calls[2].Action)
	require.Equal(t, "the payment provider is back", calls[2].Reason)
	require.ElementsMatch(t, api.idsWithStatus("failed"), calls[2].IDs)

	for _, name := range []string{"overview.png", "failed.png", "run.png", "elements.png", "running.png", "refused.png", "batch.png"} {
		st, err := os.Stat(filepath.Join(shots, name))
		require.NoError(t, err, name)
		require.Greater(t, st.Size(), int64(10_000), name)
	}
}

// runBrowserStory is the acceptance story: open the overview, filter to
// failed runs, open a run that is rolling back, watch its grid and progress
// bar move, try to cancel it (confirming, entering a wrong token then the
// right one) and read the engine's refusal, then batch-retry failed runs.
func runBrowserStory(t *testing.T, ctx context.Context, base string, s browserStory) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	console := watchConsole(t, ctx)

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	eval := func(what, js string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, what)
		return v
	}
	poll := pollUntil(t, ctx)
	shot := func(name string, also ...string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, name)
		require.NoError(t, os.WriteFile(filepath.Join(s.ShotDir, name), png, 0o644))
		for _, p := range also {
			if p != "" {
				require.NoError(t, os.WriteFile(p, png, 0o644))
				t.Logf("wrote %s", p)
			}
		}
	}
	cspClean := func(where string) {
		t.Helper()
		require.Equal(t, "[]", eval("read the policy violations", `JSON.stringify(window.__csp || ['no recorder'])`), "%s: the CSP blocked something", where)
	}
	id := jsString(s.RollingBack)

	// 1. The overview: counts by status and the run list.
	do("open the overview", chromedp.Navigate(base+"/"),
		chromedp.WaitVisible(chromedp.CSS("#status-tiles .tile-failed")),
		chromedp.WaitVisible(chromedp.CSS("#runs tr")))
	poll("the live indicator says live", `document.getElementById('live').dataset.state === 'live'`)
	poll("the queue table is filled", `document.querySelectorAll('#queues tr').length > 0`)
	// Both stacks have a queue no worker serves: the overview says so
	// above everything else.
	poll("the unserved queue is warned about", `!document.getElementById('warnings-panel').hidden &&
		[...document.querySelectorAll('#warnings li')].some(li => li.textContent.startsWith('no worker serves queue '))`)
	shot("overview.png")
	cspClean("overview")
	if s.Pages {
		first := eval("count the rows", `String(document.querySelectorAll('#runs tr').length)`)
		do("load more", chromedp.Click(chromedp.ID("load-more")))
		poll("the next page is appended", `document.querySelectorAll('#runs tr').length > `+first+` &&
			new Set([...document.querySelectorAll('#runs tr')].map(r => r.dataset.id)).size === document.querySelectorAll('#runs tr').length`)
	}
	// A reactor's row filters the list to it.
	poll("the reactors table is filled", `document.querySelectorAll('#reactors tr[data-reactor]').length > 0`)
	do("filter by a reactor", chromedp.Evaluate[chromedp.Void](`document.querySelector('#reactors tr[data-reactor] .reactor-name a').click()`))
	poll("only that reactor's runs are listed", `(() => {
		const name = document.querySelector('#reactors tr.active')?.dataset.reactor;
		const rows = [...document.querySelectorAll('#runs tr')];
		return name && document.getElementById('filter-reactor').value === name &&
			document.getElementById('runs').dataset.loading === 'false' && rows.length > 0 &&
			rows.every(r => r.querySelector('.reactor-cell').textContent === name);
	})()`)
	do("clear the filters", chromedp.Click(chromedp.ID("clear-filters")))
	require.Equal(t, "undefined", eval("no injected script ran", `typeof window.__xss`))

	// 2. Failed runs, one click away.
	do("filter to failed runs", chromedp.Click(chromedp.ID("only-failed")))
	poll("only failed runs are listed", `location.search === '?status=failed' &&
		document.querySelector('.tile-failed').classList.contains('active') &&
		document.getElementById('runs').dataset.loading === 'false' &&
		document.querySelectorAll('#runs tr').length > 0 &&
		[...document.querySelectorAll('#runs tr')].every(r => r.dataset.status === 'failed')`)
	shot("failed.png")
	// A reactor name or an error holding markup is shown as text.
	require.Equal(t, "undefined", eval("no injected script ran", `typeof window.__xss`))
	require.Equal(t, "0", eval("no injected element", `String(document.querySelectorAll('#runs img, #runs script, #runs b').length)`))
	if s.Markup != "" {
		require.Equal(t, "true", eval("the markup is shown as text", `String([...document.querySelectorAll('#runs td')].some(c => c.textContent === `+jsString(s.Markup)+`))`))
	}

	// 3. The rolling-back run, from its status tile.
	do("filter to rolling back runs", chromedp.Click(chromedp.CSS("#status-tiles .tile-rolling_back")))
	poll("the rolling back run is listed", `[...document.querySelectorAll('#runs tr')].some(r => r.dataset.id === `+id+`) &&
		[...document.querySelectorAll('#runs tr')].every(r => r.dataset.status === 'rolling_back')`)
	_, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil,
		chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll('#runs tr')].find(r => r.dataset.id === `+id+`).querySelector('a.run-link').click()`)))
	require.NoError(t, err, "open the run from the list")
	poll("the run page shows the run", `document.body.dataset.page === 'run' && document.getElementById('run').dataset.status === 'rolling_back'`)
	mapSel := `document.querySelector('.map[data-step=` + jsString(s.MapStep) + `]')`
	poll("the map's grid is drawn", mapSel+` && `+mapSel+`.querySelectorAll('.grid .cell').length > 0 &&
		`+mapSel+`.querySelector('.bar-map-rollback') !== null`)

	// 4. The grid and the progress bars follow the rollback, poll by poll.
	progress := func() (settled, undone int) {
		t.Helper()
		v := eval("read the rollback progress", `JSON.stringify([`+mapSel+`.querySelector('.bar-map-rollback').dataset.settled, `+mapSel+`.querySelector('.grid').dataset.undone])`)
		var pair [2]string
		require.NoError(t, json.Unmarshal([]byte(v), &pair))
		a, err := strconv.Atoi(pair[0])
		require.NoError(t, err)
		b, err := strconv.Atoi(pair[1])
		require.NoError(t, err)
		return a, b
	}
	for round := range 2 {
		settled, undone := progress()
		s.Advance(t)
		poll(fmt.Sprintf("round %d: the rollback bar and the grid move past %d settled, %d undone cells", round, settled, undone),
			`+`+mapSel+`.querySelector('.bar-map-rollback').dataset.settled > `+strconv.Itoa(settled)+` &&
			+`+mapSel+`.querySelector('.grid').dataset.undone > `+strconv.Itoa(undone)+` &&
			+document.querySelector('.bar-run-rollback').dataset.settled > 0`)
	}
	// Each cell names its elements and their counts by state.
	require.Regexp(t, `^elements? \d+(–\d+)?: [a-z ]+ \d+`, eval("a cell's tooltip", mapSel+`.querySelector('.grid .cell').title`))
	if s.RetryOf != "" {
		require.Equal(t, s.RetryOf, eval("the retry link", `document.querySelector('#run-facts a.retry-of')?.textContent ?? ''`))
	}
	// A cell of the grid opens its elements.
	do("click a cell that needs a look", chromedp.Evaluate[chromedp.Void](`(`+mapSel+`.querySelector('.grid .cell.cs-undo_failed') ||
		`+mapSel+`.querySelector('.grid .cell.cs-failed') || `+mapSel+`.querySelector('.grid .cell:last-child')).click()`))
	poll("the cell's elements are listed, from its first", `(() => {
		const m = `+mapSel+`, cell = m.querySelector('.grid .cell.picked'), first = m.querySelector('.elements tbody tr td a');
		return cell && first && first.textContent === cell.title.match(/^elements? (\d+)/)[1];
	})()`)
	shot("elements.png")
	require.Equal(t, "undefined", eval("no injected script ran", `typeof window.__xss`))
	require.Equal(t, "0", eval("inputs are text", `String(document.querySelectorAll('#inputs script, #inputs img, #failure img').length)`))
	do("scroll to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	shot("run.png", s.RunShot)
	cspClean("run detail")

	// 4b. A running map's grid fills in as its elements complete.
	if s.Running != "" {
		do("open the running run", chromedp.Navigate(base+"/runs/"+url.PathEscape(s.Running)))
		runSel := `document.querySelector('.map[data-step=` + jsString(s.RunningStep) + `]')`
		poll("the running map is drawn", runSel+` && `+runSel+`.querySelectorAll('.grid .cell').length > 0`)
		before := eval("read the forward progress", `JSON.stringify([+`+runSel+`.querySelector('.bar-map').dataset.settled, +`+runSel+`.querySelector('.grid').dataset.completed])`)
		var pair [2]int
		require.NoError(t, json.Unmarshal([]byte(before), &pair))
		s.AdvanceRunning(t)
		poll("the forward bar and the grid move", `+`+runSel+`.querySelector('.bar-map').dataset.settled > `+strconv.Itoa(pair[0])+` &&
			+`+runSel+`.querySelector('.grid').dataset.completed > `+strconv.Itoa(pair[1]))
		shot("running.png")
		do("back to the rolling back run", chromedp.Navigate(base+"/runs/"+url.PathEscape(s.RollingBack)))
		poll("the rolling back run is shown again", `document.getElementById('run').dataset.status === 'rolling_back'`)
	}

	// 5. Cancel: a confirmation naming what happens, a token prompt, a wrong
	// token refused with 401, the right one, and the engine's 409 reason.
	do("forget any token", chromedp.Evaluate[chromedp.Void](`sessionStorage.clear()`))
	poll("cancel is not offered on a rolling back run, and says why on hover", `(b => b.disabled && b.title.includes(`+jsString(s.Refusal)+`))(document.querySelector('.run-actions button[data-action="cancel"]'))`)
	// A page that read the run before it moved on still offers what it
	// offered then: the server refuses with the engine's reason.
	do("a page from before the rollback offers cancel", chromedp.Evaluate[chromedp.Void](`document.querySelector('.run-actions button[data-action="cancel"]').disabled = false`))
	do("click cancel", chromedp.Click(chromedp.CSS(`.run-actions button[data-action="cancel"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-dialog")))
	require.Equal(t, "Cancel run "+s.RollingBack+": stop it at its next checkpoint and roll back what it completed.",
		eval("the confirmation", `document.getElementById('confirm-text').textContent`))
	poll("a dialog pauses the live refresh", `document.getElementById('live').dataset.state === 'paused'`)
	do("try to confirm without a reason", chromedp.Click(chromedp.ID("confirm-yes")))
	poll("a reason is required: the dialog stays open", `document.getElementById('confirm-dialog').open && !document.getElementById('confirm-reason').validity.valid`)
	do("confirm with a reason", chromedp.SendKeys(chromedp.ID("confirm-reason"), "customer asked, ticket 4711"),
		chromedp.Click(chromedp.ID("confirm-yes")),
		chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), "not-the-token"),
		chromedp.Click(chromedp.ID("token-save")))
	poll("the 401 brings the token prompt back with the server's word", `document.getElementById('token-dialog').open &&
		!document.getElementById('token-reason').hidden &&
		document.getElementById('token-reason').textContent.startsWith('The server refused the token: ')`)
	do("enter the right token", chromedp.SendKeys(chromedp.ID("token-input"), s.Token), chromedp.Click(chromedp.ID("token-save")))
	poll("the refusal is shown verbatim", `[...document.querySelectorAll('#messages .msg-error .msg-detail')].some(e => e.textContent.includes(`+jsString(s.Refusal)+`))`)
	require.Equal(t, s.Token, eval("the token is kept for the tab", `sessionStorage.getItem('goreactor.dashboard.token')`))
	poll("live again once the dialog is closed", `document.getElementById('live').dataset.state === 'live'`)
	shot("refused.png")

	// 6. Selecting text pauses the refresh.
	do("select text", chromedp.Evaluate[chromedp.Void](`getSelection().selectAllChildren(document.getElementById('run-reactor'))`))
	poll("a selection pauses the live refresh", `document.getElementById('live').dataset.state === 'paused' && document.getElementById('live-label').textContent === 'paused: text selected'`)
	do("clear the selection", chromedp.Evaluate[chromedp.Void](`getSelection().removeAllRanges()`))
	poll("live again", `document.getElementById('live').dataset.state === 'live'`)

	// 7. An unknown run says so.
	do("open an unknown run", chromedp.Navigate(base+"/runs/no-such-run-"+strconv.FormatInt(time.Now().UnixNano(), 36)))
	poll("the page says the run is unknown", `!document.getElementById('run-missing').hidden && document.getElementById('run-missing').textContent.length > 0`)

	// 8. Batch: select every failed run and retry them.
	do("back to the failed runs", chromedp.Navigate(base+"/?status=failed"), chromedp.WaitVisible(chromedp.CSS("#runs tr")))
	poll("the failed runs are listed", `document.getElementById('runs').dataset.loading === 'false' && [...document.querySelectorAll('#runs tr')].every(r => r.dataset.status === 'failed')`)
	n := eval("count the failed runs", `String(document.querySelectorAll('#runs tr').length)`)
	do("select all and retry", chromedp.Click(chromedp.ID("select-all")),
		chromedp.WaitVisible(chromedp.ID("batch-bar")),
		chromedp.Click(chromedp.CSS(`#batch-bar button[data-batch="retry"]`)),
		chromedp.WaitVisible(chromedp.ID("confirm-dialog")))
	require.Equal(t, "Retry "+n+" runs: run each again with the same inputs under a new id, linked to the original.",
		eval("the batch confirmation", `document.getElementById('confirm-text').textContent`))
	require.Equal(t, n, eval("the dialog lists the runs", `String(document.querySelectorAll('#confirm-list li').length)`))
	do("confirm the batch", chromedp.SendKeys(chromedp.ID("confirm-reason"), "the payment provider is back"), chromedp.Click(chromedp.ID("confirm-yes")))
	poll("the batch outcome is shown", `[...document.querySelectorAll('#messages .msg-ok .msg-title')].some(e => e.textContent === 'Retry: `+n+` requested')`)
	poll("the selection is cleared", `document.getElementById('batch-bar').hidden`)
	shot("batch.png")
	cspClean("overview after the batch")

	console.check(t)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// consoleWatch collects what the pages print to the console: any exception
// or error is a failure, except the answers the story provokes on purpose.
type consoleWatch struct {
	mu   sync.Mutex
	msgs []string
}

func watchConsole(t *testing.T, ctx context.Context) *consoleWatch {
	w := &consoleWatch{}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleException {
				continue
			}
			// The API's 401, 404 and 409 are the story's; the browser logs them.
			if m.Source == "network" && strings.Contains(m.URL, "/api/") && (strings.Contains(m.Text, "status of 401") ||
				strings.Contains(m.Text, "status of 404") || strings.Contains(m.Text, "status of 409")) {
				continue
			}
			w.mu.Lock()
			w.msgs = append(w.msgs, fmt.Sprintf("%s %s (%s:%d)", m.Type, m.Text, m.URL, m.Line+1))
			w.mu.Unlock()
		}
	}()
	// Also catch what a policy blocked, which the console may word in many
	// ways: the page records every violation before its own scripts run.
	_, err := chromedp.Run(ctx, func(ctx context.Context, tg *chromedp.Target) (page.ScriptIdentifier, error) {
		res, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: `window.__csp = []; document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`,
		})
		return res.Identifier, err
	})
	require.NoError(t, err)
	return w
}

func (w *consoleWatch) check(t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.msgs, "the pages logged errors")
}

// ---- the test-only backend ----------------------------------------------

const (
	fakeRollingBackID = "ord-20261201-0042"
	fakeMarkupReactor = `<script>window.__xss='reactor'</script>`
	fakeRunningID     = "imp-7781"
)

// fakeAPI answers the dashboard's JSON API from Go values that the test
// changes between polls. Its shapes are the documented contract; the real
// handler (dashboard.New) replaces it when the story runs against Redis.
type fakeAPI struct {
	token string

	mu    sync.Mutex
	runs  []*fakeRun // newest first
	log   []fakeCall
	clock time.Time
}

type fakeCall struct {
	Path, Auth string
	Code       int
	Action     string
	IDs        []string
	Reason     string
}

type fakeRun struct {
	fakeDetail
	maps map[string]*fakeMap
}

type fakeFailure struct {
	Step             string                `json:"step"`
	Message          string                `json:"message"`
	RollbackFailures []fakeRollbackFailure `json:"rollback_failures,omitempty"`
}

type fakeRollbackFailure struct {
	Step    string `json:"step"`
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

type fakeSummary struct {
	ID        string       `json:"id"`
	Reactor   string       `json:"reactor"`
	Status    string       `json:"status"`
	CreatedAt string       `json:"created_at"`
	UpdatedAt string       `json:"updated_at"`
	ElapsedMS int64        `json:"elapsed_ms"`
	Failure   *fakeFailure `json:"failure"`
}

type fakeStep struct {
	Name       string `json:"name"`
	Status     string `json:"status"`
	Attempts   int    `json:"attempts"`
	StartedAt  string `json:"started_at"`
	FinishedAt string `json:"finished_at"`
	DurationMS int64  `json:"duration_ms"`
	Result     any    `json:"result"`
	Error      string `json:"error"`
}

type fakeChild struct {
	Step    string `json:"step"`
	RunID   string `json:"run_id"`
	Reactor string `json:"reactor"`
	Status  string `json:"status"`
}

type fakeProgress struct {
	Generation  int `json:"generation,omitempty"`
	Total       int `json:"total"`
	Settled     int `json:"settled"`
	Outstanding int `json:"outstanding"`
	Failed      int `json:"failed"`
}

type fakeMapInfo struct {
	Step       string        `json:"step"`
	MapID      string        `json:"map_id"`
	Mode       string        `json:"mode"`
	Total      int           `json:"total"`
	Dispatched int           `json:"dispatched"`
	Settled    int           `json:"settled"`
	Failed     int           `json:"failed"`
	Rollback   *fakeProgress `json:"rollback"`
}

type fakeAudit struct {
	Step    string `json:"step"`
	Status  string `json:"status"`
	Kind    string `json:"kind"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	At      string `json:"at"`
}

type fakeDetail struct {
	fakeSummary
	Inputs    map[string]any `json:"inputs"`
	Value     any            `json:"value"`
	Reason    string         `json:"reason"`
	TraceID   string         `json:"trace_id"`
	Queue     string         `json:"queue"`
	Steps     []fakeStep     `json:"steps"`
	Children  []fakeChild    `json:"children"`
	Maps      []fakeMapInfo  `json:"maps"`
	Rollback  *fakeProgress  `json:"rollback"`
	Rollbacks []fakeAudit    `json:"rollbacks"`
	RetryOf   string         `json:"retry_of"`
	RetriedBy []string       `json:"retried_by"`
	// Actions is what the real API derives from Engine.Allowed; the fake
	// derives it from its own answers to the actions (decide).
	Actions map[string]map[string]any `json:"actions"`
}

// fakeMap is a map's elements, one state each, from which its counters, its
// summary cells and its element pages are derived as the real API does.
type fakeMap struct {
	id, mode   string
	states     []string
	errors     map[int]string
	outcomes   map[int]string
	generation int // 0: no rollback
	rbTotal    int
}

func fakeTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func newFakeAPI(token string) *fakeAPI {
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := &fakeAPI{token: token, clock: now}
	add := func(id, reactor, status string, age, took time.Duration, f *fakeFailure) *fakeRun {
		created := now.Add(-age)
		r := &fakeRun{maps: map[string]*fakeMap{}}
		r.fakeSummary = fakeSummary{ID: id, Reactor: reactor, Status: status, CreatedAt: fakeTime(created),
			UpdatedAt: fakeTime(created.Add(took)), ElapsedMS: took.Milliseconds(), Failure: f}
		r.Inputs = map[string]any{"order_id": id}
		r.Queue = "goreactor"
		r.Steps = []fakeStep{{Name: "validate", Status: "completed", Attempts: 1, StartedAt: fakeTime(created), FinishedAt: fakeTime(created.Add(12 * time.Millisecond)), DurationMS: 12}}
		r.Children, r.Maps, r.Rollbacks, r.RetriedBy = []fakeChild{}, []fakeMapInfo{}, []fakeAudit{}, []string{}
		a.runs = append(a.runs, r)
		return r
	}

	// The run the story opens: a checkout whose fan-out shipping map failed
	// and is being rolled back, element by element.
	rb := add(fakeRollingBackID, "checkout", "rolling_back", 3*time.Minute, 2*time.Minute+41*time.Second,
		&fakeFailure{Step: "ship_items", Message: "3 of 2000 elements failed: carrier API answered 503 Service Unavailable"})
	created := now.Add(-3 * time.Minute)
	at := func(d time.Duration) string { return fakeTime(created.Add(d)) }
	rb.Inputs = map[string]any{
		"order_id": fakeRollingBackID,
		"customer": map[string]any{"id": 98121, "tier": "gold", "country": "NL"},
		"items":    2000,
		"note":     `<script>window.__xss = 'input'</script><img src=x onerror="window.__xss='img'">`,
	}
	rb.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	rb.Queue = "goreactor:checkout"
	rb.Steps = []fakeStep{
		{Name: "validate", Status: "completed", Attempts: 1, StartedAt: at(0), FinishedAt: at(40 * time.Millisecond), DurationMS: 40, Result: true},
		{Name: "reserve_stock", Status: "completed", Attempts: 1, StartedAt: at(50 * time.Millisecond), FinishedAt: at(370 * time.Millisecond), DurationMS: 320, Result: map[string]any{"reservation": "rsv-5521", "lines": 2000}},
		{Name: "fraud_check", Status: "completed", Attempts: 1, StartedAt: at(380 * time.Millisecond), FinishedAt: at(2100 * time.Millisecond), DurationMS: 1720, Result: map[string]any{"score": 0.07}},
		{Name: "charge_card", Status: "completed", Attempts: 2, StartedAt: at(2110 * time.Millisecond), FinishedAt: at(4300 * time.Millisecond), DurationMS: 2190, Result: map[string]any{"charge_id": "ch_3PqX81", "amount_cents": 1299900}},
		{Name: "ship_items", Status: "failed", Attempts: 1, StartedAt: at(4310 * time.Millisecond), FinishedAt: at(98 * time.Second), DurationMS: 93690, Error: "3 of 2000 elements failed: carrier API answered 503 Service Unavailable"},
		{Name: "notify_customer", Status: "pending"},
	}
	rb.Children = []fakeChild{{Step: "fraud_check", RunID: fakeRollingBackID + "~fraud_check", Reactor: "fraud-screen", Status: "completed"}}
	rb.Rollbacks = []fakeAudit{{Step: "ship_items", Status: "compensating", Kind: "map", Reason: "step ship_items failed", At: at(98 * time.Second)}}
	m := &fakeMap{id: fakeRollingBackID + "~ship_items", mode: "fanout", states: make([]string, 2000), errors: map[int]string{}, outcomes: map[int]string{}}
	for i := range m.states {
		switch {
		case i == 411 || i == 1207 || i == 1530:
			m.states[i] = "failed"
			m.errors[i] = "carrier API answered 503 Service Unavailable"
		case i < 1700:
			m.states[i] = "completed"
		case i < 1760:
			m.states[i] = "unavailable"
		default:
			m.states[i] = "pending" // never dispatched: the map stopped at its first failure
		}
	}
	m.generation = 1
	for _, s := range m.states {
		if s == "completed" {
			m.rbTotal++
		}
	}
	rb.maps["ship_items"] = m

	add("ord-20261201-0041", "checkout", "failed", 7*time.Minute, 9*time.Second+400*time.Millisecond,
		&fakeFailure{Step: "charge_card", Message: "card declined: insufficient funds",
			RollbackFailures: []fakeRollbackFailure{{Step: "reserve_stock", Kind: "undo", Message: "inventory service timed out after 5s"}}})
	imp := add(fakeRunningID, "import-catalog", "running", 8*time.Minute, 8*time.Minute, nil)
	impAt := func(d time.Duration) string { return fakeTime(now.Add(-8*time.Minute + d)) }
	imp.Inputs = map[string]any{"feed": "s3://catalog/2026-12-01.ndjson", "rows": 600}
	imp.Steps = []fakeStep{
		{Name: "fetch_feed", Status: "completed", Attempts: 1, StartedAt: impAt(0), FinishedAt: impAt(3 * time.Second), DurationMS: 3000, Result: map[string]any{"bytes": 48_213_004}},
		{Name: "load_rows", Status: "running", Attempts: 1, StartedAt: impAt(3 * time.Second)},
		{Name: "reindex", Status: "pending"},
	}
	lm := &fakeMap{id: fakeRunningID + "~load_rows", mode: "fanout", states: make([]string, 600), errors: map[int]string{}, outcomes: map[int]string{}}
	for i := range lm.states {
		switch {
		case i < 200:
			lm.states[i] = "completed"
		case i < 240:
			lm.states[i] = "running"
		default:
			lm.states[i] = "pending"
		}
	}
	imp.maps["load_rows"] = lm
	add("xss-probe-1", fakeMarkupReactor, "failed", 9*time.Minute, 1200*time.Millisecond,
		&fakeFailure{Step: "<b>parse</b>", Message: `<img src=x onerror="window.__xss='failure'">`})
	add("ord-20261201-0039", "checkout", "completed", 11*time.Minute, 41*time.Second, nil)
	add("imp-7780", "import-catalog", "failed", 14*time.Minute, 3*time.Minute+12*time.Second,
		&fakeFailure{Step: "load_rows", Message: "row 88123: duplicate key value violates unique constraint \"sku\""})
	add("ord-20261201-0038", "checkout", "cancelled", 16*time.Minute, 22*time.Second, nil).RetriedBy = []string{fakeRollingBackID}
	rb.RetryOf = "ord-20261201-0038"
	add("rpt-daily-1201", "daily-report", "halted", 21*time.Minute, 3*time.Second, nil)
	add("ord-20261201-0037", "checkout", "pending", 22*time.Minute, 0, nil)
	add("sync-erp-552", "erp-sync", "aborted", 25*time.Minute, 14*time.Second, nil)
	for i := range 70 {
		add(fmt.Sprintf("ord-20261130-%04d", 900-i), "checkout", "completed", 30*time.Minute+time.Duration(i)*97*time.Second, time.Duration(20+i%17)*time.Second, nil)
	}
	a.sync()
	return a
}

// advanceForward settles the running elements of the running run's map and
// dispatches the next n.
func (a *fakeAPI) advanceForward(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.find(fakeRunningID)
	m := r.maps["load_rows"]
	for i, s := range m.states {
		switch {
		case s == "running":
			m.states[i] = "completed"
		case s == "pending" && n > 0:
			m.states[i] = "running"
			n--
		}
	}
	a.clock = a.clock.Add(2 * time.Second)
	r.UpdatedAt = fakeTime(a.clock)
	a.sync()
}

// advanceRollback undoes n more elements of the rolling-back run's map,
// newest position first; the first pass has one undo fail.
func (a *fakeAPI) advanceRollback(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.find(fakeRollingBackID)
	m := r.maps["ship_items"]
	first := true
	for i := len(m.states) - 1; i >= 0 && n > 0; i-- {
		if m.states[i] != "completed" {
			continue
		}
		if first && !slices.Contains(m.states, "undo_failed") {
			m.states[i] = "undo_failed"
			m.outcomes[i] = "compensation_failed"
			m.errors[i] = "refund API: 409 already refunded"
			r.Failure.RollbackFailures = append(r.Failure.RollbackFailures, fakeRollbackFailure{
				Step: fmt.Sprintf("ship_items[%d]", i), Kind: "undo", Message: "refund API: 409 already refunded"})
		} else {
			m.states[i] = "undone"
			m.outcomes[i] = "compensated"
		}
		first = false
		n--
	}
	a.clock = a.clock.Add(2 * time.Second)
	r.UpdatedAt = fakeTime(a.clock)
	a.sync()
}

// sync recomputes the derived fields (map counters, the run's rollback) of
// every run from its maps.
func (a *fakeAPI) sync() {
	for _, r := range a.runs {
		r.Maps = r.Maps[:0]
		var rb *fakeProgress
		for step, m := range r.maps {
			info := fakeMapInfo{Step: step, MapID: m.id, Mode: m.mode, Total: len(m.states)}
			var undone, undoFailed int
			for _, s := range m.states {
				switch s {
				case "pending":
				case "running":
					info.Dispatched++
				case "failed":
					info.Dispatched++
					info.Settled++
					info.Failed++
				case "undone":
					undone++
					info.Dispatched++
					info.Settled++
				case "undo_failed":
					undoFailed++
					info.Dispatched++
					info.Settled++
				default: // completed, unavailable
					info.Dispatched++
					info.Settled++
				}
			}
			if m.generation > 0 {
				settled := undone + undoFailed
				info.Rollback = &fakeProgress{Generation: m.generation, Total: m.rbTotal, Settled: settled, Outstanding: m.rbTotal - settled, Failed: undoFailed}
				// The run's own rollback: the map's elements, then the four
				// completed steps before it, newest first.
				rb = &fakeProgress{Total: m.rbTotal + 4, Settled: settled, Outstanding: m.rbTotal + 4 - settled, Failed: undoFailed}
			}
			r.Maps = append(r.Maps, info)
		}
		if r.Status == "rolling_back" {
			r.Rollback = rb
		} else {
			r.Rollback = nil
		}
	}
}

func (a *fakeAPI) find(id string) *fakeRun {
	for _, r := range a.runs {
		if r.ID == id {
			return r
		}
	}
	return nil
}

func (a *fakeAPI) calls() []fakeCall {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.log)
}

func (a *fakeAPI) idsWithStatus(status string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for _, r := range a.runs {
		if r.Status == status {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func fakeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func fakeError(w http.ResponseWriter, code int, msg string) {
	fakeJSON(w, code, map[string]string{"error": msg})
}

func (a *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := strings.TrimPrefix(r.URL.EscapedPath(), "/api/")
	parts := strings.Split(p, "/")
	for i := range parts {
		parts[i], _ = url.PathUnescape(parts[i])
	}
	switch {
	case r.Method == "GET" && p == "stats":
		a.stats(w)
	case r.Method == "GET" && p == "runs":
		a.list(w, r)
	case r.Method == "GET" && p == "needs-human":
		fakeJSON(w, 200, map[string]any{"runs": []any{}, "more": false})
	case r.Method == "GET" && len(parts) == 2 && parts[0] == "runs":
		run := a.find(parts[1])
		if run == nil {
			fakeError(w, 404, "dashboard: no run "+parts[1])
			return
		}
		d := run.fakeDetail
		d.Actions = map[string]map[string]any{}
		for _, act := range []string{"undo", "cancel", "retry", "rollback"} {
			code, body := a.decide(run.ID, act)
			d.Actions[act] = map[string]any{"allowed": code == 202, "reason": body["error"]}
		}
		fakeJSON(w, 200, d)
	case r.Method == "GET" && len(parts) == 5 && parts[0] == "runs" && parts[2] == "maps" && parts[4] == "elements":
		a.elements(w, r, parts[1], parts[3])
	case r.Method == "POST" && p == "runs/actions":
		a.batch(w, r)
	case r.Method == "POST" && len(parts) == 3 && parts[0] == "runs":
		a.action(w, r, parts[1], parts[2])
	default:
		fakeError(w, 404, "no such endpoint")
	}
}

func (a *fakeAPI) stats(w http.ResponseWriter) {
	byStatus := map[string]int{}
	byReactor := map[string]map[string]int{}
	for _, r := range a.runs {
		byStatus[r.Status]++
		if byReactor[r.Reactor] == nil {
			byReactor[r.Reactor] = map[string]int{}
		}
		byReactor[r.Reactor][r.Status]++
	}
	fakeJSON(w, 200, map[string]any{
		"by_status":  byStatus,
		"by_reactor": byReactor,
		"queues": []map[string]any{
			{"queue": "goreactor", "served": true, "pending": 12, "active": 4, "scheduled": 0, "retry": 1, "archived": 0, "oldest_pending_age_ms": 1840},
			{"queue": "goreactor:checkout", "served": true, "pending": 1287, "active": 16, "scheduled": 3, "retry": 0, "archived": 2, "oldest_pending_age_ms": 65200},
			{"queue": "goreactor:control", "served": false, "pending": 0, "active": 0, "scheduled": 0, "retry": 0, "archived": 0, "oldest_pending_age_ms": 0},
		},
		"control_queue": "goreactor",
		"warnings":      []string{`no worker serves queue "goreactor:control": its runs and the actions on them wait there until a worker serving it starts (worker -queue goreactor:control, or GOREACTOR_QUEUE=goreactor:control)`},
	})
}

func (a *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 50
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 500 {
			fakeError(w, 400, "dashboard: limit must be 1..500")
			return
		}
		limit = n
	}
	from := 0
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(c, "o"))
		if err != nil {
			fakeError(w, 400, "dashboard: bad cursor")
			return
		}
		from = n
	}
	var match []fakeSummary
	for _, run := range a.runs {
		if (q.Get("status") == "" || run.Status == q.Get("status")) &&
			(q.Get("reactor") == "" || run.Reactor == q.Get("reactor")) &&
			(q.Get("q") == "" || strings.HasPrefix(run.ID, q.Get("q"))) {
			s := run.fakeSummary
			if s.Failure != nil {
				s.Failure = &fakeFailure{Step: s.Failure.Step, Message: s.Failure.Message}
			}
			match = append(match, s)
		}
	}
	page, next := match[min(from, len(match)):], ""
	if len(page) > limit {
		page, next = page[:limit], "o"+strconv.Itoa(from+limit)
	}
	if page == nil {
		page = []fakeSummary{}
	}
	fakeJSON(w, 200, map[string]any{"runs": page, "next_cursor": next})
}

func (a *fakeAPI) elements(w http.ResponseWriter, r *http.Request, id, step string) {
	run := a.find(id)
	if run == nil || run.maps[step] == nil {
		fakeError(w, 404, "dashboard: no map "+step+" in run "+id)
		return
	}
	m := run.maps[step]
	total := len(m.states)
	from, _ := strconv.Atoi(r.URL.Query().Get("from"))
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		limit, _ = strconv.Atoi(s)
	}
	type element struct {
		Index           int    `json:"index"`
		State           string `json:"state"`
		Error           string `json:"error"`
		RollbackOutcome string `json:"rollback_outcome"`
	}
	els := []element{}
	for i := from; i < min(total, from+limit); i++ {
		els = append(els, element{Index: i, State: m.states[i], Error: m.errors[i], RollbackOutcome: m.outcomes[i]})
	}
	next := from + limit
	if next >= total {
		next = -1
	}
	bucket := (total + 999) / 1000
	cells := []map[string]int{}
	for lo := 0; lo < total; lo += bucket {
		c := map[string]int{"from": lo, "to": min(lo+bucket, total) - 1} // inclusive, as the real API
		for _, s := range []string{"pending", "running", "completed", "failed", "undone", "undo_failed", "unavailable"} {
			c[s] = 0
		}
		for i := lo; i < min(lo+bucket, total); i++ {
			c[m.states[i]]++
		}
		cells = append(cells, c)
	}
	fakeJSON(w, 200, map[string]any{"map_id": m.id, "total": total, "from": from, "next_from": next, "elements": els,
		"summary": map[string]any{"bucket_size": bucket, "cells": cells}})
}

func (a *fakeAPI) authorized(w http.ResponseWriter, r *http.Request) bool {
	want := "Bearer " + a.token
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
		fakeError(w, 401, "dashboard: missing or wrong bearer token; send Authorization: Bearer <GOREACTOR_DASHBOARD_TOKEN>")
		return false
	}
	return true
}

// decide answers one action on one run as the engine would.
func (a *fakeAPI) decide(id, action string) (int, map[string]any) {
	run := a.find(id)
	if run == nil {
		return 404, map[string]any{"error": "dashboard: no run " + id}
	}
	refuse := func(err string) (int, map[string]any) {
		return 409, map[string]any{"error": fmt.Sprintf("%s (run %s is %s; %s refused)", err, id, run.Status, action), "status": run.Status}
	}
	switch {
	case action == "cancel" && run.Status == "rolling_back":
		return refuse("reactor: rollback already in progress; wait for the run to reach failed or cancelled")
	case action == "retry" && run.Status != "failed" && run.Status != "cancelled" && run.Status != "aborted":
		return refuse("dashboard: only a failed, cancelled or aborted run can be retried")
	case action != "undo" && action != "cancel" && action != "retry":
		return 400, map[string]any{"error": "dashboard: unknown action " + action}
	}
	return 202, map[string]any{"run_id": id, "action": action, "task_id": "ctl:" + id + ":" + action + ":1", "duplicate": false}
}

func (a *fakeAPI) action(w http.ResponseWriter, r *http.Request, id, action string) {
	call := fakeCall{Path: r.URL.Path, Auth: r.Header.Get("Authorization")}
	defer func() { a.log = append(a.log, call) }()
	if !a.authorized(w, r) {
		call.Code = 401
		return
	}
	var req struct {
		Reason string `json:"reason"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil || strings.TrimSpace(req.Reason) == "" {
		call.Code = 400
		fakeError(w, 400, "dashboard: a reason is required")
		return
	}
	call.Reason = req.Reason
	code, body := a.decide(id, action)
	call.Code = code
	fakeJSON(w, code, body)
}

func (a *fakeAPI) batch(w http.ResponseWriter, r *http.Request) {
	call := fakeCall{Path: r.URL.Path, Auth: r.Header.Get("Authorization")}
	defer func() { a.log = append(a.log, call) }()
	if !a.authorized(w, r) {
		call.Code = 401
		return
	}
	var req struct {
		Action string   `json:"action"`
		IDs    []string `json:"ids"`
		Reason string   `json:"reason"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		call.Code = 400
		fakeError(w, 400, "dashboard: bad body: "+err.Error())
		return
	}
	call.Action, call.IDs, call.Reason, call.Code = req.Action, req.IDs, req.Reason, 200
	type result struct {
		RunID      string `json:"run_id"`
		StatusCode int    `json:"status_code"`
		TaskID     string `json:"task_id"`
		Duplicate  bool   `json:"duplicate"`
		Error      string `json:"error"`
	}
	results := []result{}
	for _, id := range req.IDs {
		code, body := a.decide(id, req.Action)
		task, _ := body["task_id"].(string)
		msg, _ := body["error"].(string)
		results = append(results, result{RunID: id, StatusCode: code, TaskID: task, Error: msg})
	}
	fakeJSON(w, 200, map[string]any{"results": results})
}

// pollUntil returns a wait on the page of ctx: poll(what, js) returns once
// the JavaScript expression js is true, and fails the test naming what it
// waited for if that takes over 20 s.
func pollUntil(t *testing.T, ctx context.Context) func(what, js string) {
	return func(what, js string) {
		t.Helper()
		_, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second)))
		require.NoError(t, err, "waiting until %s (%s)", what, js)
	}
}
