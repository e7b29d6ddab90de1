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

// Choose implements Policy. An empty Chain chooses nothing.
func (ch Chain) Choose(req Request, peers []PeerView, now time.Time) Decision {
	var first, d Decision
	var note string
	for i, p := range ch {
		d = p.Choose(req, peers, now)
		if i == 0 {
			first = d
		}
		if d.Target != "" {
			break
		}
		note = merge(note, d.Note, "; ")
		if d.Eligible == 0 {
			break // every later policy sees the same empty field
		}
	}
	if d.Target == "" {
		d.Reason = ReasonNone
		d.Note = note
		if len(ch) == 0 {
			d.Note = "empty chain"
		}
	} else {
		d.Note = merge(note, d.Note, "; ")
	}
	keepMatches(d.Candidates, first.Candidates)
	return d
}

// keepMatches copies match columns from an earlier Decision's candidates
// of the same peers, where the later policy did not compute them.
func keepMatches(dst, src []Candidate) {
	if len(dst) != len(src) || len(dst) == 0 || &dst[0] == &src[0] {
		return // none to copy, or the same policy's own
	}
	for i := range dst {
		if dst[i].ID != src[i].ID || dst[i].MatchedKeys != 0 {
			continue
		}
		dst[i].MatchedKeys, dst[i].MatchedTokens = src[i].MatchedKeys, src[i].MatchedTokens
		dst[i].GPUTokens, dst[i].CPUTokens, dst[i].DiskTokens = src[i].GPUTokens, src[i].CPUTokens, src[i].DiskTokens
		dst[i].Rank, dst[i].Ranks, dst[i].Pinned = src[i].Rank, src[i].Ranks, src[i].Pinned
		dst[i].Note = merge(src[i].Note, dst[i].Note, ", ")
	}
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
