package dashboard_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
)

type auditList struct {
	Entries []struct {
		Kind     string `json:"kind"`
		Request  string `json:"request"`
		Operator string `json:"operator"`
		Note     string `json:"note"`
		TaskID   string `json:"task_id"`
		Step     string `json:"step"`
	} `json:"entries"`
}

// withHandler points e at a dashboard of its own config (on e's Redis,
// prefix and queues).
func (e *env) withHandler(cfg dashboard.Config) {
	e.t.Helper()
	cfg.Client, cfg.Prefix, cfg.Queues, cfg.ControlQueue, cfg.Logger = e.rdb, e.prefix, []string{e.queue}, e.ctl, discard
	h, err := dashboard.New(cfg)
	require.NoError(e.t, err)
	srv := httptest.NewServer(h)
	e.t.Cleanup(srv.Close)
	e.srv = srv
}

// Each action needs a reason, and an accepted one is written to the run's
// audit with who asked (the operators file's name for the token), why, and
// the control task; a duplicate request is not written twice.
func TestRequestsAreAuditedWithTheOperatorAndTheReason(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789ab"
	e.withHandler(dashboard.Config{Operators: map[string]string{alice: "alice", bob: "bob"}})
	ctx := ctxTimeout(t, 30*time.Second)
	ok := echo("audited-ok")
	e.startWorker(ok)
	e.enqueueAll(ctx, ok, []string{"aud-1"}, map[string]any{"note": "n"})
	e.stopWorkers() // the undo stays queued: a second request is a duplicate

	var eb errBody
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", alice, ""), http.StatusBadRequest, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", alice, `{"reason":"  "}`), http.StatusBadRequest, &eb)
	require.Contains(t, eb.Error, "a reason is required")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", alice, `{"reason":"`+strings.Repeat("x", 1001)+`"}`), http.StatusBadRequest, &eb)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", "mallory-token-0123456", `{"reason":"r"}`), http.StatusUnauthorized, &eb)
	var a accepted
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", alice, `{"reason":"customer asked on ticket 4711"}`), http.StatusAccepted, &a)
	decodeInto(t, e.do(http.MethodPost, "/api/runs/aud-1/undo", bob, `{"reason":"double click"}`), http.StatusAccepted, &a)
	require.True(t, a.Duplicate)

	var al auditList
	e.get("/api/runs/aud-1/audit", http.StatusOK, &al)
	var reqs []string
	for _, en := range al.Entries {
		if en.Kind == "operator_request" {
			reqs = append(reqs, en.Request+" by "+en.Operator+": "+en.Note)
			require.Equal(t, a.TaskID, en.TaskID)
		}
	}
	require.Equal(t, []string{"undo by alice: customer asked on ticket 4711"}, reqs, "the duplicate is not written again")
}

// With OperatorHeader and no token, the trusted proxy's header names the
// operator and is what lets a request act.
func TestTrustedProxyHeaderNamesTheOperator(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	e.withHandler(dashboard.Config{OperatorHeader: "X-Forwarded-User"})
	ctx := ctxTimeout(t, 30*time.Second)
	ok := echo("proxied-ok")
	e.startWorker(ok)
	e.enqueueAll(ctx, ok, []string{"prox-1"}, map[string]any{"note": "n"})
	e.stopWorkers()

	var eb errBody
	decodeInto(t, e.doWith(http.MethodPost, "/api/runs/prox-1/undo", nil, `{"reason":"r"}`), http.StatusUnauthorized, &eb)
	require.Contains(t, eb.Error, "X-Forwarded-User")
	var a accepted
	decodeInto(t, e.doWith(http.MethodPost, "/api/runs/prox-1/undo", map[string]string{"X-Forwarded-User": "carol@example.com"},
		`{"reason":"requested in the incident channel"}`), http.StatusAccepted, &a)
	var al auditList
	e.get("/api/runs/prox-1/audit", http.StatusOK, &al)
	found := false
	for _, en := range al.Entries {
		found = found || (en.Kind == "operator_request" && en.Operator == "carol@example.com" && en.Note == "requested in the incident channel")
	}
	require.True(t, found, "%+v", al.Entries)
}

func TestParseOperators(t *testing.T) {
	t.Parallel()
	ops, err := dashboard.ParseOperators(strings.NewReader("# the on-call rota\nalice  0123456789abcdef0123\n\nbob\t fedcba9876543210fedc\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]string{"0123456789abcdef0123": "alice", "fedcba9876543210fedc": "bob"}, ops)
	for in, want := range map[string]string{
		"alice":       `want "<name> <token>"`,
		"alice short": "use at least 16",
		"alice 0123456789abcdef\nalice fedcba9876543210": "alice is named twice",
		"alice 0123456789abcdef\nbob 0123456789abcdef":   "bob's token is alice's too",
		"alice 0123456789abcdef extra":                   `want "<name> <token>"`,
	} {
		_, err := dashboard.ParseOperators(strings.NewReader(in))
		require.ErrorContains(t, err, want, in)
	}
	rdb := newEnv(t, "").rdb
	_, err = dashboard.New(dashboard.Config{Client: rdb, Operators: map[string]string{"short": "x"}})
	require.ErrorContains(t, err, "at least 16 bytes")
	_, err = dashboard.New(dashboard.Config{Client: rdb, OperatorHeader: "authorization"})
	require.ErrorContains(t, err, "cannot be Authorization")
}
