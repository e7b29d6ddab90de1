package gossip

import "github.com/kvroute/kvroute/membership"

// delegate is the mesh as its membership sees it: membership.Delegate and
// membership.Events. Every method runs on one of memberlist's loops (some
// while memberlist holds its node lock), so each one only takes a mesh
// lock briefly or hands off to a channel; none blocks or calls back into
// the membership.
type delegate struct{ m *Mesh }

var (
	_ membership.Delegate = delegate{}
	_ membership.Events   = delegate{}
)

// NodeMeta returns the meta built in advance by the meta loop.
func (d delegate) NodeMeta(limit int) []byte { return d.m.advert.nodeMeta(limit) }

// NotifyMsg puts b on the inbox, or drops it when the inbox is full.
func (d delegate) NotifyMsg(b []byte) {
	select {
	case d.m.inbox <- b:
	default:
		d.m.stats.inboxDrops.Add(1)
	}
}

// LocalState carries the newest response owners (responses.go), which a
// (re)joining node has no other way to learn. It carries no digests: the
// load reports carry each node's digest version, and the repair tick
// compares it with our copies, so digests in push/pull state would only
// duplicate the periodic full digest.
func (d delegate) LocalState(join bool) []byte { return d.m.responseState(join) }

// MergeRemoteState hands the peer's state, a message of its own, to the
// mesh loop as NotifyMsg does. memberlist has merged the peer's members
// first (net.go mergeRemoteState), so owners that are live are members.
func (d delegate) MergeRemoteState(buf []byte, join bool) { d.NotifyMsg(buf) }

// Joined adds the peer (members.go) and gives it back its responses
// (responses.go).
func (d delegate) Joined(n membership.Node) {
	meta, ok := d.meta(n)
	d.m.peerJoined(n, meta, ok)
	d.m.responsesJoined(n.Name)
}

// Left removes the peer (members.go) and marks its responses gone
// (responses.go): at once when its last meta said its store is gone.
func (d delegate) Left(n membership.Node) {
	meta, _ := DecodeMeta(n.Meta) // a meta that does not decode says nothing
	d.m.peerLeft(n.Name)
	d.m.responsesLeft(n.Name, meta.StoreGone)
}

// Updated records a peer's new meta (members.go).
func (d delegate) Updated(n membership.Node) {
	meta, ok := d.meta(n)
	d.m.peerUpdated(n, meta, ok)
}

func (d delegate) meta(n membership.Node) (Meta, bool) {
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
