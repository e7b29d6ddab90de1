package cachestate

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the cache-state series (namespace kvroute).
type Metrics struct {
	events            *prometheus.CounterVec
	eventGaps         prometheus.Counter
	eventRestarts     prometheus.Counter
	eventErrors       prometheus.Counter
	digestPublished   *prometheus.CounterVec
	digestBytes       prometheus.Gauge
	engineUp          prometheus.Gauge
	engineTransitions *prometheus.CounterVec
	eventsSilent      prometheus.Gauge
	eventsSilentTotal prometheus.Counter
}

// NewMetrics registers the series with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_events_total",
			Help: "KV events applied to the local index, by type."}, []string{"type"}),
		eventGaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_gaps_total",
			Help: "Holes in the KV-event sequence that replay could not fill."}),
		eventRestarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_restarts_total",
			Help: "vLLM restarts seen as a KV-event sequence going backwards or its counters restarting."}),
		eventErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_decode_errors_total",
			Help: "KV-event batches that could not be decoded and were dropped."}),
		digestPublished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "digest_published_total",
			Help: "Local digest publications, full or delta."}, []string{"kind"}),
		digestBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "digest_bytes",
			Help: "Wire size of the last full local digest."}),
		engineUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "engine_up",
			Help: "1 while the local vLLM serves (healthy, digest advertised), else 0: starting, dead or hung."}),
		engineTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "engine_transitions_total",
			Help: "Changes of the local vLLM's state, by the state entered (serving, down)."}, []string{"state"}),
		eventsSilent: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "kv_events_silent",
			Help: "1 while vLLM serves but no KV event has arrived within the silence window (a misconfigured event path)."}),
		eventsSilentTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_events_silent_total",
			Help: "Times the KV-event path was found silent while vLLM served."}),
	}
	if reg != nil {
		reg.MustRegister(m.events, m.eventGaps, m.eventRestarts, m.eventErrors, m.digestPublished, m.digestBytes,
			m.engineUp, m.engineTransitions, m.eventsSilent, m.eventsSilentTotal)
	}
	return m
}
