package main

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/buildinfo"
	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/vllmclient"
)

// sidecarMetrics are the sidecar's own series (namespace kvroute) besides
// those of the front (forward.NewMetrics) and the cache state
// (cachestate.NewMetrics).
type sidecarMetrics struct {
	loadErrors prometheus.Counter
}

func newSidecarMetrics(reg *prometheus.Registry) *sidecarMetrics {
	m := &sidecarMetrics{
		loadErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Name: "vllm_scrape_errors_total",
			Help: "Failed scrapes of the local vLLM's /metrics."}),
	}
	// One series of 1 whose labels say what runs: the release
	// (buildinfo.Version) and the gossip wire version it speaks, so a
	// rolling upgrade shows as two series changing hands.
	build := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Name: "build_info",
		Help:        "1, labelled with the sidecar's release version and its gossip wire version.",
		ConstLabels: prometheus.Labels{"version": buildinfo.Version(), "wire_version": strconv.Itoa(int(gossip.WireVersion))}})
	build.Set(1)
	reg.MustRegister(m.loadErrors, build, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// registerViews exports gauges read at scrape time from the index, the
// subscriber and the mesh, so their owners keep plain counters.
func registerViews(reg *prometheus.Registry, ix *kvindex.Index, sub *vllmclient.Subscriber, mesh *gossip.Mesh, cs *cachestate.State) {
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
			if cs.Partial() {
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
		counter("gossip_newer_dropped_total", "Gossip messages of a newer wire version this sidecar cannot read (an unknown kind or format); dropped, expected during an upgrade.", func() float64 { return float64(mesh.Stats().NewerDropped) }),
		counter("gossip_newer_read_total", "Gossip messages and node metas of a newer wire version, read as far as this sidecar knows them.", func() float64 { return float64(mesh.Stats().NewerRead) }),
		gauge("gossip_oldest_wire_version", "The lowest gossip wire version among this sidecar and its peers: 1 while a v0.1.0 sidecar is a member.", func() float64 { return float64(mesh.OldestWire()) }),
		counter("gossip_stream_waits_total", fmt.Sprintf("Gossip sends by TCP that waited for a free slot: a node has at most %d such connections open at once (gossip.Config.MaxStreams).", gossip.DefaultConfig().MaxStreams), func() float64 { return float64(mesh.Stats().StreamWaits) }),
		counter("gossip_meta_updates_total", "Node-meta broadcasts: each change of models, drain or engine goes out twice, 300 ms apart.", func() float64 { return float64(mesh.Stats().MetaUpdates) }),
		gauge("peer_digests_grouped", "Peer digests the transposed copy holds: the choice matches them all in one pass.", func() float64 {
			held, _ := mesh.Grouped()
			return float64(held)
		}),
		gauge("peer_digests_misfit", "Plain peer digests of another size than the transposed copy's, matched one by one; the copy follows the most common size.", func() float64 {
			_, misfits := mesh.Grouped()
			return float64(misfits)
		}),
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
