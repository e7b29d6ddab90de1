package route

import "time"

// LeastLoad picks the eligible peer with the shortest wait (queued prefill
// work and requests, see wait), ignoring the cache. Ties go to the highest rendezvous weight of (peer ID, the
// request's rendezvous key), so equal peers share the traffic by prefix
// and independent sidecars agree. It is the last resort of a Chain: it
// declines only when no peer is eligible.
type LeastLoad struct {
	Config Config
}

// Choose implements Policy. A candidate's Score is minus its wait, in tokens.
func (p LeastLoad) Choose(req Request, peers []PeerView, now time.Time) Decision {
	a := assess(p.Config, req, peers, now)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	rk, _ := rendezvousKey(p.Config, req.Keys)
	cs := a.d.Candidates
	price := p.Config.price()
	best := -1
	for i := range cs {
		if !cs[i].Eligible {
			continue
		}
		cs[i].Scored, cs[i].Score = true, -wait(&p.Config, &cs[i], price)
		if best < 0 || better(cs, rk, i, best) {
			best = i
		}
	}
	return a.choose(best, ReasonLeastLoad)
}
