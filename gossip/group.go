package gossip

import (
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// regroup makes the table's transposed copy (bloom.Transposed) hold p's
// digest, or nothing for p when it has none or one the copy cannot hold;
// p.grouped is then the digest as views hand it out (route.Member): route
// matches every such peer's prefix in one pass over the copy instead of
// one digest at a time. Every table change of a digest calls it.
//
// The copy holds one shape of digest, its first member's. A plain digest
// of another shape is a misfit, matched alone; when one other shape
// outnumbers the members (a rolling change of the digests' size, or an
// odd pod that happened to come first), the copy is rebuilt for it.
func (t *table) regroup(p *peer) {
	if p.grouped != nil && p.grouped.TierMatcher == p.digest {
		return
	}
	slot := -1
	if p.grouped != nil {
		slot = p.grouped.Slot
	}
	p.grouped = nil
	if p.digest == nil {
		t.group.Remove(slot)
		t.setMisfit(p, false)
		t.rebuildIf(false)
		return
	}
	s, stamp := t.group.Put(slot, p.digest)
	if s >= 0 {
		p.grouped = &route.Member{TierMatcher: p.digest, G: t.group, Slot: s, Stamp: stamp}
		t.setMisfit(p, false)
		return
	}
	was := p.misfit
	t.setMisfit(p, bloom.Groupable(p.digest))
	t.rebuildIf(p.misfit && !was)
}

// rebuildIf rebuilds the copy when misfits outnumber its members and
// either one just became a misfit or the copy has emptied (its shape is
// then free for theirs).
func (t *table) rebuildIf(newMisfit bool) {
	if t.misfits > t.group.Len() && (newMisfit || t.group.Len() == 0) {
		t.rebuildGroup()
	}
}

func (t *table) setMisfit(p *peer, misfit bool) {
	switch {
	case misfit && !p.misfit:
		t.misfits++
	case !misfit && p.misfit:
		t.misfits--
	}
	p.misfit = misfit
}

// rebuildGroup starts a new copy with the most common shape among the
// peers' plain digests, if that is not the copy's, and puts every peer's
// digest in it again: O(peers × M/64), once per change of the common
// shape. Views made before hold the old copy, which answers for them as
// before.
func (t *table) rebuildGroup() {
	count := map[bloom.Params]int{}
	var shape bloom.Params
	for _, e := range t.sorted {
		if d := e.p.digest; d != nil && bloom.Groupable(d) {
			ps := d.Header().Params
			count[ps]++
			if count[ps] > count[shape] {
				shape = ps
			}
		}
	}
	if shape == t.group.Shape() || count[shape] <= t.group.Len() {
		return
	}
	t.group, t.misfits = bloom.NewTransposed(), 0
	t.unsort() // every brief's slot changes
	for _, e := range t.sorted {
		e.p.grouped, e.p.misfit = nil, false
	}
	for _, first := range []bool{true, false} { // the common shape first: it sets the copy's
		for _, e := range t.sorted {
			if d := e.p.digest; d != nil && (d.Header().Params == shape) == first {
				t.regroup(e.p)
			}
		}
	}
}
