package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"
)

// The HTML status view is a set of page shells: the templates carry no run
// data, only the page's identity (which page, which run id). Everything
// dynamic is fetched by the scripts in assets/ from the JSON API on the same
// origin and written into the page with textContent and DOM calls, never
// innerHTML, so a reactor name, an input or an error containing markup
// renders as text. The Content-Security-Policy below forbids inline scripts
// and styles, which holds the scripts to that rule.

//go:embed assets templates
var uiFiles embed.FS

// uiCSP is sent with every response of the HTML view.
const uiCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

// uiAsset is one embedded static file with the digest that versions its URL.
type uiAsset struct {
	body []byte
	etag string // quoted, strong
	tag  string // short digest used as the ?v= cache buster
}

// uiPage is the data of a page shell.
type uiPage struct {
	Title string
	Page  string // "overview", "run", "workers", "paused", "limits" or "notfound": selects the script's view
	RunID string
	Base  string // path prefix the dashboard is mounted under, "" at the root
}

type uiHandler struct {
	assets map[string]uiAsset
	pages  map[string]*template.Template
}

// newUI returns the handler of the HTML status view: GET / (overview and run
// list), GET /runs/{id} (run detail), GET /workers (the workers and what
// they run), GET /paused (the runs paused at an interrupt), GET /limits
// (who holds a step limit's key) and GET
// /static/... (embedded assets).
// Every other path answers 404 and every method but GET and HEAD 405. It
// panics if the embedded templates do not parse, which a test catches.
func newUI() http.Handler {
	u := &uiHandler{assets: map[string]uiAsset{}, pages: map[string]*template.Template{}}
	err := fs.WalkDir(uiFiles, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := uiFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		digest := hex.EncodeToString(sum[:])
		u.assets[strings.TrimPrefix(p, "assets/")] = uiAsset{body: body, etag: `"` + digest[:32] + `"`, tag: digest[:12]}
		return nil
	})
	if err != nil {
		panic("dashboard: read embedded assets: " + err.Error())
	}
	funcs := template.FuncMap{
		// asset names a static file by a URL that changes with its content,
		// so browsers may cache it for good.
		"asset": func(base, name string) (string, error) {
			a, ok := u.assets[name]
			if !ok {
				return "", fs.ErrNotExist
			}
			return base + "/static/" + name + "?v=" + a.tag, nil
		},
	}
	layout := template.Must(template.New("layout.html").Funcs(funcs).ParseFS(uiFiles, "templates/layout.html"))
	for _, name := range []string{"overview", "run", "workers", "paused", "limits", "notfound"} {
		t := template.Must(template.Must(layout.Clone()).ParseFS(uiFiles, "templates/"+name+".html"))
		u.pages[name] = t
	}
	return u
}

func (u *uiHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")

	p := r.URL.Path
	known := p == "/" || p == "/workers" || p == "/paused" || p == "/limits" || strings.HasPrefix(p, "/static/") || (strings.HasPrefix(p, "/runs/") && len(p) > len("/runs/"))
	if known && r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed: the dashboard's pages are read with GET", http.StatusMethodNotAllowed)
		return
	}
	base := uiMountBase(r)
	switch {
	case p == "/":
		u.render(w, r, http.StatusOK, uiPage{Title: "Runs", Page: "overview", Base: base})
	case p == "/workers":
		u.render(w, r, http.StatusOK, uiPage{Title: "Workers", Page: "workers", Base: base})
	case p == "/paused":
		u.render(w, r, http.StatusOK, uiPage{Title: "Paused", Page: "paused", Base: base})
	case p == "/limits":
		u.render(w, r, http.StatusOK, uiPage{Title: "Limits", Page: "limits", Base: base})
	case strings.HasPrefix(p, "/runs/") && len(p) > len("/runs/"):
		// Run ids may hold slashes (element runs of a map under a composed
		// step), so the rest of the path is the id.
		id := strings.TrimPrefix(p, "/runs/")
		u.render(w, r, http.StatusOK, uiPage{Title: "Run " + id, Page: "run", RunID: id, Base: base})
	case strings.HasPrefix(p, "/static/"):
		u.serveAsset(w, r, strings.TrimPrefix(p, "/static/"))
	default:
		u.render(w, r, http.StatusNotFound, uiPage{Title: "Not found", Page: "notfound", Base: base})
	}
}

func (u *uiHandler) render(w http.ResponseWriter, r *http.Request, code int, page uiPage) {
	var buf bytes.Buffer
	if err := u.pages[page.Page].ExecuteTemplate(&buf, "layout.html", page); err != nil {
		http.Error(w, "dashboard: render page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(buf.Bytes())
	}
}

func (u *uiHandler) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	a, ok := u.assets[name]
	if !ok || !fs.ValidPath(name) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	h := w.Header()
	// A URL carrying the current digest never changes content; any other
	// (an old page, a hand-typed URL) is revalidated with the ETag.
	if r.URL.Query().Get("v") == a.tag {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	h.Set("ETag", a.etag)
	http.ServeContent(w, r, path.Base(name), time.Time{}, bytes.NewReader(a.body))
}

// uiMountBase returns the path prefix that a wrapping http.StripPrefix
// removed, so that pages link to their assets and the API under the same
// prefix. At the root it is "".
func uiMountBase(r *http.Request) string {
	orig, err := url.ParseRequestURI(r.RequestURI)
	if err != nil {
		return ""
	}
	full, stripped := orig.EscapedPath(), r.URL.EscapedPath()
	if len(full) <= len(stripped) || !strings.HasSuffix(full, stripped) {
		return ""
	}
	return strings.TrimSuffix(full[:len(full)-len(stripped)], "/")
}
