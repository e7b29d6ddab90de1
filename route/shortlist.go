package route

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Brief is a peer as a Shortlist reads it: what its eligibility, its load
// and its match depend on, in a quarter of a PeerView. A peer table keeps
// one per peer (BriefOf), in its views' order, rebuilt when the peer's
// view would change, so that a choice among a thousand peers reads a
// hundred bytes of each where it read a view built for it.
type Brief struct {
	// What every Brief is read for comes first, in one cache line.
	Flags  BriefFlags
	Engine Engine
	// Slot, Stamp and G place its plain digest in a Group as Member does;
	// G nil: no Group holds it.
	Slot  int32
	Stamp uint64
	G     Group
	// Unix nanoseconds, 0 for never (nanos): PeerView's LoadAt and
	// LastFailure; DigestAt and Since below.
	LoadAt, Failed int64
	KV             float64 // Load.KVUsage
	// Busy is the requests its report counts (busy); Queued and
	// Prefilling are its reported QueuedPrefillTokens and Prefilling.
	Busy, Queued, Prefilling int32

	Claims          []Claim // shared with the view: read, never modify
	DigestAt, Since int64
	Hash            uint64 // IDHash(ID): its half of every rendezvous weight
	ID              string
}

// BriefFlags are a Brief's facts.
type BriefFlags uint8

const (
	BriefLocal BriefFlags = 1 << iota
	BriefDraining
	BriefFronted
	// BriefListed: the peer lists its models; a request for a named
	// model reads its view to know whether it serves it.
	BriefListed
	// BriefWhole: a Shortlist cannot judge the peer by its Brief and
	// always reads its view: several ranks, a digest with lower tiers, or
	// one no Group holds.
	BriefWhole
	// BriefNoMatch: its digest is not asked (another key scheme, none
	// yet); it holds nothing of any prompt.
	BriefNoMatch
)

// BriefOf returns v's Brief. v's Load is its table's: nothing of a
// front's own counts (InFlight), which the front adds to the views a
// Shortlist reads.
func BriefOf(v *PeerView) Brief {
	l := &v.Load
	b := Brief{ID: v.ID, Hash: IDHash(v.ID), Slot: -1, LoadAt: nanos(v.LoadAt), Failed: nanos(v.LastFailure),
		DigestAt: nanos(v.DigestAt), Since: nanos(v.Since), KV: l.KVUsage, Busy: int32(busy(l)),
		Queued: int32(max(l.QueuedPrefillTokens, 0)), Prefilling: int32(max(l.Prefilling, 0)),
		Engine: v.Engine, Claims: v.Claims}
	for _, f := range [...]struct {
		on bool
		f  BriefFlags
	}{{v.Local, BriefLocal}, {v.Draining, BriefDraining}, {l.Fronted, BriefFronted}, {len(v.Models) > 0, BriefListed}} {
		if f.on {
			b.Flags |= f.f
		}
	}
	m, grouped := v.Digest.(*Member)
	switch {
	case v.KeyScheme != blockkey.Version || v.Digest == nil:
		b.Flags |= BriefNoMatch
	case grouped && v.Ranks <= 1:
		b.G, b.Slot, b.Stamp = m.G, int32(m.Slot), m.Stamp
	default:
		b.Flags |= BriefWhole
	}
	return b
}

// Rest is what a choice on a Shortlist's peers knows of the others
// (Request.Rest): how many, how many of them are eligible, the sums of
// their loads and of the requests waiting there, and whether one idles.
type Rest struct {
	Peers, Eligible int
	Load            float64
	Ahead           int
	Idle            bool
}

// ShortlistMin is the fewest peers a front shortlists: below, a choice
// reads every view, and lists every peer (ListPeers).
const ShortlistMin = 2 * ListPeers

// maxShort is the longest shortlist worth making: past it, reading every
// view costs about as much.
const maxShort = 256

// Shortlist makes a choice among many peers cost the few that can win it
// (docs/design.md, "The blocked Bloom layout", its last paragraphs).
// Every peer's Brief is read, in one pass over compact data; only the
// peers that could be chosen, be next in the failover order, or be
// listed are read whole and handed to the policy, the rest summed into
// Request.Rest:
//
//   - the local peer, and those the caller names (its own requests in
//     flight there change their load);
//   - those a Brief cannot judge: BriefWhole, a digest its Group has
//     moved on from, a model list when the request names a model, claims
//     or this sidecar's own forwards (Recent) reaching further than the
//     digest;
//   - of the rest, by the rules the policies apply to them: Affinity's
//     best scores (as listed, and the one chosen) and its longest match,
//     the failover order's next peers (listFailover+1), and only where
//     Affinity may decline, Rendezvous's highest weights within its
//     headroom or LeastLoad's least waits.
//
// A DefaultChain's Decision on the shortlist, with Rest, is the one it
// makes on every view: its target, reason, load bound, mean, eligible
// count, failover order and every candidate that Decision lists
// (TestShortlistDecidesAsAll). Its Note may count fewer tightened peers,
// and it lists the shortlist's peers.
type Shortlist struct {
	// Rest and Prefixes are for the Request (Make sets them there).
	Rest     Rest
	Prefixes Prefixes
	rows     []brow
	must     []row // the rows of the views that must be read (weighMust)
	totals   totals
	picked   []int    // the rows read: those that must be, then those picked
	claimed  []string // the peers whose claims may match (ClaimIndex.Peers)
}

// brow is a Brief as the shortlist weighs it.
type brow struct {
	load          float64
	queued, ahead int32
	depth         int32 // its digest's prefix of the request's keys
	f             browFlags
}

type browFlags uint8

const (
	browEligible browFlags = 1 << iota
	browMust               // its view is read whatever it scores
	browPicked
	browClaims // its claims may match (ClaimIndex): read them
)

var shortlists = sync.Pool{New: func() any { return new(Shortlist) }}

// GetShortlist returns a Shortlist to Make, from a pool; PutShortlist
// gives it back once its views have been read.
func GetShortlist() *Shortlist   { return shortlists.Get().(*Shortlist) }
func PutShortlist(sl *Shortlist) { shortlists.Put(sl) }

// Make shortlists briefs for req (one prompt) at now and returns the
// views its choice reads, appended to out[:0] in the briefs' order, with
// req's Rest and Prefixes set: g is the Group that holds the briefs' plain
// digests, also the IDs of peers to read whole, r this sidecar's Recent
// (nil: none), claims an index of the briefs' claims (nil: every brief's
// claims are read), and view sets v to the view of briefs[i] as the choice
// must see it (a front's own counts in it). Briefs must be in the order
// of the caller's views, by ID. It reports false when no shortlist is
// worth making (no Group, a batch, fewer than ShortlistMin peers, more
// than maxShort to read): the caller then reads every view.
func (sl *Shortlist) Make(cfg *Config, req *Request, briefs []Brief, g Group, also []string, r *Recent, claims *ClaimIndex,
	now time.Time, view func(i int, v *PeerView), out []PeerView) ([]PeerView, bool) {
	sl.Rest = Rest{}
	if g == nil || len(req.Batch) > 0 || len(briefs) < ShortlistMin {
		return out, false
	}
	p := &sl.Prefixes
	p.ask(g, req.Keys)
	if cap(sl.rows) < len(briefs) {
		sl.rows = make([]brow, len(briefs))
	}
	rows := sl.rows[:len(briefs)]
	at := momentOf(cfg, now)
	sl.totals, sl.picked = totals{}, sl.picked[:0]
	clear(rows)
	for _, id := range also {
		if i, ok := briefAt(briefs, id); ok {
			rows[i].f = browMust
		}
	}
	if claims != nil {
		sl.claimed = claims.Peers(req.Keys, sl.claimed[:0])
		for _, id := range sl.claimed {
			if i, ok := briefAt(briefs, id); ok {
				rows[i].f |= browClaims
			}
		}
	}
	sl.assess(cfg, req, briefs, rows, r, claims == nil, &at)
	if len(sl.picked) > maxShort {
		return out, false
	}
	// The views that must be read, read first: their loads, with the
	// caller's counts, enter the mean the others are bounded by.
	out = out[:0]
	for i := range rows {
		if rows[i].f&browMust != 0 {
			out = append(out, PeerView{})
			view(i, &out[len(out)-1])
		}
	}
	sl.weighMust(cfg, req, out, rows, &at)
	sl.pick(cfg, req, briefs, rows)
	if len(sl.picked) > maxShort {
		return out, false
	}
	// Every picked view in the briefs' order: the must views, read
	// first, kept in place, the others read. What is not picked is the
	// rest: the totals less what was.
	slices.Sort(sl.picked)
	rs := &sl.Rest
	*rs = Rest{Peers: len(rows) - len(sl.picked), Eligible: sl.totals.eligible, Load: sl.totals.load,
		Ahead: sl.totals.ahead}
	idle := sl.totals.idle
	k, n := len(out), len(sl.picked)
	out = slices.Grow(out, n-k)[:n]
	for j := n - 1; j >= 0; j-- {
		i := sl.picked[j]
		w := &rows[i]
		if w.f&browMust != 0 {
			k--
			if j != k {
				out[j] = out[k]
			}
		} else {
			view(i, &out[j])
		}
		if w.f&browEligible != 0 {
			rs.Eligible--
			rs.Load -= w.load
			rs.Ahead -= int(w.ahead)
			if idles(w.load, int(w.ahead)) {
				idle--
			}
		}
	}
	rs.Idle = idle > 0
	req.Rest, req.Prefixes = rs, p
	return out, true
}

// briefAt returns the place of peer id's brief in briefs, by ID.
func briefAt(briefs []Brief, id string) (int, bool) {
	return slices.BinarySearchFunc(briefs, id, func(b Brief, id string) int { return strings.Compare(b.ID, id) })
}

// totals are the eligible peers' count, load and queue summed, and how
// many of them idle.
type totals struct {
	eligible, ahead, idle int
	load                  float64
}

func (t *totals) add(load float64, ahead int) {
	t.eligible++
	t.load += load
	t.ahead += ahead
	if idles(load, ahead) {
		t.idle++
	}
}

// assess fills a row per brief: eligibility, load, the digest's prefix,
// and whether its view must be read (must, set already for those the
// caller names), and sums the totals of those that need not.
func (sl *Shortlist) assess(cfg *Config, req *Request, briefs []Brief, rows []brow, r *Recent, allClaims bool, at *moment) {
	p, t := &sl.Prefixes, &sl.totals
	keys := req.Keys
	var recent recentSet
	r.knownNow(&recent)
	ttl := cfg.DigestTTL > 0
	claims := cfg.ClaimTTL > 0
	named := req.Model != ""
	for i := range briefs {
		b, w := &briefs[i], &rows[i]
		switch {
		case w.f&browMust != 0, b.Flags&(BriefLocal|BriefWhole) != 0, named && b.Flags&BriefListed != 0:
			w.f = browMust
			sl.picked = append(sl.picked, i)
			continue
		case barOf(cfg, b.Engine, b.Flags&BriefDraining != 0, b.Flags&BriefFronted != 0,
			b.LoadAt, b.Failed, at) != barNone:
			continue // never chosen, nor counted
		}
		w.f = browEligible | w.f&browClaims
		switch {
		case b.Flags&BriefNoMatch != 0, ttl && b.DigestAt < at.digestN:
		case b.G != p.g || b.Slot < 0 || int(b.Slot) >= len(p.out) || p.stamps[b.Slot] != b.Stamp:
			w.f = browMust // the group moved on: its digest is asked alone
		default:
			w.depth = int32(p.out[b.Slot])
		}
		if w.f&browMust != 0 || (claims && len(b.Claims) > 0 && (allClaims || w.f&browClaims != 0) &&
			claimedLen(b.Claims, keys, at.now, cfg.ClaimTTL) > int(w.depth)) ||
			(recent.r != nil && recent.may(b.Hash) && recent.reaches(b, keys, int(w.depth), at.now)) {
			w.f = browMust
			sl.picked = append(sl.picked, i)
			continue
		}
		if b.LoadAt != 0 && (cfg.LoadTTL <= 0 || b.LoadAt >= at.staleN) {
			// A stale report counts nothing but a front's own requests,
			// and those peers are read whole.
			w.load = loadOf(cfg, int(b.Busy), 0, b.KV)
			w.queued, w.ahead = b.Queued, b.Prefilling
		}
		t.add(w.load, int(w.ahead))
	}
}

// weighMust sets the rows of the views that must be read (views, in the
// briefs' order) from those views, as a policy rates them.
func (sl *Shortlist) weighMust(cfg *Config, req *Request, views []PeerView, rows []brow, at *moment) {
	if cap(sl.must) < len(views) {
		sl.must = make([]row, len(views))
	}
	mr := sl.must[:len(views)]
	plain := *req
	plain.Rest = nil
	rate(cfg, &plain, views, at.now, mr)
	j := 0
	for i := range rows {
		w := &rows[i]
		if w.f&browMust == 0 {
			continue
		}
		r := &mr[j]
		w.f &^= browEligible
		if r.is(rowEligible) {
			w.f |= browEligible
			sl.totals.add(r.load, r.ahead)
		}
		w.load, w.queued, w.ahead = r.load, int32(r.queued), int32(r.ahead)
		j++
	}
}

// pick adds to sl.picked the rows to read besides those that must be: by
// the rules the policies weigh them by, the few that could be chosen, be
// next in the failover order, or be listed.
func (sl *Shortlist) pick(cfg *Config, req *Request, briefs []Brief, rows []brow) {
	// The eligible peers' mean load and queue, the bound, the pricing:
	// rate's, bound's and Affinity's, over every row (assess, weighMust).
	t := &sl.totals
	if t.eligible == 0 {
		return
	}
	m := (t.load + 1) / float64(t.eligible)
	k := picker{cfg: cfg, briefs: briefs, rows: rows, held: -1, heldAll: -1, heldDepth: -1, heldAllDepth: -1,
		best: newBest(), nextBest: newBest(),
		bound: max(m*(1+cfg.Slack), m+cfg.MinHeadroom), tight: math.Inf(1), price: cfg.price(),
		pr:  pricingFor(cfg, req.PromptTokens, t.idle > 0, float64(t.ahead)/float64(t.eligible)),
		tpk: cmp.Or(max(req.TokensPerKey, 0), DefaultTokensPerKey)}
	if t.idle > 0 && (cfg.IdleSlack > 0 || cfg.IdleHeadroom > 0) {
		k.tight = max(m*(1+cfg.IdleSlack), m+cfg.IdleHeadroom)
	}
	k.rk, k.keyed = rendezvousKey(*cfg, req.Keys)
	k.aff.k, k.fail.k, k.next.k = listScored, listFailover+1, listScored
	allOver := k.firstPass()
	if allOver { // every row is in bound: weighed again as such
		for i := range rows {
			if w := &rows[i]; w.f&browEligible != 0 {
				k.inBound(i, w)
			}
		}
	}
	if !k.decided(req) {
		k.cold(allOver)
	}
	mark := func(i int) {
		if i >= 0 && rows[i].f&(browPicked|browMust) == 0 {
			rows[i].f |= browPicked
			sl.picked = append(sl.picked, i)
		}
	}
	mark(k.held)
	mark(k.heldAll)
	mark(k.best.i)
	mark(k.nextBest.i)
	for _, l := range [][]int{k.aff.i[:k.aff.n], k.fail.i[:k.fail.n], k.next.i[:k.next.n]} {
		for _, i := range l {
			mark(i)
		}
	}
}

// picker is pick's pass over the rows.
type picker struct {
	cfg    *Config
	briefs []Brief
	rows   []brow
	pr     pricing
	// bound and tight are bound's, price is Config.price, tpk the
	// request's tokens per key, rk its rendezvous key if keyed.
	bound, tight, price float64
	tpk                 int
	rk                  blockkey.Key
	keyed               bool
	// held is the longest match in bound, heldAll of all eligible, and
	// their depths (-1 while none).
	held, heldAll           int
	heldDepth, heldAllDepth int32
	// aff and next are Affinity's, and Rendezvous's or LeastLoad's, best
	// scores as a Decision lists them; best and nextBest the rows they
	// choose.
	aff, next      few[byScore]
	best, nextBest best
	fail           few[light]
}

// firstPass weighs every eligible row as if some row were in bound, and
// reports whether every one is over the bound. Over is as bound marks it
// before a match may spare a row: no row here is spared (those a match
// extends are read whole), and a row read whole that is marked over here
// may be in bound there, which only makes the pick more than it needs.
// The rows most peers are (not read whole, in bound, a plain score at
// the base price) are scored inline: a thousand-peer choice weighs a
// thousand, and the two calls each saves were a fifth of the pass.
func (k *picker) firstPass() (allOver bool) {
	allOver = true
	plain := !k.pr.product
	for i := range k.rows {
		w := &k.rows[i]
		if w.f&(browEligible|browMust) != browEligible {
			if w.f&browEligible != 0 && !k.over(w) {
				allOver = false
			}
			continue
		}
		over := k.over(w)
		if w.depth > k.heldAllDepth {
			k.heldAll, k.heldAllDepth = i, w.depth
		}
		if !k.fail.full() || k.ahead(over, w.load, k.fail.last()) {
			k.fail.offer(i, light{over, w.load}, light.ahead)
		}
		if over {
			continue
		}
		allOver = false
		if !plain || w.depth > k.heldDepth || w.ahead >= idleQueue {
			k.inBound(i, w)
			continue
		}
		// score's, for a plain score at the base price, written out:
		// score's offer as a call (not inlined: over the budget) cost
		// about a microsecond of a thousand-peer choice. Keep the two alike.
		s := k.pr.at(float64(gpuTokens(int(w.depth), k.tpk, k.pr.prompt)), int(w.queued), w.load, k.pr.base)
		if !k.aff.full() || s > float64(k.aff.last()) {
			k.aff.offer(i, byScore(s), byScore.ahead)
		}
		if k.best.i < 0 || s >= k.best.score {
			k.best.see(i, s, k.weight)
		}
	}
	return allOver
}

// ahead is light.ahead for a row over or not, of load, against last:
// lighter's order with the loads compared plainly (a load is never NaN),
// which most rows fail.
func (k *picker) ahead(over bool, load float64, last light) bool {
	return (!over && last.over) || (over == last.over && load < last.load)
}

// over reports whether row w is over the bound, as bound marks it
// before a match may spare a row.
func (k *picker) over(w *brow) bool {
	return w.load+1 > k.bound || (w.ahead > 0 && w.load+1 > k.tight)
}

// inBound weighs eligible row i, in bound, for Affinity.
func (k *picker) inBound(i int, w *brow) {
	if w.f&browMust != 0 {
		return
	}
	if w.depth > k.heldDepth {
		k.held, k.heldDepth = i, w.depth
	}
	k.score(i, w)
}

// score offers row i, in bound, to Affinity's best scores.
func (k *picker) score(i int, w *brow) {
	var s float64
	if gpu := gpuTokens(int(w.depth), k.tpk, k.pr.prompt); k.pr.product {
		s, _ = k.pr.score(gpu, 0, 0, int(w.queued), int(w.ahead), w.load)
	} else {
		s, _ = k.pr.plain(k.cfg.saved(gpu, 0, 0), int(w.queued), int(w.ahead), w.load)
	}
	// Most rows stop at the first comparison of each: below the fourth
	// best score, and below the best (an idle mesh's rows tie by the
	// dozen: then their weights are compared).
	if !k.aff.full() || s > float64(k.aff.last()) {
		k.aff.offer(i, byScore(s), byScore.ahead)
	}
	if k.best.i < 0 || s >= k.best.score {
		k.best.see(i, s, k.weight)
	}
}

// weight is row i's rendezvous weight for the request.
func (k *picker) weight(i int) uint64 { return weighed(k.briefs[i].Hash, k.rk) }

// decided reports whether Affinity surely decides: the longest match in
// bound is long enough (the rows read whole may only match further).
// Then neither Rendezvous nor LeastLoad is asked.
func (k *picker) decided(req *Request) bool {
	if k.held < 0 {
		return false
	}
	d := int(k.rows[k.held].depth)
	return d >= max(k.cfg.MinMatchKeys, 1) && (req.PromptTokens <= 0 ||
		float64(gpuTokens(d, k.tpk, req.PromptTokens)) >= k.cfg.MinMatchFraction*float64(req.PromptTokens))
}

// cold weighs the rows for Rendezvous (the highest weights in bound
// within ColdHeadroom of the least wait) or, for a prompt without keys,
// which Rendezvous declines, LeastLoad (the least waits).
func (k *picker) cold(allOver bool) {
	lightest := math.Inf(1) // the least wait in bound
	for i := range k.rows {
		if w := &k.rows[i]; w.f&browEligible != 0 && (allOver || !k.over(w)) {
			lightest = min(lightest, wait(k.cfg, int(w.queued), w.load, k.price))
		}
	}
	reach := lightest + k.price*max(k.cfg.ColdHeadroom, 0)
	for i := range k.rows {
		w := &k.rows[i]
		if w.f&(browEligible|browMust) != browEligible {
			continue
		}
		wt := wait(k.cfg, int(w.queued), w.load, k.price)
		switch {
		case !k.keyed: // LeastLoad's score
			k.next.offer(i, byScore(-wt), byScore.ahead)
			k.nextBest.see(i, -wt, k.weight)
		case (allOver || !k.over(w)) && wt <= reach: // Rendezvous's
			u := unit(k.weight(i))
			k.next.offer(i, byScore(u), byScore.ahead)
			k.nextBest.see(i, u, k.weight)
		}
	}
}

// byScore orders rows as a Decision lists the best scores (listed):
// higher first, then the first offered.
type byScore float64

func (a byScore) ahead(b byScore) bool { return a > b }

// best is the row a policy chooses among those it is shown
// (assessment.better): the highest score, then the highest rendezvous
// weight, then the first shown. -1: none yet.
type best struct {
	i     int
	score float64
	w     uint64
}

func newBest() best { return best{i: -1} }

// see shows best row i of score, its weight computed only on a tie.
func (b *best) see(i int, score float64, weight func(int) uint64) {
	switch {
	case b.i >= 0 && score < b.score:
	case b.i < 0 || score > b.score:
		*b = best{i: i, score: score, w: weight(i)}
	default:
		if w := weight(i); w > b.w {
			*b = best{i: i, score: score, w: w}
		}
	}
}

// light orders rows as the failover order does (before): in bound first,
// then lighter (then the first offered, the smaller ID).
type light struct {
	over bool
	load float64
}

func (l light) ahead(o light) bool { return lighter(l.over, o.over, l.load, o.load) < 0 }

// few keeps the first k (at most listFailover+1) rows offered, in an
// order (ahead), rows offered in the peers' order: of rows that tie, the
// first offered.
type few[K any] struct {
	n, k int
	i    [listFailover + 1]int
	key  [listFailover + 1]K
}

func (t *few[K]) full() bool { return t.n == t.k }
func (t *few[K]) last() K    { return t.key[t.n-1] }

func (t *few[K]) offer(i int, key K, ahead func(K, K) bool) {
	if t.full() && !ahead(key, t.last()) {
		return
	}
	j := min(t.n, t.k-1)
	for ; j > 0 && ahead(key, t.key[j-1]); j-- {
		t.i[j], t.key[j] = t.i[j-1], t.key[j-1]
	}
	t.i[j], t.key[j] = i, key
	t.n = min(t.n+1, t.k)
}
