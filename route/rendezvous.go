package route

import (
	"sort"
	"time"
)

// Rendezvous places a prefix nobody holds: among eligible peers within the
// load bound it ranks peers by the highest random weight of (peer ID, the
// request's first RendezvousKeys keys) and takes the lighter of the top
// RendezvousChoices. Independent sidecars that see the same peers agree on
// the same few pods for a burst of new same-prefix requests without
// talking (the sender's own Recent entry keeps its follow-ups on the pod
// it chose), while unrelated prompts, whose top choices differ, spread as
// "power of two choices" does: load-aware, yet immune to the herding of
// every sidecar sending to the one pod that looked idlest in a stale load
// report. It declines a request with no keys (a prompt shorter than one
// routing block, or tokenize failed).
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
	var ranked []int
	for i := range cs {
		if a.inBound(i) {
			cs[i].Scored, cs[i].Score = true, unit(weight(cs[i].ID, rk))
			ranked = append(ranked, i)
		}
	}
	if len(ranked) == 0 {
		return a.decline("rendezvous: no peer within the bound")
	}
	sort.Slice(ranked, func(x, y int) bool { return better(cs, rk, ranked[x], ranked[y]) })
	best := ranked[0]
	for _, i := range ranked[1:min(len(ranked), max(p.Config.RendezvousChoices, 1))] {
		if cs[i].Load < cs[best].Load {
			best = i
		}
	}
	return a.choose(best, ReasonRendezvous)
}
