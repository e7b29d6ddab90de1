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
	return decide(p, &req, peers, now)
}

func (p LeastLoad) weigh(req *Request, peers []PeerView, now time.Time, sp *scratch) assessment {
	rows := sp.take(len(peers))
	cfg := &p.Config
	a := assess(cfg, req, peers, now, rows)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	rk, _ := rendezvousKey(*cfg, req.Keys)
	price := cfg.price()
	hi := top{i: -1} // the best score
	for i := range rows {
		r := &rows[i]
		if !r.is(rowEligible) {
			continue
		}
		r.flags |= rowScored
		r.score = -wait(cfg, r.queued, r.load, price)
		hi.see(i, r.score)
	}
	return a.choose(a.best(rk, hi), ReasonLeastLoad)
}
