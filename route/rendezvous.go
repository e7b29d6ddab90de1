package route

import (
	"math"
	"time"
)

// Rendezvous places a prefix nobody holds: among eligible peers within the
// load bound and within ColdHeadroom requests of the shortest wait (queued
// prefill work and requests, see wait), it picks the
// highest random weight of (peer ID, the request's first RendezvousKeys
// keys). Independent sidecars that see the same peers
// therefore send a burst of new same-prefix requests to the same pod
// without talking, and when that pod fills past the bound the burst moves
// to the next pod in the same agreed order. It declines a request with no
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
	price := p.Config.price()
	least := math.Inf(1)
	for i := range cs {
		if a.inBound(i) {
			least = min(least, wait(&p.Config, &cs[i], price))
		}
	}
	best := -1
	for i := range cs {
		if !a.inBound(i) {
			continue
		}
		if wait(&p.Config, &cs[i], price) > least+price*max(p.Config.ColdHeadroom, 0) {
			cs[i].Note = addTag(cs[i].Note, "busier")
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
