package route

import (
	"slices"
	"strconv"
	"sync"
	"time"
)

// ListPeers is how many peers a Decision lists whole. A choice among more
// lists only the candidates its caller uses (listed), unless the Request
// asks to explain: a Candidate is ~190 bytes with three strings, and a
// thousand of them built for every request were most of a choice's time,
// and made every later pass over the Decision (the failover order,
// admission, steering) as long.
const ListPeers = 64

// What a Decision among more than ListPeers peers lists beyond the chosen
// and the local candidate: the peers its caller reads, and the ones a
// person reading it asks about.
const (
	// listFailover is how many of the failover order's next peers
	// (Attempts' rule, before) it lists: Attempts is exact up to
	// MaxAttempts of listFailover+1.
	listFailover = 8
	// listScored is how many of the best scores it lists: the runners-up.
	listScored = 4
)

// weigher is a policy of this package: it weighs the peers in rows of
// its scratch, and its Decision is built from them last (decision), once
// for a Chain.
type weigher interface {
	weigh(req *Request, peers []PeerView, now time.Time, sp *scratch) assessment
}

// scratch is the memory one policy's weighing reuses from choice to
// choice: a row per peer, and the group's answer (Affinity).
type scratch struct {
	rows  []row
	group Prefixes
}

// take returns n rows, grown if need be. assess overwrites them.
func (sp *scratch) take(n int) []row {
	if cap(sp.rows) < n {
		sp.rows = make([]row, n)
	}
	return sp.rows[:n]
}

// space is one choice's scratch: the first policy's, whose rows a Chain
// keeps for their match columns, and a later one's.
type space struct{ first, later scratch }

// spaces recycles choices' scratch among the requests of a sidecar's
// fronts: no state, only memory (as fmt's printers).
var spaces = sync.Pool{New: func() any { return new(space) }}

// decide is a policy's Choose.
func decide(w weigher, req *Request, peers []PeerView, now time.Time) Decision {
	s := spaces.Get().(*space)
	defer spaces.Put(s)
	a := w.weigh(req, peers, now, &s.first)
	return a.decision(nil)
}

// decision returns the Decision a made, its Candidates built from its
// rows: every peer's, or among more than ListPeers peers and unless the
// request asks to explain, only those listed. first, if set, is a Chain's
// first policy, whose match columns a later policy's rows show (they do
// not match).
func (a *assessment) decision(first *assessment) Decision {
	d := a.d
	if a.req.Rest != nil {
		d.Omitted = a.req.Rest.Peers
	}
	if a.req.Explain || len(a.rows) <= ListPeers {
		d.Candidates = make([]Candidate, len(a.rows))
		for i := range a.rows {
			a.explain(&d.Candidates[i], i, first)
		}
		return d
	}
	keep := a.listed(first)
	d.Candidates = make([]Candidate, len(keep))
	for j, i := range keep {
		a.explain(&d.Candidates[j], i, first)
	}
	d.Omitted += len(a.rows) - len(keep)
	return d
}

// matchOf is the row whose match columns row i shows: its own, or where
// it has none, first's.
func (a *assessment) matchOf(i int, first *assessment) *row {
	if r := &a.rows[i]; first == nil || r.keys != 0 || !r.is(rowEligible) {
		return r
	}
	return &first.rows[i]
}

// listed returns the rows a Decision among many peers lists, in the
// peers' order:
//
//   - the chosen one and the local one;
//   - the failover order's next listFailover peers (eligible, not local,
//     by before): Attempts reads no other;
//   - the listScored best scores, and the eligible peer with the longest
//     match: what /debug/route's reader and the logs ask about.
//
// The front's admission and steering read the failover order's pods, and
// admission the rest from the peer table when those are full.
func (a *assessment) listed(first *assessment) []int {
	// Insertion into short lists, best first; a row that does not beat a
	// full list's last, as most do, costs one comparison.
	var fail [listFailover]int
	var scored [listScored]int
	nf, ns, held, heldKeys := 0, 0, -1, -1
	keep := make([]int, 0, listFailover+listScored+3)
	// What a row is compared with, in locals, where they were loaded
	// through a and the lists for every row: the last score of the full
	// scored list, and the failover list's last row.
	rows, peers, chosen := a.rows, a.peers, a.chosen
	var floor, lastLoad float64
	var lastOver bool
	var lastID string
	for i := range rows {
		r := &rows[i]
		local := r.is(rowLocal)
		if i == chosen || local {
			keep = append(keep, i)
		}
		if !r.is(rowEligible) {
			continue
		}
		if k := a.matchOf(i, first).keys; k > heldKeys {
			held, heldKeys = i, k
		}
		if r.is(rowScored) && (ns < listScored || r.score > floor) {
			j := min(ns, listScored-1)
			for ; j > 0 && r.score > rows[scored[j-1]].score; j-- {
				scored[j] = scored[j-1]
			}
			scored[j], ns = i, min(ns+1, listScored)
			floor = rows[scored[ns-1]].score
		}
		if local || i == chosen {
			continue
		}
		if nf == listFailover {
			// before, its cheap part inline (most rows stop here) and
			// the IDs only on a tie.
			c := lighter(r.is(rowOver), lastOver, r.load, lastLoad)
			if c > 0 || (c == 0 && peers[i].ID >= lastID) {
				continue
			}
		}
		j := min(nf, listFailover-1)
		for ; j > 0 && a.before(i, fail[j-1]); j-- {
			fail[j] = fail[j-1]
		}
		fail[j], nf = i, min(nf+1, listFailover)
		last := &rows[fail[nf-1]]
		lastOver, lastLoad, lastID = last.is(rowOver), last.load, peers[fail[nf-1]].ID
	}
	keep = append(keep, fail[:nf]...)
	keep = append(keep, scored[:ns]...)
	if held >= 0 {
		keep = append(keep, held)
	}
	slices.Sort(keep)
	return slices.Compact(keep)
}

// before is the failover order's rule (before) for rows i and j, their
// IDs read only where their rows tie (lighter).
func (a *assessment) before(i, j int) bool {
	ri, rj := &a.rows[i], &a.rows[j]
	oi, oj := ri.is(rowOver), rj.is(rowOver)
	if c := lighter(oi, oj, ri.load, rj.load); c != 0 {
		return c < 0
	}
	return before(oi, oj, ri.load, rj.load, a.peers[i].ID, a.peers[j].ID)
}

// explain sets c, zero, to row i as a Candidate (in place: a Candidate
// returned by value was copied through the stack).
func (a *assessment) explain(c *Candidate, i int, first *assessment) {
	p, r := &a.peers[i], &a.rows[i]
	c.ID, c.Index, c.Local, c.Chosen, c.Rank = p.ID, i, p.Local, i == a.chosen, NoRank
	if !r.is(rowEligible) {
		c.Excluded = excluded(a.cfg, p, a.req, &a.at)
		return
	}
	m := a.matchOf(i, first)
	f := r.flags | m.flags&rowMatch
	c.Eligible, c.Over, c.Scored, c.Score = true, r.is(rowOver), r.is(rowScored), r.score
	c.Load, c.Queued, c.Ahead = r.load, r.queued, r.ahead
	c.MatchedKeys, c.MatchedTokens = m.keys, m.gpu+m.cpu+m.disk
	c.GPUTokens, c.CPUTokens, c.DiskTokens = m.gpu, m.cpu, m.disk
	c.Rank, c.Ranks, c.Pinned = m.rank, m.ranks, m.is(rowPinned)
	c.TTFT = a.ttft(r) // the deciding policy's own price
	c.Note = note(f, p.KeyScheme)
}

// note is a candidate's Note for its row's flags.
func note(f flags, scheme int) string {
	if f&(rowMatch|rowUnlisted|rowStaleLoad|rowBusier)&^rowPinned == 0 {
		return "" // most rows: nothing to say
	}
	var n string
	for _, t := range [...]struct {
		f   flags
		tag string
	}{
		{rowUnlisted, "model unlisted, in digest"},
		{rowStaleLoad, "stale load"},
		{rowOtherScheme, ""}, // below: it names the scheme
		{rowNoDigest, "no digest"},
		{rowStaleDigest, "stale digest"},
		{rowRecent, "recent"},
		{rowClaimed, "claim"},
		{rowBusier, "busier"},
	} {
		switch {
		case f&t.f == 0:
		case t.f == rowOtherScheme:
			n = addTag(n, "scheme "+strconv.Itoa(scheme))
		default:
			n = addTag(n, t.tag)
		}
	}
	return n
}
