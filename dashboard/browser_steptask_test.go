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

// Spawned runs are linked both ways on the run pages: the spawning run
// lists the run its step started, and that run's page links back.
func TestBrowserSpawnedRunsAreLinked(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "spawn-token", "")
	child := reactor.MustDefine("spawned-child",
		reactor.Step("send", reactor.StepConfig[reactor.Args, string]{Run: func(context.Context, reactor.Args) (string, error) { return "sent", nil }}))
	def := reactor.MustDefine("spawner", reactor.Spawn("notify", child, reactor.SpawnConfig{}))
	st.startWorker(2, def)
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := st.engine.Enqueue(bg, def, nil, reactor.WithRunID("spawner-1"))
	require.NoError(t, err)
	childID := reactor.SpawnID("spawner-1", "notify")
	for _, id := range []string{"spawner-1", childID} {
		done, err := st.engine.Wait(bg, id)
		require.NoError(t, err)
		require.Equal(t, reactor.StatusCompleted, done.Status)
	}

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/spawner-1"), chromedp.WaitVisible(chromedp.ID("run-facts"))))
	poll("the spawned run is linked", `(document.querySelector('#run-facts a.spawned-run')?.textContent ?? '') === '`+childID+`'`)
	href, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#run-facts a.spawned-run').href`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(href), chromedp.WaitVisible(chromedp.ID("run-facts"))))
	poll("its page links back to the spawning run", `(document.querySelector('#run-facts a.spawned-by')?.textContent ?? '') === 'spawner-1' &&
		document.querySelector('#run-facts').textContent.includes('notify')`)
}
