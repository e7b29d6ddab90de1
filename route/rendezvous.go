package route

import "time"

// Rendezvous places a prefix nobody holds: among the least-loaded eligible
// peers (load at most the minimum plus RendezvousSlack) it picks the
// highest random weight of (peer ID, the request's first RendezvousKeys
// keys). Independent sidecars that see the same loads therefore send a
// burst of new same-prefix requests to the same pod without talking (the
// sender's own Recent entry keeps its follow-ups there), while unrelated
// new prompts go to idle pods as a least-loaded policy would: with no reuse
// at all, prefix routing must cost nothing. It declines a request with no
// keys (a prompt shorter than one routing block, or tokenize failed).
type Rendezvous struct {
	Config Config
}

// Choose implements Policy. A candidate's Score is its weight in [0, 1).
func (p Rendezvous) Choose(req Request, peers []PeerView, now time.Time) Decision {
	a := assess(p.Config, req, peers, now)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	rk, ok := rendezvousKey(p.Config, req.Keys)
	if !ok {
		return a.decline("rendezvous: no keys")
	}
	cs := a.d.Candidates
	least := -1.0
	for i := range cs {
		if a.inBound(i) && (least < 0 || cs[i].Load < least) {
			least = cs[i].Load
		}
	}
	best := -1
	for i := range cs {
		if !a.inBound(i) || cs[i].Load > least+p.Config.RendezvousSlack {
			continue
		}
		cs[i].Scored, cs[i].Score = true, unit(weight(cs[i].ID, rk))
		if best < 0 || better(cs, rk, i, best) {
			best = i
		}
	}
	if best < 0 {
		return a.decline("rendezvous: no peer within the bound")
	}
	return a.choose(best, ReasonRendezvous)
}
