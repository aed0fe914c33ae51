package reactor_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goreactor/goreactor/internal/facadegen/gen"
)

// api.go is generated from internal/engine; an exported identifier added
// there without regenerating would be missing from the public API.
func TestFacadeIsUpToDate(t *testing.T) {
	want, err := gen.Facade("../internal/engine", "github.com/goreactor/goreactor/internal/engine", "reactor", nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("reactor/api.go is out of date: run go generate ./reactor")
	}
	// go doc shows no methods or fields for an alias: the facade's comments
	// carry them.
	for _, manual := range []string{"//\tfunc (e *Engine) Run(ctx context.Context", "//\t\tLockExpiry time.Duration"} {
		if !bytes.Contains(got, []byte(manual)) {
			t.Errorf("reactor/api.go lacks %q in its doc comments", manual)
		}
	}
}

// The engine's core lives under internal/ and never imports the public
// packages that are its facades: the dependency runs one way, and no
// exported function variable waits to be filled in by a public package. (Test files
// are exempt: an internal package's tests may drive it through mapstep or
// worker.) The leaf packages fingerprint and metrics' sibling examples are
// not facades; fingerprint imports nothing of goreactor.
func TestInternalImportsNoFacade(t *testing.T) {
	facades := map[string]bool{}
	for _, p := range []string{"reactor", "mapstep", "worker", "sweeper", "dashboard", "metrics", "bench", "examples"} {
		facades["github.com/goreactor/goreactor/"+p] = true
	}
	root := filepath.Join("..", "internal")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		checked++
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					if _, isFunc := vs.Type.(*ast.FuncType); isFunc && vs.Names[0].IsExported() {
						t.Errorf("%s: var %s is a function variable: plumbing is an ordinary function, not a hook set at init",
							path, vs.Names[0].Name)
					}
				}
			}
		}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			for facade := range facades {
				if p == facade || strings.HasPrefix(p, facade+"/") {
					t.Errorf("%s imports %s: internal packages must not import the public API", path, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Fatalf("checked only %d files under %s", checked, root)
	}
}
