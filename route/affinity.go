package route

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Affinity sends a request to the peer that saves the most prefill tokens,
// among eligible peers within the load bound. It scores a peer by
//
//	MatchedTokens - LoadTokens*Load
//
// and declines (no target) when the top-scoring peer matches fewer than
// MinMatchKeys keys, so a Chain moves on to Rendezvous. Recent, if set,
// adds this sidecar's own recent forwards to the peers' digests.
type Affinity struct {
	Config Config
	Recent *Recent
}

// Choose implements Policy.
func (p Affinity) Choose(req Request, peers []PeerView, now time.Time) Decision {
	a := assess(p.Config, req, peers, now)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	tpk := req.TokensPerKey
	if tpk < 1 {
		tpk = DefaultTokensPerKey
	}
	cs := a.d.Candidates
	for i, pv := range peers {
		c := &cs[i]
		if !c.Eligible {
			continue
		}
		n, tag := matchPeer(pv, req.Keys, now, p.Config.DigestTTL, p.Recent)
		c.Note = addTag(c.Note, tag)
		c.MatchedKeys = n
		c.MatchedTokens = n * tpk
		if req.PromptTokens > 0 {
			c.MatchedTokens = min(c.MatchedTokens, req.PromptTokens)
		}
		if a.inBound(i) {
			c.Scored = true
			c.Score = float64(c.MatchedTokens) - p.Config.LoadTokens*c.Load
		}
	}
	rk, _ := rendezvousKey(p.Config, req.Keys)
	best := -1
	for i := range cs {
		if cs[i].Scored && (best < 0 || better(cs, rk, i, best)) {
			best = i
		}
	}
	if best < 0 {
		return a.decline("affinity: no peer within the bound")
	}
	if need := max(p.Config.MinMatchKeys, 1); cs[best].MatchedKeys < need {
		return a.decline(fmt.Sprintf("affinity: best %s matches %s < %d",
			cs[best].ID, plural(cs[best].MatchedKeys, "key"), need))
	}
	return a.choose(best, ReasonAffinity)
}

// matchPeer returns how many leading keys pv holds, by its digest or by
// r's recent forwards, and a note on where the answer came from.
func matchPeer(pv PeerView, keys []blockkey.Key, now time.Time, digestTTL time.Duration, r *Recent) (int, string) {
	if pv.KeyScheme != blockkey.Version {
		return 0, fmt.Sprintf("scheme %d", pv.KeyScheme)
	}
	var n int
	var tag string
	switch {
	case pv.Digest == nil:
		tag = "no digest"
	case digestTTL > 0 && now.Sub(pv.DigestAt) > digestTTL:
		tag = "stale digest"
	default:
		n = pv.Digest.PrefixLen(keys)
	}
	if m := r.PrefixLen(pv.ID, keys, now); m > n {
		return m, addTag(tag, "recent")
	}
	return n, tag
}
