// Package membership is who is in the mesh and how to reach them
// (docs/design.md D3): memberlist over sockets that count their bytes,
// joined to the seeds and rejoined, with encryption and a label. It knows
// nothing of what the members say to each other; gossip (dissemination)
// does, through two small interfaces it implements: Delegate (this node's
// meta, messages and push/pull state) and Events (peers joined, left,
// updated).
//
// The caller's sequence:
//
//	ms, err := membership.New(cfg, d, ev) // memberlist is up; d and ev are called from here on
//	ms.Join(ctx)                          // the seeds; never fails for want of peers
//	ms.Send(name, b, reliable)            // to a live peer, at its last event's address
//	ms.UpdateMeta(time.Second)            // after d.NodeMeta's answer changed
//	ms.Leave(5 * time.Second); ms.Shutdown()
//
// Every Node handed over is a copy taken in the event: memberlist rewrites
// its own in place.
//
// Files:
//
//	members.go    New, Join, Send, UpdateMeta, Shutdown; the copies of the live nodes
//	delegate.go   Delegate and Events, and the adapter memberlist calls
//	join.go       joining the seeds, settling, and rejoining them
//	transport.go  memberlist's sockets: NetTransport's, each packet in a buffer of its size
//	log.go        memberlist's log lines as zerolog events
//	config.go     Config, its presets, and memberlist's configuration
package membership
