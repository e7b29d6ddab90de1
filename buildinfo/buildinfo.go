// Package buildinfo is the version every kvroute binary prints for
// --version and the sidecar exports as kvroute_build_info. The version is
// Release, the constant this source tree carries, unless the link
// overrides it:
//
//	go build -ldflags "-X github.com/kvroute/kvroute/buildinfo.version=v0.2.0" ./cmd/...
//
// The commit the go tool stamped into the binary (vcs.revision) is printed
// beside it, so a build between releases says both what it will be and
// where it came from. CHANGELOG.md lists the releases; docs/compat.md says
// which of them share a mesh.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// Release is this tree's version: the release it is, or between releases
// the next one with a "-dev" suffix (semver's pre-release, which sorts
// before the release itself). Cutting a release sets it without the
// suffix in the commit that is tagged, and the next commit moves it on.
const Release = "v0.2.0-dev"

// version is the -ldflags -X override; empty unless the link set it.
var version string

// Version returns the -X override if the link set one, else Release.
// The go tool's own module version is not used: built from a checkout it
// is a pseudo-version of the commit (or "(devel)"), which String already
// names, and inside an image built with -trimpath and no VCS it is
// nothing.
func Version() string {
	if version != "" {
		return version
	}
	return Release
}

// String is the --version line of program: its version, the commit it was
// built from (with "+modified" when the tree had local changes) and the Go
// toolchain, e.g. "sidecar v0.2.0 (commit b485253, go1.26.8)".
func String(program string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Sprintf("%s %s", program, Version())
	}
	return fmt.Sprintf("%s %s (%s)", program, Version(), details(bi))
}

// details names the revision and toolchain from the settings that go build
// stamps (vcs.revision, vcs.modified); a build outside a repository has none.
func details(bi *debug.BuildInfo) string {
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+modified"
			}
		}
	}
	if rev == "" {
		return bi.GoVersion
	}
	return fmt.Sprintf("commit %.12s%s, %s", rev, modified, bi.GoVersion)
}
