package dashboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// refundApproval is the payload the paused story's interrupt waits for.
type refundApproval struct {
	Approver string `json:"approver"`
	Approved bool   `json:"approved"`
	Note     string `json:"note"`
}

// An operator finds the paused runs under Paused, with what each expects,
// opens one, fills the continue form prefilled with the example (reason,
// confirm, token) and the run completes; its page then shows it so.
func TestBrowserPausedRunIsContinued(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "", "")
	const aliceToken = "alice-token-0123456789"
	def := reactor.MustDefine("refund",
		reactor.Input[string]("order", reactor.Required()),
		reactor.Step("hold_funds", reactor.StepConfig[reactor.Args, bool]{
			Run: func(context.Context, reactor.Args) (bool, error) { return true, nil },
		}),
		reactor.Interrupt("approve", reactor.InterruptConfig[reactor.Args, refundApproval]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			After: []string{"hold_funds"},
			Correlation: func(in reactor.Args) (string, error) {
				o, err := reactor.Arg[string](in, "order")
				return "refund-" + o, err
			},
			Validate: func(a refundApproval) error {
				if a.Approver == "" {
					return errors.New("name the approver")
				}
				return nil
			},
			Timeout: 4 * time.Hour,
		}),
		reactor.Step("pay_out", reactor.StepConfig[reactor.Args, string]{
			After: []string{"approve"},
			Run:   func(context.Context, reactor.Args) (string, error) { return "paid", nil },
		}),
	)
	dash, err := New(Config{Client: st.rdb, Prefix: st.prefix, Queues: []string{st.queue}, ControlQueue: st.queue,
		Operators: map[string]string{aliceToken: "alice"}, Definitions: []*reactor.Definition{def},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ids := []string{"rf-1041", "rf-1042", "rf-1043"}
	for i, id := range ids {
		_, err := st.engine.Enqueue(bg, def, map[string]any{"order": fmt.Sprintf("A-%d", 7710+i)}, reactor.WithRunID(id))
		require.NoError(t, err)
	}
	for _, id := range ids {
		require.Eventually(t, func() bool {
			run, err := st.engine.Get(bg, id)
			return err == nil && run.Status == reactor.StatusPaused
		}, 30*time.Second, 10*time.Millisecond, "run %s pauses", id)
	}

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	console := watchConsole(t, bctx)
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("nav-paused"))))
	poll("the navigation links the paused view", `new URL(document.getElementById('nav-paused').href).pathname === '/paused'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/paused"), chromedp.WaitVisible(chromedp.CSS("#paused tr"))))
	poll("the paused page lists the three runs", `document.querySelectorAll('#paused tr.paused-run').length === 3`)
	poll("each with its step, correlation, deadline and expected payload", `[...document.querySelectorAll('#paused tr.paused-run')].every(r =>
		r.dataset.step === 'approve' && r.textContent.includes('refund-A-77') && r.querySelector('.time-left') &&
		r.querySelector('.expected').textContent.startsWith('dashboard.refundApproval {"approver":"","approved":false,"note":""}') &&
		r.textContent.includes('0 / 1'))`)
	poll("the nav marks the page", `document.getElementById('nav-paused').getAttribute('aria-current') === 'page'`)
	if os.Getenv("GOREACTOR_UPDATE_SCREENSHOT") == "1" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		p := filepath.Join("..", "docs", "dashboard-paused.png")
		require.NoError(t, os.WriteFile(p, png, 0o644))
		t.Logf("wrote %s", p)
	}

	poll("the run links its page", `new URL(document.querySelector('#paused tr[data-id="rf-1042"] a').href).pathname === '/runs/rf-1042'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/runs/rf-1042"), chromedp.WaitVisible(chromedp.ID("run-status"))))
	poll("the run page shows the interrupt", `!document.getElementById('interrupt-panel').hidden &&
		document.getElementById('interrupt-facts').textContent.includes('refund-A-7711')`)
	poll("the form is prefilled with the example", `document.getElementById('continue-step').value === 'approve' &&
		JSON.parse(document.getElementById('continue-payload').value).approver === '' && !document.getElementById('continue-button').disabled`)
	if dir := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); dir != "" { // to look at it
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "paused-run.png"), png, 0o644))
	}
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Evaluate[chromedp.Void](`(t => { t.value = JSON.stringify({approver: 'alice', approved: true, note: 'goodwill'}, null, 2); t.dispatchEvent(new Event('input')); })(document.getElementById('continue-payload'))`),
		chromedp.SendKeys(chromedp.ID("continue-reason"), "refund approved on ticket 5120"),
		chromedp.Click(chromedp.ID("continue-button"))))
	poll("the confirmation names the step", `document.getElementById('confirm-dialog').open && document.getElementById('confirm-text').textContent.includes('step approve')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), aliceToken), chromedp.Click(chromedp.ID("token-save"))))
	poll("the payload is recorded", `[...document.querySelectorAll('#messages .msg-ok .msg-title')].some(e => e.textContent === 'Payload recorded for run rf-1042')`)
	final, err := st.engine.Wait(bg, "rf-1042")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, final.Status, "%v", final.Err())
	poll("the page shows the run completed, the interrupt gone", `document.getElementById('run').dataset.status === 'completed' &&
		document.getElementById('interrupt-panel').hidden`)
	poll("the audit shows who continued and why", `[...document.querySelectorAll('#audit .audit-request')].some(e =>
		e.querySelector('.audit-operator').textContent === 'alice' && e.textContent.startsWith('continue by alice'))`)
	console.check(t)
}
