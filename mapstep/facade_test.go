package mapstep_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/goreactor/goreactor/internal/facadegen/gen"
)

// api.go is generated from internal/mapcore: an exported identifier added
// there without regenerating would be missing from mapstep's API.
func TestFacadeIsUpToDate(t *testing.T) {
	want, err := gen.Facade("../internal/mapcore", "github.com/goreactor/goreactor/internal/mapcore", "mapstep",
		map[string]string{"github.com/goreactor/goreactor/internal/engine": "github.com/goreactor/goreactor/reactor"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("mapstep/api.go is out of date: run go generate ./mapstep")
	}
}
