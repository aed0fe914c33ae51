// Package version says which goreactor a binary was built from, for the
// -version flag of every command.
package version

import (
	"runtime/debug"
	"strings"
)

// Module is goreactor's module path.
const Module = "github.com/goreactor/goreactor"

// Default is the version of this source tree, reported when the build
// carries no module version for goreactor (a build inside a checkout, where
// Go records "(devel)"). It is the release's version in the release's
// commit (CHANGELOG.md) and the next version with "-dev" after it.
const Default = "0.1.0"

// String is goreactor's version in this binary: the version Go recorded
// for the goreactor module (the main module's, or a dependency's when a
// program of another module links goreactor in, as worker.Main does), without
// its leading "v"; otherwise Default.
func String() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Default
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	m := &bi.Main
	if m.Path != Module {
		m = nil
		for _, d := range bi.Deps {
			if d.Path == Module {
				m = d
				if d.Replace != nil {
					m = d.Replace
				}
				break
			}
		}
	}
	if m == nil || m.Version == "" || m.Version == "(devel)" {
		return Default
	}
	return strings.TrimPrefix(m.Version, "v")
}

// Line is what -version prints: "goreactor " and the version.
func Line() string { return "goreactor " + String() }
