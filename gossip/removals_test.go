package gossip

import (
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
)

// TestMeshRemovals: a delta's removals leave every peer's copy of wire 2,
// including after a full resend of the local digest (which carries them);
// a peer whose meta says wire 1 is sent the delta's additions alone, and
// the bits alone in a full digest, in format 1.
func TestMeshRemovals(t *testing.T) {
	var mu sync.Mutex
	formats := map[string]map[byte]bool{} // peer → kind and format bytes n0 sent it
	ms := clusterWith(t, 3, func(i int, c *Config) { c.FullDigestInterval = time.Hour }, func(i int, h *hooks) {
		if i == 0 {
			h.dropOut = func(peer string, b []byte) bool {
				if len(b) > 5 && (b[0] == kindDelta || b[0] == kindDigest) {
					mu.Lock()
					if formats[peer] == nil {
						formats[peer] = map[byte]bool{}
					}
					formats[peer][b[0]^b[5]<<4] = true
					mu.Unlock()
				}
				return false
			}
		}
	})
	ms[2].advert.edit(func(mt *Meta) bool { mt.Wire = 1; return true })
	ms[2].advert.kickNow()
	waitFor(t, 10*time.Second, "n2's wire 1 on n0", func() bool { v, ok := ms[0].PeerWire("n2"); return ok && v == 1 })

	if err := ms[0].PublishDigest(testDigest("n0", 1, 1, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the digest on n1 and n2", func() bool { return holds(ms[1], "n0", 1, 2, 3) && holds(ms[2], "n0", 1, 2, 3) })
	if err := ms[0].PublishDelta(bloom.Delta{Node: "n0", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{4}, Removed: []blockkey.Key{2}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the delta on n1 and n2", func() bool { return digestVersion(ms[1], "n0") == 2 && digestVersion(ms[2], "n0") == 2 })
	if holds(ms[1], "n0", 2) || !holds(ms[1], "n0", 1, 3, 4) {
		t.Fatalf("n1 (wire 2): removed key 2 still matched, or a held one lost")
	}
	if !holds(ms[2], "n0", 1, 2, 3, 4) {
		t.Fatalf("n2 (wire 1) lost a key: it reads additions only")
	}
	// A full resend carries the removals to wire 2 and the bits to wire 1.
	ms[0].sendFulls()
	waitFor(t, 5*time.Second, "a full digest to each", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return formats["n1"][kindDigest^bloom.FormatRemovals<<4] && formats["n2"][kindDigest^bloom.FormatVersion<<4]
	})
	if holds(ms[1], "n0", 2) {
		t.Fatal("n1: the full resend brought back a removed key")
	}
	mu.Lock()
	defer mu.Unlock()
	if !formats["n1"][kindDelta^bloom.FormatRemovals<<4] || formats["n2"][kindDelta^bloom.FormatRemovals<<4] ||
		formats["n2"][kindDigest^bloom.FormatRemovals<<4] || !formats["n2"][kindDelta^bloom.FormatVersion<<4] {
		t.Fatalf("formats sent: %v; want removals (format 2) to n1 only, format 1 to n2", formats)
	}
}

// TestSocketBytes: the socket counters see everything the mesh moves, so
// more than our own messages (memberlist's probes and metas too), and a
// full digest sent by TCP is in them on both sides.
func TestSocketBytes(t *testing.T) {
	ms := cluster(t, 2, nil)
	if err := ms[0].PublishDigest(testDigest("n0", 1, 1, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the digest on n1", func() bool { return holds(ms[1], "n0", 1, 2, 3) })
	a, b := ms[0].Stats(), ms[1].Stats()
	ours := func(k ByKind) (n uint64) {
		for _, tr := range k.All {
			n += tr.Bytes
		}
		return n
	}
	if a.Sent.Digest.Bytes == 0 || a.SocketSent <= ours(a.Sent) || b.SocketReceived <= ours(b.Received) {
		t.Fatalf("n0 socket sent %d (ours %d, digest %d), n1 socket received %d (ours %d); want more than ours",
			a.SocketSent, ours(a.Sent), a.Sent.Digest.Bytes, b.SocketReceived, ours(b.Received))
	}
}
