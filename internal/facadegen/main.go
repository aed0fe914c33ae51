// Command facadegen writes a public package's facade over an internal one:
// a type alias, a forwarding function, a constant or a variable for every
// exported top-level identifier of the internal package, with its doc
// comment, except those declared in plumbing*.go files (the internal
// package's API for goreactor's own packages).
//
//	go run ./internal/facadegen -src internal/engine \
//	    -import github.com/goreactor/goreactor/internal/engine -pkg reactor -out reactor/api.go
//
// Package reactor's facade_test.go runs it and fails when reactor/api.go is
// out of date.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/goreactor/goreactor/internal/facadegen/gen"
)

func main() {
	src := flag.String("src", "", "directory of the internal package")
	imp := flag.String("import", "", "import path of the internal package")
	pkg := flag.String("pkg", "", "name of the facade package")
	out := flag.String("out", "", "file to write (stdout if empty)")
	renames := map[string]string{}
	flag.Func("rename", "from=to: name from's types through to (repeatable)", func(v string) error {
		from, to, ok := strings.Cut(v, "=")
		if !ok {
			return fmt.Errorf("want from=to, got %q", v)
		}
		renames[from] = to
		return nil
	})
	flag.Parse()
	if *src == "" || *imp == "" || *pkg == "" {
		log.Fatal("facadegen: -src, -import and -pkg are required")
	}
	b, err := gen.Facade(*src, *imp, *pkg, renames)
	if err != nil {
		log.Fatal(err)
	}
	if *out == "" {
		fmt.Print(string(b))
		return
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		log.Fatal(err)
	}
}
