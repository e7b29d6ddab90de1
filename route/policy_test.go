package route

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/blockkey"
)

func withDigest(p PeerView, s keySet) PeerView {
	p.Digest, p.DigestAt = s, t0
	return p
}

// TestPolicies checks each policy's choice and reason. Peers a..d: see each case.
func TestPolicies(t *testing.T) {
	prompt := keysN(1, 20)
	other := append([]blockkey.Key{1}, keysN(500, 19)...) // shares key 1 only
	cfg := DefaultConfig()
	cfg.MinMatchFraction = 0 // rendezvous on the 4th key, as the pinned weights assume
	r := NewRecent(DefaultRecentConfig())
	r.Record("c", keysN(1, 15), t0.Add(-time.Second))

	base := []PeerView{
		withDigest(fresh("a", Load{Running: 1}), holds(keysN(1, 5))),
		withDigest(fresh("b", Load{Running: 1}), holds(keysN(1, 10))),
		fresh("c", Load{Running: 1}),
		fresh("d", Load{Running: 1}),
	}
	set := func(ps []PeerView, i int, f func(*PeerView)) []PeerView {
		ps = slices.Clone(ps)
		f(&ps[i])
		return ps
	}
	tests := []struct {
		name       string
		p          Policy
		req        Request
		peers      []PeerView
		wantTarget string
		wantReason string
	}{
		{"affinity longest digest match", Affinity{Config: cfg}, Request{Keys: prompt}, base, "b", ReasonAffinity},
		{"affinity recent beats digest", Affinity{Config: cfg, Recent: r}, Request{Keys: prompt}, base, "c", ReasonAffinity},
		{"affinity nil recent", Affinity{Config: cfg, Recent: nil}, Request{Keys: prompt}, base, "b", ReasonAffinity},
		{"affinity holder over bound", Affinity{Config: cfg}, Request{Keys: prompt},
			set(base, 1, func(p *PeerView) { p.Load.Running = 30 }), "a", ReasonAffinity},
		{"affinity other scheme matches nothing", Affinity{Config: cfg}, Request{Keys: prompt},
			set(base, 1, func(p *PeerView) { p.KeyScheme = 99 }), "a", ReasonAffinity},
		{"affinity declines one-key match", Affinity{Config: cfg}, Request{Keys: other}, base, "", ReasonNone},
		{"affinity no peers", Affinity{Config: cfg}, Request{Keys: prompt}, nil, "", ReasonNone},
		{"rendezvous places new prefix", Rendezvous{Config: cfg}, Request{Keys: other}, base, "d", ReasonRendezvous},
		{"rendezvous skips peer over bound", Rendezvous{Config: cfg}, Request{Keys: other},
			set(base, 3, func(p *PeerView) { p.Load.Waiting = 30 }), "c", ReasonRendezvous},
		{"rendezvous declines without keys", Rendezvous{Config: cfg}, Request{}, base, "", ReasonNone},
		{"least load", LeastLoad{Config: cfg}, Request{Keys: prompt},
			set(base, 0, func(p *PeerView) { p.Load.Running = 0 }), "a", ReasonLeastLoad},
		{"least load ignores cache", LeastLoad{Config: cfg}, Request{Keys: prompt},
			set(base, 3, func(p *PeerView) { p.Load.Running = 0 }), "d", ReasonLeastLoad},
		{"least load tie by weight", LeastLoad{Config: cfg}, Request{Keys: prompt}, base, "a", ReasonLeastLoad},
		{"least load no eligible", LeastLoad{Config: cfg}, Request{},
			set(base[:1], 0, func(p *PeerView) { p.Draining = true }), "", ReasonNone},
		{"chain affinity", DefaultChain(cfg, nil), Request{Keys: prompt}, base, "b", ReasonAffinity},
		{"chain falls to rendezvous", DefaultChain(cfg, nil), Request{Keys: other}, base, "d", ReasonRendezvous},
		{"chain falls to least load", DefaultChain(cfg, nil), Request{},
			set(base, 2, func(p *PeerView) { p.Load.Running = 0 }), "c", ReasonLeastLoad},
		{"empty chain", Chain{}, Request{Keys: prompt}, base, "", ReasonNone},
		{"affinity-only chain declines", Chain{Affinity{Config: cfg}}, Request{Keys: other}, base, "", ReasonNone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.p.Choose(tt.req, tt.peers, t0)
			if d.Target != tt.wantTarget || d.Reason != tt.wantReason {
				t.Errorf("Choose = %q (%s); want %q (%s)\n%s", d.Target, d.Reason, tt.wantTarget, tt.wantReason, d.Table())
			}
			chosen := 0
			for _, c := range d.Candidates {
				if c.Chosen {
					chosen++
					if c.ID != d.Target {
						t.Errorf("chosen candidate %q; Target %q", c.ID, d.Target)
					}
				}
			}
			if want := map[bool]int{true: 1, false: 0}[d.Target != ""]; chosen != want {
				t.Errorf("%d chosen candidates; want %d", chosen, want)
			}
		})
	}
}

// TestChainExplains checks that a rendezvous decision still shows what
// affinity matched, and why affinity declined.
func TestChainExplains(t *testing.T) {
	peers := []PeerView{
		withDigest(fresh("a", Load{}), holds(keysN(1, 1))),
		fresh("b", Load{}),
	}
	d := DefaultChain(DefaultConfig(), nil).Choose(Request{Keys: keysN(1, 8), TokensPerKey: 64}, peers, t0)
	if d.Reason != ReasonRendezvous {
		t.Fatalf("Reason = %s; want rendezvous\n%s", d.Reason, d.Table())
	}
	if got := d.Candidates[0]; got.MatchedKeys != 1 || got.MatchedTokens != 64 {
		t.Errorf("candidate a matched %d keys, %d tokens; want 1, 64", got.MatchedKeys, got.MatchedTokens)
	}
	if got := d.Candidates[1].Note; got != "no digest" {
		t.Errorf("candidate b note %q; want %q", got, "no digest")
	}
	if !strings.HasPrefix(d.Note, "affinity: ") {
		t.Errorf("Note = %q; want affinity's reason to decline", d.Note)
	}
}

func TestDecisionLocal(t *testing.T) {
	local := withDigest(fresh("me", Load{}), holds(keysN(1, 8)))
	local.Local = true
	d := DefaultChain(DefaultConfig(), nil).Choose(Request{Keys: keysN(1, 8)}, []PeerView{fresh("x", Load{}), local}, t0)
	if d.Target != "me" || !d.Local {
		t.Errorf("Choose = %q local %v; want me local true", d.Target, d.Local)
	}
}

// TestTokensPerKey checks the saving is counted in the request's units.
func TestTokensPerKey(t *testing.T) {
	peers := []PeerView{withDigest(fresh("a", Load{}), holds(keysN(1, 4)))}
	tests := []struct {
		name string
		req  Request
		want int
	}{
		{"16 per key", Request{Keys: keysN(1, 8), TokensPerKey: 16}, 64},
		{"64 per key", Request{Keys: keysN(1, 8), TokensPerKey: 64}, 256},
		{"unset means 16", Request{Keys: keysN(1, 8)}, 64},
		{"capped by prompt", Request{Keys: keysN(1, 8), TokensPerKey: 64, PromptTokens: 100}, 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Affinity{Config: DefaultConfig()}.Choose(tt.req, peers, t0)
			if got := d.Candidates[0].MatchedTokens; got != tt.want {
				t.Errorf("MatchedTokens = %d; want %d", got, tt.want)
			}
		})
	}
}

// randomCluster builds n peers with random digests, loads and faults.
func randomCluster(rng *rand.Rand, n int, prompt []blockkey.Key) []PeerView {
	peers := make([]PeerView, n)
	for i := range peers {
		p := fresh("pod-"+string(rune('a'+i%26))+string(rune('a'+i/26)), Load{
			Running: rng.IntN(20), Waiting: rng.IntN(5), InFlight: rng.IntN(5),
			KVUsage: rng.Float64(), QueuedPrefillTokens: rng.IntN(10000),
		})
		switch rng.IntN(10) {
		case 0:
			p.Draining = true
		case 1:
			p.LastFailure = t0.Add(-time.Duration(rng.IntN(20)) * time.Second)
		case 2:
			p.LoadAt = time.Time{}
		case 3:
			p.KeyScheme = 2
		case 4:
			p.Models = []string{"other"}
		}
		if rng.IntN(4) > 0 {
			p = withDigest(p, holds(prompt[:rng.IntN(len(prompt)+1)]))
		}
		peers[i] = p
	}
	return peers
}

// TestSidecarsAgree is the property behind rendezvous: independent
// sidecars that see the same cluster choose the same pod, whatever order
// their peer tables list it in and whichever pod each of them runs in.
func TestSidecarsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		prompt := keysN(rng.IntN(1000)*100, 1+rng.IntN(40))
		if rng.IntN(5) == 0 {
			prompt = nil
		}
		peers := randomCluster(rng, 1+rng.IntN(12), prompt)
		req := Request{Model: "llama", Keys: prompt, TokensPerKey: 16}
		want := DefaultChain(DefaultConfig(), nil).Choose(req, peers, t0)
		for sidecar := range 8 {
			view := slices.Clone(peers)
			rng.Shuffle(len(view), func(i, j int) { view[i], view[j] = view[j], view[i] })
			for i := range view {
				view[i].Local = i == sidecar%len(view)
			}
			got := DefaultChain(DefaultConfig(), nil).Choose(req, view, t0)
			if got.Target != want.Target || got.Reason != want.Reason {
				t.Fatalf("trial %d sidecar %d: Choose = %q (%s); want %q (%s)\n%s\n%s",
					trial, sidecar, got.Target, got.Reason, want.Target, want.Reason, got.Table(), want.Table())
			}
		}
		// Same inputs, same Decision, to the last field.
		if again := DefaultChain(DefaultConfig(), nil).Choose(req, peers, t0); !cmp.Equal(again, want) {
			t.Fatalf("trial %d: not deterministic: %s", trial, cmp.Diff(want, again))
		}
	}
}

// TestChooseNeverPanics feeds hostile configs and peers: zero and negative
// knobs, NaN usage, empty IDs, duplicate IDs.
func TestChooseNeverPanics(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	cfgs := []Config{{}, DefaultConfig(), {Slack: -1, MinHeadroom: -5, MinMatchKeys: -3, RendezvousKeys: -2, LoadTokens: -1, PrefillTokensPerSecond: -9}}
	for trial := range 300 {
		prompt := keysN(1, rng.IntN(30))
		peers := randomCluster(rng, rng.IntN(6), prompt)
		if len(peers) > 1 {
			peers[1].ID = peers[0].ID
			peers[0].Load.KVUsage = 0 / func() float64 { return 0 }()
		}
		for _, cfg := range cfgs {
			d := DefaultChain(cfg, NewRecent(RecentConfig{})).Choose(Request{Keys: prompt, TokensPerKey: -1}, peers, t0)
			if d.Target == "" && d.Reason != ReasonNone {
				t.Fatalf("trial %d: no target with reason %q", trial, d.Reason)
			}
			_ = d.Table()
		}
	}
}
