package buildinfo

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOverride(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.8.7"
	if got := Version(); got != "v9.8.7" {
		t.Errorf("Version() = %q; want the -ldflags value v9.8.7", got)
	}
	if got := String("sidecar"); !strings.HasPrefix(got, "sidecar v9.8.7 (") || !strings.Contains(got, "go1.") {
		t.Errorf("String(sidecar) = %q; want program, version and toolchain", got)
	}
	version = ""
	if got := Version(); got != Release {
		t.Errorf("Version() without -X = %q; want Release %q", got, Release)
	}
}

// semver is a version tag as semver.org and the go tool read it.
var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

// TestRelease: Release is a semver tag, and CHANGELOG.md has a section for
// it (the release itself, or "Unreleased" naming it while it is -dev), so
// a bump of one without the other fails here.
func TestRelease(t *testing.T) {
	if !semver.MatchString(Release) {
		t.Fatalf("Release = %q; want vMAJOR.MINOR.PATCH[-pre]", Release)
	}
	log, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	rel, dev := strings.CutSuffix(Release, "-dev")
	head := "## [" + rel + "]"
	if dev {
		head = "## [Unreleased] (" + rel + ")"
	}
	if !strings.Contains(string(log), "\n"+head) {
		t.Errorf("CHANGELOG.md has no section %q for Release %s", head, Release)
	}
}

func TestDetails(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings []debug.BuildSetting
		want     string
	}{
		{"no vcs", nil, "go1.26.8"},
		{"clean", []debug.BuildSetting{{Key: "vcs.revision", Value: "b485253abcdef0123456789"}, {Key: "vcs.modified", Value: "false"}},
			"commit b485253abcde, go1.26.8"},
		{"modified", []debug.BuildSetting{{Key: "vcs.revision", Value: "b485253"}, {Key: "vcs.modified", Value: "true"}},
			"commit b485253+modified, go1.26.8"},
	} {
		if got := details(&debug.BuildInfo{GoVersion: "go1.26.8", Settings: tc.settings}); got != tc.want {
			t.Errorf("%s: details = %q; want %q", tc.name, got, tc.want)
		}
	}
}
