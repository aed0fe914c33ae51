package readmetest_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// prelude declares what the README's snippets use without defining: the
// user's own services and values. It compiles only with the snippets.
const prelude = `package readmetest

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

var (
	_ = time.Second
	_ = redis.NewClient
	_ = mapstep.Map
	_ = worker.NewClient
)

type stockService struct{}

func (stockService) Reserve(ctx context.Context, item string, qty int) (Reservation, error) {
	return Reservation{ID: item, Qty: qty}, nil
}
func (stockService) Release(ctx context.Context, id string) error { return nil }

var stock stockService

func charge(ctx context.Context, r Reservation) (string, error)          { return "receipt-" + r.ID, nil }
func refund(ctx context.Context, r Reservation, receipt string) error { return nil }

var checkout *reactor.Definition

type Parcel struct {
	ID string ` + "`json:\"id\"`" + `
}

var PackParcel = reactor.MustDefine("pack",
	reactor.Input[Parcel]("parcel", reactor.Required()),
	reactor.Step("label", reactor.StepConfig[reactor.Args, string]{
		Run: func(context.Context, reactor.Args) (string, error) { return "label", nil },
	}),
	reactor.Returns(reactor.FromStep("label")),
)
`

// imports every snippet file starts with; blank uses keep unused ones legal.
const snippetHeader = `package readmetest

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/goreactor/goreactor/mapstep"
	"github.com/goreactor/goreactor/metrics"
	"github.com/goreactor/goreactor/reactor"
	"github.com/goreactor/goreactor/worker"
)

var (
	_ = context.Background
	_ = fmt.Sprint
	_ = http.ListenAndServe
	_ = time.Second
	_ = prometheus.NewRegistry
	_ = promhttp.HandlerFor
	_ = redis.NewClient
	_ = sdktrace.NewTracerProvider
	_ = mapstep.Map
	_ = metrics.New
	_ = reactor.Define
	_ = worker.NewClient
)
`

// snippets returns the Go code blocks of a Markdown text: those fenced
// "```go" exactly (a "```go sketch" block is left out).
func snippets(t *testing.T, readme string) []string {
	t.Helper()
	var out []string
	var cur []string
	in := false
	for _, line := range strings.Split(readme, "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```go":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			out = append(out, strings.Join(cur, "\n"))
		case in:
			cur = append(cur, line)
		}
	}
	require.False(t, in, "an unterminated code block")
	return out
}

// split separates a snippet's top-level declarations from its statements:
// a declaration starts at column 0 with type, func, var or const and runs
// until the next column-0 line that is neither a closing bracket nor a
// comment; comments go with what follows them.
func split(snippet string) (decls, stmts string) {
	var d, s, pending []string
	top := false
	for _, line := range strings.Split(snippet, "\n") {
		trimmed := strings.TrimSpace(line)
		col0 := line != "" && line[0] != '\t' && line[0] != ' '
		switch {
		case col0 && strings.HasPrefix(line, "//"):
			pending = append(pending, line)
			continue
		case col0 && (strings.HasPrefix(line, "type ") || strings.HasPrefix(line, "func ") ||
			strings.HasPrefix(line, "var ") || strings.HasPrefix(line, "const ")):
			top = true
		case col0 && (strings.HasPrefix(trimmed, "}") || strings.HasPrefix(trimmed, ")")):
			// a declaration's (or a statement's) closing line stays where it is
		case col0:
			top = false
		}
		if top {
			d = append(d, pending...)
			d = append(d, line)
		} else {
			s = append(s, pending...)
			s = append(s, line)
		}
		pending = nil
	}
	return strings.Join(d, "\n"), strings.Join(s, "\n")
}

// isFile reports whether a block is a whole Go file (it has a package clause).
func isFile(block string) bool {
	for _, line := range strings.Split(block, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "//") {
			continue
		}
		return strings.HasPrefix(t, "package ")
	}
	return false
}

// docs returns the Markdown files whose Go blocks the tests check: the
// README and every page of docs/, by path from the repository's root.
func docs(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	paths = append([]string{"../../README.md"}, paths...)
	out := map[string]string{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		out[strings.TrimPrefix(p, "../../")] = string(b)
	}
	return out
}

// excerptOf returns the repository file a block is an excerpt of: a block
// whose first line is a comment naming a .go file ("// examples/orders/orders.go")
// shows part of that file, and is checked against it instead of compiled.
func excerptOf(block string) (path string, ok bool) {
	first, _, _ := strings.Cut(block, "\n")
	m := excerptHeader.FindStringSubmatch(strings.TrimSpace(first))
	if m == nil {
		return "", false
	}
	return m[1], true
}

var excerptHeader = regexp.MustCompile(`^// ([\w./-]+\.go)$`)

// TestREADMESnippetsCompile builds every Go block of the README and of
// docs/*.md as written, its declarations at file level and its statements
// in a function body, all in one package (so two blocks may not declare the
// same name). Whole files (a package clause) and excerpts of repository
// files are left to the go command and to TestExcerptsMatchTheirFiles.
func TestREADMESnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's snippets with the go command")
	}
	pkgDir, err := filepath.Abs(".")
	require.NoError(t, err)
	tmp := t.TempDir()
	overlay := map[string]string{}
	add := func(name, src string) {
		p := filepath.Join(tmp, name)
		require.NoError(t, os.WriteFile(p, []byte(src), 0o600))
		overlay[filepath.Join(pkgDir, name)] = p
	}
	add("prelude.go", prelude)
	var compiled []string // "<doc> block <n>:\n<block>", for the log
	pages := docs(t)
	names := slices.Sorted(maps.Keys(pages))
	for _, doc := range names {
		blocks := snippets(t, pages[doc])
		if doc == "README.md" {
			require.NotEmpty(t, blocks)
		}
		for i, b := range blocks {
			if _, ok := excerptOf(b); ok || isFile(b) {
				continue
			}
			name := strings.NewReplacer("/", "_", ".md", "", "-", "_").Replace(doc)
			decls, stmts := split(b)
			src := snippetHeader + "\n" + decls + "\n"
			if strings.TrimSpace(stmts) != "" {
				src += fmt.Sprintf("\nfunc %s_snippet%d(ctx context.Context, rdb *redis.Client, inputs map[string]any) error {\n%s\n\treturn nil\n}\n",
					name, i+1, stmts)
			}
			add(fmt.Sprintf("%s_snippet%d.go", name, i+1), src)
			compiled = append(compiled, fmt.Sprintf("%s Go block %d (%s_snippet%d.go):\n%s", doc, i+1, name, i+1, b))
		}
	}
	cfg, err := json.Marshal(map[string]any{"Replace": overlay})
	require.NoError(t, err)
	overlayFile := filepath.Join(tmp, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, cfg, 0o600))

	cmd := exec.Command("go", "vet", "-overlay="+overlayFile, ".")
	cmd.Dir = pkgDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		for _, c := range compiled {
			t.Log(c)
		}
	}
	require.NoError(t, err, "the docs' Go blocks do not build as written:\n%s", out)
}

// TestExcerptsMatchTheirFiles checks every Go block that names a repository
// file on its first line against that file: its other lines, cut into
// pieces at lines that read "// ...", are each a run of consecutive lines
// of the file, in the file's order. So what the README shows of
// examples/orders is what the end-to-end test of examples/orders runs.
func TestExcerptsMatchTheirFiles(t *testing.T) {
	t.Parallel()
	found := 0
	for doc, text := range docs(t) {
		for i, b := range snippets(t, text) {
			path, ok := excerptOf(b)
			if !ok {
				continue
			}
			found++
			src, err := os.ReadFile(filepath.Join("../..", path))
			require.NoError(t, err, "%s Go block %d names %s", doc, i+1, path)
			file := strings.Split(string(src), "\n")
			lines := strings.Split(b, "\n")[1:]
			from := 0 // the file line after the previous piece
			for _, piece := range pieces(lines) {
				at := find(file[from:], piece)
				if at < 0 {
					t.Errorf("%s Go block %d: these lines are not in %s as they are shown (in this order):\n%s",
						doc, i+1, path, strings.Join(piece, "\n"))
					break
				}
				from += at + len(piece)
			}
		}
	}
	require.NotZero(t, found, "no excerpt found: the README shows examples/orders")
}

// pieces cuts an excerpt's lines at the lines that read "// ...".
func pieces(lines []string) [][]string {
	var out [][]string
	var cur []string
	for _, l := range lines {
		if strings.TrimSpace(l) == "// ..." {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, l)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// find returns where piece starts in file as consecutive lines, or -1.
func find(file, piece []string) int {
	for i := 0; i+len(piece) <= len(file); i++ {
		if slices.Equal(file[i:i+len(piece)], piece) {
			return i
		}
	}
	return -1
}
