package loadgen

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// PolicyResult is one policy's figures. The JSON fields are the benchmark's
// published shape; times are seconds, simulated when the server reports
// them.
type PolicyResult struct {
	Name        string  `json:"name"`
	Requests    int     `json:"requests"`
	SuccessRate float64 `json:"success_rate"`
	// Refused counts the failed requests that were answered 429: a
	// router's admission refusing under overload, with Retry-After, which
	// an SDK client retries (loadgen.SDKRetry), where a central router
	// queues them instead. They are among the failures (1 − SuccessRate).
	Refused int `json:"refused,omitempty"`
	// HitRate is token-weighted: Σ cached_tokens / Σ prompt_tokens over
	// successful requests.
	HitRate     float64 `json:"hit_rate"`
	TTFTP50     float64 `json:"ttft_p50_s"`
	TTFTP90     float64 `json:"ttft_p90_s"`
	TTFTP99     float64 `json:"ttft_p99_s"`
	E2EP50      float64 `json:"e2e_p50_s"`
	E2EP99      float64 `json:"e2e_p99_s"`
	OutputTokS  float64 `json:"output_tok_s"`
	MaxMeanLoad float64 `json:"max_mean_load"`
	// SimClock is how fast the simulators' clocks kept up with the wall
	// clock; nil without simulated timings.
	SimClock *SimClock `json:"sim_clock,omitempty"`
	// RepeatTTFTP90 is the TTFT p90 of the successful requests that repeat
	// a prefix: a later turn, or a session of a Group scheduled before.
	// The first request of each prefix is a miss whatever the routing;
	// when those are more than a tenth of the requests, TTFTP90 is theirs.
	RepeatTTFTP90 float64 `json:"repeat_ttft_p90_s,omitempty"`
	// HitByModel is HitRate per model ("base" for the default), for a
	// workload whose sessions name models (multi-lora); nil otherwise.
	HitByModel map[string]float64 `json:"hit_rate_by_model,omitempty"`
	// ByAPI holds the figures per request shape (Sample.API) and, under
	// APIAll, over all requests, for a workload whose requests speak more
	// than one API (agentic); nil otherwise.
	ByAPI map[string]APIResult `json:"by_api,omitempty"`
	// Tiers splits the hits between the GPU and the CPU offload tier, from
	// the engines' counters, for a run whose pods offload; nil otherwise.
	Tiers *TierSplit `json:"tiers,omitempty"`
	// Sidecars is what the sidecars cost, scraped at the end of the run,
	// for a policy that runs them; nil otherwise.
	Sidecars *SidecarCost `json:"sidecars,omitempty"`
	// Decisions counts the answered requests by the router's reason
	// (DecisionHeader: "affinity", "rendezvous", "rendezvous-full", ...),
	// for a router that names it; nil otherwise. It shows which rule
	// placed the requests where hit rates or balance differ.
	Decisions map[string]int `json:"decisions,omitempty"`

	// Not published in the JSON:

	// PerPod counts requests served per pod (every known pod listed).
	PerPod map[string]int `json:"-"`
	// WallTTFTP90 is the client-measured TTFT p90 in seconds.
	WallTTFTP90 float64 `json:"-"`
	// TTFTs are the successful requests' TTFTs, sorted (for CDF plots).
	TTFTs []float64 `json:"-"`
}

// TierSplit is where the engines found the tokens they did not compute,
// summed over pods from vLLM's counters: prefix_cache_hits (the GPU) and
// external_prefix_cache_hits (loaded from the CPU tier), each over
// prefix_cache_queries, every prompt token the engines scheduled (failed
// and preempted requests included, so GPU+CPU may differ from HitRate by
// a little).
type TierSplit struct {
	GPUHitRate float64 `json:"gpu_hit_rate"`
	CPUHitRate float64 `json:"cpu_hit_rate"`
	// CPUBlocks is the blocks the CPU tiers hold at the end of the run
	// (the simulator's gauge), summed over pods.
	CPUBlocks int `json:"cpu_blocks"`
}

// SidecarCost is what a run's sidecars cost, from their own metrics at
// its end: resident memory (process_resident_memory_bytes) and Go heap in
// use (go_memstats_heap_inuse_bytes), mean and max over pods, and the
// upkeep, the digest exchange's bytes each sidecar sent
// (kvroute_gossip_sent_bytes_total) over the cluster's life, per second
// (memberlist's own traffic not counted).
type SidecarCost struct {
	RSSMeanMiB     float64 `json:"rss_mean_mib"`
	RSSMaxMiB      float64 `json:"rss_max_mib"`
	HeapMeanMiB    float64 `json:"heap_inuse_mean_mib"`
	SentKiBPerSec  float64 `json:"gossip_sent_kib_per_pod_per_second"`
	Pods           int     `json:"pods"`
	ClusterSeconds float64 `json:"cluster_seconds"`
}

// APIAll is the ByAPI key of the figures over every API.
const APIAll = "all"

// APIResult is one API's figures within a policy's run.
type APIResult struct {
	Requests int `json:"requests"`
	// Failures counts requests that got no answer: an error status
	// (a stored response's follow-up on a pod without it is a 404), a
	// broken stream, a timeout.
	Failures int `json:"failures"`
	// HitRate is token-weighted over successful requests, as
	// PolicyResult.HitRate.
	HitRate float64 `json:"hit_rate"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	// Continued counts the requests that named a stored response
	// (previous_response_id), ContinuedFailures those of them that failed.
	Continued         int `json:"continued,omitempty"`
	ContinuedFailures int `json:"continued_failures,omitempty"`
	// PredictedCached and ActualCached are the kvroute sidecars' cached
	// tokens for the API: what the routing choices expected at their
	// targets and what vLLM reported (kvroute_cached_tokens_total); nil
	// where no sidecar reports them.
	PredictedCached *float64 `json:"predicted_cached_tokens,omitempty"`
	ActualCached    *float64 `json:"actual_cached_tokens,omitempty"`
}

// Report is the benchmark's JSON document: one offered load's results.
type Report struct {
	// OfferedLoad is the requests a second offered (a trace's, at its
	// time scale); 0 in files written before it was recorded.
	OfferedLoad float64 `json:"offered_load,omitempty"`
	Workload    string  `json:"workload"`
	// Trace is the replayed trace's file name, TimeScale its compression;
	// both unset for a synthetic workload.
	Trace     string  `json:"trace,omitempty"`
	TimeScale float64 `json:"time_scale,omitempty"`
	Pods      int     `json:"pods"`
	// Seed is the run's --seed; 0 in files written before it was recorded.
	Seed uint64 `json:"seed,omitempty"`
	// SidecarArgs are the flags added to every kvroute sidecar.
	SidecarArgs []string `json:"sidecar_args,omitempty"`
	// ClientRetry says the clients retried as the OpenAI SDKs do
	// (SDKRetry): a refusal or a 5xx counts as a failure only when its
	// retries failed too, and times span every attempt.
	ClientRetry bool           `json:"client_retry,omitempty"`
	Policies    []PolicyResult `json:"policies"`
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted
// values; 0 for none.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Summarize computes a policy's figures from its samples. pods lists every
// pod of the cluster, so that an idle pod counts in the load balance;
// pods seen only in samples are added. timeScale is simulated seconds per
// wall second (the simulator's --sim-time-scale; <= 0 means 1): output
// tokens per second are over the run's wall span, from the first send to the
// last answer, converted to simulated time.
func Summarize(name string, samples []Sample, pods []string, timeScale float64) PolicyResult {
	if timeScale <= 0 {
		timeScale = 1
	}
	res := PolicyResult{Name: name, Requests: len(samples), PerPod: make(map[string]int)}
	for _, p := range pods {
		res.PerPod[p] = 0
	}
	var ttft, e2e, wall []float64
	var prompt, cached, out int
	type tokens struct{ prompt, cached int }
	byModel := map[string]tokens{}
	named := false
	var first, last time.Duration = math.MaxInt64, 0
	for _, s := range samples {
		first = min(first, s.Sent)
		if s.Decision != "" {
			if res.Decisions == nil {
				res.Decisions = map[string]int{}
			}
			res.Decisions[s.Decision]++
		}
		if !s.OK() {
			if s.Status == http.StatusTooManyRequests {
				res.Refused++
			}
			continue
		}
		last = max(last, s.Sent+s.WallE2E)
		ttft = append(ttft, s.TTFT)
		e2e = append(e2e, s.E2E)
		wall = append(wall, s.WallTTFT.Seconds())
		prompt += s.PromptTokens
		cached += s.CachedTokens
		out += s.OutputTokens
		m := s.Model
		if m == "" {
			m = "base"
		} else {
			named = true
		}
		t := byModel[m]
		t.prompt, t.cached = t.prompt+s.PromptTokens, t.cached+s.CachedTokens
		byModel[m] = t
		if s.Pod != "" {
			res.PerPod[s.Pod]++
		}
	}
	if len(samples) > 0 {
		res.SuccessRate = float64(len(ttft)) / float64(len(samples))
	}
	if prompt > 0 {
		res.HitRate = float64(cached) / float64(prompt)
	}
	if named {
		res.HitByModel = make(map[string]float64, len(byModel))
		for m, t := range byModel {
			if t.prompt > 0 {
				res.HitByModel[m] = float64(t.cached) / float64(t.prompt)
			}
		}
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	slices.Sort(wall)
	res.TTFTs = ttft
	res.TTFTP50, res.TTFTP90, res.TTFTP99 = Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99)
	res.E2EP50, res.E2EP99 = Percentile(e2e, 50), Percentile(e2e, 99)
	res.WallTTFTP90 = Percentile(wall, 90)
	if span := (last - first).Seconds() * timeScale; len(ttft) > 0 && span > 0 {
		res.OutputTokS = float64(out) / span
	}
	res.MaxMeanLoad = maxMean(res.PerPod)
	res.RepeatTTFTP90 = Percentile(repeatTTFTs(samples), 90)
	res.ByAPI = byAPI(samples)
	res.SimClock = simClock(samples, timeScale)
	return res
}

// repeatTTFTs are the sorted TTFTs of the successful samples that repeat a
// prefix (PolicyResult.RepeatTTFTP90), in the schedule's order, so every
// policy counts the same requests.
func repeatTTFTs(samples []Sample) []float64 {
	order := slices.Clone(samples)
	slices.SortStableFunc(order, func(a, b Sample) int { return cmp.Compare(a.Scheduled, b.Scheduled) })
	seen := map[string]bool{}
	var out []float64
	for _, s := range order {
		repeat := s.Turn > 0 || (s.Group != "" && seen[s.Group])
		if s.Group != "" {
			seen[s.Group] = true
		}
		if repeat && s.OK() {
			out = append(out, s.TTFT)
		}
	}
	slices.Sort(out)
	return out
}

// byAPI is the per-API breakdown of samples, nil when they speak one API.
func byAPI(samples []Sample) map[string]APIResult {
	type acc struct {
		res            APIResult
		prompt, cached int
		ttft           []float64
	}
	groups := map[string]*acc{}
	all := &acc{}
	for _, s := range samples {
		g := groups[s.API]
		if g == nil {
			g = &acc{}
			groups[s.API] = g
		}
		for _, a := range []*acc{g, all} {
			a.res.Requests++
			if s.Continued {
				a.res.Continued++
			}
			if !s.OK() {
				a.res.Failures++
				if s.Continued {
					a.res.ContinuedFailures++
				}
				continue
			}
			a.prompt += s.PromptTokens
			a.cached += s.CachedTokens
			a.ttft = append(a.ttft, s.TTFT)
		}
	}
	if len(groups) < 2 {
		return nil
	}
	groups[APIAll] = all
	out := make(map[string]APIResult, len(groups))
	for name, a := range groups {
		if a.prompt > 0 {
			a.res.HitRate = float64(a.cached) / float64(a.prompt)
		}
		slices.Sort(a.ttft)
		a.res.TTFTP90 = Percentile(a.ttft, 90)
		out[name] = a.res
	}
	return out
}

// maxMean is the busiest pod's request count over the mean; 0 when no pod
// served anything.
func maxMean(perPod map[string]int) float64 {
	if len(perPod) == 0 {
		return 0
	}
	total, most := 0, 0
	for _, n := range perPod {
		total += n
		most = max(most, n)
	}
	if total == 0 {
		return 0
	}
	return float64(most) / (float64(total) / float64(len(perPod)))
}

// WriteJSON writes r indented.
func WriteJSON(w io.Writer, r Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Markdown renders r as a table, one row per policy, plus the per-pod
// request counts.
func Markdown(r Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "workload %s, %d pods (times in simulated seconds)\n\n", r.Workload, r.Pods)
	b.WriteString("| policy | requests | success | hit rate | TTFT p50 | TTFT p90 | TTFT p99 | e2e p50 | e2e p99 | out tok/s | max/mean load | wall TTFT p90 | repeat TTFT p90 |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, p := range r.Policies {
		fmt.Fprintf(&b, "| %s | %d | %.1f%% | %.1f%% | %.3f | %.3f | %.3f | %.3f | %.3f | %.0f | %.2f | %.3f | %.3f |\n",
			p.Name, p.Requests, 100*p.SuccessRate, 100*p.HitRate, p.TTFTP50, p.TTFTP90, p.TTFTP99,
			p.E2EP50, p.E2EP99, p.OutputTokS, p.MaxMeanLoad, p.WallTTFTP90, p.RepeatTTFTP90)
	}
	count := func(n int) string { return strconv.Itoa(n) }
	keyLines(&b, r.Policies, false, "requests per pod", func(p PolicyResult) map[string]int { return p.PerPod }, count)
	keyLines(&b, r.Policies, true, "hit rate by model", func(p PolicyResult) map[string]float64 { return p.HitByModel },
		func(h float64) string { return fmt.Sprintf("%.1f%%", 100*h) })
	keyLines(&b, r.Policies, true, "decisions", func(p PolicyResult) map[string]int { return p.Decisions }, count)
	b.WriteString("\n")
	b.WriteString(simClockLines(r.Policies))
	b.WriteString(tierTable(r.Policies))
	b.WriteString(apiTable(r.Policies))
	b.WriteString(costTable(r.Policies))
	return b.String()
}

// keyLines writes a line per policy whose map of(p) holds anything: its
// name, label and key=value in key order, shown by show; the first after
// a blank line when gap.
func keyLines[V any](b *strings.Builder, ps []PolicyResult, gap bool, label string, of func(PolicyResult) map[string]V, show func(V) string) {
	for _, p := range ps {
		m := of(p)
		if len(m) == 0 {
			continue
		}
		if gap {
			b.WriteString("\n")
			gap = false
		}
		fmt.Fprintf(b, "\n%s %s:", p.Name, label)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(b, " %s=%s", k, show(m[k]))
		}
	}
}

// costTable renders what the sidecars of the policies that run them cost,
// "" when none does.
func costTable(policies []PolicyResult) string {
	var b strings.Builder
	for _, p := range policies {
		c := p.Sidecars
		if c == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nsidecar cost (each pod's sidecar, at the end of the run; the digest exchange's bytes sent over the cluster's life)\n\n")
			b.WriteString("| policy | RSS MiB | RSS max MiB | heap in use MiB | digest exchange KiB/s sent a pod |\n")
			b.WriteString("|---|--:|--:|--:|--:|\n")
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.2f |\n", p.Name, c.RSSMeanMiB, c.RSSMaxMiB, c.HeapMeanMiB, c.SentKiBPerSec)
	}
	return b.String()
}

// tierTable renders the GPU/CPU split of the policies that have one, ""
// when none does.
func tierTable(policies []PolicyResult) string {
	var b strings.Builder
	for _, p := range policies {
		if p.Tiers == nil {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nhits by tier (the engines' counters, over every prompt token scheduled)\n\n")
			b.WriteString("| policy | GPU hit | CPU hit | GPU+CPU | CPU tier blocks at end |\n")
			b.WriteString("|---|--:|--:|--:|--:|\n")
		}
		t := p.Tiers
		fmt.Fprintf(&b, "| %s | %.1f%% | %.1f%% | %.1f%% | %d |\n",
			p.Name, 100*t.GPUHitRate, 100*t.CPUHitRate, 100*(t.GPUHitRate+t.CPUHitRate), t.CPUBlocks)
	}
	return b.String()
}

// apiTable renders the per-API figures of the policies that have them, ""
// when none does: each API's row in name order, then the overall row.
func apiTable(policies []PolicyResult) string {
	var b strings.Builder
	for _, p := range policies {
		if len(p.ByAPI) == 0 {
			continue
		}
		if b.Len() == 0 {
			b.WriteString("\nby API (failures: requests without an answer; continued: previous_response_id follow-ups, failed/sent; predicted/actual: the sidecars' cached tokens)\n\n")
			b.WriteString("| policy | API | requests | failures | hit rate | TTFT p90 | continued failed | predicted/actual cached |\n")
			b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|\n")
		}
		apis := make([]string, 0, len(p.ByAPI))
		for a := range p.ByAPI {
			if a != APIAll {
				apis = append(apis, a)
			}
		}
		slices.Sort(apis)
		for _, a := range append(apis, APIAll) {
			x, ok := p.ByAPI[a]
			if !ok {
				continue
			}
			cont := "-"
			if x.Continued > 0 {
				cont = fmt.Sprintf("%d/%d", x.ContinuedFailures, x.Continued)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %.1f%% | %.3f | %s | %s |\n",
				p.Name, a, x.Requests, x.Failures, 100*x.HitRate, x.TTFTP90, cont, x.predictedActual())
		}
	}
	return b.String()
}

// predictedActual renders the sidecars' predicted and actual cached tokens
// and their ratio, "-" without them.
func (x APIResult) predictedActual() string {
	if x.PredictedCached == nil || x.ActualCached == nil {
		return "-"
	}
	p, a := *x.PredictedCached, *x.ActualCached
	if a == 0 {
		return fmt.Sprintf("%.0f / 0", p)
	}
	return fmt.Sprintf("%.2f (%.0f / %.0f)", p/a, p, a)
}
