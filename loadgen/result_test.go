package loadgen

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPercentile(t *testing.T) {
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		in   []float64
		p    float64
		want float64
	}{
		{nil, 50, 0},
		{[]float64{4}, 99, 4},
		{ten, 50, 5},
		{ten, 90, 9},
		{ten, 99, 10},
		{ten, 100, 10},
		{ten, 1, 1},
		{[]float64{1, 2}, 50, 1},
	}
	for _, tt := range tests {
		if got := Percentile(tt.in, tt.p); got != tt.want {
			t.Errorf("Percentile(%v, %v) = %v; want %v", tt.in, tt.p, got, tt.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	ok := func(pod string, prompt, cached, out int, ttft, e2e float64, sent time.Duration) Sample {
		return Sample{Pod: pod, PromptTokens: prompt, CachedTokens: cached, OutputTokens: out,
			TTFT: ttft, E2E: e2e, Sim: true, Sent: sent, WallE2E: time.Second, WallTTFT: 100 * time.Millisecond}
	}
	samples := []Sample{
		ok("p0", 1000, 800, 10, 0.1, 1.0, 0),
		ok("p0", 1000, 0, 10, 0.4, 2.0, time.Second),
		ok("p1", 2000, 1000, 20, 0.2, 1.5, 2*time.Second),
		ok("p0", 0, 0, 0, 0.3, 3.0, 3*time.Second),
		{Pod: "p1", Err: "status 500", Sent: 9 * time.Second, PromptTokens: 5000},
	}
	got := Summarize("kvroute", samples, []string{"p0", "p1", "p2", "p3"}, 1)
	want := PolicyResult{
		Name: "kvroute", Requests: 5, SuccessRate: 0.8,
		HitRate: 1800.0 / 4000.0,
		TTFTP50: 0.2, TTFTP90: 0.4, TTFTP99: 0.4,
		E2EP50: 1.5, E2EP99: 3.0,
		// 40 output tokens from the first send (0 s) to the last success's
		// end (3 s + 1 s).
		OutputTokS: 40.0 / 4.0,
		// 3 requests on p0 against a mean of 4/4 = 1.
		MaxMeanLoad: 3,
		PerPod:      map[string]int{"p0": 3, "p1": 1, "p2": 0, "p3": 0},
		WallTTFTP90: 0.1,
		TTFTs:       []float64{0.1, 0.2, 0.3, 0.4},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Summarize (-want +got):\n%s", d)
	}
	if got := Summarize("x", samples, nil, 2).OutputTokS; got != 5 {
		t.Errorf("time scale 2: out tok/s %v; want 5", got)
	}
	empty := Summarize("none", nil, []string{"a"}, 1)
	if empty.Requests != 0 || empty.SuccessRate != 0 || empty.MaxMeanLoad != 0 || math.IsNaN(empty.HitRate) {
		t.Errorf("empty summary %+v", empty)
	}
	if _, err := json.Marshal(empty); err != nil {
		t.Errorf("empty summary does not marshal: %v", err)
	}
}

// TestReportJSONShape pins the published field names exactly.
func TestReportJSONShape(t *testing.T) {
	r := Report{Workload: "shared-prefix", Pods: 4, Policies: []PolicyResult{
		Summarize("service", []Sample{{Pod: "a", PromptTokens: 10, CachedTokens: 5}}, []string{"a"}, 1),
	}}
	var buf bytes.Buffer
	if err := WriteJSON(&buf, r); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(doc), []string{"pods", "policies", "workload"}; !slices.Equal(got, want) {
		t.Errorf("top-level keys %v; want %v", got, want)
	}
	pol := doc["policies"].([]any)[0].(map[string]any)
	want := []string{"e2e_p50_s", "e2e_p99_s", "hit_rate", "max_mean_load", "name", "output_tok_s", "requests",
		"success_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s"}
	if got := keys(pol); !slices.Equal(got, want) {
		t.Errorf("policy keys %v; want %v", got, want)
	}
	if pol["name"] != "service" || pol["hit_rate"] != 0.5 || doc["pods"] != 4.0 || doc["workload"] != "shared-prefix" {
		t.Errorf("values: %s", buf.String())
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// With sessions naming models, the hit rate is also given per model,
// token-weighted like the total; failures do not count.
func TestSummarizeByModel(t *testing.T) {
	samples := []Sample{
		{Model: "", PromptTokens: 1000, CachedTokens: 900},
		{Model: "lora-a", PromptTokens: 1000, CachedTokens: 200},
		{Model: "lora-a", PromptTokens: 3000, CachedTokens: 1800},
		{Model: "lora-b", Err: "status 404", PromptTokens: 5000},
	}
	got := Summarize("kvroute", samples, nil, 1).HitByModel
	want := map[string]float64{"base": 0.9, "lora-a": 0.5}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("HitByModel (-want +got):\n%s", d)
	}
	if got := Summarize("x", samples[:1], nil, 1).HitByModel; got != nil {
		t.Errorf("no session names a model: HitByModel = %v; want nil", got)
	}
	if got := Summarize("x", samples, nil, 1).Decisions; got != nil {
		t.Errorf("no router named its reason: Decisions = %v; want nil", got)
	}
	md := Markdown(Report{Policies: []PolicyResult{{Name: "service"}, {Name: "kvroute", HitByModel: want}}})
	if !strings.Contains(md, "\n\nkvroute hit rate by model: base=90.0% lora-a=50.0%") {
		t.Errorf("Markdown lacks the per-model line:\n%s", md)
	}
}

func TestMarkdown(t *testing.T) {
	r := Report{Workload: "w", Pods: 2, Policies: []PolicyResult{
		{Name: "service", Requests: 10, SuccessRate: 1, HitRate: 0.25, TTFTP90: 1.5, PerPod: map[string]int{"b": 4, "a": 6}},
		{Name: "kvroute", Requests: 10, SuccessRate: 0.9, HitRate: 0.75},
	}}
	md := Markdown(r)
	for _, want := range []string{"| service | 10 | 100.0% | 25.0% |", "| kvroute | 10 | 90.0% | 75.0% |",
		"service requests per pod: a=6 b=4", "workload w, 2 pods"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
}

func TestMarkdownTiers(t *testing.T) {
	r := Report{Workload: "w", Pods: 2, Policies: []PolicyResult{{Name: "service", Requests: 1, SuccessRate: 1}}}
	if md := Markdown(r); strings.Contains(md, "hits by tier") {
		t.Errorf("a run without tiers shows a tier table:\n%s", md)
	}
	r.Policies = append(r.Policies, PolicyResult{Name: "kvroute", Tiers: &TierSplit{GPUHitRate: 0.5, CPUHitRate: 0.25, CPUBlocks: 7}})
	md := Markdown(r)
	if !strings.Contains(md, "| kvroute | 50.0% | 25.0% | 75.0% | 7 |") || strings.Contains(md, "| service | 0.0%") {
		t.Errorf("tier table:\n%s", md)
	}
}

func TestMarkdownSidecarCost(t *testing.T) {
	r := Report{Workload: "w", Pods: 2, Policies: []PolicyResult{{Name: "service", Requests: 1, SuccessRate: 1}}}
	if md := Markdown(r); strings.Contains(md, "sidecar cost") {
		t.Errorf("a run without sidecars shows their cost:\n%s", md)
	}
	r.Policies = append(r.Policies, PolicyResult{Name: "kvroute", Sidecars: &SidecarCost{RSSMeanMiB: 31.25, RSSMaxMiB: 40, HeapMeanMiB: 12.5, SentKiBPerSec: 3.125}})
	if md := Markdown(r); !strings.Contains(md, "| kvroute | 31.2 | 40.0 | 12.5 | 3.12 |") || strings.Contains(md, "| service | 0.0") {
		t.Errorf("cost table:\n%s", md)
	}
}

func TestPlots(t *testing.T) {
	dir := t.TempDir()
	res := []PolicyResult{
		{Name: "service", TTFTs: []float64{0.1, 0.5, 0.9}, HitRate: 0.2, TTFTP90: 0.9},
		{Name: "kvroute", TTFTs: []float64{0.05, 0.1, 0.2}, HitRate: 0.7, TTFTP90: 0.2},
	}
	cdf := filepath.Join(dir, "cdf.png")
	if err := PlotCDF(cdf, "t", res); err != nil {
		t.Fatal(err)
	}
	paths, err := PlotSweep(dir, "t", []SweepPoint{{Rate: 1, Policies: res}, {Rate: 2, Policies: res}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range append(paths, cdf) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG")) || len(b) < 1000 {
			t.Errorf("%s: not a PNG (%d bytes)", p, len(b))
		}
	}
	if len(paths) != 2 {
		t.Errorf("PlotSweep wrote %v; want 2 files", paths)
	}
}

// A workload that mixes APIs gets per-API figures and an overall row; one
// that does not keeps its output as it was.
func TestSummarizeByAPI(t *testing.T) {
	ok := func(api string, prompt, cached int, ttft float64) Sample {
		return Sample{API: api, PromptTokens: prompt, CachedTokens: cached, TTFT: ttft, Pod: "p1"}
	}
	samples := []Sample{
		ok("messages", 100, 50, 0.1), ok("messages", 100, 100, 0.3),
		ok("responses", 200, 0, 0.2), {API: "responses", Err: "status 404", Continued: true},
		{API: "responses", Continued: true, PromptTokens: 100, CachedTokens: 100, TTFT: 0.4, Pod: "p1"},
	}
	res := Summarize("x", samples, []string{"p1"}, 1)
	want := map[string]APIResult{
		"messages":  {Requests: 2, HitRate: 0.75, TTFTP90: 0.3},
		"responses": {Requests: 3, Failures: 1, HitRate: 100.0 / 300, TTFTP90: 0.4, Continued: 2, ContinuedFailures: 1},
		APIAll:      {Requests: 5, Failures: 1, HitRate: 250.0 / 500, TTFTP90: 0.4, Continued: 2, ContinuedFailures: 1},
	}
	if d := cmp.Diff(want, res.ByAPI); d != "" {
		t.Errorf("ByAPI (-want +got):\n%s", d)
	}
	p, a := 90.0, 100.0
	x := res.ByAPI["messages"]
	x.PredictedCached, x.ActualCached = &p, &a
	res.ByAPI["messages"] = x
	md := Markdown(Report{Workload: "agentic", Pods: 1, Policies: []PolicyResult{res}})
	for _, row := range []string{"| x | messages | 2 | 0 | 75.0% | 0.300 | - | 0.90 (90 / 100) |",
		"| x | responses | 3 | 1 | 33.3% | 0.400 | 1/2 | - |", "| x | all | 5 | 1 | 50.0% | 0.400 | 1/2 | - |"} {
		if !strings.Contains(md, row) {
			t.Errorf("Markdown lacks %q:\n%s", row, md)
		}
	}
	one := Summarize("y", samples[:2], nil, 1)
	if one.ByAPI != nil || strings.Contains(Markdown(Report{Policies: []PolicyResult{one}}), "by API") {
		t.Errorf("one API: ByAPI %v; want none and no per-API table", one.ByAPI)
	}
}

// Only requests that repeat a prefix count: later turns, and a group's
// sessions after its first in the schedule's order (not completion order).
func TestRepeatTTFT(t *testing.T) {
	samples := []Sample{
		{Session: "d1-1", Group: "d1", Scheduled: 2, TTFT: 0.2},
		{Session: "d1-0", Group: "d1", Scheduled: 1, TTFT: 9}, // the first of d1: out
		{Session: "conv-0", Turn: 0, Scheduled: 0, TTFT: 8},   // a first turn: out
		{Session: "conv-0", Turn: 1, Scheduled: 3, TTFT: 0.1},
		{Session: "d2-2", Group: "d2", Scheduled: 4, TTFT: 7}, // alone: out
		{Session: "d1-3", Group: "d1", Scheduled: 5, TTFT: 5, Err: "x"},
	}
	if got := repeatTTFTs(samples); !slices.Equal(got, []float64{0.1, 0.2}) {
		t.Errorf("repeatTTFTs = %v; want [0.1 0.2]", got)
	}
}

// A 429 is a failure and counts as refused; another error status does not.
func TestSummarizeRefused(t *testing.T) {
	samples := []Sample{
		{Pod: "p0", PromptTokens: 10, TTFT: 0.1, E2E: 0.2, Sim: true},
		{Err: "status 429", Status: http.StatusTooManyRequests},
		{Err: "status 429", Status: http.StatusTooManyRequests},
		{Err: "status 502", Status: http.StatusBadGateway},
	}
	got := Summarize("kvroute", samples, []string{"p0"}, 1)
	if got.Refused != 2 || got.SuccessRate != 0.25 {
		t.Errorf("refused %d, success rate %v; want 2 and 0.25", got.Refused, got.SuccessRate)
	}
}

// TestSummarizeDecisions: the router's reasons are counted over every
// answered request, a refused one too, and listed per policy.
func TestSummarizeDecisions(t *testing.T) {
	samples := []Sample{
		{Decision: "affinity"}, {Decision: "affinity"}, {Decision: "rendezvous"},
		{Decision: "rendezvous-full", Err: "status 429", Status: 429},
		{}, // a router that names no reason
	}
	got := Summarize("kvroute", samples, nil, 1).Decisions
	want := map[string]int{"affinity": 2, "rendezvous": 1, "rendezvous-full": 1}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Decisions (-want +got):\n%s", d)
	}
	md := Markdown(Report{Policies: []PolicyResult{{Name: "service"}, {Name: "kvroute", Decisions: want}}})
	if !strings.Contains(md, "\n\nkvroute decisions: affinity=2 rendezvous=1 rendezvous-full=1\n") {
		t.Errorf("Markdown lacks the decisions line:\n%s", md)
	}
}
