package forward

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the front's Prometheus series (namespace kvroute, base units).
type Metrics struct {
	tiers           *TierMetrics // rank.go
	decisions       *prometheus.CounterVec
	badRequests     *prometheus.CounterVec
	hopRejected     *prometheus.CounterVec
	forwardSeconds  *prometheus.HistogramVec
	tokenizeSeconds prometheus.Histogram
	tokenizeErrors  prometheus.Counter
	retries         prometheus.Counter
	canceled        prometheus.Counter
	cachedTokens    *prometheus.CounterVec
	storedProbes    *prometheus.CounterVec
	inflight        prometheus.Gauge
	queuedPrefill   prometheus.Gauge
	prefillShare    prometheus.Gauge
	shareWaived     *prometheus.CounterVec
}

// NewMetrics creates the front's metrics and registers them with reg (nil:
// not registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	latency := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "routing_decisions_total",
			Help: "Routing decisions by outcome (local, forwarded, direct: a stored response's request sent to its pod's vLLM itself while that pod's sidecar is away, fallback, refused), the policy that decided, and the request's API (chat, completions, messages, responses).",
		}, []string{"outcome", "reason", "api"}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "request_errors_total",
			Help: "Requests answered with an error by the sidecar itself, by kind and API.",
		}, []string{"kind", "api"}),
		hopRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "hop_rejected_total",
			Help: "Hop headers that were not trusted (forged, stale, misaddressed), by reason.",
		}, []string{"reason"}),
		forwardSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kvroute", Name: "forward_duration_seconds",
			Help:    "Time from receiving a routed request to the upstream's response headers, by where it was served.",
			Buckets: latency, NativeHistogramBucketFactor: 1.1,
		}, []string{"target"}),
		tokenizeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvroute", Name: "tokenize_duration_seconds",
			Help:    "Latency of the local vLLM's /tokenize calls.",
			Buckets: latency, NativeHistogramBucketFactor: 1.1,
		}),
		tokenizeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "tokenize_errors_total",
			Help: "Failed /tokenize calls; those requests were routed by load alone.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "forward_retries_total",
			Help: "Forward attempts to a peer that failed before the first response byte.",
		}),
		canceled: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "client_canceled_total",
			Help: "Requests whose client went away before the upstream answered.",
		}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "cached_tokens_total",
			Help: "Prefix-cache tokens: predicted by the routing choice, and actual as vLLM reported (each API's cached-tokens usage field), by API; unpredicted is what vLLM reported for requests routed to a stored response's pod, where nothing was predicted.",
		}, []string{"kind", "api"}),
		storedProbes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "stored_response_probes_total",
			Help: "Stored responses looked for: those the mesh's map did not know, on every pod (found, not_found, incomplete); those whose pod's sidecar was away, at that pod's vLLM itself (engine_found, engine_not_found, engine_vanished: nothing listens where it was reached, engine_unknown).",
		}, []string{"result"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Name: "inflight_requests",
			Help: "Routed requests in flight through this sidecar.",
		}),
		queuedPrefill: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Name: "queued_prefill_tokens",
			Help: "Prompt tokens the local vLLM must still prefill for the requests it has from this sidecar (each request's predicted uncached tokens until its first answer byte); what this pod pushes to its peers as its load. vllm:num_requests_waiting is the engine's own check.",
		}),
		prefillShare: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Name: "prefill_share",
			Help: "Share of the recent past (an average over 5 s) in which the local vLLM had prompt tokens queued for prefill, at its last change; what this pod pushes to its peers with its queue. At --max-prefill-share the pod takes no new long prompt, so the requests it decodes get prefill-free steps.",
		}),
		shareWaived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Name: "prefill_share_waived_total",
			Help: "Clients' last attempts (X-Stainless-Retry-Count at --serve-retry) served though --max-prefill-share would have refused them, by API: refused, they were lost.",
		}, []string{"api"}),
	}
	if reg != nil {
		reg.MustRegister(m.decisions, m.badRequests, m.hopRejected, m.forwardSeconds, m.tokenizeSeconds,
			m.tokenizeErrors, m.retries, m.canceled, m.cachedTokens, m.storedProbes, m.inflight, m.queuedPrefill, m.prefillShare, m.shareWaived)
	}
	m.tiers = newTierMetrics(reg)
	return m
}
