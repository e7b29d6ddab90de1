package forward

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/route"
)

// RankHeader is vLLM's header pinning a request to one data-parallel rank
// of its engine (vLLM serves it on that rank's engine core). Route chooses
// the rank (route.Decision.RankOf, the rank holding the prompt's prefix);
// forward only carries it: on a hop it passes through the peer's sidecar
// to its vLLM unchanged.
const RankHeader = "X-data-parallel-rank"

// rankFor is RankHeader's value for the decision's candidate peer (its ID,
// the local one's included), or "" when the engine there chooses.
func rankFor(d route.Decision, peer string) string {
	if r, ok := d.RankOf(peer); ok {
		return strconv.Itoa(r)
	}
	return ""
}

// setRank pins out to t's rank, if the choice named one; otherwise the
// request keeps whatever its client sent.
func setRank(out *http.Request, t target) {
	if t.Rank != "" {
		out.Header.Set(RankHeader, t.Rank)
	}
}

// TierMetrics count where routed requests' cached prefixes are held, as
// the choice predicted them at the pod it chose: per tier (GPU, and the
// lower tiers vLLM loads from) and per data-parallel rank.
type TierMetrics struct {
	tokens *prometheus.CounterVec
	hits   *prometheus.CounterVec
	pins   *prometheus.CounterVec
}

// newTierMetrics creates the series and registers them with reg (nil: not
// registered); NewMetrics calls it.
func newTierMetrics(reg prometheus.Registerer) *TierMetrics {
	counter := func(name, label, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: name, Help: help}, []string{label})
	}
	m := &TierMetrics{
		tokens: counter("route_matched_tokens_total", "tier",
			"Prompt tokens the routing choice predicted cached at the pod it chose, by the tier that pod holds them on (gpu; cpu and disk, which vLLM loads rather than computes)."),
		hits: counter("route_tier_hits_total", "tier",
			"Routed requests whose chosen pod holds part of their prompt on the tier (gpu, cpu, disk)."),
		pins: counter("route_rank_pins_total", "rank",
			"Routed requests sent to a pod of several data-parallel ranks, by the rank they were pinned to (X-data-parallel-rank), or any: the engine chose (no rank holds more of the prompt, or the pod does not advertise its rank count)."),
	}
	for _, tier := range []string{"gpu", "cpu", "disk"} {
		m.tokens.WithLabelValues(tier)
		m.hits.WithLabelValues(tier)
	}
	if reg != nil {
		reg.MustRegister(m.tokens, m.hits, m.pins)
	}
	return m
}

// observe counts a routed request's decision d, first sent to first.
func (m *TierMetrics) observe(d route.Decision, first target) {
	for _, c := range d.Candidates {
		if !c.Chosen {
			continue
		}
		for _, t := range [...]struct {
			tier   string
			tokens int
		}{{"gpu", c.GPUTokens}, {"cpu", c.CPUTokens}, {"disk", c.DiskTokens}} {
			if t.tokens > 0 {
				m.tokens.WithLabelValues(t.tier).Add(float64(t.tokens))
				m.hits.WithLabelValues(t.tier).Inc()
			}
		}
		if c.Ranks > 1 {
			rank := first.Rank
			if rank == "" {
				rank = "any"
			}
			m.pins.WithLabelValues(rank).Inc()
		}
		return
	}
}
