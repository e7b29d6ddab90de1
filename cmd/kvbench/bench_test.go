package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/loadgen"
)

func TestWriteSamples(t *testing.T) {
	path := filepath.Join(t.TempDir(), "samples.jsonl")
	in := []loadgen.Sample{
		{Session: "m-a0-1", Turn: 0, Pod: "pod2", PromptTokens: 3000, CachedTokens: 2400, TTFT: 0.12, Decision: "affinity"},
		{Session: "m-a0-1", Turn: 1, Pod: "pod3", Err: "503", Attempts: 3},
	}
	if err := writeSamples(path, in); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != len(in) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(in), b)
	}
	for i, l := range lines {
		var got loadgen.Sample
		if err := json.Unmarshal([]byte(l), &got); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, in[i]) {
			t.Errorf("line %d: %+v, want %+v", i, got, in[i])
		}
	}
	if err := writeSamples(filepath.Join(t.TempDir(), "no", "such", "dir"), in); err == nil {
		t.Error("a path that cannot be created: no error")
	}
}
