package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHelpAndVersion: every way of asking for help or the version answers
// on stdout and returns nil (exit 0), before anything starts.
func TestHelpAndVersion(t *testing.T) {
	host, _ := os.Hostname()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--help"}, "Usage: sidecar [serve] [flags]"},
		{[]string{"-h"}, "Every flag has an environment twin"},
		{[]string{"serve", "--help"}, "-kv-events-endpoint string"},
		{[]string{"events", "--help"}, "Usage: sidecar events [flags]"},
		{[]string{"--version"}, "sidecar "},
		{[]string{"events", "--version"}, "sidecar events "},
	} {
		var out bytes.Buffer
		if err := run(tc.args, &out); err != nil {
			t.Errorf("run(%q) = %v; want nil (exit 0)", tc.args, err)
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("run(%q) stdout = %q; want %q in it", tc.args, out.String(), tc.want)
		}
		if strings.Contains(tc.args[len(tc.args)-1], "help") {
			if n := strings.Count(out.String(), "$POD_NAME"); n > 1 {
				t.Errorf("run(%q): the node-name default is printed %d times", tc.args, n)
			}
			if host != "" && strings.Contains(out.String(), `(default "`+host+`")`) {
				t.Errorf("run(%q) prints the hostname as a default besides $POD_NAME", tc.args)
			}
		}
	}
}

// TestPlainConsole: console logs written to a file carry no ANSI colour
// codes; an explicit NO_COLOR is left alone.
func TestPlainConsole(t *testing.T) {
	t.Setenv("NO_COLOR", "") // restored after the test
	os.Unsetenv("NO_COLOR")
	f, err := os.Create(filepath.Join(t.TempDir(), "sidecar.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	plainConsole(f, os.Setenv)
	if os.Getenv("NO_COLOR") == "" {
		t.Fatal("plainConsole(file) left NO_COLOR unset")
	}
	orig := os.Stderr
	os.Stderr = f
	log := newLogger(config{LogFormat: "console", LogLevel: "info", NodeName: "pod1"})
	os.Stderr = orig
	log.Warn().Str("k", "v").Msg("no secret")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "no secret") || strings.Contains(string(b), "\x1b[") {
		t.Errorf("console log in a file = %q; want the message without ANSI escapes", b)
	}

	os.Setenv("NO_COLOR", "")
	plainConsole(f, func(k, v string) error {
		t.Errorf("plainConsole set %s=%s over an explicit NO_COLOR", k, v)
		return nil
	})
}
