//go:build integration

package cli

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaries runs every kvroute binary as a user would: --help prints a
// usage with a description on stdout and exits 0 with nothing on stderr,
// --version prints one line naming the program, and a bad flag exits 2
// with the error on stderr and nothing on stdout.
func TestBinaries(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "github.com/kvroute/kvroute/cmd/...")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/...: %v\n%s", err, out)
	}
	run := func(args ...string) (stdout, stderr string, code int) {
		var o, e bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, args[0]), args[1:]...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		return o.String(), e.String(), code
	}
	for _, tc := range []struct {
		cmd   []string // program and subcommand
		usage string
	}{
		{[]string{"sidecar"}, "Usage: sidecar [serve] [flags]"},
		{[]string{"sidecar", "serve"}, "Usage: sidecar [serve] [flags]"},
		{[]string{"sidecar", "events"}, "Usage: sidecar events [flags]"},
		{[]string{"vllm-sim"}, "Usage: vllm-sim [flags] [MODEL]"},
		{[]string{"kvbench"}, "Usage: kvbench [flags]"},
		{[]string{"kvcluster"}, "Usage: kvcluster [flags]"},
		{[]string{"kvcluster", "down"}, "Usage: kvcluster down"},
		{[]string{"kvproxy"}, "Usage: kvproxy --policy NAME"},
		{[]string{"bareproxy"}, "Usage: bareproxy"},
	} {
		name := strings.Join(tc.cmd, " ")
		out, errs, code := run(append(tc.cmd, "--help")...)
		if code != 0 || errs != "" || !strings.HasPrefix(out, tc.usage) || strings.Count(out, "\n") < 6 {
			t.Errorf("%s --help: exit %d, stdout %q, stderr %q; want exit 0 and a usage with a description on stdout only", name, code, out, errs)
		}
		out, errs, code = run(append(tc.cmd, "--version")...)
		if code != 0 || errs != "" || !strings.HasPrefix(out, tc.cmd[0]+" ") || strings.Count(out, "\n") != 1 {
			t.Errorf("%s --version: exit %d, stdout %q, stderr %q; want one line on stdout", name, code, out, errs)
		}
		out, errs, code = run(append(tc.cmd, "--no-such-flag")...)
		if code != 2 || out != "" || !strings.Contains(errs, "flag provided but not defined: -no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q; want exit 2 with the error on stderr", name, code, out, errs)
		}
	}
}
