package route

import (
	"slices"
	"strings"
	"time"
)

// Chain tries its policies in order; the first Decision with a target
// wins. The result carries the winner's reason, and its Note says why each
// earlier policy declined. Candidates keep the match columns of the first
// policy that computed them (Affinity), so the explanation of a
// rendezvous or least-load choice still shows what every peer held.
type Chain []Policy

// DefaultChain is the kvroute choice (docs/design.md D4): cache affinity within
// the load bound, then rendezvous for prefixes nobody holds, then least
// load. r may be nil.
func DefaultChain(cfg Config, r *Recent) Chain {
	return Chain{Affinity{Config: cfg, Recent: r}, Rendezvous{Config: cfg}, LeastLoad{Config: cfg}}
}

// Choose implements Policy. An empty Chain chooses nothing. A policy of
// another package is asked its Choose, and a Decision of its is returned
// as it comes (the Chain's note added): no match columns are carried into
// it.
func (ch Chain) Choose(req Request, peers []PeerView, now time.Time) Decision {
	s := spaces.Get().(*space)
	defer spaces.Put(s)
	var first, a assessment
	var foreign *Decision
	var note string
	decided := -1 // the policy whose choice or decline is returned
	for i, p := range ch {
		decided = i
		var d *Decision
		if w, ok := p.(weigher); ok {
			sp := &s.later // only the first's rows and the last's are read
			if i == 0 {
				sp = &s.first
			}
			a, foreign = w.weigh(&req, peers, now, sp), nil
			if i == 0 {
				first = a
			}
			d = &a.d
		} else {
			fd := p.Choose(req, peers, now)
			foreign, d = &fd, &fd
		}
		if d.Target != "" {
			break
		}
		note = merge(note, d.Note, "; ")
		if d.Eligible == 0 {
			break // every later policy sees the same empty field
		}
	}
	var d Decision
	switch {
	case decided < 0:
		return Decision{Reason: ReasonNone, Note: "empty chain"}
	case foreign != nil:
		d = *foreign
	case decided == 0 || first.rows == nil:
		d = a.decision(nil)
	default:
		d = a.decision(&first)
	}
	if d.Target == "" {
		d.Reason, d.Note = ReasonNone, note
	} else {
		d.Note = merge(note, d.Note, "; ")
	}
	return d
}

// merge appends the sep-separated parts of b that a lacks.
func merge(a, b, sep string) string {
	if a == "" {
		return b
	}
	if b == "" || a == b {
		return a
	}
	have := strings.Split(a, sep)
	for _, t := range strings.Split(b, sep) {
		if !slices.Contains(have, t) {
			have = append(have, t)
		}
	}
	return strings.Join(have, sep)
}
