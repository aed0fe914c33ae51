package dashboard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

// The acceptance story of issue 25 against the real stack: a fan-out
// map's rollback loses its worker and the tasks that were queued. The
// overview's Stalled tile counts it and its filter lists it with why (no
// worker serves its queue); its run page says "Stalled: ..." with the
// queue. A worker starts: the rollback stays stalled, its tasks were lost.
// Re-dispatch from the run page (confirm with a reason, token) has the
// sweeper's recovery re-enqueue them, and the worker completes the
// rollback: the run turns failed and the banner goes.
func TestBrowserStalledRollbackIsRedispatched(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "stall-browser-token"
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	rdb := redistest.Client(t)
	prefix, queue := redistest.Prefix(t), redistest.Queue(t)
	engine, err := reactor.NewEngine(context.Background(), reactor.Config{Client: rdb, Prefix: prefix,
		Enqueuer: worker.NewClient(rdb, queue), Logger: discard})
	require.NoError(t, err)
	dash, err := New(Config{Client: rdb, Prefix: prefix, Token: token, Queues: []string{queue}, ControlQueue: queue,
		StallAfter: 500 * time.Millisecond, Logger: discard})
	require.NoError(t, err)
	dash.stallCache.ttl, dash.served.ttl = time.Millisecond, time.Millisecond
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)

	release, held := make(chan struct{}), make(chan struct{}, 100)
	elem := reactor.MustDefine("stall-elem", reactor.Input[int]("item"), reactor.Step("reserve", reactor.StepConfig[realItem, int]{
		Args: reactor.Bindings{"item": reactor.FromInput("item")},
		Run:  func(_ context.Context, in realItem) (int, error) { return in.Item, nil },
		Undo: func(ctx context.Context, _ realItem, _ int) error {
			select {
			case held <- struct{}{}:
			default:
			}
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	}))
	owner := reactor.MustDefine("stall-checkout", reactor.Input[[]int]("items"),
		mapstep.Map("each", mapstep.Config{Element: elem, Items: reactor.FromInput("items"), FanOut: true, BatchSize: 5}),
		reactor.Step("decline", reactor.StepConfig[reactor.Args, string]{
			After: []string{"each"},
			Run: func(context.Context, reactor.Args) (string, error) {
				return "", reactor.Permanent(errors.New("card declined"))
			},
		}))
	require.NoError(t, engine.Register(owner, elem))
	start := func() *worker.Worker {
		w := worker.New(engine, rdb, worker.Config{Queues: map[string]int{queue: 1}, ShutdownTimeout: 2 * time.Second,
			Logger: discard, Concurrency: 4})
		require.NoError(t, w.Start(context.Background()))
		t.Cleanup(func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = w.Stop(c)
		})
		return w
	}
	first := start()
	bg, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	items := make([]int, 30)
	for i := range items {
		items[i] = i
	}
	_, err = engine.Enqueue(bg, owner, map[string]any{"items": items}, reactor.WithRunID("stall-ui"))
	require.NoError(t, err)
	select {
	case <-held:
	case <-bg.Done():
		t.Fatal("the rollback never started")
	}
	// The worker goes, and what was queued with it.
	require.NoError(t, first.Stop(bg))
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for _, del := range []func(string) (int, error){insp.DeleteAllPendingTasks, insp.DeleteAllScheduledTasks, insp.DeleteAllRetryTasks} {
		_, err := del(queue)
		require.NoError(t, err)
	}

	bctx, bcancel := context.WithTimeout(ctx, 90*time.Second)
	defer bcancel()
	poll := pollUntil(t, bctx)
	q := jsString
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("stalls-panel"))))
	const row = `document.querySelector('#stalls-list .stall-run[data-id="stall-ui"]')`
	poll("the Stalled tile counts the rollback", `document.getElementById('stalls-count').textContent === '1'`)
	poll("the list says why: no worker serves its queue", row+` && `+row+`.dataset.kind === 'no_worker' &&
		`+row+`.textContent.includes('no worker serves queue "'+`+q(queue)+`+'"') && `+row+`.textContent.includes('rolling back')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#stalls-kinds button[data-kind="no_worker"]`))))
	poll("the no-worker filter keeps it", `document.querySelector('#stalls-kinds button[data-kind="no_worker"]').classList.contains('active') && `+
		row+` !== null && document.querySelectorAll('#stalls-list .stall-run').length === 1`)
	shot := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		shot = d
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shot, "stalls-overview.png"), png, 0o644))

	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#stalls-list a.stall-link`)), chromedp.WaitVisible(chromedp.ID("run-facts"))))
	const banner = `document.getElementById('stall-banner')`
	poll("the run page says it stalled, and why", `!`+banner+`.hidden && `+banner+`.textContent.startsWith('Stalled: no worker serves queue') &&
		[...document.querySelectorAll('#run-facts .fact')].some(f => f.textContent.includes(`+q(queue)+`))`)
	poll("re-dispatch is offered", `document.querySelector('.run-actions button[data-action="redispatch"]').dataset.allowed === 'true'`)
	poll("cancel and retry rollback say why not", `document.querySelector('.run-actions button[data-action="cancel"]').title.includes('rollback')`)

	// A worker serves the queue again: the lost tasks stay lost.
	close(release)
	start()
	poll("still stalled: its tasks were lost", banner+`.dataset.kind === 'lost' && `+banner+`.textContent.includes('its tasks were lost')`)
	png, err = chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shot, "stalls-run.png"), png, 0o644))

	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`.run-actions button[data-action="redispatch"]`))))
	poll("the confirmation says what a re-dispatch does", `document.getElementById('confirm-dialog').open &&
		document.getElementById('confirm-text').textContent.includes("the sweeper's recovery re-enqueues what it lost")`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("confirm-reason"), "rollback stuck after the worker pool went away, INC-25"),
		chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("the request is accepted", `[...document.querySelectorAll('#messages .msg-ok')].some(m => m.textContent.includes('Re-dispatch requested for run stall-ui'))`)
	poll("the rollback completes: the run turns failed and the banner goes", `document.getElementById('run').dataset.status === 'failed' && `+banner+`.hidden`)

	final, err := engine.Get(bg, "stall-ui")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusFailed, final.Status)
	audit, err := engine.Audit(bg, "stall-ui")
	require.NoError(t, err)
	var noted bool
	for _, ev := range audit {
		noted = noted || (ev.Request == redispatchAction && ev.Note == "rollback stuck after the worker pool went away, INC-25")
	}
	require.True(t, noted, "the re-dispatch is in the run's audit")
}
