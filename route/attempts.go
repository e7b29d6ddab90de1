package route

import (
	"cmp"
	"slices"
)

// Attempts returns the failover order of d (docs/design.md D5): the IDs of the
// candidates to try, first to last, at most max of them. A request is
// retried only before its first response byte, so the order matters only
// when a try fails; it is part of the Decision so that /debug/route shows
// it and one place decides it.
//
// The chosen peer comes first. The next are the other eligible peers,
// those within the load bound before those over it, lighter first, ties by
// ID. The local pod comes last while its engine serves (a forward is the
// optimisation; the local vLLM the fallback), or first when it was chosen,
// the peers then taking a request its engine dies with; peers over the
// bound count only when the local engine cannot serve. With no eligible
// candidate at all the local pod is the one attempt: it answers with the
// error vLLM gives.
func Attempts(d Decision, max int) []string {
	max = cmp.Or(max, 1)
	var local *Candidate
	for i := range d.Candidates {
		if d.Candidates[i].Local {
			local = &d.Candidates[i]
		}
	}
	localOK := local != nil && local.Eligible
	out := make([]string, 0, max) // never more: one allocation per request
	switch {
	case d.Target != "" && d.Local:
		out = append(out, d.Target)
		localOK = false // tried already
	case d.Target != "":
		out = append(out, d.Target)
	}
	room := max
	if localOK {
		room-- // the last try is local's
	}
	// The best room-len(out) of the rest, in order: a selection, not a
	// sort, since a front computes this for every request and a mesh may
	// have a thousand candidates.
	next := make([]*Candidate, 0, room)
	for i := range d.Candidates {
		c := &d.Candidates[i]
		if c.Local || !c.Eligible || c.ID == d.Target {
			continue
		}
		if c.Over && localOK && !d.Local {
			continue // the local engine serves: no need to load a full peer
		}
		if len(out)+len(next) >= room && (len(next) == 0 || !candidateBefore(c, next[len(next)-1])) {
			continue
		}
		j := len(next)
		for j > 0 && candidateBefore(c, next[j-1]) {
			j--
		}
		next = slices.Insert(next, j, c)
		if len(out)+len(next) > room {
			next = next[:len(next)-1]
		}
	}
	for _, c := range next {
		out = append(out, c.ID)
	}
	if local != nil && ((localOK && len(out) < max) || len(out) == 0) {
		out = append(out, local.ID)
	}
	return out
}

// before orders failover candidates: within the load bound before over
// it, lighter first, ties by ID. Attempts orders Candidates by it, and a
// Decision among many peers lists its rows by it (listed).
func before(overA, overB bool, loadA, loadB float64, idA, idB string) bool {
	if c := lighter(overA, overB, loadA, loadB); c != 0 {
		return c < 0
	}
	return idA < idB
}

// lighter is before's order but for the IDs: -1 or +1 where it orders a
// and b, 0 where only their IDs can. A choice among many peers lists them
// by before (listed), and most rows of a large mesh differ from the
// list's last in load: they are passed over without reading an ID, a
// cache line away in the peer's view.
func lighter(overA, overB bool, loadA, loadB float64) int {
	switch {
	case overA == overB:
		return cmp.Compare(loadA, loadB)
	case overA:
		return +1
	}
	return -1
}

func candidateBefore(a, b *Candidate) bool { return before(a.Over, b.Over, a.Load, b.Load, a.ID, b.ID) }
