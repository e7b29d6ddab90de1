package main

import (
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/baseline"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--policy", "central-precise", "--model", "m",
		"--backends", "http://127.0.0.2:8001, http://127.0.0.3:8001",
		"--events", "ipc:///d/pod1-events,ipc:///d/pod2-events",
		"--topics", "kv@pod1@m,kv@pod2@m"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []baseline.Backend{
		{Name: "pod1", URL: "http://127.0.0.2:8001", Events: "ipc:///d/pod1-events", Topic: "kv@pod1@m"},
		{Name: "pod2", URL: "http://127.0.0.3:8001", Events: "ipc:///d/pod2-events", Topic: "kv@pod2@m"},
	}
	if d := cmp.Diff(want, o.Proxy.Backends); d != "" {
		t.Errorf("backends (-want +got):\n%s", d)
	}
	if o.Proxy.Policy != "central-precise" || o.Proxy.Model != "m" || o.Proxy.BlockSize != 16 {
		t.Errorf("options = %+v", o.Proxy)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"no backends", []string{"--policy", "chwbl"}},
		{"names count", []string{"--backends", "http://a,http://b", "--names", "x"}},
		{"events count", []string{"--backends", "http://a", "--events", "ipc:///1,ipc:///2"}},
		{"stray argument", []string{"--backends", "http://a", "extra"}},
		{"unknown flag", []string{"--backends", "http://a", "--nope"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := parseFlags(tt.args, io.Discard, io.Discard); err == nil {
				t.Errorf("parseFlags(%q) succeeded", tt.args)
			}
		})
	}
}
