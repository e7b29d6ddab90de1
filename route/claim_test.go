package route

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

func TestClaimsFor(t *testing.T) {
	cfg := DefaultConfig() // rendezvous at max(4th key, 25% of the prompt)
	depths := func(cs []Claim) []int {
		var out []int
		for _, c := range cs {
			out = append(out, c.Keys)
		}
		return out
	}
	for _, tt := range []struct {
		n    int
		want []int
	}{
		{0, nil}, {1, []int{1}}, {4, []int{4}}, {8, []int{4, 6, 8}}, {20, []int{5, 8, 12, 16, 18, 20}},
		{2048, []int{512, 768, 1152, 1728, 2032, 2040, 2044, 2046, 2048}},
		{100, []int{25, 38, 57, 84, 86, 92, 96, 98, 100}}, {101, []int{26, 39, 59, 85, 89, 93, 97, 99, 101}},
		{112, []int{28, 42, 63, 95, 96, 104, 108, 110, 112}}, // agent fan-out's calls
	} {
		keys := keysN(1, tt.n)
		cs := ClaimsFor(cfg, keys, 0)
		if got := depths(cs); !slices.Equal(got, tt.want) {
			t.Errorf("ClaimsFor(%d keys) depths %v; want %v", tt.n, got, tt.want)
		}
		// What the target holds already is no news: only deeper claims.
		for held := 0; held <= tt.n+1; held++ {
			var want []int
			for _, d := range tt.want {
				if d > held {
					want = append(want, d)
				}
			}
			if got := depths(ClaimsFor(cfg, keys, held)); !slices.Equal(got, want) {
				t.Errorf("ClaimsFor(%d keys, %d held) depths %v; want %v", tt.n, held, got, want)
			}
		}
		for _, c := range cs {
			if c.Key != keys[c.Keys-1] {
				t.Errorf("claim at depth %d has key %d; want %d", c.Keys, c.Key, keys[c.Keys-1])
			}
		}
	}
}

// TestClaimsKeepSharedPrefix checks what a burst's other request, which
// shares the first s of the claimed prompt's n keys, matches of the claims:
// at least two thirds of s (the checkpoints spaced by half again), and all
// of s but as much again as its own end when that end is 16 keys or less
// (an agent's parallel calls, which differ in their last few hundred
// tokens); nothing when s is short of the rendezvous depth.
func TestClaimsKeepSharedPrefix(t *testing.T) {
	cfg := DefaultConfig()
	for n := 1; n <= 600; n++ {
		keys := keysN(1, n)
		claims := ClaimsFor(cfg, keys, 0)
		if len(claims) > 10 {
			t.Errorf("%d keys: %d claims; want at most 10", n, len(claims))
		}
		for i := range claims {
			claims[i].At = t0
		}
		depth := RendezvousDepth(cfg, n)
		for s := 1; s <= n; s++ {
			other := slices.Concat(keys[:s], keysN(1_000_000, n-s)) // its own end: n-s keys
			got := claimedLen(claims, other, t0, time.Second)
			want := 0
			if s >= depth {
				want = max(depth, (2*s+2)/3)
				if n-s <= 1<<tailClaims {
					want = max(want, s-(n-s))
				}
			}
			if got < want || got > s {
				t.Fatalf("%d keys, %d shared: claimed %d; want %d to %d (claims %v)", n, s, got, want, s, claims)
			}
		}
	}
}

func TestClaimedLen(t *testing.T) {
	keys := keysN(1, 20)
	claims := []Claim{
		{Key: keys[4], Keys: 5, At: t0},
		{Key: keys[9], Keys: 10, At: t0.Add(-10 * time.Second)}, // expired
		{Key: 999, Keys: 20, At: t0},                            // another prompt's tail
		{Key: keys[3], Keys: 40, At: t0},                        // deeper than the request
	}
	if got := claimedLen(claims, keys, t0, 5*time.Second); got != 5 {
		t.Errorf("claimedLen = %d; want 5", got)
	}
	if got := claimedLen(claims, keys, t0, 0); got != 10 {
		t.Errorf("claimedLen without TTL = %d; want 10", got)
	}
	if got := claimedLen(claims, keys[:4], t0, 5*time.Second); got != 0 {
		t.Errorf("claimedLen of a shorter request = %d; want 0", got)
	}
	// A claim the mesh carried holds its key's tag alone; a key that
	// differs from the request's above the tag's 32 bits still matches,
	// one that differs within them does not.
	wide := make([]blockkey.Key, len(keys))
	for i, k := range keys {
		wide[i] = k | blockkey.Key(i+1)<<40
	}
	tagged := []Claim{
		{Key: blockkey.Key(ClaimTag(wide[6])), Keys: 7, At: t0},
		{Key: wide[11] ^ 1<<40, Keys: 12, At: t0},
		{Key: wide[14] ^ 1, Keys: 15, At: t0},
	}
	if got := claimedLen(tagged, wide, t0, time.Second); got != 12 {
		t.Errorf("claimedLen by tags = %d; want 12", got)
	}
}

// TestClaimPullsBurst checks a claim makes Affinity follow the first
// request of a new prefix while the claimed tokens outweigh the claimant's
// extra load, and lets the load win when they do not.
func TestClaimPullsBurst(t *testing.T) {
	cfg := DefaultConfig()
	keys := keysN(100, 64) // 64 keys of 64 tokens: 4096 tokens
	claims := ClaimsFor(cfg, keys, 0)
	for i := range claims {
		claims[i].At = t0
	}
	peers := func(claimantLoad int) []PeerView {
		a := fresh("a", Load{Serving: claimantLoad, Fronted: true})
		a.Claims = claims
		return []PeerView{a, fresh("b", Load{Fronted: true}), fresh("c", Load{Fronted: true})}
	}
	req := Request{Keys: slices.Concat(keys[:32], keysN(900, 32)), TokensPerKey: 64, PromptTokens: 4096}
	// Shares 32 keys (2048 tokens) with the claimed prompt: claimed at 16
	// keys (1024 tokens), worth 16 requests of load at 64 tokens each.
	if d := DefaultChain(cfg, nil).Choose(req, peers(3), t0); d.Target != "a" || d.Reason != ReasonAffinity {
		t.Errorf("claimant 3 busier: chose %s (%s); want a by affinity\n%s", d.Target, d.Reason, d.Table())
	}
	short := Request{Keys: keys[:16:16], TokensPerKey: 4, PromptTokens: 64} // a tiny prefix is not worth a queue
	p := peers(3)
	p[0].Claims = ClaimsFor(cfg, short.Keys, 0)
	for i := range p[0].Claims {
		p[0].Claims[i].At = t0
	}
	if d := DefaultChain(cfg, nil).Choose(short, p, t0); d.Target == "a" {
		t.Errorf("short claimed prefix on a 3-busier pod: chose a\n%s", d.Table())
	}
	cfg.ClaimTTL = 0
	if d := DefaultChain(cfg, nil).Choose(req, peers(3), t0); d.Reason == ReasonAffinity {
		t.Errorf("claims off: reason %s; want no affinity\n%s", d.Reason, d.Table())
	}
}

func TestHeldAt(t *testing.T) {
	d := Decision{Candidates: []Candidate{{ID: "a", Local: true, MatchedKeys: 3}, {ID: "b", MatchedKeys: 5}}}
	for id, want := range map[string]int{"b": 5, "a": 3, "": 3, "x": 0} {
		if got := d.HeldAt(id); got != want {
			t.Errorf("HeldAt(%q) = %d; want %d", id, got, want)
		}
	}
}
