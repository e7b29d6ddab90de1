package route

import (
	"github.com/kvroute/kvroute/blockkey"
	"testing"
)

// A batch goes to the peer that holds the most of all its prompts
// together, not to the best holder of its first prompt alone.
func TestAffinityBatchSumsPrompts(t *testing.T) {
	now := t0
	first, second, third := keysN(1, 8), keysN(100, 8), keysN(200, 8)
	a := fresh("a", Load{})
	a.Digest = holds(first) // all of the first prompt
	b := fresh("b", Load{})
	b.Digest = holds(first[:6], second, third) // less of the first, all of the others
	req := Request{Keys: first, TokensPerKey: 64, PromptTokens: 3 * 8 * 64}
	pol := Affinity{Config: DefaultConfig()}
	if d := pol.Choose(req, []PeerView{a, b}, now); d.Target != "a" {
		t.Fatalf("single prompt: target %q, want a", d.Target)
	}
	req.Batch = [][]blockkey.Key{second, third}
	d := pol.Choose(req, []PeerView{a, b}, now)
	if d.Target != "b" {
		t.Fatalf("batch: target %q, want b (candidates %+v)", d.Target, d.Candidates)
	}
	if got := d.Candidates[1].MatchedKeys; got != 22 {
		t.Fatalf("b matched %d keys, want 6+8+8", got)
	}
}
