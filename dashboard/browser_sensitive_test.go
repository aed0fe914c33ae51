package dashboard

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/reactor"
)

// TestBrowserSensitiveRunValues: a sensitive run's page shows its
// fingerprints but not its values, nor its inputs, and says why; once the
// person sets the token, the values and inputs appear.
func TestBrowserSensitiveRunValues(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	const token = "sensitive-token"
	st := newRealStack(t, token, "")
	fx := NewGuardFixtureWith(st.rdb, "sensitive-ui", st.prefix+":user:9/email", reactor.Input[string]("card", reactor.Sensitive()))
	bg, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	id, err := fx.RunInputs(bg, st.engine, "sensitive-ui-1", map[string]any{"card": "4111-1111-1111-1111"})
	require.NoError(t, err)

	bctx, bcancel := context.WithTimeout(ctx, time.Minute)
	defer bcancel()
	poll := pollUntil(t, bctx)
	q := jsString
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(st.srv.URL+"/runs/"+id), chromedp.WaitVisible(chromedp.ID("rbstatus-panel"))))
	const item = `document.querySelector('#action-required .action-item[data-entry="book/fix2#2"]')`
	poll("the values are redacted, the fingerprints shown", `!document.getElementById('action-panel').hidden && `+item+` &&
		`+item+`.querySelector('.ai-observed').textContent.startsWith('sha256:') &&
		`+item+`.querySelector('.ai-observed-value').textContent === `+q(reactor.RedactedValue)+` &&
		document.querySelector('#action-required .values-redacted') !== null &&
		document.querySelector('#inputs .inputs-redacted') !== null &&
		!document.body.textContent.includes(`+q(GuardClobbered)+`) && !document.body.textContent.includes('4111')`)
	if d := os.Getenv("GOREACTOR_SCREENSHOT_DIR"); d != "" {
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(d, "sensitive-redacted.png"), png, 0o644))
	}
	require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.ID("token-button"))))
	poll("the token is asked for", `document.getElementById('token-dialog').open`)
	require.NoError(t, chromedp.Do(bctx, chromedp.SendKeys(chromedp.ID("token-input"), token), chromedp.Click(chromedp.ID("token-save"))))
	poll("with the token, the values and the inputs are shown", item+` &&
		`+item+`.querySelector('.ai-observed-value').textContent === `+q(`"`+GuardClobbered+`"`)+` &&
		document.querySelector('#action-required .values-redacted') === null &&
		document.querySelector('#inputs .inputs-redacted') === null &&
		document.getElementById('inputs').textContent.includes('4111-1111-1111-1111')`)
}
