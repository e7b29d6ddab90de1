package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/loadgen"
)

func TestWriteOutputs(t *testing.T) {
	res := func(name string, hit float64) loadgen.PolicyResult {
		return loadgen.PolicyResult{Name: name, Requests: 3, SuccessRate: 1, HitRate: hit, TTFTs: []float64{0.1, 0.2, 0.3}}
	}
	pts := []loadgen.SweepPoint{
		{Rate: 4, Policies: []loadgen.PolicyResult{res("service", 0.2), res("kvroute", 0.6)}},
		{Rate: 8, Policies: []loadgen.PolicyResult{res("service", 0.1), res("kvroute", 0.5)}},
	}
	dir := t.TempDir()
	o, err := parseFlags([]string{"--out", dir, "--pods", "3"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := writeOutputs(o, pts, "shared-prefix")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"results.json", "ttft-cdf-4.png", "ttft-cdf-8.png", "results.md", "hit-rate-vs-load.png",
		"ttft-p90-vs-load.png", "sweep.json"}
	if len(paths) != len(want) {
		t.Errorf("wrote %v; want %v", paths, want)
	}
	for _, f := range want {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	var rep loadgen.Report
	b, _ := os.ReadFile(filepath.Join(dir, "results.json"))
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	// results.json holds the last (highest) offered load.
	if rep.Pods != 3 || rep.Workload != "shared-prefix" || len(rep.Policies) != 2 || rep.Policies[1].HitRate != 0.5 {
		t.Errorf("results.json %+v", rep)
	}
	var sweep []struct {
		OfferedLoad float64 `json:"offered_load"`
		loadgen.Report
	}
	b, _ = os.ReadFile(filepath.Join(dir, "sweep.json"))
	if err := json.Unmarshal(b, &sweep); err != nil {
		t.Fatal(err)
	}
	if len(sweep) != 2 || sweep[0].OfferedLoad != 4 || sweep[0].Policies[1].HitRate != 0.6 {
		t.Errorf("sweep.json %s", b)
	}
}
