package dashboard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/fingerprint"
	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

type realItem struct {
	Item int `json:"item"`
}

// The acceptance story against the real stack: dashboard.New (with its
// worker controller) over real Redis, a real worker running a 200-element
// fan-out map that rolls back as fast as the test releases its undos, and
// a run that failed. The cancel of the rolling-back run is refused with the
// engine's reason.
func TestBrowserStoryAgainstTheRealStack(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "real-token"
	// The runs record the worker's queue, so the batch retry goes there
	// and is carried out; the dashboard's own control queue (for runs
	// that recorded none) is one no worker serves.
	st := newRealStack(t, token, "-ctl")
	engine, srv := st.engine, st.srv

	release := make(chan struct{}, 1000)
	elem := reactor.MustDefine("rb-elem", reactor.Input[int]("item"), reactor.Step("reserve", reactor.StepConfig[realItem, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run:  func(_ context.Context, in realItem) (int, error) { return in.Item, nil },
		Undo: func(ctx context.Context, _ realItem, out int) error {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			return nil
		},
	}))
	owner := reactor.MustDefine("checkout", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 10}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("card declined"))
			},
		}))
	quick := reactor.MustDefine("quick-fail", reactor.Input[int]("n"), reactor.Step("boom", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) {
			return "", reactor.Permanent(errors.New("<b>boom</b>"))
		},
	}))
	st.startWorker(4, owner, elem, quick)
	t.Cleanup(func() { close(release) })

	bg, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	_, err := engine.Enqueue(bg, quick, map[string]any{"n": 1}, reactor.WithRunID("qf-1"))
	require.NoError(t, err)
	_, err = engine.Wait(bg, "qf-1")
	require.NoError(t, err)
	items := make([]int, 200)
	for i := range items {
		items[i] = i
	}
	_, err = engine.Enqueue(bg, owner, map[string]any{"items": items}, reactor.WithRunID("rb-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := engine.Get(bg, "rb-1")
		return err == nil && run.Status == reactor.StatusRollingBack
	}, 60*time.Second, 10*time.Millisecond, "rb-1 rolls back")
	dir := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		dir = d
	}
	runBrowserStory(t, ctx, srv.URL, browserStory{
		Token: token, RollingBack: "rb-1", MapStep: "each", Refusal: "rollback already in progress",
		Advance: func(*testing.T) {
			for range 30 {
				release <- struct{}{}
			}
		},
		ShotDir: dir,
	})
}

// The run page of a run whose rollback left an effect in place shows the
// rollback status table (needs human, the failed entry) and the audit
// trail, against the real stack; with the token, "Retry rollback" is
// requested and a worker carries it out, and the page turns to reverted.
func TestBrowserRollbackStatusAndAudit(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "audit-token"
	st := newRealStack(t, token, "") // control tasks on the worker's own queue
	engine, srv := st.engine, st.srv
	var refunds atomic.Int32
	def := reactor.MustDefine("audited",
		reactor.Step("charge", reactor.StepConfig[reactor.Args, string]{
			Run: func(context.Context, reactor.Args) (string, error) { return "ch", nil },
			Undo: func(context.Context, reactor.Args, string) error {
				if refunds.Add(1) == 1 {
					return reactor.Permanent(errors.New("refund API down"))
				}
				return nil
			},
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{After: []string{"charge"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("no courier"))
			},
		}))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := engine.Enqueue(bg, def, nil, reactor.WithRunID("audited-1"))
	require.NoError(t, err)
	_, err = engine.Wait(bg, "audited-1")
	require.NoError(t, err)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/runs/audited-1"),
		chromedp.WaitVisible(chromedp.ID("rbstatus-panel"))))
	poll("the summary reads needs human", `document.querySelector('#rbstatus .rb-outcome')?.textContent === 'needs human'`)
	poll("the failed entry is listed", `[...document.querySelectorAll('#rbstatus tbody tr')].some(r => r.textContent.includes('charge') && r.textContent.includes('compensation_failed'))`)
	poll("the audit trail is shown", `document.querySelectorAll('#audit .audit-item').length >= 4 &&
		[...document.querySelectorAll('#audit .audit-item')].some(e => e.textContent.includes('compensation failed') && e.textContent.includes('sha256:'))`)
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(t.TempDir(), "rollback-status.png"), png, 0o644))

	// Retry the rollback from the page: confirm, give the token.
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`button[data-action="rollback"]`))))
	poll("the confirmation says what happens", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-text').textContent.includes('undo again only the entries its last rollback could not undo')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("confirm-reason"), "refund service is back"),
		chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the summary turns reverted", `document.querySelector('#rbstatus .rb-outcome')?.textContent === 'reverted'`)
	require.Equal(t, int32(2), refunds.Load(), "the failed refund was retried once")
}

// The run page of a completed run lists the steps still applied; ticking
// one and clicking "Undo selected steps" (confirm, token) has a worker undo
// that step alone: its rollback status turns compensated while the run
// stays completed and the other steps stay on the undo stack.
func TestBrowserUndoSelectedSteps(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "steps-token"
	st := newRealStack(t, token, "") // control tasks on the worker's own queue
	engine, srv := st.engine, st.srv
	var mu sync.Mutex
	var undos []string
	step := func(name string, after ...string) reactor.Part {
		return reactor.Step(name, reactor.StepConfig[reactor.Args, string]{After: after,
			Run: func(context.Context, reactor.Args) (string, error) { return name, nil },
			Undo: func(context.Context, reactor.Args, string) error {
				mu.Lock()
				defer mu.Unlock()
				undos = append(undos, name)
				return nil
			},
		})
	}
	def := reactor.MustDefine("picked", step("reserve"), step("charge", "reserve"), step("ship", "charge"))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := engine.Enqueue(bg, def, nil, reactor.WithRunID("picked-1"))
	require.NoError(t, err)
	done, err := engine.Wait(bg, "picked-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, done.Status)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	const stack = `[...document.querySelectorAll('#undosteps tbody tr')].map(r => r.dataset.step).join(',')`
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/runs/picked-1"),
		chromedp.WaitVisible(chromedp.ID("undosteps-panel"))))
	poll("the undo stack lists the three steps", stack+` === 'reserve,charge,ship'`)
	poll("nothing is selected yet", `document.getElementById('undo-steps-button').disabled`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#undosteps input.undo-pick[data-step="charge"]`))))
	poll("the button is enabled", `!document.getElementById('undo-steps-button').disabled &&
		document.getElementById('undosteps-picked').textContent === '1 step selected'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("undo-steps-button"))))
	poll("the confirmation names the step and says the rest stays", `document.getElementById('confirm-dialog').open &&
		[...document.querySelectorAll('#confirm-list li')].map(l => l.textContent).join(',') === 'charge' &&
		document.getElementById('confirm-text').textContent.includes('the run stays completed')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("confirm-reason"), "charged twice, ticket 12"),
		chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the request is accepted", `[...document.querySelectorAll('#messages .msg-ok')].some(m => m.textContent.includes('Undo of 1 step requested for run picked-1'))`)
	poll("the step's rollback status is compensated", `document.getElementById('rbstatus-panel').hidden === false &&
		[...document.querySelectorAll('#rbstatus tbody tr')].some(r => r.children[1].textContent === 'charge' && r.children[2].textContent === 'compensated')`)
	poll("the run stays completed, the other steps applied", `document.getElementById('run').dataset.status === 'completed' &&
		document.querySelector('#run-status .badge').textContent === 'completed' && `+stack+` === 'reserve,ship'`)
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	shot := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		shot = d
	}
	require.NoError(t, os.WriteFile(filepath.Join(shot, "undo-steps.png"), png, 0o644))

	run, err := engine.Get(bg, "picked-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, run.Status)
	mu.Lock()
	require.Equal(t, []string{"charge"}, undos, "only the ticked step was undone")
	mu.Unlock()
}

// realStack is the dashboard over real Redis with an engine (and, once
// started, a worker) on a queue of the test's own.
type realStack struct {
	t      *testing.T
	rdb    redis.UniversalClient
	prefix string
	queue  string
	engine *reactor.Engine
	srv    *httptest.Server
}

// newRealStack serves New with token; the control tasks of runs that
// recorded no queue go to the queue named by the test's queue plus
// ctlSuffix ("" : the worker's own queue), the others to the run's queue.
func newRealStack(t *testing.T, token, ctlSuffix string) *realStack {
	t.Helper()
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix,
		Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	dash, err := New(Config{Client: rdb, Prefix: prefix, Token: token, Queues: []string{queue},
		ControlQueue: queue + ctlSuffix, Logger: discard})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	return &realStack{t: t, rdb: rdb, prefix: prefix, queue: queue, engine: engine, srv: srv}
}

// startWorker registers defs and runs a worker on the stack's queue until
// the test ends.
func (st *realStack) startWorker(concurrency int, defs ...*reactor.Definition) {
	st.t.Helper()
	require.NoError(st.t, st.engine.Register(defs...))
	w := worker.New(st.engine, st.rdb, worker.Config{Queues: map[string]int{st.queue: 1}, ShutdownTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Concurrency: concurrency})
	require.NoError(st.t, w.Start(context.Background()))
	st.t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Stop(c)
	})
}

// The guarded-undo story against the real stack: a run whose undo found its
// resource changed by somebody else is listed under "Needs a person"; its
// page's Action required panel shows the resource and the fingerprints; the
// person picks "manually reverted", writes a note, resolves (confirm, token),
// and the entry turns manually_reverted while the panel empties.
func TestBrowserResolveConflict(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "resolve-token"
	st := newRealStack(t, token, "")
	fx := NewGuardFixture(st.rdb, "clobber-ui", st.prefix+":user:7/email")
	st.startWorker(2, fx.Def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := fx.Run(bg, st.engine, "clobber-ui-1")
	require.NoError(t, err)
	expected, _ := fingerprint.Of(GuardNewer)
	observed, _ := fingerprint.Of(GuardClobbered)
	restoreTo, _ := fingerprint.Of(GuardNew)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	q := jsString
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("needs-panel"))))
	poll("the run is under Needs a person", `document.getElementById('needs-count').textContent === '1' &&
		[...document.querySelectorAll('#needs-list .needs-run')].some(li => li.dataset.id === `+q(id)+` && li.textContent.includes('book/fix2#2'))`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#needs-list a.needs-link`)), chromedp.WaitVisible(chromedp.ID("rbstatus-panel"))))
	poll("the run page opens", `document.body.dataset.page === 'run' && document.getElementById('run').dataset.runId === `+q(id))
	const item = `document.querySelector('#action-required .action-item[data-entry="book/fix2#2"]')`
	poll("the Action required panel shows the resource and the fingerprints", `!document.getElementById('action-panel').hidden && `+item+` &&
		`+item+`.querySelector('.ai-resource').textContent === `+q(fx.Key)+` &&
		`+item+`.querySelector('.ai-expected').textContent === `+q(expected)+` &&
		`+item+`.querySelector('.ai-observed').textContent === `+q(observed)+` &&
		`+item+`.querySelector('.ai-restore-to').textContent === `+q(restoreTo)+` &&
		`+item+`.querySelector('.ai-blocked').textContent.includes('book/fix1#1') &&
		document.getElementById('action-required-text').textContent.includes(`+q(observed)+`)`)
	poll("beside each fingerprint, the value", item+`.querySelector('.ai-expected-value').textContent === `+q(`"`+GuardNewer+`"`)+` &&
		`+item+`.querySelector('.ai-observed-value').textContent === `+q(`"`+GuardClobbered+`"`)+` &&
		`+item+`.querySelector('.ai-restore-to-value').textContent === `+q(`"`+GuardNew+`"`)+` &&
		document.getElementById('action-required-text').textContent.includes(`+q(`"`+GuardClobbered+`"`)+`) &&
		[...document.querySelectorAll('#rbstatus tbody tr[data-entry="book/fix2#2"] .fp-val')].some(v => v.textContent === `+q(`"`+GuardClobbered+`"`)+`)`)
	poll("the status table shows the blocked entry and the fingerprints", `[...document.querySelectorAll('#rbstatus tbody tr')].some(r =>
		r.dataset.entry === 'book/fix1#1' && r.dataset.status === 'blocked' && r.querySelector('.rb-blocked-by').textContent === 'book/fix2#2') &&
		[...document.querySelectorAll('#rbstatus tbody tr[data-entry="book/fix2#2"] .fp')].some(f => f.title === `+q(observed)+`)`)
	poll("Resolve is disabled without a note", item+`.querySelector('.resolve-button').disabled`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#action-required .resolve-kind[data-kind="manually_reverted"]`))))
	poll("still disabled: the note is empty", item+`.querySelector('.resolve-button').disabled`)
	// The person puts the address back, then says so.
	require.NoError(t, st.rdb.Set(bg, fx.Key, GuardNew, 0).Err())
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.CSS(`#action-required .resolve-note`), "restored ada@new.test by hand, ticket SUP-12")))
	poll("Resolve is enabled", `!`+item+`.querySelector('.resolve-button').disabled`)
	shot := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		shot = d
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shot, "action-required.png"), png, 0o644))
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#action-required .resolve-button`))))
	poll("the confirmation names the entry and the note", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-title').textContent.includes('book/fix2#2') &&
		document.getElementById('confirm-list').textContent.includes('SUP-12')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the entry turns manually_reverted and the panel empties", `[...document.querySelectorAll('#rbstatus tbody tr')].some(r =>
		r.dataset.entry === 'book/fix2#2' && r.dataset.status === 'manually_reverted') &&
		document.getElementById('action-panel').hidden && document.querySelectorAll('#action-required .action-item').length === 0`)
	png, err = chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shot, "resolve.png"), png, 0o644))

	rep, err := st.engine.RollbackReport(bg, id)
	require.NoError(t, err)
	require.Empty(t, rep.ActionRequired)
	waiting, err := st.engine.NeedsHuman(bg, 10)
	require.NoError(t, err)
	require.NotContains(t, waiting, id)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/")))
	poll("nothing waits for a person", `document.getElementById('needs-count')?.textContent === '0' && document.querySelector('#needs-list .needs-none') !== null`)
}

// TestBrowserResolveAnElementConflictFromItsOwner: a fan-out map element's
// guarded undo conflicted; the owner's page lists it under Action required,
// naming the element run, and resolving it there settles both runs.
func TestBrowserResolveAnElementConflictFromItsOwner(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "owner-token"
	st := newRealStack(t, token, "")
	owner, element, key := TierDefs(st.rdb, st.prefix)
	st.startWorker(2, owner, element)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n := range 3 {
		require.NoError(t, st.rdb.Set(bg, key(n), "basic", 0).Err())
	}
	_, err := st.engine.Enqueue(bg, owner, map[string]any{"items": []int{0, 1, 2}}, reactor.WithRunID("tiers-ui"))
	require.NoError(t, err)
	final, err := st.engine.Wait(bg, "tiers-ui")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	elemID := mapstep.MapID("tiers-ui", "each") + ".1"

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	q := jsString
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/tiers-ui"), chromedp.WaitVisible(chromedp.ID("rbstatus-panel"))))
	const item = `document.querySelector('#action-required .action-item[data-entry="upgrade#1"]')`
	poll("the owner lists its element's conflict, naming the element run", `!document.getElementById('action-panel').hidden && `+item+` &&
		`+item+`.querySelector('a.ai-run') && `+item+`.querySelector('a.ai-run').textContent.includes(`+q(elemID)+`)`)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`#action-required .resolve-kind[data-kind="left_applied"]`)),
		chromedp.SendKeys(chromedp.CSS(`#action-required .resolve-note`), "platinum stays, agreed with support")))
	poll("Resolve is enabled", `!`+item+`.querySelector('.resolve-button').disabled`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#action-required .resolve-button`))))
	poll("the confirmation names the entry", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-title').textContent.includes('upgrade#1')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the owner's panel empties", `document.getElementById('action-panel').hidden &&
		document.querySelectorAll('#action-required .action-item').length === 0`)

	rep, err := st.engine.RollbackReport(bg, elemID)
	require.NoError(t, err)
	require.Empty(t, rep.ActionRequired, "resolved on the element run")
	waiting, err := st.engine.NeedsHuman(bg, 10)
	require.NoError(t, err)
	require.NotContains(t, waiting, elemID)
	require.NotContains(t, waiting, "tiers-ui")
	v, err := st.rdb.Get(bg, key(1)).Result()
	require.NoError(t, err)
	require.Equal(t, "platinum (support desk)", v, "left applied")
}
