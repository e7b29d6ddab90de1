package gossip

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// TestPushLoadKeepsTheNewest replaces an unsent report with the newer one,
// keeping the claims of both (the newest maxClaims) and the need to go
// reliably of either.
func TestPushLoadKeepsTheNewest(t *testing.T) {
	claims := func(from, n int) []peerClaim {
		var cs []peerClaim
		for k := range n {
			cs = append(cs, peerClaim{Peer: "p", Key: blockkey.Key(from + k), Keys: 1})
		}
		return cs
	}
	s := newSender(nil, "p", 1)
	if _, _, _, ok := s.takeLoad(); ok {
		t.Fatal("takeLoad on an empty slot: ok")
	}
	b := []byte("encoded")
	s.pushLoad(loadReport{Node: "n", Seq: 1}, b, false)
	if r, got, _, ok := s.takeLoad(); !ok || r.Seq != 1 || string(got) != "encoded" {
		t.Fatalf("takeLoad() = %+v, %q, ok %v; want seq 1 with its bytes", r, got, ok)
	}
	s.pushLoad(loadReport{Node: "n", Seq: 1, Claims: claims(0, 2)}, b, true)
	s.pushLoad(loadReport{Node: "n", Seq: 2, Load: route.Load{Serving: 3}, Claims: claims(2, 1)}, b, false)
	r, got, reliable, ok := s.takeLoad()
	if !ok || r.Seq != 2 || r.Load.Serving != 3 || !reliable || len(r.Claims) != 3 || r.Claims[0].Key != 0 || r.Claims[2].Key != 2 {
		t.Fatalf("takeLoad() = %+v, reliable %v, ok %v; want seq 2, serving 3, claims 0..2, reliable", r, reliable, ok)
	}
	if got != nil {
		t.Errorf("merged report kept the bytes %q; want nil (encode it again)", got)
	}
	if _, _, _, ok := s.takeLoad(); ok {
		t.Error("the slot still holds a report after takeLoad")
	}
	s.pushLoad(loadReport{Node: "n", Seq: 3, Claims: claims(0, maxClaims)}, b, false)
	s.pushLoad(loadReport{Node: "n", Seq: 4, Claims: claims(100, 5)}, b, false)
	r, _, reliable, _ = s.takeLoad()
	if len(r.Claims) != maxClaims || r.Claims[maxClaims-1].Key != 104 || r.Claims[0].Key != 5 || reliable {
		t.Errorf("merged claims %d (first %d, last %d), reliable %v; want the newest %d, 5..104, unreliable",
			len(r.Claims), r.Claims[0].Key, r.Claims[len(r.Claims)-1].Key, reliable, maxClaims)
	}
	if _, err := encodeLoad(r); err != nil {
		t.Errorf("merged report does not encode: %v", err)
	}
}

// TestMeshLoadNeverWaitsBehindTheQueue blocks n0's sends to n1 (as a TCP
// send to a slow peer blocks) with n0's queue to n1 full behind it: load
// changes, the engine's state and the refreshes still reach n1, so a busy
// pod never looks silent (route.Config.SilentFor).
func TestMeshLoadNeverWaitsBehindTheQueue(t *testing.T) {
	gate := make(chan struct{})
	var hold atomic.Bool
	var stuck atomic.Int32
	ms := clusterWith(t, 2, func(i int, c *Config) { c.MetaInterval = time.Hour; c.OutboxDepth = 4 },
		func(i int, h *hooks) {
			if i != 0 {
				return
			}
			h.dropOut = func(peer string, b []byte) bool {
				if hold.Load() && peer == "n1" && b[0] != kindLoad {
					stuck.Add(1)
					<-gate
				}
				return false
			}
		})
	hold.Store(true)
	defer close(gate) // before the meshes shut down (t.Cleanup)
	s := ms[0].members.get("n1")
	drops := ms[0].Stats().OutboxDrops
	for range 10 {
		s.enqueue(out{b: []byte{kindNeedFull}}) // undecodable at n1: counted and dropped there
	}
	waitFor(t, 5*time.Second, "n0's sender to n1 stuck", func() bool { return stuck.Load() == 1 })
	if d := ms[0].Stats().OutboxDrops - drops; d == 0 {
		t.Fatalf("queue to n1 never full (0 drops of 10 on depth 4)")
	}

	ms[0].SetServing(9, 3, 900, 0)
	waitFor(t, 2*time.Second, "the load change on n1", func() bool {
		v, _ := view(ms[1], "n0")
		return v.Load.Serving == 9 && v.Load.QueuedPrefillTokens == 900
	})
	ms[0].SetEngine(route.EngineDown)
	waitFor(t, 2*time.Second, "the engine's state on n1", func() bool {
		v, _ := view(ms[1], "n0")
		return v.Engine == route.EngineDown
	})
	// Refreshes keep coming while the queue is stuck: three in a row.
	v, _ := view(ms[1], "n0")
	last := v.LoadAt
	for k := range 3 {
		waitFor(t, 2*time.Second, "a refresh on n1", func() bool {
			v, _ := view(ms[1], "n0")
			if age := time.Since(v.LoadAt); age > route.DefaultConfig().SilentFor {
				t.Fatalf("refresh %d: n0 silent for %v on n1", k, age)
			}
			return v.LoadAt.After(last)
		})
		v, _ := view(ms[1], "n0")
		last = v.LoadAt
	}
	if n := stuck.Load(); n != 1 {
		t.Errorf("%d sends got stuck; want the one (the queue must not have moved)", n)
	}
}

// TestMaxStreams: a node that must push to five newcomers by TCP at once
// (their joins change what it tells them) keeps at most MaxStreams of
// those sends open, the others wait their turn (counted), and every one
// is sent once the slots free.
func TestMaxStreams(t *testing.T) {
	gate := make(chan struct{})
	var cur, peak atomic.Int32
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	ended := t.Context().Done() // before any cleanup, the meshes' shutdowns too
	ms := clusterWith(t, 6, func(i int, c *Config) {
		if i == 0 {
			c.MaxStreams = 2
		}
	}, func(i int, h *hooks) {
		if i != 0 {
			return
		}
		h.streaming = func(string) {
			n := cur.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			select {
			case <-gate:
			case <-ended: // the test failed before releasing it
			}
			cur.Add(-1)
		}
	})
	waitFor(t, 10*time.Second, "two sends holding n0's slots and three waiting", func() bool {
		return peak.Load() >= 2 && ms[0].Stats().StreamWaits >= 3
	})
	if p := peak.Load(); p != 2 {
		t.Fatalf("%d TCP sends at once with MaxStreams 2", p)
	}
	sentBefore := ms[0].Stats().Sent.Load.Msgs
	release()
	waitFor(t, 10*time.Second, "the waiting sends sent", func() bool {
		return ms[0].Stats().Sent.Load.Msgs >= sentBefore+3
	})
	if p := peak.Load(); p > 2 {
		t.Errorf("%d TCP sends at once with MaxStreams 2", p)
	}
}
