package buildinfo

import (
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
