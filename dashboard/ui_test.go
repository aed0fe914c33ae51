package dashboard

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func uiGet(t *testing.T, h http.Handler, method, target string, header http.Header) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestUIEveryResponseCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	ui := newUI()
	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{"GET", "/", 200},
		{"GET", "/?status=failed", 200},
		{"GET", "/runs/order-42", 200},
		{"GET", "/runs/order-42~child/each.3", 200},
		{"GET", "/workers", 200},
		{"POST", "/workers", 405},
		{"GET", "/static/app.js", 200},
		{"GET", "/static/style.css", 200},
		{"GET", "/nowhere", 404},
		{"GET", "/static/missing.js", 404},
		{"POST", "/", 405},
	} {
		rec := uiGet(t, ui, tc.method, tc.target, nil)
		require.Equal(t, tc.code, rec.Code, "%s %s", tc.method, tc.target)
		require.Equal(t, uiCSP, rec.Header().Get("Content-Security-Policy"), "%s %s", tc.method, tc.target)
		require.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"), "%s %s", tc.method, tc.target)
		require.Equal(t, "DENY", rec.Header().Get("X-Frame-Options"), "%s %s", tc.method, tc.target)
	}
	// The policy admits no inline code and no other origin.
	require.NotContains(t, uiCSP, "unsafe-inline")
	require.NotContains(t, uiCSP, "unsafe-eval")
	require.Contains(t, uiCSP, "script-src 'self';")
	require.Contains(t, uiCSP, "frame-ancestors 'none'")
}

func TestUIPagesAreShellsThatLoadVersionedAssets(t *testing.T) {
	t.Parallel()
	ui := newUI()
	for target, page := range map[string]string{"/": "overview", "/runs/order-42": "run", "/workers": "workers"} {
		rec := uiGet(t, ui, "GET", target, nil)
		require.Equal(t, http.StatusOK, rec.Code)
		require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
		body := rec.Body.String()
		require.Contains(t, body, `data-page="`+page+`"`)
		for _, name := range []string{"app.js", "overview.js", "run.js", "workers.js", "style.css", "favicon.svg"} {
			require.Regexp(t, `"/static/`+regexp.QuoteMeta(name)+`\?v=[0-9a-f]{12}"`, body, "page %s links %s", target, name)
		}
	}
	body := uiGet(t, ui, "GET", "/runs/order-42", nil).Body.String()
	require.Contains(t, body, `data-run-id="order-42"`)
	require.Contains(t, body, "<title>Run order-42 · goreactor</title>")
}

func TestUITemplatesHoldNoInlineCode(t *testing.T) {
	t.Parallel()
	ui := newUI()
	inlineScript := regexp.MustCompile(`<script(?:\s[^>]*)?>`)
	handlerAttr := regexp.MustCompile(`\son[a-z]+\s*=`)
	for _, target := range []string{"/", "/runs/x", "/nowhere"} {
		body := uiGet(t, ui, "GET", target, nil).Body.String()
		for _, tag := range inlineScript.FindAllString(body, -1) {
			require.Contains(t, tag, ` src="`, "%s: every script is a file (the CSP forbids inline ones)", target)
		}
		require.NotContains(t, body, "<style", target)
		require.NotContains(t, body, " style=", target)
		require.NotRegexp(t, handlerAttr, body, target)
	}
}

// The scripts build the page with DOM calls only; markup in run data must
// never be parsed. This pins that no asset reaches for an HTML parser.
func TestUIScriptsNeverParseHTML(t *testing.T) {
	t.Parallel()
	names, err := fs.Glob(uiFiles, "assets/*.js")
	require.NoError(t, err)
	require.NotEmpty(t, names)
	for _, name := range names {
		src, err := uiFiles.ReadFile(name)
		require.NoError(t, err)
		for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "createContextualFragment", "DOMParser"} {
			require.False(t, strings.Contains(string(src), sink), "%s uses %s", name, sink)
		}
	}
}

func TestUIRunPageEscapesTheRunID(t *testing.T) {
	t.Parallel()
	ui := newUI()
	id := `<script>alert(1)</script>"><img src=x onerror=alert(2)>`
	rec := uiGet(t, ui, "GET", "/runs/"+strings.NewReplacer("<", "%3C", ">", "%3E", `"`, "%22", " ", "%20").Replace(id), nil)
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	require.NotContains(t, body, "<script>alert(1)")
	require.NotContains(t, body, "<img src=x")
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;")
	require.Contains(t, body, `data-run-id="&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;"`)
}

func TestUIAssetsAreServedWithTypesAndCaching(t *testing.T) {
	t.Parallel()
	u := newUI().(*uiHandler)
	for name, ctype := range map[string]string{
		"app.js":      "text/javascript; charset=utf-8",
		"overview.js": "text/javascript; charset=utf-8",
		"run.js":      "text/javascript; charset=utf-8",
		"style.css":   "text/css; charset=utf-8",
		"favicon.svg": "image/svg+xml",
	} {
		a, ok := u.assets[name]
		require.True(t, ok, name)

		rec := uiGet(t, u, "GET", "/static/"+name+"?v="+a.tag, nil)
		require.Equal(t, http.StatusOK, rec.Code, name)
		require.Equal(t, ctype, rec.Header().Get("Content-Type"), name)
		require.Equal(t, "public, max-age=31536000, immutable", rec.Header().Get("Cache-Control"), name)
		require.Equal(t, a.etag, rec.Header().Get("ETag"), name)
		require.Equal(t, a.body, rec.Body.Bytes(), name)

		// Without the current digest the browser must revalidate.
		rec = uiGet(t, u, "GET", "/static/"+name+"?v=stale", nil)
		require.Equal(t, "no-cache", rec.Header().Get("Cache-Control"), name)

		rec = uiGet(t, u, "GET", "/static/"+name, http.Header{"If-None-Match": {a.etag}})
		require.Equal(t, http.StatusNotModified, rec.Code, name)
		require.Empty(t, rec.Body.Bytes(), name)
	}
	// Content changes move the URL: the digest is the content's.
	require.NotEqual(t, u.assets["app.js"].tag, u.assets["run.js"].tag)
}

func TestUIUnknownPathsAre404AndMutationsAre405(t *testing.T) {
	t.Parallel()
	ui := newUI()
	for _, tc := range []struct {
		method, target string
		code           int
	}{
		{"GET", "/nowhere", 404},
		{"GET", "/runs/", 404},
		{"GET", "/runs", 404},
		{"GET", "/static/", 404},
		{"GET", "/static/../ui.go", 404},
		{"GET", "/static/templates/layout.html", 404},
		{"POST", "/nowhere", 404},
		{"POST", "/", 405},
		{"PUT", "/runs/order-42", 405},
		{"DELETE", "/runs/order-42", 405},
		{"POST", "/runs/order-42", 405},
		{"POST", "/static/app.js", 405},
		{"HEAD", "/", 200},
		{"HEAD", "/static/app.js", 200},
	} {
		rec := uiGet(t, ui, tc.method, tc.target, nil)
		require.Equal(t, tc.code, rec.Code, "%s %s", tc.method, tc.target)
		if tc.code == 405 {
			require.Equal(t, "GET, HEAD", rec.Header().Get("Allow"))
		}
		if tc.method == "HEAD" {
			require.Empty(t, rec.Body.Bytes(), "%s %s", tc.method, tc.target)
		}
	}
	rec := uiGet(t, ui, "GET", "/nowhere", nil)
	require.Equal(t, "text/html; charset=utf-8", rec.Header().Get("Content-Type"))
	require.Contains(t, rec.Body.String(), "Not found")
}

func TestUIMountedUnderAPrefixLinksUnderIt(t *testing.T) {
	t.Parallel()
	ui := http.StripPrefix("/ops/reactors", newUI())
	rec := uiGet(t, ui, "GET", "/ops/reactors/runs/order-42", nil)
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	require.Contains(t, body, `data-base="/ops/reactors"`)
	require.Regexp(t, `src="/ops/reactors/static/app\.js\?v=`, body)

	rec = uiGet(t, newUI(), "GET", "/runs/order-42", nil)
	require.Contains(t, rec.Body.String(), `data-base=""`)
}
