package dashboard_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goreactor/goreactor/dashboard"
	"github.com/goreactor/goreactor/reactor"
)

// doWith sends a request with the headers given (Host among them) and
// returns the answer.
func (e *env) doWith(method, path string, header map[string]string, body string) response {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	require.NoError(e.t, err)
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(e.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(e.t, err)
	return response{code: res.StatusCode, header: res.Header, body: b}
}

// The credential's scheme is case-insensitive (RFC 9110): "bearer" and
// "BEARER" carry the token as "Bearer" does; another scheme does not.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	t.Parallel()
	const token = "tok-case"
	e := newEnv(t, token)
	var eb errBody
	for _, auth := range []string{"bearer " + token, "BEARER " + token, "  Bearer   " + token + " "} {
		// The run is unknown: past the token check, the answer is 404.
		decodeInto(t, e.doWith(http.MethodPost, "/api/runs/nobody/cancel", map[string]string{"Authorization": auth}, `{"reason":"test"}`), http.StatusNotFound, &eb)
	}
	for _, auth := range []string{"Basic " + token, token, "Bearer", "Bearer " + token + "x"} {
		decodeInto(t, e.doWith(http.MethodPost, "/api/runs/nobody/cancel", map[string]string{"Authorization": auth}, `{"reason":"test"}`), http.StatusUnauthorized, &eb)
	}
}

// A body is one JSON value: anything after it is refused, not ignored.
func TestBodyWithDataAfterItsValueIsRefused(t *testing.T) {
	t.Parallel()
	const token = "tok-trail"
	e := newEnv(t, token)
	var eb errBody
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, `{"action":"cancel","ids":["x"],"reason":"r"} {"action":"undo"}`), http.StatusBadRequest, &eb)
	require.Contains(t, eb.Error, "unexpected data after the JSON value")
	decodeInto(t, e.do(http.MethodPost, "/api/runs/actions", token, `{"action":"cancel","ids":["x"],"reason":"r"}garbage`), http.StatusBadRequest, &eb)
	// Whitespace after the value is fine.
	res := e.do(http.MethodPost, "/api/runs/actions", token, "{\"action\":\"cancel\",\"ids\":[\"x\"],\"reason\":\"r\"}\n\n")
	require.Equal(t, http.StatusOK, res.code, "%s", res.body)
}

// A run named "actions" opens (GET), while POST /api/runs/actions stays
// the batch action; ids a URL cannot name ("." and "..") are refused when
// the run is started.
func TestRunsNamedLikeRoutesOpen(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "tok")
	ctx := ctxTimeout(t, 30*time.Second)
	def := echo("route-names")
	e.startWorker(def)
	e.enqueueAll(ctx, def, []string{"actions"}, map[string]any{"note": "n"})
	var d runDetail
	e.get("/api/runs/actions", http.StatusOK, &d)
	require.Equal(t, "actions", d.ID)
	require.Equal(t, "completed", d.Status)
	res := e.do(http.MethodPut, "/api/runs/actions", "tok", "")
	require.Equal(t, http.StatusMethodNotAllowed, res.code)
	for _, id := range []string{".", ".."} {
		_, err := e.engine.Enqueue(ctx, def, map[string]any{"note": "n"}, reactor.WithRunID(id))
		require.ErrorContains(t, err, "dot segment")
	}
}

// DNS rebinding: a request whose Host is a name the dashboard was not told
// of is refused, the API and the pages alike; an IP address, localhost
// and the configured names are served, and /metrics is not checked.
func TestForeignHostIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	var eb errBody
	for _, path := range []string{"/api/runs", "/", "/api/stats"} {
		decodeInto(t, e.doWith(http.MethodGet, path, map[string]string{"Host": "rebound.attacker.example:8080"}, ""), http.StatusForbidden, &eb)
		require.Contains(t, eb.Error, `host "rebound.attacker.example:8080" is not one this dashboard answers to`)
		require.Contains(t, eb.Error, "-allowed-hosts")
	}
	for _, host := range []string{"127.0.0.1:9", "localhost:8080", "[::1]:8080", "app.localhost", "10.1.2.3"} {
		require.Equal(t, http.StatusOK, e.doWith(http.MethodGet, "/api/runs", map[string]string{"Host": host}, "").code, host)
	}
	require.Equal(t, http.StatusOK, e.doWith(http.MethodGet, "/metrics", map[string]string{"Host": "prometheus.scraper.example"}, "").code)

	h, err := dashboard.New(dashboard.Config{Client: e.rdb, Prefix: e.prefix, AllowedHosts: []string{"dash.example.com", "*.corp.example"}})
	require.NoError(t, err)
	for host, code := range map[string]int{
		"dash.example.com": 200, "DASH.example.com:443": 200, "ops.corp.example": 200, "a.b.corp.example": 200,
		"corp.example": 403, "dash.example.com.evil": 403, "example.com": 403,
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+host+"/api/runs", nil)
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		require.Equal(t, code, rec.Code, host)
	}
	for _, bad := range []string{"", "a:80", "*x.example", "*.*.example", "http://x"} {
		_, err := dashboard.New(dashboard.Config{Client: e.rdb, Prefix: e.prefix, AllowedHosts: []string{bad}})
		require.ErrorContains(t, err, "AllowedHosts", bad)
	}
}

// The run detail says which actions the engine would accept now, and why
// not for the others: what the run page offers.
func TestDetailOffersTheActionsTheEngineAccepts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	ctx := ctxTimeout(t, 30*time.Second)
	ok, bad := echo("offer-ok"), failing("offer-bad")
	e.startWorker(ok, bad)
	e.enqueueAll(ctx, ok, []string{"offer-done"}, map[string]any{"note": "n"})
	e.enqueueAll(ctx, bad, []string{"offer-failed"}, nil)
	type action struct {
		Allowed bool   `json:"allowed"`
		Reason  string `json:"reason"`
	}
	var d struct {
		Actions map[string]action `json:"actions"`
	}
	e.get("/api/runs/offer-done", http.StatusOK, &d)
	require.True(t, d.Actions["undo"].Allowed)
	require.True(t, d.Actions["undo_steps"].Allowed)
	require.False(t, d.Actions["cancel"].Allowed)
	require.Contains(t, d.Actions["cancel"].Reason, reactor.ErrAlreadyFinished.Error())
	require.False(t, d.Actions["retry"].Allowed)
	require.NotEmpty(t, d.Actions["retry"].Reason)
	e.get("/api/runs/offer-failed", http.StatusOK, &d)
	require.True(t, d.Actions["retry"].Allowed)
	require.False(t, d.Actions["undo"].Allowed)
	require.Contains(t, d.Actions["undo"].Reason, reactor.ErrNotUndoable.Error())
}
