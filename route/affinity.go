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
//	dupWeight*MatchedTokens - QueuedWeight*Queued - LoadTokens*Load
//
// (the tokens it spares the request and the requests queued behind it,
// weighed up where requests wait, less what it waits for there; see
// QueuedWeight) and picks the best score, even a peer that holds less
// when the holder is that much busier. It declines (no target) when no
// peer within the bound matches MinMatchKeys keys or MinMatchFraction of
// the prompt: a prefix nobody holds, or one too short to matter (every
// request of the Mooncake conversation trace shares its first 512
// tokens), goes to Rendezvous, which balances. Recent, if set, adds this
// sidecar's own recent forwards to the peers' digests.
type Affinity struct {
	Config Config
	Recent *Recent
}

// Choose implements Policy.
func (p Affinity) Choose(req Request, peers []PeerView, now time.Time) Decision {
	return decide(p, &req, peers, now)
}

// idleQueue is how many requests must wait at a peer for IdleLoadTokens
// to price its load: one may be a report a few milliseconds old that
// still shows the last request of a quiet holder waiting, and a short
// prefix's follow-up then moved to an idle pod.
const idleQueue = 2

func (p Affinity) weigh(req *Request, peers []PeerView, now time.Time, sp *scratch) assessment {
	rows := sp.take(len(peers))
	cfg := &p.Config
	tpk := req.TokensPerKey
	if tpk < 1 {
		tpk = DefaultTokensPerKey
	}
	mr := newMatcher(cfg, req, tpk, now, p.Recent)
	switch {
	case len(req.Batch) > 0:
	case req.Prefixes != nil:
		mr.group = req.Prefixes
	default:
		mr.group = groupFor(peers, req.Keys, &sp.group)
	}
	a := rate(cfg, req, peers, now, rows)
	if a.d.Eligible == 0 {
		return a.decline("no eligible peer")
	}
	// Matched in a pass of its own over the eligible peers, where assess
	// called a closure for each: a call less per peer, and the loop's
	// values stay in registers.
	prompt := req.PromptTokens
	for i := range rows {
		r := &rows[i]
		if !r.is(rowEligible) {
			continue
		}
		pv := &peers[i]
		if n, ok := mr.plain(pv); ok {
			r.setGPU(n, tpk, prompt) // groupMatch's
			continue
		}
		m, f := mr.match(pv)
		r.flags |= f
		r.setMatch(&m, tpk, prompt)
	}
	a.bound()
	pr := pricingOf(&a)
	rk, _ := rendezvousKey(*cfg, req.Keys)
	held, heldKeys := -1, 0 // a scored peer with the longest match
	hi := top{i: -1}        // the best score
	raised := false         // a peer's load was priced at IdleLoadTokens
	allOver := a.allOver
	for i := range rows {
		r := &rows[i]
		if !r.inBound(allOver) {
			continue
		}
		r.flags |= rowScored
		var up bool
		r.score, up = pr.score(r.gpu, r.cpu, r.disk, r.queued, r.ahead, r.load)
		raised = raised || up
		hi.see(i, r.score)
		if held < 0 || r.keys > heldKeys {
			held, heldKeys = i, r.keys
		}
	}
	if held < 0 {
		return a.decline("affinity: no peer within the bound")
	}
	hr, hid := &rows[held], peers[held].ID
	if need := max(cfg.MinMatchKeys, 1); hr.keys < need {
		return a.decline(fmt.Sprintf("affinity: longest match %s at %s < %d",
			plural(hr.keys, "key"), hid, need))
	}
	if f := cfg.MinMatchFraction; req.PromptTokens > 0 && float64(hr.gpu+hr.cpu+hr.disk) < f*float64(req.PromptTokens) {
		return a.decline(fmt.Sprintf("affinity: longest match %d of %d tokens at %s < %.0f%%",
			hr.gpu+hr.cpu+hr.disk, req.PromptTokens, hid, 100*f))
	}
	if raised {
		a.d.Note = addNote(a.d.Note, "a peer idles: a request of load costs "+num(pr.price, 0)+" tokens where requests wait")
	}
	if pr.dup > 1 && !cfg.ProductCost {
		a.d.Note = addNote(a.d.Note, "saved tokens weigh "+num(pr.dup, 2)+": requests wait")
	}
	best := a.best(rk, hi)
	if best != held && rows[best].keys < hr.keys {
		a.d.Note = addNote(a.d.Note, fmt.Sprintf("load over affinity: %s holds more", hid))
	}
	return a.choose(best, ReasonAffinity)
}

// pricing is what Affinity's score of every peer shares, from the
// assessment of them all: the one rule the choice and a Shortlist score
// by.
type pricing struct {
	cfg     *Config
	prompt  int
	product bool    // Config.ProductCost
	qw      float64 // Config.queuedWeight
	dup     float64 // dupWeight
	// base prices a request of load (LoadTokens); price where requests
	// wait while a peer idles (IdleLoadTokens).
	base, price float64
}

func pricingOf(a *assessment) pricing {
	return pricingFor(a.cfg, a.req.PromptTokens, a.idle, a.waiting)
}

// pricingFor is the pricing of a prompt of prompt tokens among eligible
// peers of which one idles or none (idle), and waiting requests wait on
// average (assessment's).
func pricingFor(cfg *Config, prompt int, idle bool, waiting float64) pricing {
	price := cfg.LoadTokens
	if idle && cfg.IdleLoadTokens > price {
		price = cfg.IdleLoadTokens
	}
	return pricing{cfg: cfg, prompt: prompt, product: cfg.ProductCost, qw: cfg.queuedWeight(),
		dup: dupWeight(cfg, waiting), base: cfg.LoadTokens, price: price}
}

// score is Affinity's score of a peer whose match is gpu, cpu and disk
// tokens, with queued tokens and ahead requests waiting there and load,
// and whether its load was priced at IdleLoadTokens.
func (pr *pricing) score(gpu, cpu, disk, queued, ahead int, load float64) (float64, bool) {
	if pr.product {
		return -max(pr.cfg.work(pr.prompt, gpu, cpu, disk), 1) * (load + 1), false
	}
	return pr.plain(pr.cfg.saved(gpu, cpu, disk), queued, ahead, load)
}

// plain is score of a peer that saves saved tokens, not ProductCost's.
func (pr *pricing) plain(saved float64, queued, ahead int, load float64) (float64, bool) {
	// This peer's price of a request of load: raised for a queue at the
	// holder while a pod idles.
	per, raised := pr.base, false
	if ahead >= idleQueue && pr.price != per {
		per, raised = pr.price, true
	}
	return pr.at(saved, queued, load, per), raised
}

// at is plain's score at a price per request of load: the one formula
// plain and the shortlist's pass (firstPass) both use.
func (pr *pricing) at(saved float64, queued int, load, per float64) float64 {
	return pr.dup*saved - waitAt(pr.qw, queued, load, per)
}

// dupWeight is what a saved token is worth in Affinity's score, against
// a queued token at QueuedWeight: 1 + QueuedWeight × waiting, the mean
// number of requests waiting for their first token at the eligible peers
// (assess).
//
// A token computed where another peer holds it is work the cluster does
// twice. With no queue it costs the request alone, a saved token weighs
// 1. Under queues it delays every waiting request as well: the choice
// balances queues, so the cluster drains them as one, each by the work
// it adds. Weighed at 1, the shared-prefix workload past the knee (4
// pods, 41 req/s, seed 2) collapsed: pods spread system prompts to
// balance queues, the hit rate fell from 87% to 67%, the work grew and
// the queues with it, and admission refused a quarter of the requests
// (TTFT p90 3.6 s, central-precise's 0.43). The mean, not the candidate's
// own count, since a burst of one task waiting at its holder is no
// reason to compute the next task's prefix again elsewhere (priced per
// peer, agent fan-out's hit rate fell 4 points at the knee).
func dupWeight(cfg *Config, waiting float64) float64 {
	return 1 + max(cfg.QueuedWeight, 0)*waiting
}

// matcher matches one request against peer after peer. It holds what
// every peer's match shares (the request's prompts, scratch space), so
// that a choice among a thousand peers allocates nothing per peer.
type matcher struct {
	cfg      *Config
	prompts  [][]blockkey.Key // the request's keys, then a batch's further prompts
	tpk      int
	now      time.Time
	r        *Recent
	known    known   // whom r knows, asked of every peer
	per, cur []match // per prompt: the answer, and digestMatch's scratch
	// group, if set, holds the prefixes of the request's keys (a single
	// prompt) in the digests a Group holds.
	group *Prefixes
	// digestCut is now less Config.DigestTTL: a digest received before
	// it is stale (computed once, not per peer). ttl says DigestTTL is
	// set, claims that ClaimTTL is: a peer's claims count.
	digestCut   time.Time
	ttl, claims bool
}

func newMatcher(cfg *Config, req *Request, tpk int, now time.Time, r *Recent) *matcher {
	prompts := [][]blockkey.Key{req.Keys}
	if len(req.Batch) > 0 {
		prompts = append(prompts, req.Batch...)
	}
	return &matcher{cfg: cfg, prompts: prompts, tpk: tpk, now: now, r: r, known: r.known(),
		per: make([]match, len(prompts)), cur: make([]match, len(prompts)),
		digestCut: now.Add(-cfg.DigestTTL), ttl: cfg.DigestTTL > 0, claims: cfg.ClaimTTL > 0}
}

// plain returns pv's match when its group's answer is all of it: a
// digest match asks (digestFlags), of one rank and a single prompt
// (groupPrefix), with nothing of this sidecar's own (Recent, claims)
// reaching further. It is match's answer for most peers of a large mesh,
// without match's generality.
func (mr *matcher) plain(pv *PeerView) (int, bool) {
	if mr.group == nil || mr.digestFlags(pv) != 0 || mr.extends(pv) {
		return 0, false
	}
	return mr.groupPrefix(pv)
}

// digestFlags says why pv's digest is not asked: another key scheme,
// none yet, or older than DigestTTL; 0 when it is.
func (mr *matcher) digestFlags(pv *PeerView) flags {
	switch {
	case pv.KeyScheme != blockkey.Version:
		return rowOtherScheme
	case pv.Digest == nil:
		return rowNoDigest
	case mr.ttl && pv.DigestAt.Before(mr.digestCut):
		return rowStaleDigest
	}
	return 0
}

// groupPrefix is the group's answer for pv's digest, where the group
// holds it and it is digestMatch's: one rank, a single prompt.
func (mr *matcher) groupPrefix(pv *PeerView) (int, bool) {
	if pv.Ranks > 1 || len(mr.prompts) != 1 {
		return 0, false
	}
	return mr.group.prefix(pv)
}

// groupMatch is digestMatch's answer for a plain digest whose prefix is
// n keys, without its probes.
func groupMatch(n int, pv *PeerView) match {
	return match{gpu: n, placed: placed{rank: NoRank, ranks: 1, exact: pv.Ranks > 0}}
}

// extends reports whether this sidecar's own forwards (Recent) or claims
// may reach further at pv than its digest.
func (mr *matcher) extends(pv *PeerView) bool {
	return (mr.claims && len(pv.Claims) > 0) || mr.known.has(pv.ID)
}

// match returns what pv holds of the request (its keys, and a batch's
// further prompts, summed): by its digest, per tier and rank
// (digestMatch), or on a GPU by r's recent forwards or by its claims where
// those reach further, prompt by prompt; and flags for where the answer
// came from (the note's).
func (mr *matcher) match(pv *PeerView) (match, flags) {
	cfg, now := mr.cfg, mr.now
	sum := match{placed: placed{rank: NoRank}}
	f := mr.digestFlags(pv)
	if f == rowOtherScheme {
		return sum, f
	}
	per := mr.per
	clear(per)
	if f == 0 {
		if n, ok := mr.groupPrefix(pv); ok {
			g := groupMatch(n, pv)
			per[0].gpu, sum.placed = g.gpu, g.placed
		} else {
			sum.placed = digestMatch(cfg, pv, mr.prompts, mr.tpk, per, mr.cur)
		}
	}
	// This sidecar's own forwards know no tier: the prefix they sent is
	// on a GPU once it is served (on the rank they pinned, if any).
	for i, keys := range mr.prompts {
		m := per[i]
		if n := mr.r.prefixLen(pv.ID, keys, now, pv.Since); n > m.gpu {
			m = m.extend(n)
			if i == 0 {
				f |= rowRecent
			}
		}
		if cfg.ClaimTTL > 0 && len(pv.Claims) > 0 {
			if n := claimedLen(pv.Claims, keys, now, cfg.ClaimTTL); n > m.gpu {
				m = m.extend(n)
				if i == 0 {
					f |= rowClaimed
				}
			}
		}
		sum = sum.add(m)
	}
	return sum, f
}
