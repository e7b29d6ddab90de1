package route

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
)

// promptKeys returns a random n-token prompt's keys at each stride, from
// one chain (blockkey keys every block; a stride keeps some).
func promptKeys(n int, strides ...int) map[int][]blockkey.Key {
	rng := rand.New(rand.NewPCG(7, 7))
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = rng.Uint32N(32000)
	}
	root := blockkey.Root("m", "", "")
	out := map[int][]blockkey.Key{}
	for _, s := range strides {
		out[s] = blockkey.Scheme{BlockSize: 16, Stride: s}.Request(root, tokens)
	}
	return out
}

func digestOf(keys []blockkey.Key) *bloom.Digest {
	return bloom.Build(bloom.Header{Node: "p", KeyScheme: blockkey.Version, Params: bloom.ParamsFor(4096, 0.001)}, keys)
}

func TestStrided(t *testing.T) {
	ks := promptKeys(16*64+1, 1, 4, 8, 16) // 64 blocks: 16 keys at stride 4, 4 at 16
	if len(ks[4]) != 16 || len(ks[16]) != 4 {
		t.Fatalf("%d keys at stride 4, %d at 16; want 16 and 4", len(ks[4]), len(ks[16]))
	}
	for i, k := range ks[16] { // the chain is per block: stride 16's keys are stride 4's every 4th
		if ks[4][4*i+3] != k || ks[1][16*i+15] != k {
			t.Fatalf("stride 16's key %d is not stride 4's key %d and stride 1's %d", i, 4*i+3, 16*i+15)
		}
	}
	tests := []struct {
		name      string
		held      []blockkey.Key // the peer's digest: its own keys of the prefix it holds
		peer, own int
		probe     []blockkey.Key
		want      int
	}{
		{"coarser peer holds 3 of its 4 keys: 12 of ours", ks[16][:3], 16, 4, ks[4], 12},
		{"coarser peer, whole prompt", ks[16], 16, 4, ks[4], 16},
		{"coarser peer, prompt shorter than its key", ks[16], 16, 4, ks[4][:3], 0},
		{"coarser peer, per block", ks[16][:2], 16, 1, ks[1], 32},
		{"finer peer holds all our keys", ks[4][:10], 4, 16, ks[16], 2},
		{"same stride", ks[8][:5], 8, 8, ks[8], 5},
		{"stride not said: ours", ks[4][:7], 0, 4, ks[4], 7},
		{"neither divides the other", ks[8], 8, 12, ks[8], 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := Strided(digestOf(tt.held), tt.peer, tt.own)
			if got := m.PrefixLen(tt.probe); got != tt.want {
				t.Errorf("PrefixLen = %d; want %d", got, tt.want)
			}
		})
	}
	if Strided(nil, 16, 4) != nil {
		t.Errorf("Strided(nil) is not nil: a peer without a digest would look as if it had one")
	}
}

// TestStridedTiers checks a coarser peer's ranks and lower tiers read in
// our keys.
func TestStridedTiers(t *testing.T) {
	ks := promptKeys(16*128+1, 4, 16) // 8 keys at stride 16
	held := hold(nil, ks[16][:2], place{tier: bloom.TierGPU, rank: 1})
	held = hold(held, ks[16], place{tier: bloom.TierCPU, rank: 1}) // its 4th and 8th keys, at the tier's stride: its keys 2 to 7
	tm, ok := Strided(tieredDigest(2, held), 16, 4).(TierMatcher)
	if !ok {
		t.Fatalf("Strided of a TierMatcher is not one")
	}
	if tm.Ranks() != 2 {
		t.Errorf("Ranks = %d; want 2", tm.Ranks())
	}
	if g, c, d := tm.TierPrefix(ks[4], 1); g != 8 || c != 24 || d != 0 {
		t.Errorf("rank 1 holds gpu %d, cpu %d, disk %d of our keys; want 8, 24, 0", g, c, d)
	}
	if g, c, _ := tm.TierPrefix(ks[4], 0); g != 0 || c != 0 {
		t.Errorf("rank 0 holds gpu %d, cpu %d; want none", g, c)
	}
}

// TestChooseCoarserPeer checks the whole choice sees a coarser peer's
// match in our tokens: it goes to the peer holding the longest prefix,
// whatever its stride.
func TestChooseCoarserPeer(t *testing.T) {
	ks := promptKeys(16*64+1, 4, 16)
	now := time.Unix(1_800_000_000, 0)
	views := []PeerView{
		{ID: "a", Addr: "a:1", Local: true, KeyScheme: blockkey.Version, Digest: digestOf(ks[4][:4]), DigestAt: now, LoadAt: now},
		{ID: "b", Addr: "b:1", KeyScheme: blockkey.Version, Digest: Strided(digestOf(ks[16][:3]), 16, 4), DigestAt: now, LoadAt: now},
	}
	req := Request{Keys: ks[4], TokensPerKey: 64, PromptTokens: 16*64 + 1}
	d := DefaultChain(DefaultConfig(), nil).Choose(req, views, now)
	if d.Target != "b" {
		t.Fatalf("chose %s (%s); want b, which holds 768 tokens against a's 256", d.Target, d.Reason)
	}
	for _, c := range d.Candidates {
		if want := map[string]int{"a": 256, "b": 768}[c.ID]; c.MatchedTokens != want {
			t.Errorf("%s matched %d tokens; want %d", c.ID, c.MatchedTokens, want)
		}
	}
}
