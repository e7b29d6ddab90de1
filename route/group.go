package route

import "github.com/kvroute/kvroute/blockkey"

// Group answers PrefixLen for many peers' digests at once
// (bloom.Transposed): one pass over a prompt's keys gives every member's
// prefix, where asking each peer's digest costs a cache miss per peer, which
// at a thousand peers was most of a choice.
type Group interface {
	// Slots is the length PrefixLens's out and stamps need.
	Slots() int
	// PrefixLens sets out[s] to member s's PrefixLen(keys) and stamps[s]
	// to the stamp of the digest that answered (0 for a free slot).
	PrefixLens(keys []blockkey.Key, out []int, stamps []uint64)
}

// Grouped is a peer's digest that a Group holds, as its member in slot
// while the group's stamp for slot is stamp. It is a plain digest: one
// rank, no lower tier, so its TierPrefix is its PrefixLen. Another stamp
// means the group has moved on from this digest (a delta applied since the
// snapshot): the digest itself is asked, as without a group.
type Grouped interface {
	TierMatcher
	Group() (g Group, slot int, stamp uint64)
}

// Member is the Grouped a peer table hands out for a digest its Group
// holds: the digest (TierMatcher), its slot in G, and the stamp G gave it
// when it was put there. Make a new one at every change of the digest.
type Member struct {
	TierMatcher
	G     Group
	Slot  int
	Stamp uint64
}

// Group implements Grouped.
func (m *Member) Group() (Group, int, uint64) { return m.G, m.Slot, m.Stamp }

// Prefixes is one Group's answer for a request's keys.
type Prefixes struct {
	g      Group
	out    []int
	stamps []uint64
}

// groupFor asks the Group of the first peer whose digest has one for every
// member's prefix of keys, into r (its slices reused); nil when no peer's
// digest has a group.
func groupFor(peers []PeerView, keys []blockkey.Key, r *Prefixes) *Prefixes {
	for i := range peers {
		gd, ok := peers[i].Digest.(Grouped)
		if !ok {
			continue
		}
		g, _, _ := gd.Group()
		r.ask(g, keys)
		return r
	}
	return nil
}

// ask sets r to g's answer for keys, in r's slices (grown if need be).
func (r *Prefixes) ask(g Group, keys []blockkey.Key) {
	n := g.Slots()
	if cap(r.out) < n {
		r.out, r.stamps = make([]int, n), make([]uint64, n)
	}
	r.g, r.out, r.stamps = g, r.out[:n], r.stamps[:n]
	g.PrefixLens(keys, r.out, r.stamps)
}

// prefix returns pv's digest's PrefixLen from the group's answer, and
// false when the group does not answer for that digest.
func (r *Prefixes) prefix(pv *PeerView) (int, bool) {
	// A peer table's digest is a *Member: asked for that type, the check
	// is one comparison, where asking for Grouped looked the pair of types
	// up in the runtime's table and called Group, every peer.
	if m, ok := pv.Digest.(*Member); ok {
		return r.slot(m.G, m.Slot, m.Stamp)
	}
	gd, ok := pv.Digest.(Grouped)
	if !ok {
		return 0, false
	}
	return r.slot(gd.Group())
}

// slot is the group's answer for the digest in slot of g as of stamp.
func (r *Prefixes) slot(g Group, slot int, stamp uint64) (int, bool) {
	if r == nil || slot < 0 || slot >= len(r.out) || r.stamps[slot] != stamp || g != r.g {
		return 0, false
	}
	return r.out[slot], true
}
