package gossip

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bloom"
)

// ErrNoDigest is returned by PublishDelta before any PublishDigest: a delta
// needs a digest to follow.
var ErrNoDigest = errors.New("no local digest to apply the delta to")

// exchange is the local side of the digest exchange: the digest this node
// advertises and its full message, encoded once however many peers it goes
// to. Peers' copies live in the table; the requests for a full digest in
// needfull.go.
type exchange struct {
	mu    sync.Mutex
	local *bloom.Digest // replaced wholesale, never modified
	full  []byte        // local encoded, nil until first needed
	full1 []byte        // local in format 1 for peers of wire 1, nil until first needed
}

// has reports whether there is a local digest.
func (x *exchange) has() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.local != nil
}

// digestMsg is a full digest: kindDigest, then bloom.(*Digest).MarshalBinary.
type digestMsg struct{ *bloom.Digest }

func encodeDigest(d *bloom.Digest) ([]byte, error) {
	b, err := d.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return append([]byte{kindDigest}, b...), nil
}

// encodeDigestV1 is encodeDigest for a peer of wire 1: the bits without
// the removals, which it cannot read.
func encodeDigestV1(d *bloom.Digest) ([]byte, error) {
	b, err := d.MarshalV1()
	if err != nil {
		return nil, err
	}
	return append([]byte{kindDigest}, b...), nil
}

func decodeDigestMsg(b []byte) (payload, error) {
	d, err := bloom.Unmarshal(b)
	if err != nil {
		return nil, err
	}
	return digestMsg{d}, nil
}

func (d digestMsg) encode() ([]byte, error) { return encodeDigest(d.Digest) }

func (d digestMsg) apply(m *Mesh, now time.Time) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	o := m.table.applyDigest(d.Digest, now)
	m.count(o)
	m.reportApplied(o, d.Header().Node)
}

// deltaMsg is a delta: kindDelta, then bloom.MarshalDelta.
type deltaMsg struct{ bloom.Delta }

func encodeDelta(x bloom.Delta) ([]byte, error) {
	b, err := bloom.MarshalDelta(x)
	if err != nil {
		return nil, err
	}
	return append([]byte{kindDelta}, b...), nil
}

func decodeDeltaMsg(b []byte) (payload, error) {
	x, err := bloom.UnmarshalDelta(b)
	if err != nil {
		return nil, err
	}
	return deltaMsg{x}, nil
}

func (x deltaMsg) encode() ([]byte, error) { return encodeDelta(x.Delta) }

func (x deltaMsg) apply(m *Mesh, now time.Time) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	p := m.table.peers[x.Node]
	noCopy := p != nil && p.digest == nil
	o, dropped := m.table.applyDelta(x.Delta, now)
	m.count(o)
	switch {
	case o != gap:
	case noCopy:
		m.stats.gapsNoCopy.Add(1)
	case dropped:
		m.stats.gapsEpoch.Add(1)
	}
	m.reportApplied(o, x.Node)
	if dropped {
		m.stats.epochDrops.Add(1)
	}
	if o == gap {
		m.askLocked(x.Node, now)
	}
}

// count records what applying a digest or delta did.
func (m *Mesh) count(o outcome) {
	switch o {
	case held:
		m.stats.held.Add(1)
	case stale:
		m.stats.stale.Add(1)
	case gap:
		m.stats.gaps.Add(1)
	case unknown:
		m.stats.unknownOrigin.Add(1)
	}
}

// reportApplied tells the test hook the origin's copy version after a
// change. The caller holds tableMu.
func (m *Mesh) reportApplied(o outcome, origin string) {
	if o != applied || m.hooks.applied == nil {
		return
	}
	if p := m.table.peers[origin]; p != nil && p.digest != nil {
		m.hooks.applied(origin, p.digest.Header().Version)
	}
}

// PublishDigest makes d the local digest and sends it in full to every
// member by TCP. Call it on start, on an epoch change and whenever the
// digest is rebuilt; the mesh itself resends it every FullDigestInterval.
// d must be this node's (Header().Node == NodeName).
func (m *Mesh) PublishDigest(d *bloom.Digest) error {
	if d == nil {
		return fmt.Errorf("publish digest: nil digest")
	}
	h := d.Header()
	if h.Node != m.cfg.NodeName {
		return fmt.Errorf("publish digest: digest of node %q, we are %q", h.Node, m.cfg.NodeName)
	}
	b, err := encodeDigest(d)
	if err != nil {
		return fmt.Errorf("publish digest: %w", err)
	}
	x := &m.digests
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.local == nil || x.local.Header().Epoch != h.Epoch {
		m.load.setEpoch(h.Epoch, m.now()) // peers match a digest only of the epoch pushes name
	}
	x.local, x.full, x.full1 = d, b, nil
	m.load.setVersion(h.Version)
	m.advert.edit(func(mt *Meta) bool {
		mt.HasDigest, mt.DigestEpoch, mt.DigestVersion = true, h.Epoch, h.Version
		return true
	})
	m.members.each(func(s *sender) { s.requestFull() })
	return nil
}

// PublishDelta applies x to the local digest and sends it to every member:
// by UDP when it fits PacketBytes, else by TCP. A member of wire 1 gets it
// without its removals (bloom.Delta.AddsOnly). It fails, changing nothing,
// with ErrNoDigest before the first PublishDigest and with an error wrapping
// bloom.ErrGap or bloom.ErrStale when x does not follow the local digest;
// publish a full digest then.
func (m *Mesh) PublishDelta(d bloom.Delta) error {
	if d.Node != m.cfg.NodeName {
		return fmt.Errorf("publish delta: delta of node %q, we are %q", d.Node, m.cfg.NodeName)
	}
	b, err := encodeDelta(d)
	if err != nil {
		return fmt.Errorf("publish delta: %w", err)
	}
	o, o1 := out{b: b, reliable: len(b) > m.cfg.PacketBytes}, out{}
	var old map[string]bool // peers that do not read removals
	if len(d.Removed) > 0 && m.OldestWire() < 2 {
		b1, err := encodeDelta(d.AddsOnly())
		if err != nil {
			return fmt.Errorf("publish delta: %w", err)
		}
		o1, old = out{b: b1, reliable: len(b1) > m.cfg.PacketBytes}, m.withoutRemovals()
	}
	x := &m.digests
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.local == nil {
		return ErrNoDigest
	}
	next, err := x.local.Apply(d)
	if err != nil {
		return fmt.Errorf("publish delta: %w", err)
	}
	x.local, x.full, x.full1 = next, nil, nil
	m.load.setVersion(d.To)
	m.advert.note(func(mt *Meta) { mt.DigestVersion = d.To })
	m.members.each(func(s *sender) {
		if old != nil && old[s.id] {
			s.enqueue(o1)
			return
		}
		s.enqueue(o)
	})
	return nil
}

// readsRemovals reports whether peer id reads removals (wire 2 and up); a
// peer whose meta has not decoded is not assumed to.
func (m *Mesh) readsRemovals(id string) bool {
	v, ok := m.PeerWire(id)
	return ok && v >= 2
}

// withoutRemovals returns the peers in the table that do not read
// removals; a sender not in it is a peer that joined since, whose meta
// has decoded (the table learns a peer before its sender starts).
func (m *Mesh) withoutRemovals() map[string]bool {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	old := map[string]bool{}
	for id, p := range m.table.peers {
		if !p.metaOK || p.meta.Wire < 2 {
			old[id] = true
		}
	}
	return old
}

// WithdrawDigest stops advertising the local digest: peers drop their copy
// and the claims on this node at the next push, which goes at once. The
// next PublishDigest advertises again.
func (m *Mesh) WithdrawDigest() {
	x := &m.digests
	x.mu.Lock()
	if x.local != nil {
		x.local, x.full, x.full1 = nil, nil, nil
		m.advert.edit(func(mt *Meta) bool {
			mt.HasDigest, mt.DigestEpoch, mt.DigestVersion = false, 0, 0
			return true
		})
		m.load.withdraw(m.now())
	}
	x.mu.Unlock()
	m.advert.kickNow()
}

// fullBytes returns the encoded full local digest for peer id (format 1
// for a peer of wire 1 when the digest has removals), nil if there is
// none. Senders call it; the first after a delta encodes, the others share.
func (m *Mesh) fullBytes(id string) []byte {
	v1 := !m.readsRemovals(id)
	x := &m.digests
	x.mu.Lock()
	d, b := x.local, x.full
	if v1 && d != nil && d.Removed() > 0 {
		b = x.full1
	} else {
		v1 = false
	}
	x.mu.Unlock()
	if d == nil || b != nil {
		return b
	}
	enc := encodeDigest
	if v1 {
		enc = encodeDigestV1
	}
	b, err := enc(d)
	if err != nil {
		return nil // PublishDigest checked that d encodes
	}
	x.mu.Lock()
	if x.local == d {
		if v1 {
			x.full1 = b
		} else {
			x.full = b
		}
	}
	x.mu.Unlock()
	return b
}

// sendFulls queues the full local digest for every member: the periodic
// resend that bounds how long a copy can stay wrong unnoticed.
func (m *Mesh) sendFulls() {
	if m.digests.has() {
		m.members.each(func(s *sender) { s.requestFull() })
	}
}

// repair asks for a full digest from every origin whose held deltas waited
// too long or whose copy lags its meta (table.repairs).
func (m *Mesh) repair(now time.Time) {
	m.tableMu.Lock()
	defer m.tableMu.Unlock()
	for _, id := range m.table.repairs(now, m.cfg.ReorderWait, m.cfg.RepairAfter, m.cfg.NeedFullInterval) {
		m.sendNeedFullLocked(id)
	}
}
