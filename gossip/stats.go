package gossip

import (
	"sync/atomic"

	"github.com/kvroute/kvroute/membership"
)

// Traffic counts messages and their bytes (our payload, without
// memberlist's framing).
type Traffic struct{ Msgs, Bytes uint64 }

// ByKind splits traffic by message kind.
type ByKind struct {
	Digest, Delta, NeedFull, Load Traffic
	// All holds every kind by name ("digest", "delta", "need_full", "load"
	// and any kind added later), so a new kind is counted and exported
	// without a field of its own.
	All map[string]Traffic
}

// Stats are the mesh's counters since Join, for export as Prometheus
// counters (kvroute_gossip_*_total) by the caller.
type Stats struct {
	Sent, Received ByKind
	SendErrors     uint64 // memberlist refused or failed a send
	DecodeErrors   uint64 // user messages that did not decode; dropped
	MetaErrors     uint64 // node metas that did not decode
	InboxDrops     uint64 // received messages dropped: inbox full
	OutboxDrops    uint64 // messages to a peer dropped: its queue full
	StreamWaits    uint64 // TCP sends that waited for a slot (Config.MaxStreams)
	UnknownOrigin  uint64 // digests or deltas from nodes not in the table
	Held           uint64 // deltas that arrived early and waited for their predecessor
	Gaps           uint64 // deltas that could not follow our copy (lost, or no copy)
	// GapsNoCopy and GapsEpoch are the Gaps of deltas that came with no
	// copy to follow (before the first full digest, or after one was
	// dropped) and of another epoch than our copy's; the rest broke the
	// copy's chain (a delta lost, or too many waiting).
	GapsNoCopy, GapsEpoch uint64
	Stale                 uint64 // digests or deltas older than our copy
	EpochDrops            uint64 // copies dropped because their origin's epoch changed
	FullRequests          uint64 // need-full requests we sent
	FullServed            uint64 // need-full requests we answered
	MetaUpdates           uint64 // node-meta broadcasts (memberlist UpdateNode calls)

	// NewerDropped counts user messages of a newer wire version this
	// build cannot read (ErrNewer: an unknown kind, a format or version
	// byte past its own); dropped, not malformed. NewerRead counts
	// messages and metas of a newer wire version read in part: the fields
	// this build knows, the rest ignored. Both are expected while a mesh
	// upgrades (docs/compat.md).
	NewerDropped, NewerRead uint64

	// The membership's: join attempts and failures, and the bytes through
	// the mesh's sockets (memberlist's own and ours).
	membership.Stats
}

type counters struct {
	sent, recv                             kindTraffic
	sendErrors, decodeErrors, metaErrors   atomic.Uint64
	newerDropped, newerRead                atomic.Uint64
	inboxDrops, outboxDrops, unknownOrigin atomic.Uint64
	streamWaits                            atomic.Uint64
	held, gaps, stale, epochDrops          atomic.Uint64
	gapsNoCopy, gapsEpoch                  atomic.Uint64
	fullRequests, fullServed               atomic.Uint64
	metaUpdates                            atomic.Uint64
}

type traffic struct{ msgs, bytes atomic.Uint64 }

// kindTraffic counts traffic per kind, indexed by the kind byte itself, so
// no kind can miss its slot; byKind exports the kinds listed in kinds.
type kindTraffic [256]traffic

// count adds one message of b's kind; b must be non-empty.
func (t *kindTraffic) count(b []byte) {
	t[b[0]].msgs.Add(1)
	t[b[0]].bytes.Add(uint64(len(b)))
}

func (t *kindTraffic) byKind() ByKind {
	all := make(map[string]Traffic, len(kinds))
	for _, k := range kinds {
		x := &t[k.kind]
		all[k.name] = Traffic{Msgs: x.msgs.Load(), Bytes: x.bytes.Load()}
	}
	return ByKind{Digest: all["digest"], Delta: all["delta"], NeedFull: all["need_full"], Load: all["load"], All: all}
}

func (c *counters) snapshot(ms membership.Stats) Stats {
	return Stats{
		Stats:         ms,
		Sent:          c.sent.byKind(),
		Received:      c.recv.byKind(),
		SendErrors:    c.sendErrors.Load(),
		DecodeErrors:  c.decodeErrors.Load(),
		MetaErrors:    c.metaErrors.Load(),
		NewerDropped:  c.newerDropped.Load(),
		NewerRead:     c.newerRead.Load(),
		InboxDrops:    c.inboxDrops.Load(),
		OutboxDrops:   c.outboxDrops.Load(),
		StreamWaits:   c.streamWaits.Load(),
		UnknownOrigin: c.unknownOrigin.Load(),
		Held:          c.held.Load(),
		Gaps:          c.gaps.Load(),
		GapsNoCopy:    c.gapsNoCopy.Load(),
		GapsEpoch:     c.gapsEpoch.Load(),
		Stale:         c.stale.Load(),
		MetaUpdates:   c.metaUpdates.Load(),
		EpochDrops:    c.epochDrops.Load(),
		FullRequests:  c.fullRequests.Load(),
		FullServed:    c.fullServed.Load(),
	}
}
