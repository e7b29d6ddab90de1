package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestCmdMainHelpVersion: --help and --version answer on stdout with exit
// 0 and no log line; a bad flag answers on stderr with exit 2, as plain
// text with the usage, not a JSON log line.
func TestCmdMainHelpVersion(t *testing.T) {
	for _, tc := range []struct {
		args               []string
		code               int
		stdout, stderr     string
		emptyOut, emptyErr bool
	}{
		{args: []string{"--help"}, code: 0, stdout: "Usage: vllm-sim [flags] [MODEL]", emptyErr: true},
		{args: []string{"-h"}, code: 0, stdout: "-kv-events-config string", emptyErr: true},
		{args: []string{"--version"}, code: 0, stdout: "vllm-sim ", emptyErr: true},
		{args: []string{"--port", "x"}, code: 2, stderr: "invalid value \"x\" for flag -port", emptyOut: true},
		{args: []string{"--sim-drop-rate", "2"}, code: 2, stderr: "vllm-sim: --sim-drop-rate 2 outside [0, 1]", emptyOut: true},
	} {
		var out, errw bytes.Buffer
		if code := cmdMain(tc.args, &out, &errw); code != tc.code {
			t.Errorf("cmdMain(%q) = %d; want %d (stderr %q)", tc.args, code, tc.code, errw.String())
		}
		if !strings.Contains(out.String(), tc.stdout) || (tc.emptyOut && out.Len() > 0) {
			t.Errorf("cmdMain(%q) stdout = %q; want %q", tc.args, out.String(), tc.stdout)
		}
		if !strings.Contains(errw.String(), tc.stderr) || (tc.emptyErr && errw.Len() > 0) {
			t.Errorf("cmdMain(%q) stderr = %q; want %q", tc.args, errw.String(), tc.stderr)
		}
		if strings.Contains(errw.String(), `"level"`) || strings.Contains(errw.String(), "help requested") {
			t.Errorf("cmdMain(%q) stderr = %q; want no JSON log line", tc.args, errw.String())
		}
	}
}
