package membership

import "github.com/hashicorp/memberlist"

// Delegate is what this node carries for the layer above (gossip's
// dissemination). memberlist calls it on its own loops, some while it
// holds its node lock, so each method only copies, takes a lock briefly or
// hands off to a channel; none blocks or calls back into Members.
type Delegate interface {
	// NodeMeta returns this node's meta, at most limit bytes (512).
	NodeMeta(limit int) []byte
	// NotifyMsg receives a user message; b is the callee's to keep.
	NotifyMsg(b []byte)
	// LocalState is what this node sends in a push/pull exchange.
	LocalState(join bool) []byte
	// MergeRemoteState receives a peer's LocalState, after memberlist has
	// merged that peer's member list; buf is the callee's to keep.
	MergeRemoteState(buf []byte, join bool)
}

// Events tells the layer above of peers: joined, left (or dead), or with
// a new meta or address. This node's own events are not passed on (Self).
// Called as Delegate is.
type Events interface {
	Joined(n Node)
	Left(n Node)
	Updated(n Node)
}

// adapter is Members as memberlist sees it: memberlist.Delegate and
// memberlist.EventDelegate. It keeps this node's and the peers' copies
// (Self, the joiner's live set) and passes the rest on.
type adapter struct {
	ms *Members
	d  Delegate
	ev Events
}

var (
	_ memberlist.Delegate      = adapter{}
	_ memberlist.EventDelegate = adapter{}
)

func (a adapter) NodeMeta(limit int) []byte { return a.d.NodeMeta(limit) }

// NotifyMsg copies b, which memberlist reuses.
func (a adapter) NotifyMsg(b []byte) { a.d.NotifyMsg(clone(b)) }

// GetBroadcasts returns nothing: kvroute's messages never ride memberlist's
// broadcast queue, whose receivers do not relay
// (docs/reference/libraries.md §1.3).
func (adapter) GetBroadcasts(overhead, limit int) [][]byte { return nil }

func (a adapter) LocalState(join bool) []byte { return a.d.LocalState(join) }

func (a adapter) MergeRemoteState(buf []byte, join bool) {
	if len(buf) > 0 {
		a.d.MergeRemoteState(clone(buf), join)
	}
}

func (a adapter) NotifyJoin(n *memberlist.Node) {
	node := nodeOf(n)
	if a.self(node) {
		return
	}
	a.ms.mu.Lock()
	a.ms.peers[node.Name] = node
	a.ms.mu.Unlock()
	a.ev.Joined(node)
}

func (a adapter) NotifyLeave(n *memberlist.Node) {
	node := nodeOf(n)
	if node.Name == a.ms.cfg.NodeName {
		return
	}
	a.ms.mu.Lock()
	delete(a.ms.peers, node.Name)
	a.ms.mu.Unlock()
	a.ev.Left(node)
}

func (a adapter) NotifyUpdate(n *memberlist.Node) {
	node := nodeOf(n)
	if a.self(node) {
		return
	}
	a.ms.mu.Lock()
	if _, ok := a.ms.peers[node.Name]; ok {
		a.ms.peers[node.Name] = node
	}
	a.ms.mu.Unlock()
	a.ev.Updated(node)
}

// self records n when it is this node, and says so.
func (a adapter) self(n Node) bool {
	if n.Name != a.ms.cfg.NodeName {
		return false
	}
	a.ms.self.Store(&n)
	return true
}

func clone(b []byte) []byte {
	c := make([]byte, len(b))
	copy(c, b)
	return c
}
