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
	var next []Candidate
	for i := range d.Candidates {
		c := &d.Candidates[i]
		switch {
		case c.Local:
			local = c
		case c.Eligible && c.ID != d.Target:
			next = append(next, *c)
		}
	}
	localOK := local != nil && local.Eligible
	var out []string
	switch {
	case d.Target != "" && d.Local:
		out = append(out, d.Target)
		localOK = false // tried already
	case d.Target != "":
		out = append(out, d.Target)
	}
	slices.SortStableFunc(next, func(a, b Candidate) int {
		if a.Over != b.Over {
			if a.Over {
				return 1
			}
			return -1
		}
		return cmp.Or(cmp.Compare(a.Load, b.Load), cmp.Compare(a.ID, b.ID))
	})
	room := max
	if localOK {
		room-- // the last try is local's
	}
	for _, c := range next {
		if len(out) >= room {
			break
		}
		if c.Over && localOK && !d.Local {
			continue // the local engine serves: no need to load a full peer
		}
		out = append(out, c.ID)
	}
	if local != nil && ((localOK && len(out) < max) || len(out) == 0) {
		out = append(out, local.ID)
	}
	return out
}
