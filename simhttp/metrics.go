package simhttp

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/vllmsim"
)

// latencyBuckets reach minutes: simulated queues under overload are long.
var latencyBuckets = []float64{.001, .005, .01, .02, .04, .06, .08, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}

// Metrics exposes vLLM's metric names (vllm/v1/metrics/loggers.py) from the
// engine's Stats at scrape time, plus latency histograms the HTTP layer
// observes in simulated seconds. Each Metrics has its own registry.
type Metrics struct {
	reg     *prometheus.Registry
	ttft    prometheus.Observer
	e2e     prometheus.Observer
	success *prometheus.CounterVec
}

// CacheInfo is what vllm:cache_config_info reports.
type CacheInfo struct {
	BlockSize    int
	NumGPUBlocks int
	HashAlgo     string
}

// NewMetrics registers every collector. stats has one function per
// data-parallel rank; each is called once per metric per scrape, must be
// safe for concurrent use, and its gauges and counters carry the rank as
// the engine label, as vLLM's per-engine series do. The latency histograms
// are observed by the HTTP layer, which does not know the rank: they carry
// engine "0".
func NewMetrics(model string, stats []func() vllmsim.Stats, ci CacheInfo) *Metrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for rank, st := range stats {
		m.registerRank(model, strconv.Itoa(rank), st, ci)
	}
	ttft := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:time_to_first_token_seconds",
		Help: "Histogram of time to first token in seconds (simulated time).", ConstLabels: labels, Buckets: latencyBuckets})
	e2e := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vllm:e2e_request_latency_seconds",
		Help: "Histogram of e2e request latency in seconds (simulated time).", ConstLabels: labels, Buckets: latencyBuckets})
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests.", ConstLabels: labels}, []string{"finished_reason"})
	m.ttft, m.e2e = ttft, e2e
	m.reg.MustRegister(ttft, e2e, m.success)
	return m
}

// MustRegister adds collectors of the process around the HTTP layer (the
// KV-event publishers) to the same /metrics.
func (m *Metrics) MustRegister(cs ...prometheus.Collector) { m.reg.MustRegister(cs...) }

// RegisterTokenizer exports the tokenization charge's totals: how busy the
// API server's tokenizer thread was, and how long calls queued for it.
func (m *Metrics) RegisterTokenizer(stats func() vllmsim.TokenizeStats) {
	c := func(name, help string, f func(vllmsim.TokenizeStats) float64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return f(stats()) }))
	}
	c("vllm_sim_tokenize_calls_total", "Tokenizations charged (/tokenize, render, text prompts).", func(s vllmsim.TokenizeStats) float64 { return float64(s.Calls) })
	c("vllm_sim_tokenize_busy_seconds_total", "Time the tokenizer workers were held.", func(s vllmsim.TokenizeStats) float64 { return s.Busy.Seconds() })
	c("vllm_sim_tokenize_wait_seconds_total", "Time tokenizations waited for a worker.", func(s vllmsim.TokenizeStats) float64 { return s.Wait.Seconds() })
}

// registerRank registers one engine's gauges, counters and cache info.
func (m *Metrics) registerRank(model, engine string, stats func() vllmsim.Stats, ci CacheInfo) {
	labels := prometheus.Labels{"model_name": model, "engine": engine}
	gauge := func(name, help string, f func(vllmsim.Stats) float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(stats()) }))
	}
	counter := func(name, help string, f func(vllmsim.Stats) uint64) {
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return float64(f(stats())) }))
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(s vllmsim.Stats) float64 { return float64(s.Running) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(s vllmsim.Stats) float64 { return float64(s.Waiting) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(s vllmsim.Stats) float64 { return s.KVUsage })
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(s vllmsim.Stats) uint64 { return s.PrefixQueriesTokens })
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(s vllmsim.Stats) uint64 { return s.PrefixHitsTokens })
	// vLLM's KV-connector hit counters (vllm/v1/metrics/loggers.py): the
	// offload tier's lookups past the GPU hit and its loads; 0 without it.
	counter("vllm:external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", func(s vllmsim.Stats) uint64 { return s.ExternalQueriesTokens })
	counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", func(s vllmsim.Stats) uint64 { return s.ExternalHitsTokens })
	// vLLM exports no CPU-tier occupancy (llm-d's tiered guide sizes its
	// CPU index by hand for that reason); this one is the simulator's.
	gauge("vllm_sim:cpu_cache_blocks", "Blocks held by the simulated CPU offload tier.", func(s vllmsim.Stats) float64 { return float64(s.CPUBlocks) })
	counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", func(s vllmsim.Stats) uint64 { return s.PromptTokensTotal })
	counter("vllm:generation_tokens_total", "Number of generation tokens processed.", func(s vllmsim.Stats) uint64 { return s.GenerationTokensTotal })
	counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", func(s vllmsim.Stats) uint64 { return s.Preemptions })

	// vLLM labels cache_config_info with CacheConfig fields and engine only.
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
		ConstLabels: prometheus.Labels{
			"engine": engine, "block_size": strconv.Itoa(ci.BlockSize), "num_gpu_blocks": strconv.Itoa(ci.NumGPUBlocks),
			"enable_prefix_caching": "True", "prefix_caching_hash_algo": ci.HashAlgo, "cache_dtype": "auto",
		}})
	info.Set(1)
	m.reg.MustRegister(info)
}

// finished records one engine request's outcome in simulated seconds.
func (m *Metrics) finished(o vllmsim.Output) {
	if m == nil {
		return
	}
	if o.FirstTokenSim > 0 {
		m.ttft.Observe(o.FirstTokenSim - o.ArrivalSim)
	}
	m.e2e.Observe(o.NowSim - o.ArrivalSim)
	m.success.WithLabelValues(o.FinishReason).Inc()
}

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
