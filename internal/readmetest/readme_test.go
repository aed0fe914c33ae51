package readmetest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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

// snippets returns the README's Go code blocks.
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

// TestREADMESnippetsCompile builds every Go block of the README as written,
// its declarations at file level and its statements in a function body.
func TestREADMESnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's snippets with the go command")
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	blocks := snippets(t, string(readme))
	require.NotEmpty(t, blocks)

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
	for i, b := range blocks {
		if isFile(b) {
			// A whole program (the worker's main): it is a real file of the
			// repository, kept identical by cmd/worker's own test.
			continue
		}
		decls, stmts := split(b)
		src := snippetHeader + "\n" + decls + "\n"
		if strings.TrimSpace(stmts) != "" {
			src += fmt.Sprintf("\nfunc snippet%d(ctx context.Context, rdb *redis.Client, inputs map[string]any) error {\n%s\n\treturn nil\n}\n", i+1, stmts)
		}
		add(fmt.Sprintf("snippet%d.go", i+1), src)
	}
	cfg, err := json.Marshal(map[string]any{"Replace": overlay})
	require.NoError(t, err)
	overlayFile := filepath.Join(tmp, "overlay.json")
	require.NoError(t, os.WriteFile(overlayFile, cfg, 0o600))

	cmd := exec.Command("go", "vet", "-overlay="+overlayFile, ".")
	cmd.Dir = pkgDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		for i, b := range blocks {
			t.Logf("README Go block %d:\n%s", i+1, b)
		}
	}
	require.NoError(t, err, "the README's Go blocks do not build as written:\n%s", out)
}
