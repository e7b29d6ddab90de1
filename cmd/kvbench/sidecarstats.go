package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/loadgen"
)

// sidecarSeries are the sidecar counters a run reports, summed over pods:
// predicted against actual cached tokens, and how chat prompts were keyed.
var sidecarSeries = []string{
	`kvroute_cached_tokens_total{kind="predicted"}`,
	`kvroute_cached_tokens_total{kind="actual"}`,
	`kvroute_textprefix_requests_total{path="prefix"}`,
	`kvroute_textprefix_requests_total{path="tokenized"}`,
	`kvroute_textprefix_requests_total{path="untokenized"}`,
	`kvroute_textprefix_checks_total{result="right"}`,
	`kvroute_textprefix_checks_total{result="wrong"}`,
	`kvroute_textprefix_guesses_total{result="right"}`,
	`kvroute_textprefix_guesses_total{result="wrong"}`,
	`kvroute_textprefix_guesses_total{result="unchecked"}`,
	`kvroute_textprefix_compose_checks_total{result="right"}`,
	`kvroute_textprefix_compose_checks_total{result="wrong"}`,
	`kvroute_textprefix_learned_total{result="request"}`,
	`kvroute_textprefix_learned_total{result="answer"}`,
	`kvroute_textprefix_learned_total{result="composed"}`,
	`kvroute_textprefix_learned_total{result="stored"}`,
	`kvroute_textprefix_learned_total{result="shared"}`,
	`kvroute_textprefix_learned_total{result="dropped"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="request"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="learn"}`,
	`kvroute_textprefix_tokenize_duration_seconds_count{path="verify"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="request"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="learn"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="compose"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="lead"}`,
	`kvroute_textprefix_tokenized_tokens_total{path="verify"}`,
	`kvroute_tokenize_duration_seconds_count`,
}

// series is one line of the Prometheus text format.
type series struct {
	name   string
	labels map[string]string
	value  float64
}

// parseSeries reads a sample line `name{k="v",...} value [timestamp]`;
// ok is false for comments, blank lines and anything it cannot read.
func parseSeries(line string) (series, bool) {
	if line == "" || line[0] == '#' {
		return series{}, false
	}
	var s series
	rest := line
	if i := strings.IndexAny(line, "{ "); i < 0 {
		return series{}, false
	} else if line[i] == '{' {
		s.name = line[:i]
		j := strings.IndexByte(line[i:], '}')
		if j < 0 {
			return series{}, false
		}
		s.labels = map[string]string{}
		for _, kv := range splitLabels(line[i+1 : i+j]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return series{}, false
			}
			uq, err := strconv.Unquote(v)
			if err != nil {
				return series{}, false
			}
			s.labels[k] = uq
		}
		rest = line[i+j+1:]
	} else {
		s.name, rest = line[:i], line[i:]
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return series{}, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return series{}, false
	}
	s.value = v
	return s, true
}

// splitLabels splits `k="v",k2="v2"` at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// matches reports whether s is the series spec names: spec's metric name
// and every label it sets; labels it does not set (an api label, say) are
// summed over.
func (s series) matches(spec string) bool {
	want, ok := parseSeries(spec + " 0")
	if !ok || want.name != s.name {
		return false
	}
	for k, v := range want.labels {
		if s.labels[k] != v {
			return false
		}
	}
	return true
}

// cachedByAPI is the sidecars' predicted and actual cached tokens summed
// per api label ("" for series without one).
type cachedByAPI map[string]*[2]float64

// reportSidecars prints sidecarSeries summed over c's sidecars (best
// effort: a pod that does not answer is left out and said so), and what
// they cost over the cluster's life of span; it returns the predicted and
// actual cached tokens per API and the cost (nil when no pod answered).
func reportSidecars(ctx context.Context, c *chaos.Cluster, span time.Duration, w io.Writer) (cachedByAPI, *loadgen.SidecarCost) {
	sum := make([]float64, len(sidecarSeries))
	cached := cachedByAPI{}
	var cost costSum
	for _, p := range c.Pods() {
		var pod podCost
		ok := scrape(ctx, "http://"+p.Admin+"/metrics", p.Name+" metrics", w, func(s series) {
			for i, spec := range sidecarSeries {
				if s.matches(spec) {
					sum[i] += s.value
				}
			}
			pod.read(s)
			if s.name == "kvroute_cached_tokens_total" {
				kind := map[string]int{"predicted": 0, "actual": 1}
				if k, ok := kind[s.labels["kind"]]; ok {
					a := cached[s.labels["api"]]
					if a == nil {
						a = new([2]float64)
						cached[s.labels["api"]] = a
					}
					a[k] += s.value
				}
			}
		})
		if ok {
			cost.add(pod)
		}
	}
	fmt.Fprintln(w, sidecarLine(sum))
	res := cost.result(span)
	if res != nil {
		fmt.Fprintf(w, "kvbench: sidecars: RSS %.1f MiB a pod (max %.1f), heap in use %.1f MiB, digest exchange %.2f KiB/s sent a pod over %.0f s\n",
			res.RSSMeanMiB, res.RSSMaxMiB, res.HeapMeanMiB, res.SentKiBPerSec, res.ClusterSeconds)
	}
	return cached, res
}

// podCost is one sidecar's cost series.
type podCost struct{ rss, heap, sent float64 }

func (p *podCost) read(s series) {
	switch s.name {
	case "process_resident_memory_bytes":
		p.rss = s.value
	case "go_memstats_heap_inuse_bytes":
		p.heap = s.value
	case "kvroute_gossip_sent_bytes_total":
		p.sent = s.value
	}
}

// costSum adds up podCosts.
type costSum struct {
	n                     int
	rss, rssMax, heap, tx float64
}

func (c *costSum) add(p podCost) {
	c.n++
	c.rss, c.heap, c.tx = c.rss+p.rss, c.heap+p.heap, c.tx+p.sent
	c.rssMax = max(c.rssMax, p.rss)
}

func (c costSum) result(span time.Duration) *loadgen.SidecarCost {
	if c.n == 0 || span <= 0 {
		return nil
	}
	const mib = 1 << 20
	n := float64(c.n)
	return &loadgen.SidecarCost{RSSMeanMiB: c.rss / n / mib, RSSMaxMiB: c.rssMax / mib, HeapMeanMiB: c.heap / n / mib,
		SentKiBPerSec: c.tx / n / 1024 / span.Seconds(), Pods: c.n, ClusterSeconds: span.Seconds()}
}

// sidecarLine is the one line a run prints of the sidecars' counters:
// predicted against actual cached tokens, then only the counters that
// moved (a workload without chats learns no text prefixes, and a line of
// zeros reads as a fault).
func sidecarLine(sum []float64) string {
	var b strings.Builder
	predicted, actual := sum[0], sum[1]
	fmt.Fprintf(&b, "kvbench: sidecars: predicted %.0f of the %.0f cached tokens vLLM reported", predicted, actual)
	if actual > 0 {
		fmt.Fprintf(&b, " (%.2f)", predicted/actual)
	}
	var moved []string
	for i, name := range sidecarSeries[2:] {
		if v := sum[i+2]; v != 0 {
			moved = append(moved, fmt.Sprintf("%s=%.0f", strings.TrimPrefix(name, "kvroute_"), v))
		}
	}
	if len(moved) > 0 {
		b.WriteString("; " + strings.Join(moved, " "))
	}
	return b.String()
}

// fill puts the sidecars' cached tokens into res's per-API figures: each
// API's own, and the sum over every API in the overall row.
func (c cachedByAPI) fill(res *loadgen.PolicyResult) {
	if res.ByAPI == nil || len(c) == 0 {
		return
	}
	var all [2]float64
	for api, v := range c {
		all[0] += v[0]
		all[1] += v[1]
		if x, ok := res.ByAPI[api]; ok && api != loadgen.APIAll {
			x.PredictedCached, x.ActualCached = &v[0], &v[1]
			res.ByAPI[api] = x
		}
	}
	x := res.ByAPI[loadgen.APIAll]
	x.PredictedCached, x.ActualCached = &all[0], &all[1]
	res.ByAPI[loadgen.APIAll] = x
}

// scrapeTiers sums the prefix-cache counters of the simulators at sims
// (their base URLs; best effort: one that does not answer is left out and
// said so) into the GPU/CPU split of the run's hits.
func scrapeTiers(ctx context.Context, sims []string, w io.Writer) *loadgen.TierSplit {
	var queries, gpu, cpu, blocks float64
	for _, u := range sims {
		scrape(ctx, u+"/metrics", u+" engine metrics", w, func(s series) {
			switch s.name {
			case "vllm:prefix_cache_queries_total":
				queries += s.value
			case "vllm:prefix_cache_hits_total":
				gpu += s.value
			case "vllm:external_prefix_cache_hits_total":
				cpu += s.value
			case "vllm_sim:cpu_cache_blocks":
				blocks += s.value
			}
		})
	}
	t := &loadgen.TierSplit{CPUBlocks: int(blocks)}
	if queries > 0 {
		t.GPUHitRate, t.CPUHitRate = gpu/queries, cpu/queries
	}
	return t
}

// scrape calls f with every sample of the Prometheus text at url and
// reports whether it read it; a failed request is reported to w, named
// what, and skipped.
func scrape(ctx context.Context, url, what string, w io.Writer, f func(series)) bool {
	hc := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		fmt.Fprintf(w, "kvbench: %s: %v\n", what, err)
		return false
	}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintf(w, "kvbench: %s: %v\n", what, err)
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if s, ok := parseSeries(sc.Text()); ok {
			f(s)
		}
	}
	return sc.Err() == nil
}
