package dashboard_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
)

// A page is never empty while the listing goes on: an id search with a
// status that none of the ids has reads the index to its end and says it
// is done (no next_cursor); a filter that drops most entries fills its
// page from further down; and a request that examined scanBudget entries
// without filling its page says so (partial) with a cursor to read on.
// Not parallel: it sets the package's scan budget.
func TestListReadsOnPastFilteredEntries(t *testing.T) {
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 60*time.Second)
	ok, bad := echo("scan-ok"), failing("scan-bad")
	e.startWorker(ok, bad)
	var okIDs []string
	for i := range 40 {
		okIDs = append(okIDs, fmt.Sprintf("ord-%02d", i))
	}
	e.enqueueAll(ctx, ok, okIDs, map[string]any{"note": "x"})
	e.enqueueAll(ctx, bad, []string{"ord-zz"}, nil) // sorts after every ord-NN

	var l runList
	e.get("/api/runs?q=ord-&status=aborted&limit=10", http.StatusOK, &l)
	require.Empty(t, l.Runs)
	require.Empty(t, l.NextCursor, "no runs and the listing ended: no Load more")

	e.get("/api/runs?q=ord-&status=failed&limit=10", http.StatusOK, &l)
	require.Len(t, l.Runs, 1, "found past 40 entries the filter drops")
	require.Equal(t, "ord-zz", l.Runs[0].ID)
	require.Empty(t, l.NextCursor)

	e.get("/api/runs?reactor=scan-bad&q=ord-&limit=10", http.StatusOK, &l)
	require.Len(t, l.Runs, 1)

	dashboard.SetScanBudget(t, 15)
	var p struct {
		runList
		Partial bool `json:"partial"`
	}
	e.get("/api/runs?q=ord-&status=failed&limit=10", http.StatusOK, &p)
	require.Empty(t, p.Runs)
	require.True(t, p.Partial)
	require.NotEmpty(t, p.NextCursor, "a cursor to read on from")
	for i := 0; len(p.Runs) == 0; i++ {
		require.Less(t, i, 10, "the search reaches ord-zz")
		e.get("/api/runs?q=ord-&status=failed&limit=10&cursor="+p.NextCursor, http.StatusOK, &p)
	}
	require.Equal(t, "ord-zz", p.Runs[0].ID)
}
