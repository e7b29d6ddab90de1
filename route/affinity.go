package route

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Affinity sends a request to the peer where it gets its first token
// soonest, among eligible peers within the load bound: the peer that saves
// the most prefill tokens net of the work queued ahead of it. It scores a
// peer by
//
//	MatchedTokens - QueuedWeight*Queued - LoadTokens*Load
//
// (the tokens it spares the request and the requests queued behind it,
// less what it waits for there; see QueuedWeight) and picks the best
// score, even a peer that holds less when the holder is that much busier. It declines (no target) when no peer within the bound
// matches MinMatchKeys keys or MinMatchFraction of the prompt: a prefix
// nobody holds, or one too short to matter (every request of the Mooncake
// conversation trace shares its first 512 tokens), goes to Rendezvous,
// which balances. Recent, if set, adds this sidecar's own recent forwards
// to the peers' digests.
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
	held := -1 // a scored peer with the longest match
	for i, pv := range peers {
		c := &cs[i]
		if !c.Eligible {
			continue
		}
		n, tag := matchPeer(pv, req.Keys, now, p.Config, p.Recent)
		for _, ks := range req.Batch {
			m, _ := matchPeer(pv, ks, now, p.Config, p.Recent)
			n += m
		}
		c.Note = addTag(c.Note, tag)
		c.MatchedKeys = n
		c.MatchedTokens = n * tpk
		if req.PromptTokens > 0 {
			c.MatchedTokens = min(c.MatchedTokens, req.PromptTokens)
		}
		if a.inBound(i) {
			c.Scored = true
			c.Score = float64(c.MatchedTokens) - wait(p.Config, c, p.Config.LoadTokens)
			if held < 0 || c.MatchedKeys > cs[held].MatchedKeys {
				held = i
			}
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
	if need := max(p.Config.MinMatchKeys, 1); cs[held].MatchedKeys < need {
		return a.decline(fmt.Sprintf("affinity: longest match %s at %s < %d",
			plural(cs[held].MatchedKeys, "key"), cs[held].ID, need))
	}
	if f := p.Config.MinMatchFraction; req.PromptTokens > 0 && float64(cs[held].MatchedTokens) < f*float64(req.PromptTokens) {
		return a.decline(fmt.Sprintf("affinity: longest match %d of %d tokens at %s < %.0f%%",
			cs[held].MatchedTokens, req.PromptTokens, cs[held].ID, 100*f))
	}
	d := a.choose(best, ReasonAffinity)
	if best != held && cs[best].MatchedKeys < cs[held].MatchedKeys {
		d.Note = addNote(d.Note, fmt.Sprintf("load over affinity: %s holds more", cs[held].ID))
	}
	return d
}

// matchPeer returns how many leading keys pv holds, by its digest, by r's
// recent forwards or by its claims, and a note on where the answer came
// from.
func matchPeer(pv PeerView, keys []blockkey.Key, now time.Time, cfg Config, r *Recent) (int, string) {
	digestTTL := cfg.DigestTTL
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
	if m := r.prefixLen(pv.ID, keys, now, pv.Since); m > n {
		n, tag = m, addTag(tag, "recent")
	}
	if cfg.ClaimTTL > 0 {
		if m := claimedLen(pv.Claims, keys, now, cfg.ClaimTTL); m > n {
			n, tag = m, addTag(tag, "claim")
		}
	}
	return n, tag
}
