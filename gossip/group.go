package gossip

import "github.com/kvroute/kvroute/route"

// regroup makes the table's transposed copy (bloom.Transposed) hold p's
// digest, or nothing for p when it has none or one the copy cannot hold;
// p.grouped is then the digest as views hand it out (route.Member): route
// matches every such peer's prefix in one pass over the copy instead of
// one digest at a time. Every table method that may change a digest calls
// it before it returns.
func (t *table) regroup(p *peer) {
	if (p.grouped == nil && p.digest == nil) || (p.grouped != nil && p.grouped.TierMatcher == p.digest) {
		return
	}
	slot := -1
	if p.grouped != nil {
		slot = p.grouped.Slot
	}
	p.grouped = nil
	if p.digest == nil {
		t.group.Remove(slot)
		return
	}
	if s, stamp := t.group.Put(slot, p.digest); s >= 0 {
		p.grouped = &route.Member{TierMatcher: p.digest, G: t.group, Slot: s, Stamp: stamp}
	}
}
