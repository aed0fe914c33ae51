package dashboard

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// An operator cancels a live run from its page with a reason: the
// confirmation asks why, the token from the operators file names her, and
// the run's audit panel shows the request with her name and her words.
func TestBrowserCancelWithAReasonIsAuditedWithTheOperator(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "", "")
	const aliceToken = "alice-token-0123456789"
	dash, err := New(Config{Client: st.rdb, Prefix: st.prefix, Queues: []string{st.queue}, ControlQueue: st.queue,
		Operators: map[string]string{aliceToken: "alice"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(dash)
	t.Cleanup(srv.Close)

	release := make(chan struct{})
	def := reactor.MustDefine("slow-order",
		reactor.Step("reserve", reactor.StepConfig[reactor.Args, string]{
			Run:  func(context.Context, reactor.Args) (string, error) { return "held", nil },
			Undo: func(context.Context, reactor.Args, string) error { return nil },
		}),
		reactor.Step("wait", reactor.StepConfig[reactor.Args, string]{After: []string{"reserve"},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				// Until the cancel is requested: the run then stops at its
				// next checkpoint and rolls back.
				select {
				case <-release:
				case <-ctx.Done():
				}
				return "done", nil
			}}))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = st.engine.Enqueue(bg, def, nil, reactor.WithRunID("op-1"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		run, err := st.engine.Get(bg, "op-1")
		return err == nil && run.Current != nil && run.Current.Step == "wait"
	}, 30*time.Second, 10*time.Millisecond, "the run waits in its second step")

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/runs/op-1")))
	poll("cancel is offered on the running run", `!document.querySelector('.run-actions button[data-action="cancel"]').disabled`)
	poll("undo is not, and says why", `(b => b.disabled && b.title !== '')(document.querySelector('.run-actions button[data-action="undo"]'))`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`.run-actions button[data-action="cancel"]`))))
	poll("the confirmation asks why", `document.getElementById('confirm-dialog').open && !document.getElementById('confirm-reason-box').hidden`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("confirm-reason"), "customer withdrew the order, ticket 88"),
		chromedp.Click(chromedp.ID("confirm-yes"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), aliceToken), chromedp.Click(chromedp.ID("token-save"))))
	poll("the request is accepted", `[...document.querySelectorAll('#messages .msg-ok .msg-title')].some(e => e.textContent.startsWith('Cancel requested for run op-1'))`)
	close(release)
	final, err := st.engine.Wait(bg, "op-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCancelled, final.Status)
	poll("the audit shows who asked and why", `[...document.querySelectorAll('#audit .audit-request')].some(e =>
		e.querySelector('.audit-operator').textContent === 'alice' &&
		e.querySelector('.audit-reason').textContent === 'customer withdrew the order, ticket 88' &&
		e.textContent.startsWith('cancel by alice'))`)
}
