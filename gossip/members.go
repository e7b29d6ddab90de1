package gossip

import (
	"sync"

	"github.com/kvroute/kvroute/membership"
)

// members is the live membership as the mesh sends to it: one sender per
// peer, started when the membership reports the peer joined and stopped
// when it leaves or dies. After Shutdown (closed) no sender starts.
type members struct {
	mu      sync.Mutex
	closed  bool
	senders map[string]*sender
}

// each calls f for every peer's sender; f must not block.
func (ms *members) each(f func(*sender)) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, s := range ms.senders {
		f(s)
	}
}

// get returns the sender to id, nil for no live peer of that name.
func (ms *members) get(id string) *sender {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.senders[id]
}

// close stops any sender from starting. It reports false if it was
// already closed.
func (ms *members) close() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return false
	}
	ms.closed = true
	return true
}

// peerJoined adds the peer to the table, starts its sender and queues our
// full digest for it (the sender skips it while we have none).
func (m *Mesh) peerJoined(n membership.Node, meta Meta, metaOK bool) {
	m.tableMu.Lock()
	m.table.upsert(n.Name, meta, metaOK, m.now())
	m.tableMu.Unlock()
	if !m.addSender(n.Name) {
		return
	}
	// The newcomer routes to us only once it has our push (route's
	// SilentFor): send one now, by TCP, with our engine state.
	m.load.mu.Lock()
	m.load.stateChangedLocked()
	m.load.mu.Unlock()
}

// addSender starts the sender to a joined peer, if it has none, and
// queues our full digest for it; false once the mesh is closed. The
// membership keeps the peer's address.
func (m *Mesh) addSender(id string) bool {
	ms := &m.members
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.closed {
		return false
	}
	s := ms.senders[id]
	if s == nil {
		s = newSender(m, id, m.cfg.OutboxDepth)
		ms.senders[id] = s
		m.wg.Add(1) // under mu, before Shutdown can close and Wait
		go s.run()
	}
	s.requestFull()
	return true
}

// peerLeft removes the peer and its digest at once and stops its sender.
func (m *Mesh) peerLeft(id string) {
	m.tableMu.Lock()
	m.table.remove(id)
	m.tableMu.Unlock()
	ms := &m.members
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if s := ms.senders[id]; s != nil {
		close(s.stop)
		delete(ms.senders, id)
	}
}

// peerUpdated records a peer's new meta. When the meta moves the digest
// epoch on, the old copy is dropped and a full digest requested at once.
func (m *Mesh) peerUpdated(n membership.Node, meta Meta, metaOK bool) {
	now := m.now()
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	if _, known := m.table.peers[n.Name]; !known {
		return // an update for a node we never saw join, or that left
	}
	if m.table.upsert(n.Name, meta, metaOK, now) {
		m.stats.epochDrops.Add(1)
		m.askLocked(n.Name, now)
	}
}
