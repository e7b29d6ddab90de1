// Package gossip is what the sidecars tell each other, their dissemination
// (docs/design.md D3): where to forward, what each peer serves, how loaded
// it is, and which blocks its vLLM holds. Who is in the mesh and how to
// reach them is package membership's job (memberlist, the seeds, the
// sockets); a Mesh runs on one and is its Delegate and Events.
//
// Two channels carry this, for different reasons:
//
//   - memberlist carries membership, failure detection, encryption and a
//     node meta of at most 512 bytes (Meta: API address, models, key scheme,
//     digest epoch and version, draining, load). memberlist gossips metas to
//     everyone, so they are updated at most once per MetaInterval, and
//     not for a change of load or digest version alone, which the load
//     reports carry (only a v0.1.0 member reads them from the meta). Its
//     push/pull state carries the newest owners of stored responses, which
//     a (re)joining node learns nowhere else (responses.go).
//   - Digests travel by direct exchange, never by memberlist's broadcast
//     queue (its receivers do not relay, and a packet holds ~1.3 KB). Each
//     change goes straight to every live member: a delta (the keys added
//     and removed) by UDP when it fits one packet, else by TCP; the full
//     digest by TCP when the owner rebuilds it, when a peer joins, when a
//     peer asks for it, and every FullDigestInterval as a backstop. A
//     member of wire 1 gets deltas without removals and digests without
//     them (format 1), as v0.1.0 sent them.
//
// A receiver holds a delta that arrives ahead of its predecessor for
// ReorderWait (memberlist delivers a burst of UDP messages newest first),
// and asks the origin for a full digest ("need full", rate-limited per
// origin) when the gap does not fill, when a delta cannot follow its copy
// (bloom.ErrGap), when the origin's epoch changes, or when its copy lags the
// version in the origin's meta for RepairAfter (the last delta was lost). A peer that leaves or dies
// is removed at once, with its digest; an epoch change drops the old digest
// at once.
//
// The caller's loop:
//
//	m, err := gossip.Join(ctx, cfg)       // never fails for want of peers
//	defer m.Shutdown()
//	m.PublishDigest(d)                     // on start and on every epoch change
//	err = m.PublishDelta(x)                // per change; on error publish a full digest
//	m.SetLoad(l)                           // any rate; pushed ≤ once per LoadPushInterval
//	peers := m.Snapshot(time.Now())        // per request, for route
//	m.MarkFailed(peer, time.Now())         // after a failed dial
//	m.AnnounceResponses(id)                // the local vLLM stored Responses API response id
//	node, alive, ok := m.ResponseOwner(id) // where a follow-up naming id must go
//	m.SetDraining(true); m.Leave(5 * time.Second)
//
// Inside, the membership's callbacks only hand off: NotifyMsg pushes the
// message (a copy membership took) onto a bounded inbox (dropped and
// counted when full) and one loop
// decodes and applies messages; each peer has its own sender goroutine, so a
// dead peer stalls only its own queue. Shutdown returns only once every
// goroutine the mesh started has ended.
//
// Each job has its own file and, where its state is its own, its own lock:
//
//	msg.go        the message kinds: kind byte, name, decoder
//	digest.go     the local digest, deltas, the full resend and repair (digest, delta)
//	needfull.go   asking an origin for its full digest (need-full)
//	load.go       load, engine state and claims pushed to every member; the push loop
//	loadreport.go the load report's wire form and what a received one does (load)
//	textprefix.go learned text prefixes shared with every member (text_prefix)
//	responses.go  which node holds each stored response, told to every member and in push/pull state (responses)
//	advert.go     the node meta this node advertises; the meta loop
//	members.go    the live peers and their senders (sender.go)
//	table.go      the peers' state: plain data, time passed in
//	meta.go       the node meta's wire form
//	stats.go      the counters, per kind by the kind byte
//	delegate.go   the mesh as its membership sees it: meta, messages, state, peer events
//	config.go     Config (the membership's embedded) and its presets
//	mesh.go       Join, the receive loop, Snapshot, Shutdown
//
// # Adding a gossip message
//
// A new message touches two files. Write its own file with a type that
// implements payload: encode (the kind byte, then the body), a decode
// function for the body (bounded, never aliasing its input, every
// malformation an error) and apply, which the receive loop calls with the
// decoded message and the time; apply must not block and takes the mesh's
// locks only in the order Mesh documents. Then add the kind byte to the
// constants in msg.go and one line to its kinds table: the message is then
// decoded, dispatched, counted in Stats (ByKind.All, by its name) and
// round-tripped by FuzzDigestMsg (seed it there), with no switch to edit.
// To send it, encode it and queue it on the senders (members.each with
// sender.enqueue; reliable for what must not be lost). The load report's
// decoder ignores bytes after the fields it knows, so a field appended to
// it touches loadreport.go alone.
package gossip
