package gossip

import (
	"github.com/hashicorp/memberlist"
)

// delegate is the mesh as memberlist sees it: memberlist.Delegate and
// memberlist.EventDelegate. Every method runs on one of memberlist's loops
// (some while memberlist holds its node lock), so each one only copies,
// takes a mesh lock briefly, or hands off to a channel; none blocks or
// calls back into memberlist.
type delegate struct{ m *Mesh }

var (
	_ memberlist.Delegate      = delegate{}
	_ memberlist.EventDelegate = delegate{}
)

// NodeMeta returns the meta built in advance by the meta loop.
func (d delegate) NodeMeta(limit int) []byte { return d.m.advert.nodeMeta(limit) }

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
// queue, whose receivers do not relay (docs/reference/libraries.md §1.3).
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }

// LocalState carries the newest response owners (responses.go), which a
// (re)joining node has no other way to learn. It carries no digests: the
// node meta already carries each node's digest epoch and version, which
// every member gets from memberlist's own gossip, and the repair tick
// compares them with our copies, so digests in push/pull state would only
// duplicate the periodic full digest.
func (d delegate) LocalState(join bool) []byte { return d.m.responseState(join) }

// MergeRemoteState hands the peer's state, a message of its own, to the
// mesh loop as NotifyMsg does. memberlist has merged the peer's members
// first (net.go mergeRemoteState), so owners that are live are members.
func (d delegate) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 {
		d.NotifyMsg(buf)
	}
}

// NotifyJoin adds the peer (members.go) and gives it back its responses
// (responses.go), or records this node's address.
func (d delegate) NotifyJoin(n *memberlist.Node) {
	if n.Name == d.m.cfg.NodeName {
		node := *n
		d.m.members.self.Store(&node)
		return
	}
	meta, ok := d.meta(n)
	d.m.peerJoined(n, meta, ok)
	d.m.responsesJoined(n.Name)
}

// NotifyLeave removes the peer (members.go) and marks its responses gone
// (responses.go): at once when its last meta said its store is gone.
func (d delegate) NotifyLeave(n *memberlist.Node) {
	if n.Name != d.m.cfg.NodeName {
		meta, _ := DecodeMeta(n.Meta) // a meta that does not decode says nothing
		d.m.peerLeft(n.Name)
		d.m.responsesLeft(n.Name, meta.StoreGone)
	}
}

// NotifyUpdate records a peer's new meta (members.go), or this node's.
func (d delegate) NotifyUpdate(n *memberlist.Node) {
	if n.Name == d.m.cfg.NodeName {
		node := *n
		d.m.members.self.Store(&node)
		return
	}
	meta, ok := d.meta(n)
	d.m.peerUpdated(n, meta, ok)
}

func (d delegate) meta(n *memberlist.Node) (Meta, bool) {
	m, err := DecodeMeta(n.Meta)
	if err != nil {
		d.m.stats.metaErrors.Add(1)
		return Meta{}, false
	}
	if m.Wire > WireVersion {
		d.m.stats.newerRead.Add(1)
	}
	return m, true
}
