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
	mr := newMatcher(&p.Config, &req, tpk, now, p.Recent)
	dup := dupWeight(&p.Config, a.waiting)
	if len(req.Batch) == 0 {
		mr.group = groupFor(peers, req.Keys)
	}
	for i := range peers {
		c := &cs[i]
		if !c.Eligible {
			continue
		}
		m, tag := mr.match(&peers[i])
		c.Note = addTag(c.Note, tag)
		c.setMatch(m, tpk, req.PromptTokens)
		if a.inBound(i) {
			c.Scored = true
			c.Score = dup*p.Config.savedBy(c) - wait(&p.Config, c, p.Config.LoadTokens)
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
	if dup > 1 {
		d.Note = addNote(d.Note, "saved tokens weigh "+num(dup, 2)+": requests wait")
	}
	if best != held && cs[best].MatchedKeys < cs[held].MatchedKeys {
		d.Note = addNote(d.Note, fmt.Sprintf("load over affinity: %s holds more", cs[held].ID))
	}
	return d
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
	per, cur []match // per prompt: the answer, and digestMatch's scratch
	// group, if set, holds the prefixes of the request's keys (a single
	// prompt) in the digests a Group holds.
	group *grouped
}

func newMatcher(cfg *Config, req *Request, tpk int, now time.Time, r *Recent) *matcher {
	prompts := [][]blockkey.Key{req.Keys}
	if len(req.Batch) > 0 {
		prompts = append(prompts, req.Batch...)
	}
	return &matcher{cfg: cfg, prompts: prompts, tpk: tpk, now: now, r: r,
		per: make([]match, len(prompts)), cur: make([]match, len(prompts))}
}

// match returns what pv holds of the request (its keys, and a batch's
// further prompts, summed): by its digest, per tier and rank
// (digestMatch), or on a GPU by r's recent forwards or by its claims where
// those reach further, prompt by prompt; and a note on where the answer
// came from.
func (mr *matcher) match(pv *PeerView) (match, string) {
	cfg, now := mr.cfg, mr.now
	sum := match{placed: placed{rank: NoRank}}
	if pv.KeyScheme != blockkey.Version {
		return sum, fmt.Sprintf("scheme %d", pv.KeyScheme)
	}
	per := mr.per
	clear(per)
	var tag string
	switch {
	case pv.Digest == nil:
		tag = "no digest"
	case cfg.DigestTTL > 0 && now.Sub(pv.DigestAt) > cfg.DigestTTL:
		tag = "stale digest"
	default:
		if n, ok := mr.group.prefix(pv); ok && pv.Ranks <= 1 && len(mr.prompts) == 1 {
			// digestMatch's answer for a plain digest, without its probes.
			per[0].gpu = n
			sum.placed = placed{rank: NoRank, ranks: 1, exact: pv.Ranks > 0}
			break
		}
		sum.placed = digestMatch(cfg, pv, mr.prompts, mr.tpk, per, mr.cur)
	}
	// This sidecar's own forwards know no tier: the prefix they sent is
	// on a GPU once it is served (on the rank they pinned, if any).
	var recent, claimed bool
	for i, keys := range mr.prompts {
		m := per[i]
		if n := mr.r.prefixLen(pv.ID, keys, now, pv.Since); n > m.gpu {
			m, recent = m.extend(n), recent || i == 0
		}
		if cfg.ClaimTTL > 0 && len(pv.Claims) > 0 {
			if n := claimedLen(pv.Claims, keys, now, cfg.ClaimTTL); n > m.gpu {
				m, claimed = m.extend(n), claimed || i == 0
			}
		}
		sum = sum.add(m)
	}
	if recent {
		tag = addTag(tag, "recent")
	}
	if claimed {
		tag = addTag(tag, "claim")
	}
	return sum, tag
}
