package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/scale"
)

func noEnv(string) string { return "" }

func TestParseFlags(t *testing.T) {
	var out, errw bytes.Buffer
	o, err := parseFlags(nil, noEnv, &out, &errw)
	if err != nil {
		t.Fatalf("parseFlags(nil) = %v", err)
	}
	if !slices.Equal(o.Sizes, []int{16, 32, 64}) || o.Out != "out/scale" || o.Warmup != 120*time.Second || o.Requests != 240000 || o.RoutingStride != 4 ||
		o.Window != 20*time.Second || o.CapacityBlocks != 20000 || o.BlocksPerSecond != 200 || o.Repeats != 1 || o.Slow != 1 {
		t.Errorf("defaults = %+v", o)
	}
	env := map[string]string{"KVSCALE_SIZES": "8,9", "KVSCALE_WINDOW": "5s", "KVSCALE_SEED": "7", "KVSCALE_SLOW": "4"}
	o, err = parseFlags([]string{"--sizes", "4, 12", "--full-digest-interval", "2s", "--digest-interval", "250ms", "--out", "x",
		"--blocks-per-second", "50", "--capacity-blocks", "300", "--warmup", "1s"},
		func(k string) string { return env[k] }, &out, &errw)
	if err != nil {
		t.Fatalf("parseFlags = %v", err)
	}
	if !slices.Equal(o.Sizes, []int{4, 12}) || o.Window != 5*time.Second || o.Seed != 7 || o.Out != "x" ||
		o.FullDigestInterval != 2*time.Second || o.DigestInterval != 250*time.Millisecond || o.BlocksPerSecond != 50 || o.CapacityBlocks != 300 || o.Warmup != time.Second ||
		o.Slow != 4 {
		t.Errorf("flags over env = %+v; want the flag to win over its twin, the twin where no flag", o)
	}
	// A CPU tier's blocks fill after the GPU's: the default warm-up waits for both.
	o, err = parseFlags([]string{"--capacity-blocks", "4000", "--cpu-blocks", "16000", "--tier-stride", "8"}, noEnv, &out, &errw)
	if err != nil || o.CPUBlocks != 16000 || o.TierStride != 8 || o.Warmup != 120*time.Second {
		t.Errorf("tier flags: %v, %+v; want 16000 CPU blocks, stride 8, warm-up 120 s (1.15 x 20000 / 200 + 5)", err, o)
	}
	for _, bad := range [][]string{{"--sizes", "1"}, {"--sizes", "x"}, {"--sizes", ""}, {"--window", "0s"},
		{"--blocks-per-second", "0"}, {"--slow", "0.5"}, {"--slow", "NaN"}, {"--cpu-blocks", "-1"}, {"--tier-stride", "3"}, {"--routing-stride", "0"}, {"--digest-interval", "-1s"}, {"--capacity-blocks", "3", "--routing-stride", "4"}, {"extra"}, {"--no-such-flag"},
		{"--trace", "t.jsonl", "--trace-block-tokens", "100"}, {"--rebuild-removed", "-1"}, {"--trace", "t.jsonl", "--trace-block-tokens", "128", "--routing-stride", "16"}} {
		if _, err := parseFlags(bad, noEnv, &out, &errw); err == nil {
			t.Errorf("parseFlags(%q) = nil; want an error", bad)
		}
	}
	if _, err := parseFlags(nil, func(k string) string {
		return map[string]string{"KVSCALE_WINDOW": "soon"}[k]
	}, &out, &errw); err == nil || !strings.Contains(err.Error(), "KVSCALE_WINDOW") {
		t.Errorf("bad twin: %v; want an error naming KVSCALE_WINDOW", err)
	}
}

// TestTraceRequests reads a Mooncake trace as the runs replay it: at
// stride 4 each 512-token hash id is 8 routing keys' ids, requests that
// shared a block still share its keys, and --requests takes the first.
func TestTraceRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.jsonl")
	lines := `{"timestamp": 0, "input_length": 1000, "output_length": 9, "hash_ids": [0, 1]}
{"timestamp": 5, "input_length": 600, "output_length": 9, "hash_ids": [0, 2]}
{"timestamp": 9, "input_length": 0, "output_length": 9, "hash_ids": []}
{"timestamp": 9, "input_length": 512, "output_length": 9, "hash_ids": [3]}
`
	if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	o, err := parseFlags([]string{"--trace", path}, noEnv, &out, &errw)
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := requests(o)
	if err != nil || len(reqs) != 3 {
		t.Fatalf("requests = %d, %v; want the 3 lines with hash_ids", len(reqs), err)
	}
	a, b := reqs[0].HashIDs, reqs[1].HashIDs
	if len(a) != 16 || len(b) != 16 || !slices.Equal(a[:8], b[:8]) || a[8] == b[8] {
		t.Errorf("requests %v, %v; want 16 ids each, the first 8 (hash id 0) shared, then apart", a, b)
	}
	seen := map[uint64]bool{}
	for _, q := range reqs {
		for _, id := range q.HashIDs[len(q.HashIDs)-8:] {
			if seen[id] {
				t.Errorf("id %d twice: distinct hash ids must stay distinct", id)
			}
			seen[id] = true
		}
	}
	o, _ = parseFlags([]string{"--trace", path, "--requests", "1", "--routing-stride", "16"}, noEnv, &out, &errw)
	if reqs, err = requests(o); err != nil || len(reqs) != 1 || len(reqs[0].HashIDs) != 4 {
		t.Errorf("--requests 1 at stride 16 = %v, %v; want one request of 4 ids (512 tokens is 2 keys of 256)", reqs, err)
	}
	for _, bad := range []string{filepath.Join(t.TempDir(), "none.jsonl"), writeFile(t, "{\"hash_ids\": [1,"), writeFile(t, "{}\n")} {
		o.Trace = bad
		if _, err := requests(o); err == nil {
			t.Errorf("requests(--trace %s) = nil error; want one", bad)
		}
	}
}

// writeFile writes s to a new file and returns its path.
func writeFile(t *testing.T, s string) string {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}} {
		var out, errw bytes.Buffer
		if code := cmdMain(args, noEnv, &out, &errw); code != 0 || errw.Len() != 0 ||
			!strings.HasPrefix(out.String(), "Usage: kvscale [flags]") || !strings.Contains(out.String(), "-sizes") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", args, code, out.String(), errw.String())
		}
	}
	var out, errw bytes.Buffer
	if code := cmdMain([]string{"--version"}, noEnv, &out, &errw); code != 0 || !strings.HasPrefix(out.String(), "kvscale ") ||
		strings.Count(out.String(), "\n") != 1 {
		t.Errorf("--version: exit %d, stdout %q; want one line", code, out.String())
	}
	out.Reset()
	errw.Reset()
	if code := cmdMain([]string{"--no-such-flag"}, noEnv, &out, &errw); code != 2 || out.Len() != 0 ||
		!strings.Contains(errw.String(), "flag provided but not defined") {
		t.Errorf("--no-such-flag: exit %d, stdout %q, stderr %q; want 2 and the error on stderr", code, out.String(), errw.String())
	}
}

// results are three sizes whose measures grow exactly linearly.
func results() []scale.Result {
	var rs []scale.Result
	for _, n := range []int{16, 32, 64} {
		x := float64(n)
		rs = append(rs, scale.Result{N: n, StoredPerNodePerSec: 190,
			SentBytesPerNode: 1024 * (10 + 1*x), RecvBytesPerNode: 1024 * (10 + 1*x), // 20 + 2N KiB/s
			SocketBytesPerNode: 1024 * (30 + 2*x),
			SentByKind:         map[string]float64{"delta": 1024 * (10 + 1*x)}, RecvByKind: map[string]float64{"delta": 1024 * (10 + 1*x)},
			StoredP50Ms: 50, StoredP99Ms: 100 + x, // crosses 500 at 400
			EvictedP50Ms: 500, EvictedP99Ms: 2000, // flat, above 1000: fails everywhere
			ChoiceP50Us: 150, ChoiceP99Us: 300, // under load: not what is judged
			QuietChoiceP50Us: 5, QuietChoiceP99Us: 10, HeapPerNodeMiB: 3,
			JoinBytes: 1e4 * x, JoinSeconds: math.NaN(), // no data
			HitRate: 0.6 - 0.0005*x, CentralHitRate: 0.6})
	}
	return rs
}

func TestModel(t *testing.T) {
	m := model(results(), 200)
	if len(m) != len(measures) {
		t.Fatalf("model: %d verdicts; want %d", len(m), len(measures))
	}
	by := map[string]verdict{}
	for _, v := range m {
		by[v.Measure] = v
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	tr := by["traffic sent+received per node"]
	// 20 + 2N: 532 KiB/s at 256 passes, 2020 at 1000 fails; crosses 976.6 at 478.3.
	if !near(tr.Fit.A, 20) || !near(tr.Fit.B, 2) || tr.Pass || !tr.At[0].Pass || tr.At[1].Pass ||
		tr.Bound != "up to" || !near(tr.Envelope, (1e6/1024-20)/2) {
		t.Errorf("traffic verdict = %+v", tr)
	}
	st := by["stored block seen by every peer, p99"]
	if st.Pass || st.Bound != "up to" || !near(st.Envelope, 400) {
		t.Errorf("stored verdict = %+v; want FAIL (1100 ms at 1000), envelope 400", st)
	}
	if ev := by["evicted block gone from every peer, p99"]; ev.Pass || ev.Bound != "none" {
		t.Errorf("evicted verdict = %+v; want FAIL everywhere", ev)
	}
	if c := by["choice for a 32k-token prompt, p99, the load stopped"]; !c.Pass || c.Bound != "all" || c.Measured[0] != 10 {
		t.Errorf("choice verdict = %+v; want PASS at every N, on the choice with the load stopped (10 µs)", c)
	}
	if j := by["join: time to every peer's digest"]; j.Pass || j.Bound != "no data" || len(j.N) != 0 {
		t.Errorf("join time verdict = %+v; want no data", j)
	}
	// 1 - N/1200: 0.787 at 256 fails; crosses 0.95 at N = 60.
	if h := by["hit rate / central exact hit rate"]; h.Pass || h.Bound != "up to" || !near(h.Envelope, 60) || h.At[1].Judge {
		t.Errorf("hit ratio verdict = %+v; want FAIL at 256, envelope 60, not judged at 1000", h)
	}
	// A saturated run is shown but not fitted.
	sat := append(results(), scale.Result{N: 128, StoredPerNodePerSec: 40, StoredP99Ms: 1e6, CentralHitRate: 1})
	for _, v := range model(sat, 200) {
		if len(v.Excluded) != 1 || v.Excluded[0] != 128 || slices.Contains(v.N, 128) {
			t.Errorf("%s: fitted %v, excluded %v; want 128 excluded", v.Measure, v.N, v.Excluded)
		}
		if v.Measure == "stored block seen by every peer, p99" && !near(v.Envelope, 400) {
			t.Errorf("stored envelope with a saturated run = %v; want 400", v.Envelope)
		}
	}
	// A line that improves with N is held at the worst measured value.
	f := model([]scale.Result{{N: 16, HeapPerNodeMiB: 3, ChoiceP99Us: 300, CentralHitRate: 1, HitRate: 1},
		{N: 32, HeapPerNodeMiB: 2, ChoiceP99Us: 200, CentralHitRate: 1, HitRate: 1}}, 0)
	for _, v := range f {
		if v.Measure == "heap per sidecar" && (v.At[1].Value != 3 || v.At[1].Line >= 0 || !v.Flat || !v.Pass || v.Bound != "all") {
			t.Errorf("falling heap verdict = %+v; want 3 MiB at 1000, PASS", v)
		}
		if v.Measure == "choice for a 32k-token prompt, p99" && (v.At[0].Value != 300 || v.Pass || v.Bound != "none") {
			t.Errorf("falling choice verdict = %+v; want 300 µs at 256, FAIL everywhere", v)
		}
	}
}

func TestEnvelope(t *testing.T) {
	for _, tc := range []struct {
		f      scale.Fit
		target float64
		higher bool
		bound  string
		x      float64
	}{
		{scale.Fit{A: 0, B: 1}, 100, false, "up to", 100},
		{scale.Fit{A: 200, B: 1}, 100, false, "none", math.NaN()},
		{scale.Fit{A: 200, B: -1}, 100, false, "from", 100},
		{scale.Fit{A: 50, B: -1}, 100, false, "all", math.Inf(1)},
		{scale.Fit{A: 1, B: -0.001}, 0.95, true, "up to", 50},
		{scale.Fit{A: 5, B: 0}, 10, false, "all", math.Inf(1)},
		{scale.Fit{A: 5, B: 0}, 1, false, "none", math.NaN()},
	} {
		x, b := envelope(tc.f, tc.target, tc.higher)
		if b != tc.bound || !(math.Abs(x-tc.x) < 1e-9 || (math.IsNaN(x) && math.IsNaN(tc.x)) || x == tc.x) {
			t.Errorf("envelope(%+v, %v, %v) = %v %q; want %v %q", tc.f, tc.target, tc.higher, x, b, tc.x, tc.bound)
		}
	}
}

func TestMedianResult(t *testing.T) {
	rs := []scale.Result{
		{N: 16, StoredP99Ms: 300, Requests: 10, SentByKind: map[string]float64{"delta": 1}},
		{N: 16, StoredP99Ms: 100, Requests: 30, SentByKind: map[string]float64{"delta": 3}},
		{N: 16, StoredP99Ms: math.NaN(), Requests: 20, SentByKind: map[string]float64{"delta": 2, "digest": 4}},
	}
	m := medianResult(rs)
	if m.N != 16 || m.StoredP99Ms != 200 || m.Requests != 20 || m.SentByKind["delta"] != 2 || m.SentByKind["digest"] != 0 {
		t.Errorf("medianResult = %+v", m)
	}
}

// TestOutputs writes the report of given results: markdown with the table
// and the model, JSON without NaN, and the plot.
func TestOutputs(t *testing.T) {
	o, err := parseFlags(nil, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	rs := results()
	rs[1].InboxDrops, rs[1].OutboxDrops, rs[1].Gaps = 2, 7, 11
	rs[1].Requests, rs[1].WindowSeconds = 1600, 20 // 2.5 a node a second
	o.Slow = 8
	rep := report{Options: o, Results: rs, Runs: [][]scale.Result{rs[:1], rs[1:2], rs[2:]}, Model: model(rs, 200)}
	md := markdown(rep)
	for _, want := range []string{"| 16 | 52.0 | 62.0 | delta 52.0 |", "## Model", "FAIL", "PASS", "meets target up to N ≈ 478", "no data"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	dir := t.TempDir()
	if err := writeJSON(filepath.Join(dir, "results.json"), rep); err != nil {
		t.Fatalf("writeJSON = %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if len(doc["results_median"].([]any)) != 3 || len(doc["model"].([]any)) != len(measures) {
		t.Errorf("results.json = %s", b)
	}
	// --from reads back what the checks table and the header need.
	back, err := readReport(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatalf("readReport = %v", err)
	}
	if r := back.Results[1]; r.InboxDrops != 2 || r.OutboxDrops != 7 || r.Gaps != 11 || back.Options.Slow != 8 {
		t.Errorf("read back: drops %d in, %d out, %d gaps, slow %v; want 2, 7, 11, 8", r.InboxDrops, r.OutboxDrops, r.Gaps, back.Options.Slow)
	}
	if !strings.Contains(md, "slow motion ×8") || !strings.Contains(md, "| 32 | 0 (0) | 0 (0) | 190 | 1600 | 2.50 | 2 | 7 | 11 | 20.0 |") ||
		!strings.Contains(md, "requests from the synthetic trace") {
		t.Errorf("markdown lacks the slow motion or the checks row:\n%s", md)
	}
	png := filepath.Join(dir, "traffic.png")
	if err := plotTraffic(rs, rep.Model, 200, png); err != nil {
		t.Fatalf("plotTraffic = %v", err)
	}
	if st, err := os.Stat(png); err != nil || st.Size() < 1000 {
		t.Errorf("traffic.png: %v, %v", st, err)
	}
}
