package dashboard_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/internal/redistest"
	"github.com/goreactor/goreactor/reactor"
)

// /api/stats counts by status and by reactor x status from the indexes, and
// reports the goreactor queue from asynq; /metrics serves the collector.
func TestStatsAndMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	ok, bad := echo("st-ok"), failing("st-bad")
	e.startWorker(ok, bad)
	e.enqueueAll(ctx, ok, ids("s-", 3), map[string]any{"note": "x"})
	e.enqueueAll(ctx, bad, ids("f-", 2), nil)
	// A run waiting in the queue, never picked up: another queue's.
	_, err := e.engine.Enqueue(ctx, ok, map[string]any{"note": "later"}, reactor.WithRunID("later"), reactor.WithQueue(redistest.Queue(t)))
	require.NoError(t, err)

	var st struct {
		ByStatus  map[string]int64            `json:"by_status"`
		ByReactor map[string]map[string]int64 `json:"by_reactor"`
		Queues    []struct {
			Queue            string `json:"queue"`
			Pending          int    `json:"pending"`
			Active           int    `json:"active"`
			Scheduled        int    `json:"scheduled"`
			Retry            int    `json:"retry"`
			Archived         int    `json:"archived"`
			OldestPendingAge int64  `json:"oldest_pending_age_ms"`
		} `json:"queues"`
	}
	e.get("/api/stats", http.StatusOK, &st)
	require.Equal(t, int64(3), st.ByStatus["completed"])
	require.Equal(t, int64(2), st.ByStatus["failed"])
	require.Equal(t, int64(1), st.ByStatus["pending"])
	require.Len(t, st.ByStatus, len(reactor.Statuses()))
	require.Equal(t, map[string]int64{"completed": 3, "pending": 1}, st.ByReactor["st-ok"])
	require.Equal(t, map[string]int64{"failed": 2}, st.ByReactor["st-bad"])
	require.Len(t, st.Queues, 1)
	require.Equal(t, e.queue, st.Queues[0].Queue)
	require.Zero(t, st.Queues[0].Pending)

	res := e.do(http.MethodGet, "/metrics", "", "")
	require.Equal(t, http.StatusOK, res.code)
	require.True(t, strings.Contains(string(res.body), "goreactor_runs"), "the collector's gauge")
}
