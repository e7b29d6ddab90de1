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
	return decide(p, &req, peers, now)
}

func (p Rendezvous) weigh(req *Request, peers []PeerView, now time.Time, sp *scratch) assessment {
	rows := sp.take(len(peers))
	cfg := &p.Config
	a := assess(cfg, req, peers, now, rows)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	rk, ok := rendezvousKey(*cfg, req.Keys)
	if !ok {
		return a.decline("rendezvous: no keys")
	}
	price := cfg.price()
	least := math.Inf(1)
	for i := range rows {
		if a.inBound(i) {
			least = min(least, wait(cfg, rows[i].queued, rows[i].load, price))
		}
	}
	best := -1
	for i := range rows {
		if !a.inBound(i) {
			continue
		}
		r := &rows[i]
		if wait(cfg, r.queued, r.load, price) > least+price*max(cfg.ColdHeadroom, 0) {
			r.flags |= rowBusier
			continue
		}
		r.flags |= rowScored
		r.score = unit(a.weight(i, rk))
		if best < 0 || a.better(rk, i, best) {
			best = i
		}
	}
	if best < 0 {
		return a.decline("rendezvous: no peer within the bound")
	}
	return a.choose(best, ReasonRendezvous)
}
