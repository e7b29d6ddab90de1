package route

import (
	"math"
	"testing"
)

func TestWork(t *testing.T) {
	var w Work
	if got := w.LoadTokens(); got != 0 {
		t.Fatalf("empty Work.LoadTokens() = %v; want 0", got)
	}
	w.Observe(1000, 200) // 800 uncached
	w.Observe(1000, 1000)
	w.Observe(100, 500) // more cached than prompt: 0, never negative
	if got, want := w.LoadTokens(), 800.0/3/2; math.Abs(got-want) > 1e-9 {
		t.Errorf("LoadTokens() = %v; want %v (plain mean while under the window)", got, want)
	}
	for range 10 * workWindow {
		w.Observe(5000, 0)
	}
	if got := w.LoadTokens(); math.Abs(got-2500) > 1 {
		t.Errorf("LoadTokens() after a long run of 5000 = %v; want ≈2500 (old samples forgotten)", got)
	}
}

// TestAffinitySpillsWhenQueueCostsMore: with a price of one queued request
// above what the holder saves, the lighter peer wins and the decision says why.
func TestAffinitySpillsWhenQueueCostsMore(t *testing.T) {
	keys := keysN(1, 40)
	holder, idle := fresh("holder", Load{Running: 3}), fresh("idle", Load{})
	holder.Digest, idle.Digest = holds(keys), holds(keys[:2])
	peers := []PeerView{holder, idle}
	req := Request{Keys: keys, TokensPerKey: 16, PromptTokens: 12000}
	cfg := DefaultConfig()
	if d := (Affinity{Config: cfg}).Choose(req, peers, t0); d.Target != "holder" {
		t.Fatalf("cheap load: Choose = %s (%s); want holder", d.Target, d.Note)
	}
	req.LoadTokens = 11000
	d := (Affinity{Config: cfg}).Choose(req, peers, t0)
	if d.Target != "idle" || d.Reason != ReasonAffinity || d.Expected() != 32 {
		t.Errorf("expensive load: Choose = %s %s expected %d (%s); want idle, affinity, 32", d.Target, d.Reason, d.Expected(), d.Note)
	}
}
