package route

import (
	"strings"
	"testing"
)

// TestSavedWeighsRequestsWaiting: under queues a holder keeps its
// prefix's requests where the request's own wait alone would send them
// to compute it again elsewhere, and a burst waiting at the holder
// counts as the cluster's queue, not the holder's alone.
func TestSavedWeighsRequestsWaiting(t *testing.T) {
	cfg := DefaultConfig()
	keys := keysN(1, 275) // 4400 tokens at 16 a key
	prefix := keys[:250]  // the holder's 4000-token system prompt
	req := Request{Keys: keys, TokensPerKey: 16, PromptTokens: 4400}
	peers := func(holderWaiting, otherWaiting int) []PeerView {
		h := fresh("holder", Load{Fronted: true, Serving: 6, QueuedPrefillTokens: 12000, Prefilling: holderWaiting})
		h.Digest = holds(prefix)
		o := fresh("other", Load{Fronted: true, Serving: 4, QueuedPrefillTokens: 2000, Prefilling: otherWaiting})
		o.Digest = holds()
		return []PeerView{h, o}
	}
	for _, tt := range []struct {
		name          string
		holder, other int
		want          string
		note          string
	}{
		// 4000 saved against 0.5 × 10000 more queued: the request's own
		// wait is shorter at the other pod.
		{"nothing waits", 0, 0, "other", ""},
		// 4 waiting a pod: a saved token weighs 3.
		{"queues", 6, 2, "holder", "saved tokens weigh 3.00"},
		{"a burst at the holder", 6, 0, "holder", "saved tokens weigh 2.50"},
	} {
		d := Affinity{Config: cfg}.Choose(req, peers(tt.holder, tt.other), t0)
		if d.Target != tt.want || !strings.Contains(d.Note, tt.note) {
			t.Errorf("%s: chose %q, note %q; want %q, %q\n%s", tt.name, d.Target, d.Note, tt.want, tt.note, d.Table())
		}
		if tt.holder > 0 && !strings.Contains(d.Table(), "6 requests ahead") {
			t.Errorf("%s: the table does not show the requests ahead\n%s", tt.name, d.Table())
		}
	}
	// Requests alone (QueuedWeight 0): waiting requests weigh nothing.
	cfg.QueuedWeight = 0
	a, b := Affinity{Config: cfg}.Choose(req, peers(0, 0), t0), Affinity{Config: cfg}.Choose(req, peers(6, 2), t0)
	if a.Target != b.Target || a.Candidates[0].Score != b.Candidates[0].Score {
		t.Errorf("QueuedWeight 0: waiting requests changed the choice\n%s\n%s", a.Table(), b.Table())
	}
}
