package dashboard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
)

// docsShots is where the screenshots for docs/dashboard.md go: only when
// GOREACTOR_DOCS_SHOTS names a directory, so that a normal run never
// rewrites them. A relative one is from the repository root
// (GOREACTOR_DOCS_SHOTS=docs/), not from this package's directory, where
// the test runs.
func docsShots() string {
	dir := os.Getenv("GOREACTOR_DOCS_SHOTS")
	if dir != "" && !filepath.IsAbs(dir) {
		dir = filepath.Join("..", dir)
	}
	return dir
}

// failMany stores n failed runs of def in-process (Engine.Run, on workers
// goroutines): no worker needed.
func failMany(t *testing.T, engine *reactor.Engine, def *reactor.Definition, n, workers int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				res, err := engine.Run(ctx, def, nil, reactor.WithRunID(fmt.Sprintf("bulk-%04d", i)))
				if err == nil && res.Status != reactor.StatusFailed {
					err = fmt.Errorf("run %d: %s, not failed", i, res.Status)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// "Select all N matching" against the real dashboard: 1,200 failed runs
// (stored in-process), the failed filter shows 50; selecting the page
// offers all 1,200; the confirmation names the exact count. One run
// expires before the confirmation: the server counts 1,199 and refuses,
// the page offers 1,199, and confirmed, the server queues 1,199 retries
// (each in its run's audit). The UTC/local toggle, the failure text and a
// time range on the way.
func TestBrowserSelectAllMatching(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "match-token"
	const n = 1200
	st := newRealStack(t, token, "-ctl")
	def := reactor.MustDefine("bulk-pay", reactor.Step("charge", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New("card declined by issuer"))
		},
	}))
	require.NoError(t, st.engine.Register(def))
	began := time.Now()
	failMany(t, st.engine, def, n, 8)
	t.Logf("%d failed runs stored in-process in %s", n, time.Since(began).Round(time.Millisecond))

	bctx, bcancel := context.WithTimeout(ctx, 90*time.Second)
	defer bcancel()
	poll := pollUntil(t, bctx)
	console := watchConsole(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/?status=failed"), chromedp.WaitVisible(chromedp.CSS("#runs tr"))))
	poll("a page of failed runs", `document.querySelectorAll('#runs tr').length === 50 && !document.getElementById('load-more').hidden`)

	// Times: the toggle switches every absolute time to UTC, and back.
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("zone-button"))))
	poll("every time shows UTC", `[...document.querySelectorAll('time[data-mode]:not([data-mode="ago"])')].length >= 50 &&
		[...document.querySelectorAll('time[data-mode]:not([data-mode="ago"])')].every(t => t.querySelector('.tz').textContent === ' UTC') &&
		document.getElementById('zone-button').textContent === 'UTC' && localStorage.getItem('goreactor.dashboard.zone') === 'utc'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#runs tr time"))))
	poll("the zone survives a reload", `document.getElementById('zone-button').textContent === 'UTC' &&
		document.querySelector('#runs tr time .tz').textContent === ' UTC'`)

	// The failure text narrows the listing (case-insensitive).
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("filter-failure"), "BY ISSUER")))
	poll("the failure text is in the URL and the list", `location.search.includes('failure=BY+ISSUER') || location.search.includes('failure=BY%20ISSUER')`)
	poll("the rows match it", `document.querySelectorAll('#runs tr').length === 50 &&
		[...document.querySelectorAll('#runs .fail-msg')].every(m => m.textContent.includes('declined by issuer'))`)

	// A range after every run: nothing matches; cleared, the runs are back.
	setInput := func(id, v string) {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`(() => { const i = document.getElementById(`+jsString(id)+`);
			i.value = `+jsString(v)+`; i.dispatchEvent(new Event('change')); return true; })()`))
		require.NoError(t, err)
	}
	setInput("filter-from", time.Now().UTC().Add(time.Hour).Format("2006-01-02T15:04:05"))
	poll("a range after every run matches none", `location.search.includes('from=') && document.querySelectorAll('#runs tr').length === 0 &&
		!document.getElementById('runs-empty').hidden`)
	setInput("filter-from", "")
	poll("the runs are back", `!location.search.includes('from=') && document.querySelectorAll('#runs tr').length === 50`)

	// Select the page: the overview offers every matching run.
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("select-all"))))
	poll("select all 1,200 matching is offered", `document.getElementById('select-matching-button')?.textContent === 'Select all 1,200 matching'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("select-matching-button"))))
	poll("all 1,200 are selected", `document.getElementById('batch-count').textContent === 'All 1,200 matching runs selected'`)
	// One of them expires before the operator confirms: the server counts
	// 1,199, refuses, and the page offers the new count.
	require.NoError(t, st.rdb.Del(context.Background(), keys.New(st.prefix).RunState("bulk-0007")).Err())
	confirm := func(reason string) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("confirm-reason"), reason), chromedp.Click(chromedp.ID("confirm-yes"))))
	}
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`[data-batch="retry"]`))))
	poll("the confirmation states the count", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-title').textContent === 'Retry 1,200 runs?'`)
	confirm("issuer outage is over")
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the server refuses: the count changed", `[...document.querySelectorAll('#messages .msg-error')].some(e =>
		e.textContent.includes('refused (409)') && e.textContent.includes('matches 1199 runs now, not the 1200 confirmed'))`)
	poll("the page offers the new count", `document.getElementById('select-matching-button')?.textContent === 'Select all 1,199 matching'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("select-matching-button"))))
	poll("all 1,199 are selected", `document.getElementById('batch-count').textContent === 'All 1,199 matching runs selected'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`[data-batch="retry"]`))))
	poll("the confirmation states the new count", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-title').textContent === 'Retry 1,199 runs?' &&
		document.getElementById('confirm-yes').textContent === 'Retry 1,199 runs' &&
		document.getElementById('confirm-text').textContent.includes('These are the 1,199 runs matching the filter below') &&
		[...document.querySelectorAll('#confirm-list li')].map(l => l.textContent).join('|').startsWith('status failed|failure containing \u201cby issuer\u201d|entered its status up to ')`)
	asked := time.Now()
	confirm("issuer outage is over")
	poll("1,199 retries are requested", `[...document.querySelectorAll('#messages .msg-ok .msg-title')].some(e => e.textContent === 'Retry: 1,199 requested (all 1,199 matching)')`)
	t.Logf("the matching batch of %d retries answered in %s", n-1, time.Since(asked).Round(time.Millisecond))
	poll("the selection is cleared", `document.getElementById('batch-bar').hidden`)
	console.check(t)

	// The runs recorded the engine's queue (its Enqueuer's): the retries
	// went there, one control task per run.
	info, err := asynq.NewInspectorFromRedisClient(st.rdb).GetQueueInfo(st.queue)
	require.NoError(t, err)
	require.Equal(t, n-1, info.Size, "one control task per run")
	for _, i := range []int{0, 599, n - 1} { // not 7, which expired
		audit, err := st.engine.Audit(context.Background(), fmt.Sprintf("bulk-%04d", i))
		require.NoError(t, err)
		var reasons []string
		for _, a := range audit {
			if a.Request == "retry" {
				reasons = append(reasons, a.Note)
			}
		}
		require.Contains(t, reasons, "issuer outage is over", "run %d", i)
	}
}

type gridItem struct {
	Item int `json:"item"`
}

// At 390 px wide nothing scrolls the page sideways (tables scroll in
// their panel) and a long run id wraps as a line or two, not a letter a
// line; under prefers-color-scheme: dark the pages are dark; the element
// grid's cells are one tab stop, moved by the arrow keys, with their
// counts as their label, and Enter opens a cell's elements. With
// GOREACTOR_DOCS_SHOTS set it writes the screenshots docs/dashboard.md
// shows.
func TestBrowserNarrowDarkAndGridKeys(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "", "")
	elem := reactor.MustDefine("grid-elem", reactor.Input[int]("item"), reactor.Step("pack", reactor.StepConfig[gridItem, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run: func(_ context.Context, in gridItem) (int, error) {
			if in.Item%7 == 3 {
				return 0, reactor.Permanent(errors.New("box " + strconv.Itoa(in.Item) + " is crushed"))
			}
			return in.Item, nil
		},
	}))
	owner := reactor.MustDefine("warehouse-fulfilment-with-a-long-name", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), Partial: true}))
	require.NoError(t, st.engine.Register(owner, elem))
	items := make([]int, 40)
	for i := range items {
		items[i] = i
	}
	const long = "order-2026-12-03-customer-004711-retry-of-ord-20261201-0042-eu-west"
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := st.engine.Run(bg, owner, map[string]any{"items": items}, reactor.WithRunID(long))
	require.NoError(t, err)
	fail := reactor.MustDefine("quick-fail", reactor.Step("boom", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New("the payment provider answered 503 Service Unavailable after 30 s"))
		},
	}))
	require.NoError(t, st.engine.Register(fail))
	for i := range 5 {
		_, err := st.engine.Run(bg, fail, nil, reactor.WithRunID(fmt.Sprintf("checkout-2026-12-03-%06d", i)))
		require.NoError(t, err)
	}

	bctx, bcancel := context.WithTimeout(ctx, 90*time.Second)
	defer bcancel()
	poll := pollUntil(t, bctx)
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, js)
		return v
	}
	console := watchConsole(t, bctx)
	shot := func(name string) {
		t.Helper()
		if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" { // the whole page, to look at
			png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
			require.NoError(t, err, name)
			require.NoError(t, os.WriteFile(filepath.Join(d, "full-"+name), png, 0o644))
		}
		dir := docsShots()
		if dir == "" {
			return
		}
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		require.NoError(t, err, name)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
		t.Logf("wrote %s (%d bytes)", filepath.Join(dir, name), len(png))
	}

	// 390 px: the overview and the run page.
	require.NoError(t, chromedp.Do(bctx, chromedp.EmulateViewport(390, 844)))
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#runs tr"))))
	poll("the overview's rows are in", `document.querySelectorAll('#runs tr').length === 6`)
	const noOverflow = `document.documentElement.scrollWidth <= 390`
	// wide names the elements that reach past 390 px, for the failure.
	wide := func() string {
		return eval(`[...document.querySelectorAll('body *')].filter(e => e.getBoundingClientRect().right > 391 && e.offsetParent !== null)
			.slice(0, 12).map(e => e.tagName + (e.id ? '#' + e.id : '') + '.' + e.className + ':' + Math.round(e.getBoundingClientRect().right)).join(' ')`)
	}
	require.Equal(t, "true", eval(`String(`+noOverflow+`)`), "overview at 390 px: the page is %s px wide: %s", eval(`String(document.documentElement.scrollWidth)`), wide())
	idLines := eval(`(() => { const c = document.querySelector('#runs td.id-cell');
		return String(Math.round(c.getBoundingClientRect().height / (parseFloat(getComputedStyle(c).lineHeight) || 18))); })()`)
	require.Contains(t, []string{"1", "2"}, idLines, "a run id cell of the list is a line or two high")
	shot("dashboard-390-overview.png")
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/"+long), chromedp.WaitVisible(chromedp.CSS(".grid .cell"))))
	poll("the run page is drawn", `document.querySelectorAll('.grid .cell').length === 40`)
	require.Equal(t, "true", eval(`String(`+noOverflow+`)`), "run page at 390 px: the page is %s px wide: %s", eval(`String(document.documentElement.scrollWidth)`), wide())
	lines := eval(`(() => { const h = document.getElementById('run-id') || document.querySelector('.run-title h1');
		const lh = parseFloat(getComputedStyle(h).lineHeight) || 20; return String(Math.round(h.getBoundingClientRect().height / lh)); })()`)
	nl, err := strconv.Atoi(lines)
	require.NoError(t, err)
	require.LessOrEqual(t, nl, 4, "the run id wraps as a few lines, not a letter a line")
	shot("dashboard-390.png")

	// The grid: one tab stop, arrows move, Enter opens, counts in the label.
	require.Equal(t, "1", eval(`String(document.querySelectorAll('.grid .cell[tabindex="0"]').length)`))
	require.Equal(t, "element 3: failed 1", eval(`document.querySelector('.grid .cell[data-index="3"]').getAttribute('aria-label')`))
	require.NoError(t, chromedp.Do(bctx, chromedp.Focus(chromedp.CSS(`.grid .cell[tabindex="0"]`))))
	require.NoError(t, chromedp.Do(bctx, chromedp.KeyEvent(kb.ArrowRight), chromedp.KeyEvent(kb.ArrowRight), chromedp.KeyEvent(kb.ArrowRight)))
	poll("the focus moved to cell 3", `document.activeElement?.dataset.index === '3' && document.activeElement.tabIndex === 0 &&
		document.querySelectorAll('.grid .cell[tabindex="0"]').length === 1`)
	require.NoError(t, chromedp.Do(bctx, chromedp.KeyEvent(kb.Enter)))
	poll("Enter opens the cell's elements", `document.querySelector('.elements-box .el-head strong')?.textContent === 'Elements 3' &&
		document.querySelector('.elements-box .bad-text').textContent.includes('box 3 is crushed')`)
	poll("the focus survives the grid's refresh", `document.activeElement?.dataset.index === '3'`)

	// Dark mode, at a laptop's width.
	_, err = chromedp.Run(bctx, func(ctx context.Context, _ *chromedp.Target) (cdp.Empty, error) {
		return chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}}})
	})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx, chromedp.EmulateViewport(1280, 800)))
	const dark = `(() => { const lum = el => { const m = getComputedStyle(el).backgroundColor.match(/\d+(\.\d+)?/g).map(Number);
		return (0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]) / 255; };
		return String(lum(document.body) < 0.2 && lum(document.querySelector('.panel')) < 0.25 &&
			parseFloat(getComputedStyle(document.body).color.match(/\d+/)[0]) > 180); })()`
	poll("the run page turns dark", dark+` === 'true'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/?status=failed"), chromedp.WaitVisible(chromedp.CSS("#runs tr"))))
	poll("the overview is dark", dark+` === 'true'`)
	shot("dashboard-dark.png")
	console.check(t)
}
