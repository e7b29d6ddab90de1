package route_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// BenchmarkChooseBloom measures the whole choice against real Bloom digests
// (100k-key capacity at 1%): every peer holds a shared 256-token system
// prompt and 20k other keys; one peer holds 75% of the prompt. Stride 4 is
// the one-key-per-64-tokens granularity. grouped: the peers' digests come
// from a bloom.Transposed, as the peer table hands them out.
func BenchmarkChooseBloom(b *testing.B) {
	for _, peers := range []int{8, 64, 256, 1000} {
		for _, tokens := range []int{1024, 32768} {
			for _, stride := range []int{1, 4} {
				b.Run(fmt.Sprintf("peers=%d/tokens=%d/stride=%d", peers, tokens, stride), func(b *testing.B) {
					benchChooseBloom(b, peers, tokens, stride, false)
				})
			}
			b.Run(fmt.Sprintf("peers=%d/tokens=%d/stride=4-grouped", peers, tokens), func(b *testing.B) {
				benchChooseBloom(b, peers, tokens, 4, true)
			})
			b.Run(fmt.Sprintf("peers=%d/tokens=%d/stride=4-grouped-recent", peers, tokens), func(b *testing.B) {
				benchChooseBloomRecent(b, peers, tokens, 4, true)
			})
			if peers >= route.ShortlistMin {
				b.Run(fmt.Sprintf("peers=%d/tokens=%d/stride=4-shortlist-recent", peers, tokens), func(b *testing.B) {
					chooseBloom(b, peers, tokens, 4, true, true, true)
				})
			}
		}
	}
}

func benchChooseBloom(b *testing.B, npeers, ntokens, stride int, grouped bool) {
	chooseBloom(b, npeers, ntokens, stride, grouped, false, false)
}

// benchChooseBloomRecent is benchChooseBloom with a sidecar's Recent, as
// the front has one: this sidecar sent other prompts to 16 peers within
// its TTL.
func benchChooseBloomRecent(b *testing.B, npeers, ntokens, stride int, grouped bool) {
	chooseBloom(b, npeers, ntokens, stride, grouped, true, false)
}

// chooseBloom is BenchmarkChooseBloom's choice; short: on a Shortlist
// of the peers' briefs, the Shortlist's making timed with the choice.
func chooseBloom(b *testing.B, npeers, ntokens, stride int, grouped, recent, short bool) {
	rng := rand.New(rand.NewPCG(1, 2))
	scheme := blockkey.Scheme{BlockSize: 16, Stride: stride}
	tokens := make([]uint32, ntokens)
	for i := range tokens {
		tokens[i] = rng.Uint32N(32000)
	}
	keys := scheme.Request(blockkey.Root("m", "", ""), tokens)
	system := keys[:max(1, 256/scheme.TokensPerKey())]
	params := bloom.ParamsFor(100_000/stride, 0.01)
	now := time.Unix(1_800_000_000, 0)
	views := make([]route.PeerView, npeers)
	for i := range views {
		held := make([]blockkey.Key, 0, 20_000/stride+len(keys))
		held = append(held, system...)
		if i == npeers/2 {
			held = append(held, keys[:len(keys)*3/4]...)
		}
		for range 20_000 / stride {
			held = append(held, blockkey.Key(rng.Uint64()))
		}
		id := fmt.Sprintf("pod-%03d", i)
		views[i] = route.PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
			Digest: bloom.Build(bloom.Header{Node: id, Params: params}, held), DigestAt: now,
			Load: route.Load{Running: i % 3}, LoadAt: now}
	}
	var g *bloom.Transposed
	if grouped {
		g = bloom.NewTransposed()
		for i := range views {
			d := views[i].Digest.(*bloom.Digest)
			slot, stamp := g.Put(-1, d)
			views[i].Digest = &route.Member{TierMatcher: d, G: g, Slot: slot, Stamp: stamp}
		}
	}
	var r *route.Recent
	if recent {
		r = route.NewRecent(route.DefaultRecentConfig())
		for i := range min(16, npeers) {
			other := make([]blockkey.Key, 64)
			for j := range other {
				other[j] = blockkey.Key(rng.Uint64())
			}
			r.Record(views[i*npeers/16].ID, other, now)
		}
	}
	cfg := route.DefaultConfig()
	policy := route.DefaultChain(cfg, r)
	req := route.Request{Keys: keys, TokensPerKey: scheme.TokensPerKey(), PromptTokens: ntokens}
	briefs := make([]route.Brief, len(views))
	for i := range views {
		briefs[i] = route.BriefOf(&views[i])
	}
	view := func(i int, v *route.PeerView) { *v = views[i] }
	var buf []route.PeerView
	// The thousand digests just built are 60 MB of garbage's worth of
	// marking: collected now, not by the choices timed (a sidecar's
	// digests arrive one at a time).
	runtime.GC()
	b.ResetTimer()
	var d route.Decision
	var took []float64 // µs per choice: the p50 and p99 the scale targets name
	for b.Loop() {
		t0 := time.Now()
		if short {
			q := req
			sl := route.GetShortlist()
			var ok bool
			if buf, ok = sl.Make(&cfg, &q, briefs, g, nil, r, nil, now, view, buf); !ok {
				b.Fatal("no shortlist")
			}
			d = policy.Choose(q, buf, now)
			route.PutShortlist(sl)
		} else {
			d = policy.Choose(req, views, now)
		}
		took = append(took, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	if short {
		b.ReportMetric(float64(len(buf)), "views-read")
	}
	slices.Sort(took)
	b.ReportMetric(took[len(took)/2], "p50-µs")
	b.ReportMetric(took[len(took)*99/100], "p99-µs")
	if d.Target != views[npeers/2].ID {
		b.Fatalf("chose %s (%s); want the holder %s", d.Target, d.Reason, views[npeers/2].ID)
	}
}

// BenchmarkChooseCold is BenchmarkChooseBloom's choice for a prompt no peer
// holds beyond the shared system prompt: Affinity declines and the chain
// goes on to Rendezvous, each policy assessing every peer again.
func BenchmarkChooseCold(b *testing.B) {
	for _, peers := range []int{64, 1000} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			benchChooseCold(b, peers)
		})
	}
}

func benchChooseCold(b *testing.B, npeers int) {
	rng := rand.New(rand.NewPCG(3, 4))
	scheme := blockkey.Scheme{BlockSize: 16, Stride: 4}
	tokens := make([]uint32, 32768)
	for i := range tokens {
		tokens[i] = rng.Uint32N(32000)
	}
	keys := scheme.Request(blockkey.Root("m", "", ""), tokens)
	params := bloom.ParamsFor(100_000/4, 0.01)
	now := time.Unix(1_800_000_000, 0)
	g := bloom.NewTransposed()
	views := make([]route.PeerView, npeers)
	for i := range views {
		held := append([]blockkey.Key{}, keys[:4]...)
		for range 5000 {
			held = append(held, blockkey.Key(rng.Uint64()))
		}
		id := fmt.Sprintf("pod-%03d", i)
		d := bloom.Build(bloom.Header{Node: id, Params: params}, held)
		slot, stamp := g.Put(-1, d)
		views[i] = route.PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
			Digest: &route.Member{TierMatcher: d, G: g, Slot: slot, Stamp: stamp}, DigestAt: now,
			Load: route.Load{Running: i % 3}, LoadAt: now}
	}
	policy := route.DefaultChain(route.DefaultConfig(), nil)
	req := route.Request{Keys: keys, TokensPerKey: scheme.TokensPerKey(), PromptTokens: len(tokens)}
	var d route.Decision
	for b.Loop() {
		d = policy.Choose(req, views, now)
	}
	if d.Reason != route.ReasonRendezvous {
		b.Fatalf("reason %s; want rendezvous", d.Reason)
	}
}

// TestChooseAllocsPerChoice checks that a choice among many grouped
// peers, with a Recent, allocates nothing per peer: among a thousand
// peers as often as among 300, give or take the scratch rows' pool,
// which the race detector empties at random (a run then allocates its
// rows again: 12 against 11 in one make test). An allocation per peer
// would be 700 more. (Below 257 peers the group's scratch, 32 bytes or
// less, is on the stack: fewer allocations.)
func TestChooseAllocsPerChoice(t *testing.T) {
	allocs := func(npeers int) float64 {
		rng := rand.New(rand.NewPCG(11, 12))
		keys := make([]blockkey.Key, 512)
		for i := range keys {
			keys[i] = blockkey.Key(rng.Uint64())
		}
		params := bloom.ParamsFor(2000, 0.01)
		now := time.Unix(1_800_000_000, 0)
		g := bloom.NewTransposed()
		views := make([]route.PeerView, npeers)
		for i := range views {
			held := slices.Clone(keys[:4])
			if i == npeers/2 {
				held = keys[:384]
			}
			id := fmt.Sprintf("pod-%03d", i)
			d := bloom.Build(bloom.Header{Node: id, Params: params}, held)
			slot, stamp := g.Put(-1, d)
			views[i] = route.PeerView{ID: id, Local: i == 0, KeyScheme: blockkey.Version,
				Digest: &route.Member{TierMatcher: d, G: g, Slot: slot, Stamp: stamp}, DigestAt: now,
				Load: route.Load{Running: i % 3}, LoadAt: now}
		}
		r := route.NewRecent(route.DefaultRecentConfig())
		for i := range 16 {
			r.Record(views[i*npeers/16].ID, []blockkey.Key{blockkey.Key(rng.Uint64())}, now)
		}
		policy := route.DefaultChain(route.DefaultConfig(), r)
		req := route.Request{Keys: keys, TokensPerKey: 64, PromptTokens: 64 * len(keys)}
		if d := policy.Choose(req, views, now); d.Target != views[npeers/2].ID {
			t.Fatalf("%d peers: chose %s (%s); want the holder", npeers, d.Target, d.Reason)
		}
		return testing.AllocsPerRun(20, func() { policy.Choose(req, views, now) })
	}
	if few, many := allocs(300), allocs(1000); many > few+2 {
		t.Errorf("a choice allocates %v times among 1000 peers, %v among 300", many, few)
	}
}
