package dashboard

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/keys"
	"github.com/goreactor/goreactor/internal/store"
)

// An operator opens Limits from the top bar, names a limit and a key, and
// sees its holders (the one whose lease ended marked so), the admissions
// by window, and that waiters are not recorded; a holder links its run.
func TestBrowserLimitsPage(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	st := newRealStack(t, "", "")
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := keys.New(st.prefix)
	s, err := store.New(bg, st.rdb, k)
	require.NoError(t, err)
	slots := k.Slots("partner-api", "acme")
	_, err = s.AcquireSlot(bg, slots, "order-7|book/charge|aa", "order-7|book/charge", 2, 30*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	_, err = s.AcquireSlot(bg, slots, "order-8|charge|bb", "order-8|charge", 3, time.Minute)
	require.NoError(t, err)
	// that acquire dropped order-7's ended lease; one more that ends
	_, err = s.AcquireSlot(bg, slots, "order-9|charge|cc", "order-9|charge", 3, 30*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	for _, m := range []string{"order-8|charge|r1", "order-9|charge|r2"} {
		_, _, err = s.Admit(bg, k.Rate("partner-api", "acme"), m, []store.Window{{N: 10, Per: time.Minute}})
		require.NoError(t, err)
	}

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	console := watchConsole(t, bctx)
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/"), chromedp.WaitVisible(chromedp.ID("nav-limits"))))
	poll("the navigation links the limits page", `new URL(document.getElementById('nav-limits').href).pathname === '/limits'`)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/limits"), chromedp.WaitVisible(chromedp.ID("limit-name"))))
	poll("nothing is shown before a limit is named", `document.getElementById('limit-view').hidden`)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.ID("limit-name"), "partner-api"),
		chromedp.SendKeys(chromedp.ID("limit-key"), "acme"),
		chromedp.Click(chromedp.ID("limit-show"))))
	// The form's GET loads /limits?name=&key=; a poll across that navigation
	// fails, so wait for the new page first.
	var search string
	for deadline := time.Now().Add(20 * time.Second); search != "?name=partner-api&key=acme"; {
		require.True(t, time.Now().Before(deadline), "the form loads /limits?name=partner-api&key=acme (at %q)", search)
		time.Sleep(100 * time.Millisecond)
		if v, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.readyState === 'complete' ? location.search : ''`)); err == nil {
			search = v
		}
	}
	poll("the form keeps the limit named", `document.getElementById('limit-name').value === 'partner-api' && document.getElementById('limit-key').value === 'acme'`)
	poll("the holders are listed", `document.querySelectorAll('#holders tr.limit-holder').length === 2`)
	poll("the live one holds, the other's lease ended", `(r => r[0].dataset.id === 'order-9' && r[0].dataset.expired === 'true' && r[0].textContent.includes('lease ended') &&
		r[1].dataset.id === 'order-8' && r[1].dataset.expired === 'false' && r[1].textContent.includes('left'))([...document.querySelectorAll('#holders tr.limit-holder')])`)
	poll("the holder links its run", `new URL(document.querySelector('#holders tr[data-id="order-8"] a').href).pathname === '/runs/order-8'`)
	poll("the counts say 1 holding, 1 ended", `document.getElementById('holders-text').textContent.startsWith('1 holding, 1 with an ended lease')`)
	poll("the admissions are counted by window", `document.querySelector('#count-1s .strong') &&
		document.querySelector('#count-60s .strong').textContent === '2' && document.querySelectorAll('#recent tr.limit-admission').length === 2`)
	poll("waiters are not recorded", `document.querySelector('#waiters .waiters-unrecorded').textContent.startsWith('Waiters are not recorded')`)
	poll("the nav marks the page", `document.getElementById('nav-limits').getAttribute('aria-current') === 'page'`)
	if dir := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); dir != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "limits.png"), png, 0o644))
	}
	console.check(t)
}
