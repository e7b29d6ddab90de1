package cli

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func newSet() *flag.FlagSet {
	fs := flag.NewFlagSet("tool", flag.ContinueOnError)
	fs.Int("pods", 3, "how many pods")
	Usage(fs, "tool [flags]", "Tool does one thing.")
	return fs
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args             []string
		code             int
		stdout, stderr   string // substrings; "" means must be empty
		noStdout, noErrs bool
	}{
		{args: []string{"--help"}, code: 0, stdout: "Usage: tool [flags]\n\nTool does one thing.\n\nFlags:\n  -pods int"},
		{args: []string{"-h"}, code: 0, stdout: "-version"},
		{args: []string{"--version"}, code: 0, stdout: "tool "},
		{args: []string{"--pods", "x"}, code: 2, stderr: "invalid value \"x\" for flag -pods"},
		{args: []string{"--nope"}, code: 2, stderr: "flag provided but not defined: -nope"},
		{args: []string{"--pods", "4"}, code: 0},
	} {
		var out, errw bytes.Buffer
		err := Parse(newSet(), tc.args, &out, &errw)
		if got := ExitCode(err); got != tc.code {
			t.Errorf("Parse(%q): exit %d (%v); want %d", tc.args, got, err, tc.code)
		}
		check := func(stream, got, want string) {
			if want == "" && got != "" {
				t.Errorf("Parse(%q) %s = %q; want nothing", tc.args, stream, got)
			}
			if !strings.Contains(got, want) {
				t.Errorf("Parse(%q) %s = %q; want it to contain %q", tc.args, stream, got, want)
			}
		}
		check("stdout", out.String(), tc.stdout)
		check("stderr", errw.String(), tc.stderr)
		if tc.code == 2 && !strings.Contains(errw.String(), "Usage: tool") {
			t.Errorf("Parse(%q) stderr = %q; want the usage after the error", tc.args, errw.String())
		}
	}
}

func TestParseDoneIsNotAnError(t *testing.T) {
	err := Parse(newSet(), []string{"--version"}, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, ErrDone) {
		t.Errorf("Parse(--version) = %v; want ErrDone", err)
	}
}

func TestFail(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
		out  string
	}{
		{errors.New("--pods 0: want at least 1"), 2, "tool: --pods 0: want at least 1\n"},
		{&FlagError{errors.New("flag provided but not defined: -x")}, 2, ""}, // Parse printed it
		{ErrDone, 0, ""},
	} {
		var w bytes.Buffer
		if code := Fail("tool", tc.err, &w); code != tc.code || w.String() != tc.out {
			t.Errorf("Fail(%v) = %d, printed %q; want %d, %q", tc.err, code, w.String(), tc.code, tc.out)
		}
	}
}
