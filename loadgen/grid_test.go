package loadgen

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func pol(name string, p90, hit float64) PolicyResult {
	return PolicyResult{Name: name, Requests: 100, SuccessRate: 1, TTFTP90: p90, HitRate: hit, MaxMeanLoad: 1.1}
}

// TestReadGrid: three seeds of a 2-load sweep and two of a trace run,
// one trace run with other sidecar flags, one more with clients that
// retried, and a directory of cluster logs
// that holds a results.json of its own (never read).
func TestReadGrid(t *testing.T) {
	dir := t.TempDir()
	for seed, cp := range map[uint64]float64{1: 1.0, 2: 2.0, 3: 4.0} {
		sweep := []Report{
			{OfferedLoad: 20 + float64(seed), Workload: "doc-qa", Pods: 4, Seed: seed, Policies: []PolicyResult{
				pol("kvroute", 0.5, 0.9), pol("central-precise", cp, 0.9)}},
			{OfferedLoad: 10 + float64(seed), Workload: "doc-qa", Pods: 4, Seed: seed, Policies: []PolicyResult{
				pol("kvroute", 0.1, 0.8), pol("central-precise", 0.1, 1.0), pol("lmetric", 0.2, 0.7)}},
		}
		writeJSON(t, filepath.Join(dir, "dq", "s"+string(rune('0'+seed)), "sweep.json"), sweep)
		writeJSON(t, filepath.Join(dir, "dq", "s"+string(rune('0'+seed)), "results.json"), sweep[0])
	}
	for seed := range uint64(2) {
		writeJSON(t, filepath.Join(dir, "moon", "s"+string(rune('1'+seed)), "results.json"), Report{OfferedLoad: 7, Workload: "mooncake",
			Trace: "conversation_trace.jsonl", TimeScale: 2, Pods: 8, Seed: seed + 1,
			Policies: []PolicyResult{pol("kvroute", 3, 0.2), {Name: "central-precise", Requests: 10, SuccessRate: 0.9, TTFTP90: 4, HitRate: 0.2}}})
	}
	writeJSON(t, filepath.Join(dir, "moon16", "results.json"), Report{Workload: "mooncake", Trace: "conversation_trace.jsonl", TimeScale: 2,
		Pods: 8, SidecarArgs: []string{"--routing-stride", "16"}, Policies: []PolicyResult{pol("kvroute", 3, 0.2)}})
	writeJSON(t, filepath.Join(dir, "moon16r", "results.json"), Report{Workload: "mooncake", Trace: "conversation_trace.jsonl", TimeScale: 2,
		Pods: 8, SidecarArgs: []string{"--routing-stride", "16"}, ClientRetry: true, Policies: []PolicyResult{pol("kvroute", 3, 0.2)}})
	writeJSON(t, filepath.Join(dir, "dq", "s1", "clusters", "x", "results.json"), Report{Workload: "bogus"})
	// kvroute-requests of seed 2, run on its own: the same seed, not a fourth
	writeJSON(t, filepath.Join(dir, "req-dq-s2", "sweep.json"), []Report{
		{OfferedLoad: 22, Workload: "doc-qa", Pods: 4, Seed: 2, Policies: []PolicyResult{pol("kvroute-requests", 1, 0.9), pol("kvroute", 9, 0.9)}},
		{OfferedLoad: 12, Workload: "doc-qa", Pods: 4, Seed: 2, Policies: []PolicyResult{pol("kvroute-requests", 0.1, 0.8)}}})

	cells, err := ReadGrid([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cells {
		names = append(names, c.name())
	}
	want := []string{"conversation_trace.jsonl ×2", "conversation_trace.jsonl ×2 (--routing-stride 16)",
		"conversation_trace.jsonl ×2 (--routing-stride 16) [client retries]", "doc-qa", "doc-qa"}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("cells %q; want %q", names, want)
	}
	light, heavy := cells[3], cells[4]
	if light.Load != 12 || heavy.Load != 22 || len(light.Runs) != 3 || light.Level != 0 || heavy.Level != 1 {
		t.Errorf("doc-qa cells: loads %v and %v, %d seeds, levels %d and %d; want 12 and 22 (medians), 3 seeds, 0 and 1",
			light.Load, heavy.Load, len(light.Runs), light.Level, heavy.Level)
	}
	if r, ok := heavy.ratio("kvroute", "central-precise", ttftP90); !ok || r != 0.25 {
		t.Errorf("heavy p90 ratio %v, %v; want the median of 0.5, 0.25, 0.125: 0.25", r, ok)
	}
	if r, ok := heavy.ratio("kvroute", "kvroute-requests", ttftP90); !ok || r != 0.5 {
		t.Errorf("heavy p90 ratio to kvroute-requests %v, %v; want seed 2's 0.5 (its own run's kvroute ignored)", r, ok)
	}
	if _, ok := heavy.ratio("kvroute", "lmetric", ttftP90); ok {
		t.Errorf("a ratio to lmetric where it did not run")
	}
	if r, _ := light.ratio("kvroute", "central-precise", hitRate); math.Abs(r-0.8) > 1e-9 {
		t.Errorf("light hit ratio %v; want 0.8", r)
	}
	md := GridMarkdown(cells)
	for _, s := range []string{
		"| doc-qa | 4 | 22.0 | 3 | 0.500 | 0.25 | – |",
		"| doc-qa | 4 | 12.0 | 3 | 0.100 | 1.00 | 0.50 |",
		"| conversation_trace.jsonl ×2 | 8 | 7.0 | 2 | 3.000 | 0.75 |",
		"| 2 |\n", // the trace cell's failures: 1 of 10 central-precise requests in each seed
	} {
		if !strings.Contains(md, s) {
			t.Errorf("grid lacks %q:\n%s", s, md)
		}
	}
	if _, err := ReadGrid([]string{t.TempDir()}); err == nil {
		t.Errorf("an empty directory read as a grid")
	}
}
