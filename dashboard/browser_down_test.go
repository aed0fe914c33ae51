package dashboard

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
)

// Redis goes away under an open overview: the live dot stops saying live
// and the waiting-for-a-person count reads unknown, not 0; once Redis is
// back both recover.
func TestBrowserRedisDownIsNotLive(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	srvRedis := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srvRedis.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	h, err := New(Config{Client: rdb, Prefix: "down", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	bctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	poll := pollUntil(t, bctx)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.URL+"/")))
	poll("live, and nothing waits", `document.getElementById('live').dataset.state === 'live' &&
		document.getElementById('needs-count').textContent === '0'`)
	srvRedis.Stop()
	poll("not live once a refresh fails", `document.getElementById('live').dataset.state === 'failing' &&
		document.getElementById('live-label').textContent === 'not updating'`)
	poll("the count is unknown, not 0", `document.getElementById('needs-count').textContent === '?' &&
		document.getElementById('needs-tile').classList.contains('unknown')`)
	srvRedis.Restart()
	poll("live again once Redis answers", `document.getElementById('live').dataset.state === 'live' &&
		document.getElementById('needs-count').textContent === '0'`)
}
