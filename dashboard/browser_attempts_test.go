package dashboard

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// The attempts story against the real stack: a worker runs a step that
// fails twice (the second error carrying markup) and then succeeds; on the
// run page its timeline row opens to its three attempts, each with its
// start and duration, the two errors as text, and the args and result as
// JSON.
func TestBrowserStepAttempts(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "attempts-token", "")
	var n atomic.Int32
	def := reactor.MustDefine("retried", reactor.Input[string]("order"),
		reactor.Step("charge", reactor.StepConfig[reactor.Args, map[string]string]{
			Args:  reactor.Bindings{"order": reactor.FromInput("order")},
			Retry: reactor.Retry{MaxAttempts: 3},
			Run: func(_ context.Context, a reactor.Args) (map[string]string, error) {
				switch n.Add(1) {
				case 1:
					return nil, errors.New("gateway timeout")
				case 2:
					return nil, errors.New("<b>card service</b> unavailable")
				}
				o, err := reactor.Arg[string](a, "order")
				return map[string]string{"receipt": "r-" + o}, err
			},
		}),
		reactor.Step("ship", reactor.StepConfig[reactor.Args, string]{After: []string{"charge"},
			Run: func(context.Context, reactor.Args) (string, error) { return "shipped", nil },
		}))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := st.engine.Enqueue(bg, def, map[string]any{"order": "o-77"}, reactor.WithRunID("retried-1"))
	require.NoError(t, err)
	done, err := st.engine.Wait(bg, "retried-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, done.Status)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	const row = `document.querySelector('#timeline .tl-row[data-step="charge"]')`
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/retried-1"), chromedp.WaitVisible(chromedp.ID("timeline"))))
	poll("the step shows three tries and opens", row+` && `+row+`.querySelector('.tl-att').textContent === '3' && !!`+row+`.querySelector('button.tl-toggle')`)
	poll("the attempts are folded", `document.querySelectorAll('#timeline .tl-attempt').length === 0 ||
		document.querySelector('#timeline .tl-attempt').offsetParent === null`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#timeline .tl-row[data-step="charge"] button.tl-toggle`))))
	const attempts = `[...document.querySelectorAll('#timeline .tl-attempt')]`
	// Only charge has attempts to show: ship ran once, with no args.
	poll("three attempts, the two errors as text", attempts+`.length === 3 && `+attempts+`.every(r => r.offsetParent !== null) &&
		`+attempts+`.map(r => r.dataset.attempt + ':' + r.dataset.outcome).join(',') === '1:error,2:error,3:ok' &&
		`+attempts+`[0].querySelector('.tl-error').textContent === 'gateway timeout' &&
		`+attempts+`[1].querySelector('.tl-error').textContent === '<b>card service</b> unavailable' &&
		document.querySelectorAll('#timeline .tl-attempt b').length === 0 &&
		`+attempts+`.every(r => r.querySelector('time').getAttribute('datetime').endsWith('Z') && r.children[2].textContent.endsWith('ms'))`)
	poll("the args and the result as JSON", `document.querySelector('#timeline .tl-args').textContent.includes('"order": "o-77"') &&
		[...document.querySelectorAll('#timeline .tl-detail .tl-result')].some(e => e.textContent.includes('"receipt": "r-o-77"'))`)
	shot := t.TempDir()
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		shot = d
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shot, "step-attempts.png"), png, 0o644))
}
