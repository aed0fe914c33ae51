package dashboard

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// A step that runs as its own task, against the real stack: its row on the
// run page carries a "task" badge, and opens to its attempts with the
// worker that ran each.
func TestBrowserTaskStepAttempts(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "task-token", "")
	def := reactor.MustDefine("task-step",
		reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
			Task:  true,
			Retry: reactor.Retry{MaxAttempts: 2},
			Run: func(ctx context.Context, _ reactor.Args) (string, error) {
				if info, _ := reactor.RunInfoFrom(ctx); info.Attempt == 1 {
					return "", errors.New("printer jammed")
				}
				return "printed", nil
			},
		}))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := st.engine.Enqueue(bg, def, nil, reactor.WithRunID("task-1"))
	require.NoError(t, err)
	done, err := st.engine.Wait(bg, "task-1")
	require.NoError(t, err)
	require.Equal(t, reactor.StatusCompleted, done.Status)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	const row = `document.querySelector('#timeline .tl-row[data-step="label"]')`
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/task-1"), chromedp.WaitVisible(chromedp.ID("timeline"))))
	poll("the row is badged as a task", row+` && `+row+`.querySelector('.tl-task') !== null && `+row+`.querySelector('.tl-task').title.includes(':')`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(`#timeline .tl-row[data-step="label"] button.tl-toggle`))))
	const attempts = `[...document.querySelectorAll('#timeline .tl-attempt')]`
	poll("two attempts, each with its worker", attempts+`.length === 2 && `+attempts+`.every(r => r.offsetParent !== null) &&
		`+attempts+`.every(r => r.querySelector('.tl-attempt-worker').textContent.includes(':')) &&
		`+attempts+`[0].querySelector('.tl-error').textContent === 'printer jammed' &&
		[...document.querySelectorAll('#timeline .tl-attempts th')].map(th => th.textContent).join(',') === 'attempt,started,took,worker,error'`)
}
