package forward

import (
	"net/http"
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

// With several ranks the front names the rank of every request it sends
// its vLLM, from its own count of each rank's work: the rank holding the
// prefix while its queue costs less than the prefix saves, else the one
// with the least work; a client's own rank stays.
func TestPlacesRankByWork(t *testing.T) {
	tests := []struct {
		name   string
		holder int            // the local rank holding the prompt; -1: none
		queued map[int][2]int // rank → requests in flight there, their prefill
		client string         // the client's RankHeader
		want   string
		why    string
	}{
		{"idle: the holder", 1, nil, "", "1", "pinned"},
		// The prompt's 64 matched tokens are less than the wait of
		// 0.5*1000 queued tokens at rank 1.
		{"the holder's queue costs more than it saves", 1, map[int][2]int{1: {1, 1000}}, "", "0", "moved"},
		{"a short queue at the holder: stays", 1, map[int][2]int{1: {1, 0}}, "", "1", "pinned"},
		{"no holder: the least work", -1, map[int][2]int{0: {1, 200}}, "", "1", "balanced"},
		{"the client's rank, however busy", -1, map[int][2]int{0: {3, 9000}}, "0", "0", "client"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newNode(t, "a")
			a.h.SetRanks(2)
			d := rankedSet{markers: 2}
			if tt.holder >= 0 {
				d = onRank(tt.holder)
			}
			now := time.Now()
			a.peers.views = []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: d, LoadAt: now, Ranks: 2}}
			a.h.mu.Lock()
			for r, q := range tt.queued {
				for i := range q[0] {
					a.h.flights.add("", now.Add(-time.Duration(r*10+i+1)*time.Millisecond), q[1]/q[0], 0, r)
				}
			}
			a.h.mu.Unlock()
			hdr := map[string]string{}
			if tt.client != "" {
				hdr[RankHeader] = tt.client
			}
			post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, hdr)
			if len(*a.seen) != 1 || (*a.seen)[0].Get(RankHeader) != tt.want {
				t.Fatalf("vLLM saw %v; want %s: %s", *a.seen, RankHeader, tt.want)
			}
			if got := count(a.h.metrics.tiers.placed.WithLabelValues(tt.want, tt.why)); got != 1 {
				t.Errorf(`rank_placed_total{rank=%q,why=%q} = %v; want 1`, tt.want, tt.why, got)
			}
		})
	}
}

// Through a hop the serving sidecar places the request: the sender's pin
// to the rank holding the prefix is overruled when that rank's queue there
// costs more than the prefix saves, and vLLM never sees the hop's header.
func TestHopRankPlacedAtTheServingPod(t *testing.T) {
	a, b := newNode(t, "a"), newNode(t, "b")
	b.h.SetRanks(2)
	now := time.Now()
	a.peers.views = []route.PeerView{
		{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now},
		{ID: "b", Addr: hostOf(b.srv), KeyScheme: blockkey.Version, Digest: onRank(1), LoadAt: now, Ranks: 2},
	}
	b.peers.views = []route.PeerView{{ID: "b", Local: true, KeyScheme: blockkey.Version, Digest: onRank(1), LoadAt: now, Ranks: 2}}
	for i, want := range []string{"1", "0"} {
		resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
		if resp.StatusCode != 200 || resp.Header.Get(ServedByHeader) != "b" {
			t.Fatalf("status %d served by %q; want 200 by b", resp.StatusCode, resp.Header.Get(ServedByHeader))
		}
		h := (*b.seen)[i]
		if got := h.Get(RankHeader); got != want {
			t.Errorf("request %d: b's vLLM saw %s %q; want %q", i, RankHeader, got, want)
		}
		if v := h.Get(RankChoiceHeader); v != "" {
			t.Errorf("request %d: b's vLLM saw %s: %s", i, RankChoiceHeader, v)
		}
		b.h.mu.Lock() // rank 1 gets busy
		b.h.flights.add("", now.Add(-time.Second), 5000, 0, 1)
		b.h.mu.Unlock()
	}
	if got := b.h.RankLoads(time.Now()); len(got) != 2 || got[1] != (route.RankLoad{Serving: 2, Queued: 10000}) || got[0] != (route.RankLoad{}) {
		t.Errorf("b's rank loads %+v; want rank 1 with the two added flights, rank 0 idle", got)
	}
	if got := a.h.RankLoads(time.Now()); got != nil {
		t.Errorf("a pod of one rank shows rank loads %+v", got)
	}
}

func TestHopRankChoice(t *testing.T) {
	tests := []struct {
		v      string
		ok     bool
		prompt int
		rank   string
	}{
		{"", false, 0, ""},
		{"prompt=4100", true, 4100, ""},
		{"prompt=4100; rank=1", true, 4100, "1"},
		{"rank=1;prompt=7", true, 7, "1"},
		{"rank=1", false, 0, ""},
		{"prompt=-3", false, 0, ""},
		{"prompt=12; rank=x", false, 0, ""},
		{"prompt=99999999999", true, maxPrefill, ""},
		{"prompt=5; future=2", true, 5, ""},
	}
	for _, tt := range tests {
		r, _ := http.NewRequest("POST", "/", nil)
		if tt.v != "" {
			r.Header.Set(RankChoiceHeader, tt.v)
		}
		var tg target
		ok := hopRankChoice(r, &tg)
		if ok != tt.ok || tg.Prompt != tt.prompt || tg.Rank != tt.rank {
			t.Errorf("%q: ok %v prompt %d rank %q; want %v %d %q", tt.v, ok, tg.Prompt, tg.Rank, tt.ok, tt.prompt, tt.rank)
		}
		if r.Header.Get(RankChoiceHeader) != "" {
			t.Errorf("%q: header left for vLLM", tt.v)
		}
	}
}

func FuzzHopRankChoice(f *testing.F) {
	for _, s := range []string{"", "prompt=4100", "prompt=4100; rank=1", "rank=1", "prompt=;rank=", "prompt=9999999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, _ := http.NewRequest("POST", "/", nil)
		r.Header.Set(RankChoiceHeader, v)
		var tg target
		if !hopRankChoice(r, &tg) {
			return
		}
		if tg.Prompt < 0 || tg.Prompt > maxPrefill {
			t.Fatalf("%q: prompt %d", v, tg.Prompt)
		}
		r.Header.Set(RankChoiceHeader, rankChoiceValue(tg))
		var back target
		if !hopRankChoice(r, &back) || back != tg {
			t.Fatalf("%q: %+v wrote and read back as %+v", v, tg, back)
		}
	})
}

// A request moved off the rank holding its prefix is computed whole
// there: its queued work, and a non-streamed answer's prefill time, are
// the other rank's.
func TestPlaceRankMovedComputesWhole(t *testing.T) {
	cfg := route.DefaultConfig()
	cfg.PrefillTokensPerSecond = 1000
	tg := target{Rank: "0", Prefill: 100, Prompt: 4100, PrefillFor: 50 * time.Second}
	r, why := placeRank(cfg, &tg, "", []route.RankLoad{{Serving: 1, Queued: 12000}, {Serving: 1, Queued: 900}})
	if r != 1 || why != "moved" || tg.Rank != "1" || tg.Prefill != 4100 || tg.PrefillFor != 5*time.Second {
		t.Errorf("placed on %d (%s): %+v; want rank 1 moved, 4100 tokens to prefill in 5 s", r, why, tg)
	}
	tg = target{Rank: "0", Prefill: 100, Prompt: 4100}
	if r, why := placeRank(cfg, &tg, "", []route.RankLoad{{}, {}}); r != 0 || why != "pinned" || tg.Prefill != 100 || tg.PrefillFor != 0 {
		t.Errorf("placed on %d (%s): %+v; want the holder 0, 100 tokens, a stream's prefill (until its first byte)", r, why, tg)
	}
}

// A pin to a rank the pod does not run (a digest's false positive on a
// count set above vLLM's, before the sidecar saw vLLM's engines) is no
// pin: the request goes to a rank that exists, never to vLLM's 400.
func TestPlaceRankOutOfRangePin(t *testing.T) {
	tg := target{Rank: "3", Prefill: 10, Prompt: 4000}
	r, why := placeRank(route.DefaultConfig(), &tg, "", []route.RankLoad{{Serving: 2}, {}})
	if r != 1 || why != "balanced" || tg.Rank != "1" {
		t.Errorf("placed on %d (%s), header %q; want rank 1 balanced", r, why, tg.Rank)
	}
}
