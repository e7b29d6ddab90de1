package forward

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/route"
)

// RankHeader is vLLM's header pinning a request to one data-parallel rank
// of its engine (vLLM serves it on that rank's engine core). Route chooses
// the rank (route.Decision.RankOf, the rank holding the prompt's prefix);
// forward only carries it: on a hop it passes through the peer's sidecar
// to its vLLM unchanged.
const RankHeader = "X-data-parallel-rank"

// RankChoiceHeader carries, on a hop to a pod of several data-parallel
// ranks, what the serving sidecar needs to place the request on a rank
// (placeRank): "prompt=N", the request's prompt tokens, and "; rank=R"
// when the sender pinned it to rank R because R holds its prefix. A
// RankHeader without it is the client's own pin, and stays. Read only
// with a trusted hop header; an earlier version neither sends nor reads
// it.
const RankChoiceHeader = "X-Kvroute-Rank"

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

// rankChoiceValue is RankChoiceHeader's value for t.
func rankChoiceValue(t target) string {
	v := "prompt=" + strconv.Itoa(max(t.Prompt, 0))
	if t.Rank != "" {
		v += "; rank=" + t.Rank
	}
	return v
}

// hopRankChoice reads a trusted hop's RankChoiceHeader into t and removes
// it: t.Prompt, and t.Rank when the sender pinned (then a RankHeader on
// the request is the sender's, which placeRank may overrule). ok is false
// without the header (a sender of an earlier version: any RankHeader is
// kept as it came) or with a malformed one.
func hopRankChoice(r *http.Request, t *target) (ok bool) {
	v := r.Header.Get(RankChoiceHeader)
	r.Header.Del(RankChoiceHeader)
	if v == "" {
		return false
	}
	prompt, rank := -1, ""
	for _, kv := range strings.Split(v, ";") {
		k, val, _ := strings.Cut(strings.TrimSpace(kv), "=")
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return false
		}
		switch k {
		case "prompt":
			prompt = min(n, maxPrefill)
		case "rank":
			rank = strconv.Itoa(n)
		}
	}
	if prompt < 0 {
		return false
	}
	t.Prompt, t.Rank = prompt, rank
	return true
}

// placeRank names the local vLLM's data-parallel rank that serves t, of
// n (> 1), from the front's own count of what each rank has
// (route.Config.PickRank): every request it sends names one, so the count
// is exact. A rank the client named itself (RankHeader, no pin of the
// mesh's) is kept. It returns the rank and why: "client", "pinned" (the
// rank holding the prefix), "moved" (another: the holder was busier than
// its prefix saves) or "balanced" (no rank held more).
func placeRank(cfg route.Config, t *target, client string, loads []route.RankLoad) (int, string) {
	n := len(loads)
	if t.Rank == "" && client != "" {
		if r, err := strconv.Atoi(client); err == nil && r >= 0 {
			return r, "client"
		}
		return -1, "client" // vLLM answers it
	}
	pinned := route.NoRank
	if r, err := strconv.Atoi(t.Rank); err == nil && r >= 0 && r < n {
		pinned = r
	}
	r := cfg.PickRank(loads, pinned, t.Prefill, max(t.Prompt, t.Prefill))
	t.Rank = strconv.Itoa(r)
	why := "moved"
	switch {
	case pinned == route.NoRank:
		why = "balanced"
	case r == pinned:
		why = "pinned"
	default: // computed whole there
		t.Prefill = max(t.Prompt, t.Prefill)
	}
	// A non-streamed answer's prefill ends by the rank's queue, not the
	// pod's the sender priced.
	if rate := cfg.PrefillTokensPerSecond; t.PrefillFor > 0 && rate > 0 {
		t.PrefillFor = time.Duration(float64(loads[r].Queued+t.Prefill) / rate * float64(time.Second))
	}
	return r, why
}

// TierMetrics count where routed requests' cached prefixes are held, as
// the choice predicted them at the pod it chose: per tier (GPU, and the
// lower tiers vLLM loads from) and per data-parallel rank.
type TierMetrics struct {
	tokens *prometheus.CounterVec
	hits   *prometheus.CounterVec
	pins   *prometheus.CounterVec
	placed *prometheus.CounterVec
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
		placed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kvroute", Name: "rank_placed_total",
			Help: "Requests this sidecar sent its own vLLM of several data-parallel ranks, by the rank it named and why: pinned (the rank holding the prefix), moved (another: the holder's queue cost more than the prefix saves), balanced (no rank held more: the one with the least work), client (the client named it)."},
			[]string{"rank", "why"}),
	}
	for _, tier := range []string{"gpu", "cpu", "disk"} {
		m.tokens.WithLabelValues(tier)
		m.hits.WithLabelValues(tier)
	}
	if reg != nil {
		reg.MustRegister(m.tokens, m.hits, m.pins, m.placed)
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
