package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestCmdMainHelpVersion(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"--help"}, 0, "Usage: kvcluster [flags]", ""},
		{[]string{"--version"}, 0, "kvcluster ", ""},
		{[]string{"down", "--help"}, 0, "Usage: kvcluster down [--dir DIR]", ""},
		{[]string{"--pods", "0"}, 2, "", "kvcluster: --pods 0: want 1 to 253"},
		{[]string{"--nope"}, 2, "", "flag provided but not defined: -nope"},
		{[]string{"down", "--dir", t.TempDir()}, 0, "no cluster running from", ""},
	} {
		var out, errw bytes.Buffer
		if code := cmdMain(tc.args, &out, &errw); code != tc.code {
			t.Errorf("cmdMain(%q) = %d; want %d (stderr %q)", tc.args, code, tc.code, errw.String())
		}
		if !strings.Contains(out.String(), tc.stdout) || (tc.stdout == "" && out.Len() > 0) {
			t.Errorf("cmdMain(%q) stdout = %q; want %q", tc.args, out.String(), tc.stdout)
		}
		if !strings.Contains(errw.String(), tc.stderr) || (tc.stderr == "" && errw.Len() > 0) {
			t.Errorf("cmdMain(%q) stderr = %q; want %q", tc.args, errw.String(), tc.stderr)
		}
	}
}

// TestRunning: a pid file names a live cluster only when that process runs
// and is a kvcluster; a stale or reused pid is not one.
func TestRunning(t *testing.T) {
	dir := t.TempDir()
	if _, ok := running(dir); ok {
		t.Error("running(no pid file) = true")
	}
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	other := exec.Command("sleep", "30") // alive, but no kvcluster
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	write(strconv.Itoa(other.Process.Pid) + "\n")
	if _, ok := running(dir); ok {
		t.Error("running(pid of another program) = true")
	}
	write("999999999\n")
	if _, ok := running(dir); ok {
		t.Error("running(dead pid) = true")
	}
	write("garbage")
	if _, ok := running(dir); ok {
		t.Error("running(garbage) = true")
	}
}
