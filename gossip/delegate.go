package gossip

import (
	"github.com/hashicorp/memberlist"
)

// delegate is the mesh as memberlist sees it: memberlist.Delegate and
// memberlist.EventDelegate. Every method runs on one of memberlist's loops
// (some while memberlist holds its node lock), so each one only copies,
// takes the mesh lock briefly, or hands off to a channel; none blocks or
// calls back into memberlist.
type delegate struct{ m *Mesh }

var (
	_ memberlist.Delegate      = delegate{}
	_ memberlist.EventDelegate = delegate{}
)

// NodeMeta returns the meta built in advance by the meta loop.
func (d delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if len(d.m.metaBytes) <= limit {
		return d.m.metaBytes
	}
	b, err := EncodeMeta(d.m.meta, limit)
	if err != nil {
		return nil
	}
	return b
}

// NotifyMsg copies b (memberlist reuses it) onto the inbox, or drops it when
// the inbox is full.
func (d delegate) NotifyMsg(b []byte) {
	c := make([]byte, len(b))
	copy(c, b)
	select {
	case d.m.inbox <- c:
	default:
		d.m.stats.inboxDrops.Add(1)
	}
}

// GetBroadcasts returns nothing: digests never ride memberlist's broadcast
// queue, whose receivers do not relay (libraries.md §1.3).
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState carries nothing. The node meta already carries each node's
// digest epoch and version, which every member gets from memberlist's own
// gossip; the repair tick compares them with our copies. Putting digests in
// push/pull state would only duplicate the periodic full digest.
func (delegate) LocalState(join bool) []byte { return nil }

// MergeRemoteState ignores remote state; see LocalState.
func (delegate) MergeRemoteState(buf []byte, join bool) {}

// NotifyJoin adds the peer, starts its sender and queues our full digest
// for it.
func (d delegate) NotifyJoin(n *memberlist.Node) {
	if n.Name == d.m.cfg.NodeName {
		return
	}
	meta, ok := d.meta(n)
	node := *n // memberlist owns n and updates it under its own lock
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if d.m.closed {
		return
	}
	d.m.table.upsert(n.Name, meta, ok, d.m.now())
	s := d.m.senders[n.Name]
	if s == nil {
		s = newSender(d.m, n.Name, d.m.cfg.OutboxDepth)
		d.m.senders[n.Name] = s
		d.m.wg.Add(1)
		go s.run()
	}
	s.node.Store(&node)
	if d.m.local != nil {
		s.requestFull()
	}
}

// NotifyLeave removes the peer and its digest at once and stops its sender.
func (d delegate) NotifyLeave(n *memberlist.Node) {
	if n.Name == d.m.cfg.NodeName {
		return
	}
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	d.m.table.remove(n.Name)
	if s := d.m.senders[n.Name]; s != nil {
		close(s.stop)
		delete(d.m.senders, n.Name)
	}
}

// NotifyUpdate records a peer's new meta. When the meta moves the digest
// epoch on, the old copy is dropped and a full digest requested at once.
func (d delegate) NotifyUpdate(n *memberlist.Node) {
	if n.Name == d.m.cfg.NodeName {
		return
	}
	meta, ok := d.meta(n)
	node := *n
	now := d.m.now()
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if _, known := d.m.table.peers[n.Name]; !known {
		return // an update for a node we never saw join, or that left
	}
	if s := d.m.senders[n.Name]; s != nil {
		s.node.Store(&node)
	}
	if d.m.table.upsert(n.Name, meta, ok, now) {
		d.m.stats.epochDrops.Add(1)
		d.m.askLocked(n.Name, now)
	}
}

func (d delegate) meta(n *memberlist.Node) (Meta, bool) {
	m, err := DecodeMeta(n.Meta)
	if err != nil {
		d.m.stats.metaErrors.Add(1)
		return Meta{}, false
	}
	return m, true
}
