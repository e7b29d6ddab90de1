// Package buildinfo is the version every kvroute binary prints for
// --version: a release sets it at link time,
//
//	go build -ldflags "-X github.com/kvroute/kvroute/buildinfo.version=v0.4.0" ./cmd/...
//
// and a build from a checkout reports the module version and the VCS
// revision the go tool stamped into the binary.
package buildinfo

import (
	"fmt"
	"runtime/debug"
)

// version is the -ldflags -X override; empty in a development build.
var version string

// Version returns the release version, else the main module's version as
// the go tool recorded it ("(devel)" when it recorded none).
func Version() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// String is the --version line of program: its version, the commit it was
// built from (with "+modified" when the tree had local changes) and the Go
// toolchain, e.g. "sidecar v0.4.0 (commit b485253, go1.26.8)".
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
