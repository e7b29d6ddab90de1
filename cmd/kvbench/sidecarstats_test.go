package main

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/loadgen"
)

func TestParseSeries(t *testing.T) {
	tests := []struct {
		line string
		want series
		ok   bool
	}{
		{`kvroute_cached_tokens_total{api="messages",kind="predicted"} 1234`, series{"kvroute_cached_tokens_total",
			map[string]string{"api": "messages", "kind": "predicted"}, 1234}, true},
		{`kvroute_tokenize_duration_seconds_count 7 1700000000`, series{"kvroute_tokenize_duration_seconds_count", nil, 7}, true},
		{`x{a="b,c",d="e\"f"} 2.5e3`, series{"x", map[string]string{"a": "b,c", "d": `e"f`}, 2500}, true},
		{`# HELP x y`, series{}, false},
		{`x{a="b"`, series{}, false},
		{`x nan?`, series{}, false},
		{``, series{}, false},
	}
	for _, tt := range tests {
		got, ok := parseSeries(tt.line)
		if ok != tt.ok || ok && cmp.Diff(tt.want, got, cmp.AllowUnexported(series{})) != "" {
			t.Errorf("parseSeries(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseSeries(f *testing.F) {
	f.Add(`kvroute_cached_tokens_total{api="chat",kind="actual"} 3`)
	f.Add(`x{a="\\",b=""} -1`)
	f.Fuzz(func(t *testing.T, line string) {
		if s, ok := parseSeries(line); ok && s.name == "" && !strings.HasPrefix(line, "{") && !strings.HasPrefix(line, " ") {
			t.Errorf("parseSeries(%q) = %+v without a name", line, s)
		}
	})
}

// A series spec matches the lines with its labels whatever others they
// carry (the sidecars label by API now).
func TestSeriesMatches(t *testing.T) {
	s, _ := parseSeries(`kvroute_cached_tokens_total{api="responses",kind="predicted"} 5`)
	if !s.matches(`kvroute_cached_tokens_total{kind="predicted"}`) || s.matches(`kvroute_cached_tokens_total{kind="actual"}`) ||
		!s.matches(`kvroute_cached_tokens_total`) || s.matches(`kvroute_other{kind="predicted"}`) {
		t.Errorf("matches wrong for %+v", s)
	}
}

func TestCachedFill(t *testing.T) {
	res := loadgen.PolicyResult{ByAPI: map[string]loadgen.APIResult{"messages": {}, "responses": {}, loadgen.APIAll: {}}}
	cachedByAPI{"messages": {80, 100}, "responses": {10, 20}, "chat": {1, 1}}.fill(&res)
	got := map[string][2]float64{}
	for api, x := range res.ByAPI {
		if x.PredictedCached == nil || x.ActualCached == nil {
			t.Fatalf("%s: not filled", api)
		}
		got[api] = [2]float64{*x.PredictedCached, *x.ActualCached}
	}
	want := map[string][2]float64{"messages": {80, 100}, "responses": {10, 20}, loadgen.APIAll: {91, 121}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("fill (-want +got):\n%s", d)
	}
	one := loadgen.PolicyResult{}
	cachedByAPI{"": {1, 1}}.fill(&one)
	if one.ByAPI != nil {
		t.Error("fill made a per-API breakdown for a one-API workload")
	}
}

// agentic's simulators keep stored responses and serve render; nothing
// else changes another workload's.
func TestSimEnv(t *testing.T) {
	if got := simEnv("agentic"); len(got) != 2 || got[0] != "VLLM_ENABLE_RESPONSES_API_STORE=1" {
		t.Errorf("simEnv(agentic) = %v", got)
	}
	for _, w := range loadgen.Workloads {
		if w != "agentic" && simEnv(w) != nil {
			t.Errorf("simEnv(%s) = %v; want none", w, simEnv(w))
		}
	}
}

// Every agentic request fits one pod with room to spare, counting a
// generous token per three bytes of what it sends (the simulator's
// tokenizer makes one of each four-letter word, and JSON punctuation).
func TestAgenticSizing(t *testing.T) {
	o, err := parseFlags([]string{"--workload", "agentic"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := o.workloadConfig(o.Rate)
	s := loadgen.Agentic(c, rand.New(rand.NewPCG(1, 2)))
	worst := 0
	var walk func(x loadgen.Session, prefix int)
	walk = func(x loadgen.Session, prefix int) {
		n := prefix + len(x.System)
		for _, tl := range x.Tools {
			n += len(tl.Name) + len(tl.Description) + len(tl.Parameters)
		}
		for _, tu := range x.Turns {
			n += len(tu.User) + len(tu.Result) + 5*tu.MaxTokens + 64*3*len(tu.Images) + 1024 // the answer, images' placeholders, sub-agents' answers
			if tu.Call != nil {
				n += len(tu.Call.Arguments)
			}
			worst = max(worst, n/3)
			for _, sub := range tu.Spawn {
				walk(sub, n-len(x.System))
			}
		}
	}
	for _, x := range s.Sessions {
		walk(x, 0)
	}
	t.Logf("worst ~%d tokens, %d requests", worst, s.Requests())
	if limit := o.maxPromptTokens(256); worst > limit {
		t.Errorf("an agentic request may reach ~%d tokens; want at most %d", worst, limit)
	}
	if n := s.Requests(); n < 150 || n > 400 {
		t.Errorf("%d requests at the default rate and duration; want ~240 (a minute's run)", n)
	}
}

// The run's sidecar line says predicted against actual and leaves out the
// counters that did not move.
func TestSidecarLine(t *testing.T) {
	sum := make([]float64, len(sidecarSeries))
	sum[0], sum[1] = 90, 100
	if got, want := sidecarLine(sum), "kvbench: sidecars: predicted 90 of the 100 cached tokens vLLM reported (0.90)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	sum[2] = 7
	if got := sidecarLine(sum); !strings.HasSuffix(got, "; textprefix_requests_total{path=\"prefix\"}=7") {
		t.Errorf("a moved counter: %q", got)
	}
}

func TestScrapeTiers(t *testing.T) {
	page := `# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 200
vllm_sim:cpu_cache_blocks{engine="0",model_name="m"} 7
`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, page) }))
	defer srv.Close()
	var log strings.Builder
	got := scrapeTiers(context.Background(), []string{srv.URL, srv.URL, "http://127.0.0.1:1"}, &log)
	want := loadgen.TierSplit{GPUHitRate: 0.3, CPUHitRate: 0.2, CPUBlocks: 14}
	if *got != want {
		t.Errorf("scrapeTiers = %+v; want %+v", *got, want)
	}
	if !strings.Contains(log.String(), "127.0.0.1:1") {
		t.Errorf("the pod that did not answer is not reported: %q", log.String())
	}
}

// The sidecars' cost is the mean and max over the pods that answered, and
// the bytes sent a pod per second of the cluster's life.
func TestSidecarCost(t *testing.T) {
	var c costSum
	if c.result(time.Minute) != nil {
		t.Error("no pod answered, yet a cost")
	}
	for _, text := range []string{
		"process_resident_memory_bytes 3.3554432e+07\ngo_memstats_heap_inuse_bytes 1.048576e+07\nkvroute_gossip_sent_bytes_total 61440\n",
		"process_resident_memory_bytes 6.7108864e+07\ngo_memstats_heap_inuse_bytes 3.145728e+07\nkvroute_gossip_sent_bytes_total 184320\nkvroute_gossip_received_bytes_total 9e9\n",
	} {
		var p podCost
		for _, line := range strings.Split(text, "\n") {
			if s, ok := parseSeries(line); ok {
				p.read(s)
			}
		}
		c.add(p)
	}
	got := c.result(2 * time.Minute)
	want := loadgen.SidecarCost{RSSMeanMiB: 48, RSSMaxMiB: 64, HeapMeanMiB: 20, SentKiBPerSec: 1, Pods: 2, ClusterSeconds: 120}
	if got == nil || *got != want {
		t.Errorf("cost %+v; want %+v", got, want)
	}
}
