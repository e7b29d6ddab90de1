package route

import (
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
)

// place is where a pod holds one routing key.
type place struct {
	tier uint8
	rank int
}

// tieredDigest is the digest a pod of ranks ranks advertises for held,
// built as cachestate builds it: each key tagged with its place
// (bloom.Tag), the tier marker at stride 4 when any key is on a lower
// tier, a rank marker for each rank above 0.
func tieredDigest(ranks int, held map[blockkey.Key][]place) *bloom.Digest {
	var entries []blockkey.Key
	lower := false
	for k, ps := range held {
		for _, p := range ps {
			entries = append(entries, bloom.Tag(k, p.tier, p.rank))
			lower = lower || p.tier != bloom.TierGPU
		}
	}
	if lower {
		entries = append(entries, bloom.TierMarker(4))
	}
	for r := 1; r < ranks; r++ {
		entries = append(entries, bloom.RankMarker(r))
	}
	return bloom.Build(bloom.Header{Node: "p", KeyScheme: blockkey.Version, Params: bloom.ParamsFor(4096, 0.001)}, entries)
}

// hold marks keys held at p: every key for the GPU, every 4th (the
// lower-tier stride positions 3, 7, ...) for a lower tier.
func hold(held map[blockkey.Key][]place, keys []blockkey.Key, p place) map[blockkey.Key][]place {
	if held == nil {
		held = map[blockkey.Key][]place{}
	}
	for i, k := range keys {
		if p.tier == bloom.TierGPU || (i+1)%4 == 0 {
			held[k] = append(held[k], p)
		}
	}
	return held
}

func TestTierCostRule(t *testing.T) {
	d := DefaultConfig()
	// The simulator's model: 60 µs to compute a token, 2.6 µs to load it.
	wantCPU := 1 - 16667*(float64(32*8*128*2*2)/50e9)
	tests := []struct {
		name           string
		cfg            Config
		gpu, cpu, disk int
		want           float64
	}{
		{"GPU tokens save all their work", d, 1000, 0, 0, 1000},
		{"CPU tokens save all but their load", d, 0, 1000, 0, 1000 * wantCPU},
		{"disk at 5 GB/s", d, 0, 0, 1000, 1000 * (1 - 16667/(5e9/float64(32*8*128*2*2)))},
		{"tier off: no CPU credit", func() Config { c := d; c.CPULoadTokensPerSecond = 0; return c }(), 100, 1000, 0, 100},
		{"no prefill rate: the default's ratio", func() Config { c := d; c.PrefillTokensPerSecond = 0; return c }(), 0, 1000, 0, 1000 * wantCPU},
		{"a load slower than computing costs more than it saves",
			func() Config { c := d; c.CPULoadTokensPerSecond = d.PrefillTokensPerSecond / 2; return c }(), 0, 1000, 0, -1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.cfg.saved(tt.gpu, tt.cpu, tt.disk); math.Abs(got-tt.want) > 1e-6 {
				t.Errorf("saved(%d, %d, %d) = %.3f; want %.3f", tt.gpu, tt.cpu, tt.disk, got, tt.want)
			}
		})
	}
	if c := d.tierCost(d.CPULoadTokensPerSecond); c < 0.03 || c > 0.06 {
		t.Errorf("default CPU cost %.4f of a computed token; want the simulator's 2.6/60 µs ≈ 0.044", c)
	}
}

// A prefix pushed out of b's GPU into its CPU tier is still b's: it beats
// a cold idle pod (which rendezvous would otherwise pick), is reported per
// tier, and its expected TTFT counts the load at the host-to-device rate.
func TestAffinityCreditsCPUTier(t *testing.T) {
	keys := keysN(1, 64) // 1024 tokens
	a, b, c := fresh("a", Load{}), fresh("b", Load{}), fresh("c", Load{})
	a.Digest = tieredDigest(1, nil)
	b.Digest = tieredDigest(1, hold(hold(nil, keys[:8], place{bloom.TierGPU, 0}), keys[8:], place{bloom.TierCPU, 0}))
	c.Digest = tieredDigest(1, nil)
	cfg := DefaultConfig()
	req := Request{Keys: keys, TokensPerKey: 16, PromptTokens: 1024}
	d := DefaultChain(cfg, nil).Choose(req, []PeerView{a, b, c}, t0)
	if d.Target != "b" || d.Reason != ReasonAffinity {
		t.Fatalf("Choose = %s by %s; want b by affinity\n%s", d.Target, d.Reason, d.Table())
	}
	got := d.Candidates[1]
	if got.MatchedTokens != 1024 || got.CPUTokens != 1024-128 || got.DiskTokens != 0 {
		t.Errorf("b matched %d tokens, %d on CPU, %d on disk; want 1024, 896, 0", got.MatchedTokens, got.CPUTokens, got.DiskTokens)
	}
	load := 896 * cfg.PrefillTokensPerSecond / cfg.CPULoadTokensPerSecond
	if want := load / cfg.PrefillTokensPerSecond; math.Abs(got.TTFT-want) > 1e-9 {
		t.Errorf("b's TTFT %.6f s; want the load of 896 tokens, %.6f s", got.TTFT, want)
	}
	if want := 1024 - load; math.Abs(got.Score-want) > 1e-6 {
		t.Errorf("b's score %.3f; want 1024 less the load, %.3f", got.Score, want)
	}
	if tab := d.Table(); !strings.Contains(tab, "cpu 896") {
		t.Errorf("Table lacks the tier breakdown:\n%s", tab)
	}

	// With the tier off (no CPU credit) b's CPU part saves nothing: its
	// 128 GPU tokens alone are 12.5% of the prompt, so the request goes
	// by rendezvous, as it did before tiers.
	off := cfg
	off.CPULoadTokensPerSecond = 0
	b.Digest = tieredDigest(1, hold(nil, keys[:8], place{bloom.TierGPU, 0}))
	d = DefaultChain(off, nil).Choose(req, []PeerView{a, b, c}, t0)
	if d.Reason == ReasonAffinity {
		t.Errorf("GPU-only 12.5%% match chosen by affinity:\n%s", d.Table())
	}
}

// A GPU match outranks the same match on the CPU, and a whole prompt on
// the CPU outranks a quarter of it on a GPU.
func TestAffinityWeighsTiers(t *testing.T) {
	keys := keysN(1, 64)
	req := Request{Keys: keys, TokensPerKey: 16, PromptTokens: 1024}
	tests := []struct {
		name       string
		aHeld      map[blockkey.Key][]place
		bHeld      map[blockkey.Key][]place
		wantTarget string
	}{
		{"GPU beats CPU of the same length",
			hold(nil, keys, place{bloom.TierGPU, 0}),
			hold(hold(nil, keys[:4], place{bloom.TierGPU, 0}), keys[4:], place{bloom.TierCPU, 0}), "a"},
		{"all on CPU beats a quarter on GPU",
			hold(nil, keys[:16], place{bloom.TierGPU, 0}),
			hold(hold(nil, keys[:4], place{bloom.TierGPU, 0}), keys[4:], place{bloom.TierCPU, 0}), "b"},
		{"CPU beats disk of the same length",
			hold(hold(nil, keys[:4], place{bloom.TierGPU, 0}), keys[4:], place{bloom.TierDisk, 0}),
			hold(hold(nil, keys[:4], place{bloom.TierGPU, 0}), keys[4:], place{bloom.TierCPU, 0}), "b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := fresh("a", Load{}), fresh("b", Load{})
			a.Digest, b.Digest = tieredDigest(1, tt.aHeld), tieredDigest(1, tt.bHeld)
			for _, order := range [][]PeerView{{a, b}, {b, a}} {
				if d := (Affinity{Config: DefaultConfig()}).Choose(req, order, t0); d.Target != tt.wantTarget {
					t.Errorf("Choose = %q; want %q\n%s", d.Target, tt.wantTarget, d.Table())
				}
			}
		})
	}
}

// On a pod that advertises two data-parallel ranks the request is pinned
// to the rank that holds its prefix, on the GPU or the CPU; to none when
// both hold it alike, on a pod of one rank, or on a pod that does not
// advertise its count (the digest's markers find the match, but a false
// positive among them must not name a rank vLLM does not run).
func TestAffinityPinsRank(t *testing.T) {
	keys := keysN(1, 32)
	req := Request{Keys: keys, TokensPerKey: 16, PromptTokens: 512}
	tests := []struct {
		name       string
		advertised int // PeerView.Ranks
		markers    int // ranks the digest's markers say
		held       map[blockkey.Key][]place
		wantRank   int
		wantOK     bool
		wantNote   string
	}{
		{"rank 1's GPU", 2, 2, hold(nil, keys, place{bloom.TierGPU, 1}), 1, true, "rank 1/2"},
		{"rank 0's GPU", 2, 2, hold(nil, keys, place{bloom.TierGPU, 0}), 0, true, "rank 0/2"},
		{"rank 1 holds more", 2, 2, hold(hold(nil, keys[:8], place{bloom.TierGPU, 0}), keys, place{bloom.TierGPU, 1}), 1, true, "rank 1/2"},
		{"rank 1's CPU beats rank 0's shorter GPU", 2, 2,
			hold(hold(hold(nil, keys[:8], place{bloom.TierGPU, 0}), keys[:4], place{bloom.TierGPU, 1}), keys[4:], place{bloom.TierCPU, 1}),
			1, true, "gpu 64 cpu 448 rank 1/2"},
		{"both alike: the engine chooses", 2, 2, hold(hold(nil, keys, place{bloom.TierGPU, 0}), keys, place{bloom.TierGPU, 1}), NoRank, false, "rank any/2"},
		{"one rank: no pin", 1, 1, hold(nil, keys, place{bloom.TierGPU, 0}), NoRank, false, ""},
		{"count not advertised: found, not pinned", 0, 2, hold(nil, keys, place{bloom.TierGPU, 1}), 1, false, "rank 1/2 unpinned"},
		{"advertised count without the digest's markers", 2, 1, hold(nil, keys, place{bloom.TierGPU, 1}), 1, true, "rank 1/2"},
		// A rank marker's false positive (rank 2 of a 2-rank pod), with
		// entries that test positive on it: never looked at.
		{"a rank beyond the advertised count", 2, 3,
			hold(hold(nil, keys[:8], place{bloom.TierGPU, 1}), keys, place{bloom.TierGPU, 2}), 1, true, "rank 1/2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fresh("p", Load{})
			p.Digest, p.Ranks = tieredDigest(tt.markers, tt.held), tt.advertised
			q := fresh("q", Load{})
			q.Ranks = 2
			d := DefaultChain(DefaultConfig(), nil).Choose(req, []PeerView{p, q}, t0)
			if d.Target != "p" {
				t.Fatalf("Choose = %q; want p\n%s", d.Target, d.Table())
			}
			rank, ok := d.RankOf("p")
			if rank != tt.wantRank && ok || ok != tt.wantOK {
				t.Errorf("RankOf(p) = %d, %t; want %d, %t\n%s", rank, ok, tt.wantRank, tt.wantOK, d.Table())
			}
			c := d.Candidates[0]
			if c.Rank != tt.wantRank {
				t.Errorf("candidate rank %d; want %d", c.Rank, tt.wantRank)
			}
			if want := 512; tt.name == "a rank beyond the advertised count" {
				if c.MatchedTokens != 128 {
					t.Errorf("candidate matched %d tokens; want rank 1's 128, not the false rank's 512", c.MatchedTokens)
				}
			} else if c.MatchedTokens != want {
				t.Errorf("candidate matched %d tokens; want %d", c.MatchedTokens, want)
			}
			if got := tierNote(c); got != tt.wantNote {
				t.Errorf("tierNote = %q; want %q", got, tt.wantNote)
			}
			if _, ok := d.RankOf("q"); ok {
				t.Error("RankOf(q) pinned a pod with no match")
			}
			if _, ok := d.RankOf(""); ok {
				t.Error("RankOf(local) pinned: no candidate is local")
			}
		})
	}
}

// A one-key match (a Bloom false positive as likely as a shared preamble)
// pins no rank, whichever policy places the request: as it pulls no
// request to a pod (MinMatchKeys), it pulls none off the rank vLLM's own
// balance would pick.
func TestShortMatchPinsNoRank(t *testing.T) {
	keys := keysN(1, 32)
	p, q := fresh("p", Load{}), fresh("q", Load{})
	p.Ranks, q.Ranks = 2, 2
	p.Digest = tieredDigest(2, hold(nil, keys[:1], place{bloom.TierGPU, 1}))
	q.Digest = tieredDigest(2, nil)
	d := DefaultChain(DefaultConfig(), nil).Choose(Request{Keys: keys, TokensPerKey: 16, PromptTokens: 512}, []PeerView{p, q}, t0)
	if d.Reason == ReasonAffinity {
		t.Fatalf("a one-key match chosen by affinity:\n%s", d.Table())
	}
	if c := d.Candidates[0]; c.MatchedKeys != 1 || c.Rank != NoRank || c.Pinned {
		t.Errorf("p: %d keys, rank %d, pinned %t; want 1 key, NoRank, not pinned\n%s", c.MatchedKeys, c.Rank, c.Pinned, d.Table())
	}
	if _, ok := d.RankOf("p"); ok {
		t.Errorf("RankOf(p) pinned a one-key match\n%s", d.Table())
	}
}

// The local pod is pinned as a peer is, by its own advertised count.
func TestAffinityPinsLocalRank(t *testing.T) {
	keys := keysN(1, 32)
	p := fresh("p", Load{})
	p.Local, p.Ranks = true, 2
	p.Digest = tieredDigest(2, hold(nil, keys, place{bloom.TierGPU, 1}))
	d := DefaultChain(DefaultConfig(), nil).Choose(Request{Keys: keys, TokensPerKey: 16, PromptTokens: 512},
		[]PeerView{p, fresh("q", Load{})}, t0)
	if r, ok := d.RankOf(""); !d.Local || r != 1 || !ok {
		t.Errorf("local %t, RankOf(local) = %d, %t; want local rank 1, pinned\n%s", d.Local, r, ok, d.Table())
	}
}

// The match columns sum: the GPU prefix and the lower tiers beyond it.
func TestCandidateTierColumns(t *testing.T) {
	keys := keysN(1, 32)
	p := fresh("p", Load{})
	p.Digest = tieredDigest(1, hold(hold(nil, keys[:8], place{bloom.TierGPU, 0}), keys[8:], place{bloom.TierCPU, 0}))
	d := DefaultChain(DefaultConfig(), nil).Choose(Request{Keys: keys, TokensPerKey: 16, PromptTokens: 512},
		[]PeerView{p, fresh("q", Load{})}, t0)
	c := d.Candidates[0]
	if c.GPUTokens != 128 || c.CPUTokens != 384 || c.DiskTokens != 0 || c.MatchedTokens != 512 {
		t.Errorf("columns gpu %d cpu %d disk %d of %d; want 128, 384, 0 of 512", c.GPUTokens, c.CPUTokens, c.DiskTokens, c.MatchedTokens)
	}
	if got := tierNote(c); got != "gpu 128 cpu 384" {
		t.Errorf("tierNote = %q; want %q", got, "gpu 128 cpu 384")
	}
}

// Recent forwards extend a tiered match on the GPU, keeping its rank.
func TestRecentExtendsTieredMatch(t *testing.T) {
	keys := keysN(1, 32)
	p := fresh("p", Load{})
	p.Digest = tieredDigest(2, hold(hold(nil, keys[:8], place{bloom.TierGPU, 1}), keys[8:], place{bloom.TierCPU, 1}))
	r := NewRecent(DefaultRecentConfig())
	r.Record("p", keys[:16], t0)
	m, tag := newMatcher(new(DefaultConfig()), &Request{Keys: keys}, 16, t0, r).match(&p)
	if m.gpu != 16 || m.cpu != 16 || m.rank != 1 || note(tag, 0) != "recent" {
		t.Errorf("matchPeer = %+v %q; want 16 on GPU, 16 on CPU, rank 1, recent", m, note(tag, 0))
	}
}

// setGPU is setMatch for groupMatch's match: the same row for any prefix,
// key size and prompt, capped or not.
func TestSetGPUIsSetMatch(t *testing.T) {
	for _, ranks := range []int{0, 1} {
		for n := range 40 {
			for _, tpk := range []int{1, 16, 64} {
				for _, prompt := range []int{0, 1, 15, 64, 100, 2000} {
					pv := PeerView{Ranks: ranks}
					m := groupMatch(n, &pv)
					var want, got row
					want.setMatch(&m, tpk, prompt)
					got.setGPU(n, tpk, prompt)
					if got != want {
						t.Fatalf("n %d, tpk %d, prompt %d, ranks %d: setGPU %+v; setMatch %+v", n, tpk, prompt, ranks, got, want)
					}
				}
			}
		}
	}
}
