package gossip

import (
	"time"

	"github.com/kvroute/kvroute/route"
)

// briefs keeps the table's peers as a front's route.Shortlist reads them
// (route.Brief), in views' order with a place for this node: each brief
// rebuilt as its peer changes (touch), so a choice among a thousand peers
// reads a thousand briefs and builds the views of a few, where it built
// a view of every peer.
type briefs struct {
	list  []route.Brief
	order []named // list's peers; the zero named at self
	self  int     // this node's place in list
	// stale: peers came or went (or a meta was first read, or the group
	// was rebuilt); the list is made again before it is read.
	stale bool
}

// touch rebuilds p's brief after a change to what its view shows.
func (t *table) touch(p *peer) {
	if b := &t.briefs; !b.stale && p.brief >= 0 {
		b.list[p.brief] = t.briefOf(b.order[p.brief])
	}
}

// unsort marks the briefs' order out of date: a peer came, went, or
// changed its slot in a new group.
func (t *table) unsort() { t.briefs.stale = true }

func (t *table) briefOf(e named) route.Brief {
	var v route.PeerView
	t.view(&v, e)
	return route.BriefOf(&v)
}

// briefsWith returns the briefs with self's in its place, the list made
// again if stale, and self's place.
func (t *table) briefsWith(self *route.PeerView) ([]route.Brief, int) {
	b := &t.briefs
	if b.stale || len(b.list) == 0 || b.order[b.self].p != nil || b.selfID() != self.ID {
		b.list, b.order = b.list[:0], b.order[:0]
		placed := false
		for _, e := range t.sorted {
			e.p.brief = -1
			if !placed && e.id >= self.ID {
				b.self, placed = len(b.list), true
				b.list, b.order = append(b.list, route.Brief{}), append(b.order, named{id: self.ID})
			}
			if !e.p.metaOK {
				continue
			}
			e.p.brief = len(b.list)
			b.list, b.order = append(b.list, t.briefOf(e)), append(b.order, e)
		}
		if !placed {
			b.self = len(b.list)
			b.list, b.order = append(b.list, route.Brief{}), append(b.order, named{id: self.ID})
		}
		b.stale = false
	}
	b.list[b.self] = route.BriefOf(self)
	return b.list, b.self
}

func (b *briefs) selfID() string { return b.order[b.self].id }

// Shortlist makes sl for req among this node and its peers
// (route.Shortlist.Make, on the table's briefs and group) and returns the
// views its choice reads, written over buf, each passed to fresh first (a
// front adds its own counts); false when no shortlist is worth making,
// and the caller reads every view (AppendSnapshot). also and r are
// Make's. The table is held throughout: the views are of one moment.
func (m *Mesh) Shortlist(sl *route.Shortlist, cfg *route.Config, req *route.Request, also []string, r *route.Recent,
	now time.Time, fresh func(*route.PeerView), buf []route.PeerView) ([]route.PeerView, bool) {
	m.tableMu.Lock()
	few := len(m.table.sorted)+1 < route.ShortlistMin
	m.tableMu.Unlock()
	if few { // most meshes: no shortlist, and nothing built for one
		return buf, false
	}
	self := m.self(now)
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	return m.table.shortlist(sl, cfg, req, also, r, &self, now, fresh, buf)
}

// shortlist is Mesh.Shortlist on the table, self this node's view.
func (t *table) shortlist(sl *route.Shortlist, cfg *route.Config, req *route.Request, also []string, r *route.Recent,
	self *route.PeerView, now time.Time, fresh func(*route.PeerView), buf []route.PeerView) ([]route.PeerView, bool) {
	list, at := t.briefsWith(self)
	view := func(i int, v *route.PeerView) {
		if i == at {
			*v = *self
		} else {
			t.view(v, t.briefs.order[i])
		}
		fresh(v)
	}
	return sl.Make(cfg, req, list, t.group, also, r, &t.claims, now, view, buf)
}
