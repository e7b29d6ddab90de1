package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/vllmclient"
)

// sidecarMetrics are the cache-state and mesh series (namespace kvroute);
// the front registers its own (forward.NewMetrics).
type sidecarMetrics struct {
	events          *prometheus.CounterVec
	eventGaps       prometheus.Counter
	eventRestarts   prometheus.Counter
	eventErrors     prometheus.Counter
	digestPublished *prometheus.CounterVec
	digestBytes     prometheus.Gauge
	loadErrors      prometheus.Counter

	engineUp          prometheus.Gauge
	engineTransitions *prometheus.CounterVec
	eventsSilent      prometheus.Gauge
	eventsSilentTotal prometheus.Counter
}

func newSidecarMetrics(reg *prometheus.Registry) *sidecarMetrics {
	m := &sidecarMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_events_total",
			Help: "KV events applied to the local index, by type."}, []string{"type"}),
		eventGaps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_gaps_total",
			Help: "Holes in the KV-event sequence that replay could not fill."}),
		eventRestarts: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_restarts_total",
			Help: "vLLM restarts seen as a KV-event sequence going backwards."}),
		eventErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_event_decode_errors_total",
			Help: "KV-event batches that could not be decoded and were dropped."}),
		digestPublished: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "digest_published_total",
			Help: "Local digest publications, full or delta."}, []string{"kind"}),
		digestBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "digest_bytes",
			Help: "Wire size of the last full local digest."}),
		loadErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "vllm_scrape_errors_total",
			Help: "Failed scrapes of the local vLLM's /metrics."}),
		engineUp: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "engine_up",
			Help: "1 while the local vLLM serves (healthy, digest advertised), else 0: starting, dead or hung."}),
		engineTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "engine_transitions_total",
			Help: "Changes of the local vLLM's state, by the state entered (serving, down)."}, []string{"state"}),
		eventsSilent: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "kv_events_silent",
			Help: "1 while vLLM serves but no KV event has arrived within the silence window (a misconfigured event path)."}),
		eventsSilentTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "kv_events_silent_total",
			Help: "Times the KV-event path was found silent while vLLM served."}),
	}
	reg.MustRegister(m.events, m.eventGaps, m.eventRestarts, m.eventErrors, m.digestPublished, m.digestBytes, m.loadErrors,
		m.engineUp, m.engineTransitions, m.eventsSilent, m.eventsSilentTotal,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerViews exports gauges read at scrape time from the index, the
// subscriber and the mesh, so their owners keep plain counters.
func registerViews(reg *prometheus.Registry, ix *kvindex.Index, sub *vllmclient.Subscriber, mesh *gossip.Mesh, cs *cacheState) {
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "kvroute", Name: name, Help: help}, f)
	}
	counter := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "kvroute", Name: name, Help: help}, f)
	}
	reg.MustRegister(
		gauge("index_blocks", "vLLM blocks the local index holds.", func() float64 { return float64(ix.Blocks()) }),
		gauge("index_keys", "Routing keys in the local index.", func() float64 { return float64(ix.Len()) }),
		gauge("index_uncertain", "1 when events were lost and the index may be wrong.", func() float64 {
			if ix.Uncertain() {
				return 1
			}
			return 0
		}),
		gauge("index_partial", "1 when the sidecar joined vLLM's event stream mid-way without replay: chains stored before are unknown (never advertised).", func() float64 {
			if cs.partial.Load() {
				return 1
			}
			return 0
		}),
		gauge("digest_epoch", "Epoch of the local index (changes when the cache is known gone).", func() float64 { return float64(ix.Epoch()) }),
		counter("kv_event_batches_total", "KV-event batches received live.", func() float64 { return float64(sub.Stats().Received) }),
		counter("kv_event_replayed_total", "KV-event batches received by replay.", func() float64 { return float64(sub.Stats().Replayed) }),
		counter("kv_event_dropped_total", "KV-event items dropped at the hand-off (consumer too slow).", func() float64 { return float64(sub.Stats().Dropped) }),
		gauge("gossip_members", "Live members of the mesh, this node included.", func() float64 { return float64(mesh.Members()) }),
		counter("gossip_sent_bytes_total", "Digest-exchange bytes sent.", func() float64 {
			s := mesh.Stats().Sent
			return float64(s.Digest.Bytes + s.Delta.Bytes + s.NeedFull.Bytes)
		}),
		counter("gossip_received_bytes_total", "Digest-exchange bytes received.", func() float64 {
			s := mesh.Stats().Received
			return float64(s.Digest.Bytes + s.Delta.Bytes + s.NeedFull.Bytes)
		}),
		counter("gossip_decode_errors_total", "Gossip messages that did not decode and were dropped.", func() float64 { return float64(mesh.Stats().DecodeErrors) }),
		gauge("digest_staleness_seconds", "Age of the oldest peer digest in the peer table.", func() float64 {
			now := time.Now()
			worst := 0.0
			for _, p := range mesh.Snapshot(now) {
				if !p.Local && !p.DigestAt.IsZero() {
					worst = max(worst, now.Sub(p.DigestAt).Seconds())
				}
			}
			return worst
		}),
	)
}
