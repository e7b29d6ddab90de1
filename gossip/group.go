package gossip

import (
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// member is a peer's digest while the table's transposed copy holds it
// (route.Grouped): route then matches every such peer's prefix in one pass
// over the copy instead of one digest at a time. It is made anew at every
// change of the digest, so a view holds the stamp of the digest it shows.
type member struct {
	*bloom.Digest
	g     *bloom.Transposed
	slot  int
	stamp uint64
}

// Group implements route.Grouped.
func (m *member) Group() (route.Group, int, uint64) { return m.g, m.slot, m.stamp }

// regroup makes the transposed copy hold p's digest, or nothing for p when
// it has none or one the copy cannot hold (bloom.Transposed.Put). Every
// table method that may change a digest calls it before it returns.
func (t *table) regroup(p *peer) {
	if (p.grouped == nil && p.digest == nil) || (p.grouped != nil && p.grouped.Digest == p.digest) {
		return
	}
	slot := -1
	if p.grouped != nil {
		slot = p.grouped.slot
	}
	p.grouped = nil
	if p.digest == nil {
		t.group.Remove(slot)
		return
	}
	if s, stamp := t.group.Put(slot, p.digest); s >= 0 {
		p.grouped = &member{p.digest, t.group, s, stamp}
	}
}
