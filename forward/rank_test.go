package forward

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// rankedSet is a digest stand-in of a pod of several data-parallel ranks
// (route.TierMatcher): an exact key set per rank, its Ranks as the
// digest's markers would say.
type rankedSet struct {
	markers int
	held    map[int]keySet
}

func (s rankedSet) PrefixLen(keys []blockkey.Key) int { return s.held[0].PrefixLen(keys) }
func (s rankedSet) Ranks() int                        { return s.markers }
func (s rankedSet) TierPrefix(keys []blockkey.Key, rank int) (gpu, cpu, disk int) {
	return s.held[rank].PrefixLen(keys), 0, 0
}

// onRank returns a digest of a 2-rank pod holding the test prompt on rank.
func onRank(rank int) rankedSet {
	held := keySet{}
	for _, k := range promptKeys() {
		held[k] = true
	}
	return rankedSet{markers: 2, held: map[int]keySet{rank: held}}
}

// The request goes to the rank that holds its prefix, at the local pod and
// through a hop at a peer, only where the pod advertises its rank count.
func TestPinsRank(t *testing.T) {
	tests := []struct {
		name      string
		holder    string         // "a" is local, "b" a peer
		rank      int            // where the holder holds the prompt
		ranks     map[string]int // advertised counts
		wantRank  string         // the header the holder's vLLM sees
		wantLabel string         // route_rank_pins_total's
	}{
		{"local pod, rank 1", "a", 1, map[string]int{"a": 2, "b": 2}, "1", "1"},
		{"peer, rank 1, through the hop", "b", 1, map[string]int{"a": 2, "b": 2}, "1", "1"},
		{"peer, rank 0", "b", 0, map[string]int{"a": 2, "b": 2}, "0", "0"},
		// The digest's markers say 2, but nothing is pinned on them.
		{"count not advertised", "b", 1, map[string]int{"a": 2}, "", "any"},
		{"one rank advertised", "b", 0, map[string]int{"a": 2, "b": 1}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newNode(t, "a"), newNode(t, "b")
			m := a.h.metrics.tiers
			now := time.Now()
			a.peers.views = []route.PeerView{
				{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: rankedSet{markers: 2}, LoadAt: now, Ranks: tt.ranks["a"]},
				{ID: "b", Addr: hostOf(b.srv), KeyScheme: blockkey.Version, Digest: rankedSet{markers: 2}, LoadAt: now, Ranks: tt.ranks["b"]},
			}
			holder := b
			if tt.holder == "a" {
				holder, a.peers.views[0].Digest = a, onRank(tt.rank)
			} else {
				a.peers.views[1].Digest = onRank(tt.rank)
			}
			resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
			if resp.StatusCode != 200 || resp.Header.Get(ServedByHeader) != tt.holder {
				t.Fatalf("status %d served by %q; want 200 by %s", resp.StatusCode, resp.Header.Get(ServedByHeader), tt.holder)
			}
			if len(*holder.seen) != 1 {
				t.Fatalf("%s's vLLM saw %d requests; want 1", tt.holder, len(*holder.seen))
			}
			if got := (*holder.seen)[0].Get(RankHeader); got != tt.wantRank {
				t.Errorf("%s's vLLM saw %s %q; want %q", tt.holder, RankHeader, got, tt.wantRank)
			}
			pins := map[string]float64{}
			for _, r := range []string{"0", "1", "any"} {
				if v := count(m.pins.WithLabelValues(r)); v > 0 {
					pins[r] = v
				}
			}
			if want := map[string]float64{tt.wantLabel: 1}; tt.wantLabel == "" && len(pins) != 0 || tt.wantLabel != "" && (len(pins) != 1 || pins[tt.wantLabel] != 1) {
				t.Errorf("route_rank_pins_total = %v; want %v (none for a pod of one rank)", pins, want)
			}
			if got, want := count(m.tokens.WithLabelValues("gpu")), float64(4*16); got != want {
				t.Errorf(`route_matched_tokens_total{tier="gpu"} = %v; want %v`, got, want)
			}
			if got := count(m.hits.WithLabelValues("gpu")); got != 1 {
				t.Errorf(`route_tier_hits_total{tier="gpu"} = %v; want 1`, got)
			}
			if got := count(m.hits.WithLabelValues("cpu")); got != 0 {
				t.Errorf(`route_tier_hits_total{tier="cpu"} = %v; want 0`, got)
			}
		})
	}
}

// A client's own pin is left alone where the choice names no rank.
func TestClientRankKept(t *testing.T) {
	a := newNode(t, "a")
	a.peers.views = []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: time.Now()}}
	post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, map[string]string{RankHeader: "3"})
	if len(*a.seen) != 1 || (*a.seen)[0].Get(RankHeader) != "3" {
		t.Errorf("vLLM saw %v; want the client's %s: 3", *a.seen, RankHeader)
	}
}

// count reads a counter's value.
func count(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}
