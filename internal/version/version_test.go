package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   debug.BuildInfo
		want string
	}{
		{"a checkout", debug.BuildInfo{Main: debug.Module{Path: Module, Version: "(devel)"}}, Default},
		{"no version", debug.BuildInfo{Main: debug.Module{Path: Module}}, Default},
		{"a tagged build", debug.BuildInfo{Main: debug.Module{Path: Module, Version: "v0.1.0"}}, "0.1.0"},
		{"linked into another module", debug.BuildInfo{Main: debug.Module{Path: "example.com/shop", Version: "v2.0.0"},
			Deps: []*debug.Module{{Path: "example.com/other", Version: "v9.9.9"}, {Path: Module, Version: "v0.1.2"}}}, "0.1.2"},
		{"replaced", debug.BuildInfo{Main: debug.Module{Path: "example.com/shop"},
			Deps: []*debug.Module{{Path: Module, Version: "v0.1.0", Replace: &debug.Module{Path: "../goreactor", Version: ""}}}}, Default},
		{"not linked", debug.BuildInfo{Main: debug.Module{Path: "example.com/shop", Version: "v2.0.0"}}, Default},
	} {
		if got := fromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
	if got := Line(); got != "goreactor "+String() {
		t.Errorf("Line() = %q", got)
	}
}
