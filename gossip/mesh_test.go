package gossip

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// fastDetection shortens memberlist's failure detection so a killed node is
// declared dead in about a second on loopback.
func fastDetection(c *memberlist.Config) {
	c.ProbeInterval = 100 * time.Millisecond
	c.ProbeTimeout = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.SuspicionMaxTimeoutMult = 2
	c.GossipInterval = 20 * time.Millisecond
	c.PushPullInterval = time.Second
}

func testConfig(name string) Config {
	c := LocalConfig()
	c.NodeName = name
	c.APIAddr = name + ":8000"
	c.Models = []string{"m"}
	c.Memberlist = fastDetection
	return c
}

// gossipAddr is m's gossip address, ip:port.
func gossipAddr(m *Mesh) string {
	n, _ := m.ms.Load().Self()
	return n.Addr
}

// start joins one mesh and shuts it down when the test ends.
func start(t testing.TB, c Config) *Mesh {
	t.Helper()
	return startWith(t, c, hooks{})
}

// startWith is start with test hooks; it is the only place they are set.
func startWith(t testing.TB, c Config, h hooks) *Mesh {
	t.Helper()
	m, err := joinWith(context.Background(), c, h)
	if err != nil {
		t.Fatalf("Join(%s) error %v", c.NodeName, err)
	}
	t.Cleanup(func() { m.Shutdown() })
	return m
}

// cluster starts n meshes named n0..n{n-1}, all joined through n0, and
// waits until each sees all n members.
func cluster(t testing.TB, n int, edit func(i int, c *Config)) []*Mesh {
	t.Helper()
	return clusterWith(t, n, edit, nil)
}

// clusterWith is cluster with test hooks for each mesh.
func clusterWith(t testing.TB, n int, edit func(i int, c *Config), hook func(i int, h *hooks)) []*Mesh {
	t.Helper()
	ms := make([]*Mesh, n)
	for i := range ms {
		c := testConfig(fmt.Sprintf("n%d", i))
		if i > 0 {
			c.Join = []string{gossipAddr(ms[0])}
		}
		if edit != nil {
			edit(i, &c)
		}
		var h hooks
		if hook != nil {
			hook(i, &h)
		}
		ms[i] = startWith(t, c, h)
	}
	defer func() {
		if t.Failed() {
			for _, m := range ms {
				t.Logf("%s: members %d, snapshot %d, stats %+v", m.cfg.NodeName, m.Members(), len(m.Snapshot(time.Now())), m.Stats())
			}
		}
	}()
	waitFor(t, 10*time.Second, "all members", func() bool {
		for _, m := range ms {
			if m.Members() != n || len(m.Snapshot(time.Now())) != n {
				return false
			}
		}
		return true
	})
	return ms
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not a wait for convergence
	}
}

func view(m *Mesh, id string) (route.PeerView, bool) {
	for _, v := range m.Snapshot(time.Now()) {
		if v.ID == id {
			return v, true
		}
	}
	return route.PeerView{}, false
}

// holds reports whether m's view of id matches the whole chain.
func holds(m *Mesh, id string, keys ...blockkey.Key) bool {
	v, ok := view(m, id)
	return ok && v.Digest != nil && v.Digest.PrefixLen(keys) == len(keys)
}

func digestVersion(m *Mesh, id string) uint64 {
	v, ok := view(m, id)
	if !ok || v.Digest == nil {
		return 0
	}
	d := v.Digest
	if m, ok := d.(*route.Member); ok { // held in the table's group
		d = m.TierMatcher
	}
	return d.(*bloom.Digest).Header().Version
}

func TestMeshDigestAndDeltas(t *testing.T) {
	ms := cluster(t, 4, nil)
	a := ms[0]
	if err := a.PublishDigest(testDigest("n0", 1, 1, 10, 11)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "digest on every peer", func() bool {
		for _, m := range ms[1:] {
			if !holds(m, "n0", 10, 11) {
				return false
			}
		}
		return true
	})
	for v := uint64(1); v < 4; v++ {
		x := bloom.Delta{Node: "n0", Epoch: 1, From: v, To: v + 1, Keys: []blockkey.Key{blockkey.Key(10 + v + 1)}}
		if err := a.PublishDelta(x); err != nil {
			t.Fatalf("PublishDelta(%d→%d) error %v", v, v+1, err)
		}
	}
	waitFor(t, 5*time.Second, "deltas on every peer", func() bool {
		for _, m := range ms[1:] {
			if !holds(m, "n0", 10, 11, 12, 13, 14) {
				return false
			}
		}
		return true
	})
	if !holds(a, "n0", 10, 11, 12, 13, 14) {
		t.Errorf("local view lacks the published keys")
	}
	if v, _ := view(a, "n0"); !v.Local {
		t.Errorf("local view Local = false; want true")
	}
	for _, m := range ms[1:] { // each holds n0's digest, plain, in its copy
		if held, misfits := m.Grouped(); held != 1 || misfits != 0 {
			t.Errorf("Grouped() = %d, %d; want 1, 0", held, misfits)
		}
		if v, _ := view(m, "n0"); v.Digest == nil {
			t.Errorf("no view of n0's digest")
		} else if _, ok := v.Digest.(route.Grouped); !ok {
			t.Errorf("n0's view digest is a %T; want the copy's member", v.Digest)
		}
	}
	s := a.Stats()
	if s.Sent.Delta.Msgs < 9 || s.Sent.Digest.Msgs < 3 || s.DecodeErrors != 0 {
		t.Errorf("Stats() = %+v; want >= 9 deltas and >= 3 digests sent, no decode errors", s)
	}
}

func TestPublishDeltaErrors(t *testing.T) {
	m := start(t, testConfig("solo"))
	x := bloom.Delta{Node: "solo", Epoch: 1, From: 1, To: 2}
	if err := m.PublishDelta(x); err != ErrNoDigest {
		t.Errorf("PublishDelta before a digest = %v; want ErrNoDigest", err)
	}
	if err := m.PublishDigest(testDigest("other", 1, 1)); err == nil {
		t.Errorf("PublishDigest(another node's digest) = nil; want error")
	}
	if err := m.PublishDigest(testDigest("solo", 1, 1)); err != nil {
		t.Fatal(err)
	}
	x.From, x.To = 3, 4
	if err := m.PublishDelta(x); err == nil {
		t.Errorf("PublishDelta(gap) = nil; want error")
	}
	if got := digestVersion(m, "solo"); got != 1 {
		t.Errorf("local version after a refused delta = %d; want 1", got)
	}
}

func TestMeshLostDeltaIsRepaired(t *testing.T) {
	// n0 loses its delta 2→3 to n1 (a later delta reveals the gap) and its
	// last delta 3→4 to n2 (nothing reveals it but the digest version its
	// load pushes carry: its meta does not follow deltas, TestMetaQuiet).
	lose := func(peer string, b []byte) bool {
		if len(b) == 0 || b[0] != kindDelta {
			return false
		}
		x, err := bloom.UnmarshalDelta(b[1:])
		return err == nil && ((peer == "n1" && x.To == 3) || (peer == "n2" && x.To == 4))
	}
	ms := clusterWith(t, 3, func(i int, c *Config) {
		c.FullDigestInterval = time.Hour // only the repair paths may heal
	}, func(i int, h *hooks) {
		if i == 0 {
			h.dropOut = lose
		}
	})
	a := ms[0]
	if err := a.PublishDigest(testDigest("n0", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "first digest", func() bool {
		return digestVersion(ms[1], "n0") == 1 && digestVersion(ms[2], "n0") == 1
	})
	for v := uint64(1); v < 4; v++ {
		x := bloom.Delta{Node: "n0", Epoch: 1, From: v, To: v + 1, Keys: []blockkey.Key{blockkey.Key(100 + v)}}
		if err := a.PublishDelta(x); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "repair on both peers", func() bool {
		return holds(ms[1], "n0", 101, 102, 103) && holds(ms[2], "n0", 101, 102, 103)
	})
	if s := ms[1].Stats(); s.Held == 0 || s.FullRequests == 0 {
		t.Errorf("n1 Stats() = %+v; want a held delta and a full request", s)
	}
	if s := ms[2].Stats(); s.FullRequests == 0 || s.Gaps != 0 {
		t.Errorf("n2 Stats() = %+v; want a full request from the pushed version and no gap", s)
	}
	if s := a.Stats(); s.FullServed < 2 {
		t.Errorf("n0 FullServed = %d; want >= 2", s.FullServed)
	}
}

func TestMeshEpochChangeDropsOldClaims(t *testing.T) {
	ms := cluster(t, 3, nil)
	a := ms[0]
	if err := a.PublishDigest(testDigest("n0", 1, 7, 1, 2, 3)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "epoch 1 digest", func() bool { return holds(ms[1], "n0", 1, 2, 3) && holds(ms[2], "n0", 1, 2, 3) })
	if err := a.PublishDigest(testDigest("n0", 2, 1, 50)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "epoch 2 digest", func() bool { return holds(ms[1], "n0", 50) && holds(ms[2], "n0", 50) })
	for _, m := range ms {
		if v, _ := view(m, "n0"); v.Digest.PrefixLen([]blockkey.Key{1, 2, 3}) != 0 {
			t.Errorf("%s still matches epoch-1 keys", m.cfg.NodeName)
		}
	}
}

func TestMeshLoadAndDraining(t *testing.T) {
	ms := cluster(t, 2, nil)
	// SetLoad ignores Serving, the queued prefill, its share and the in-flight fields:
	// the first three come from SetServing, the others are each receiver's
	// own count.
	ms[0].SetServing(4, 2, 512, 0.75)
	ms[0].SetLoad(route.Load{Running: 3, Waiting: 2, KVUsage: 0.42, Serving: 9, Prefilling: 8, InFlight: 1, InFlightPrefilling: 1, QueuedPrefillTokens: 77, InFlightPrefillTokens: 5})
	ms[0].SetDraining(true)
	want := route.Load{Running: 3, Waiting: 2, KVUsage: 0.42, Serving: 4, Prefilling: 2, Fronted: true, QueuedPrefillTokens: 512, PrefillShare: 0.75}
	waitFor(t, 5*time.Second, "load and draining on n1", func() bool {
		v, ok := view(ms[1], "n0")
		return ok && v.Draining && v.Load == want && v.Addr == "n0:8000" && len(v.Models) == 1
	})
	at := time.Now()
	ms[1].MarkFailed("n0", at)
	if v, _ := view(ms[1], "n0"); !v.LastFailure.Equal(at) {
		t.Errorf("LastFailure = %v; want %v", v.LastFailure, at)
	}
}

// TestMeshPushesLoad checks load changes reach peers by the direct push,
// not the meta: with meta updates an hour apart, every change still
// arrives, the last one wins, and the local view has it at once.
func TestMeshPushesLoad(t *testing.T) {
	ms := cluster(t, 3, func(i int, c *Config) { c.MetaInterval = time.Hour; c.LoadPushInterval = 5 * time.Millisecond })
	for n := 1; n <= 20; n++ {
		ms[0].SetServing(n, 0, 0, 0)
	}
	ms[0].SetLoad(route.Load{Running: 7, Waiting: 1, KVUsage: 0.25})
	want := route.Load{Running: 7, Waiting: 1, KVUsage: 0.25, Serving: 20}
	if v, _ := view(ms[0], "n0"); v.Load != want || !v.Local {
		t.Errorf("local view load %+v; want %+v", v.Load, want)
	}
	want.Fronted = true // pushed: only sidecars push, and they front every request
	waitFor(t, 5*time.Second, "pushed load on n1 and n2", func() bool {
		v1, _ := view(ms[1], "n0")
		v2, _ := view(ms[2], "n0")
		return v1.Load == want && v2.Load == want
	})
	if s := ms[0].Stats(); s.Sent.Load.Msgs == 0 || s.Sent.Load.Msgs > 2*21 {
		t.Errorf("sent %d load reports for 21 changes to 2 peers; want 1..42 (coalesced)", s.Sent.Load.Msgs)
	}
}

// TestMeshDelaysLoadPush checks a change waits LoadPushDelay before it is
// pushed, so the request that made it is on its way first.
func TestMeshDelaysLoadPush(t *testing.T) {
	const delay = 200 * time.Millisecond
	ms := cluster(t, 2, func(i int, c *Config) {
		c.MetaInterval = time.Hour
		c.LoadPushInterval = 5 * time.Millisecond
		c.LoadPushDelay = delay
	})
	// Right after a push the next refresh is half a second away, more
	// than the delay, so the next report n1 gets is the change's.
	sent := ms[0].Stats().Sent.Load.Msgs
	waitFor(t, 5*time.Second, "a refresh push from n0", func() bool { return ms[0].Stats().Sent.Load.Msgs > sent })
	t0 := time.Now()
	ms[0].SetServing(5, 0, 0, 0)
	waitFor(t, 5*time.Second, "the change on n1", func() bool { v, _ := view(ms[1], "n0"); return v.Load.Serving == 5 })
	if d := time.Since(t0); d < delay*3/4 {
		t.Errorf("the change reached n1 after %v; want no sooner than LoadPushDelay %v", d, delay)
	}
}

// TestMeshSharesClaims checks a claim reaches every member's view of the
// claimed peer, the claimed peer's own (local) view included, and is in
// the claimant's view at once.
func TestMeshSharesClaims(t *testing.T) {
	ms := cluster(t, 3, func(i int, c *Config) { c.MetaInterval = time.Hour })
	cs := []route.Claim{{Key: 42, Keys: 4}, {Key: 43, Keys: 8}}
	ms[0].Claim("n1", cs)
	has := func(m *Mesh, id string) bool {
		v, _ := view(m, id)
		return len(v.Claims) == 2 && v.Claims[0].Key == 42 && v.Claims[1].Keys == 8 && !v.Claims[1].At.IsZero()
	}
	if !has(ms[0], "n1") {
		t.Errorf("claimant's view of n1 lacks the claims")
	}
	waitFor(t, 5*time.Second, "claims on n1 at n1 (local) and n2", func() bool { return has(ms[1], "n1") && has(ms[2], "n1") })
	if v, _ := view(ms[2], "n0"); len(v.Claims) != 0 {
		t.Errorf("n2's view of n0 has claims %+v; want none", v.Claims)
	}
}

// TestMeshClaimsSkipTheLoadInterval: with ClaimPushInterval under
// LoadPushInterval, a claim made right after a push goes out without
// waiting for the load's interval (here an hour).
func TestMeshClaimsSkipTheLoadInterval(t *testing.T) {
	ms := cluster(t, 2, func(i int, c *Config) {
		c.MetaInterval, c.LoadPushInterval, c.ClaimPushInterval = time.Hour, time.Hour, -1
	})
	claimed := func(key blockkey.Key) bool {
		v, _ := view(ms[1], "n0")
		return slices.ContainsFunc(v.Claims, func(c route.Claim) bool { return c.Key == key })
	}
	// The first claim's push starts an hour of the load's interval; the
	// second is made within it.
	for _, key := range []blockkey.Key{42, 43} {
		ms[0].Claim("n0", []route.Claim{{Key: key, Keys: 4}})
		waitFor(t, 5*time.Second, fmt.Sprintf("claim %d at n1", key), func() bool { return claimed(key) })
	}
}

func TestMeshLeaveAndDeath(t *testing.T) {
	ms := cluster(t, 4, nil)
	if err := ms[3].PublishDigest(testDigest("n3", 1, 1, 5)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n3's digest", func() bool { return holds(ms[0], "n3", 5) })

	if err := ms[3].Leave(time.Second); err != nil {
		t.Fatalf("Leave error %v", err)
	}
	ms[3].Shutdown()
	waitFor(t, 3*time.Second, "n3 gone after Leave", func() bool {
		_, ok0 := view(ms[0], "n3")
		_, ok1 := view(ms[1], "n3")
		return !ok0 && !ok1 && ms[0].Members() == 3
	})

	ms[2].Shutdown() // no Leave: only failure detection notices
	waitFor(t, 10*time.Second, "n2 declared dead", func() bool {
		_, ok0 := view(ms[0], "n2")
		_, ok1 := view(ms[1], "n2")
		return !ok0 && !ok1
	})
}

func TestMeshKeptApart(t *testing.T) {
	key1 := []byte("0123456789abcdef")
	key2 := []byte("fedcba9876543210")
	tests := []struct {
		name   string
		a, b   func(*Config)
		joined bool
	}{
		{"same key and label", func(c *Config) { c.SecretKey, c.Label = key1, "kvroute/ns/a" }, func(c *Config) { c.SecretKey, c.Label = key1, "kvroute/ns/a" }, true},
		{"other key", func(c *Config) { c.SecretKey = key1 }, func(c *Config) { c.SecretKey = key2 }, false},
		{"plain to encrypted", func(c *Config) { c.SecretKey = key1 }, func(c *Config) {}, false},
		{"other label", func(c *Config) { c.Label = "kvroute/ns/a" }, func(c *Config) { c.Label = "kvroute/ns/b" }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, cb := testConfig("a"), testConfig("b")
			ca.Memberlist, cb.Memberlist = nil, nil
			ca.RejoinInterval, cb.RejoinInterval = 0, 0
			tt.a(&ca)
			a := start(t, ca)
			cb.Join = []string{gossipAddr(a)}
			tt.b(&cb)
			b := start(t, cb) // Join attempts once synchronously and never fails
			got := b.Members() == 2
			if got != tt.joined {
				t.Errorf("joined = %v (members %d, %d); want %v", got, a.Members(), b.Members(), tt.joined)
			}
			if !tt.joined && b.Stats().JoinFailures == 0 {
				t.Errorf("JoinFailures = 0; want the refused join counted")
			}
		})
	}
}

func TestJoinAloneThenHeals(t *testing.T) {
	// Reserve a port for the seed that is not up yet.
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()

	cb := testConfig("b")
	cb.Join = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	b := start(t, cb)
	if b.Members() != 1 {
		t.Fatalf("Members() = %d alone; want 1", b.Members())
	}
	ca := testConfig("a")
	ca.BindPort = port
	a := start(t, ca)
	waitFor(t, 10*time.Second, "background join", func() bool { return a.Members() == 2 && b.Members() == 2 })
	if b.Stats().JoinFailures == 0 {
		t.Errorf("JoinFailures = 0; want the first attempt counted")
	}
}

func TestJoinConfigErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"no name", func(c *Config) { c.NodeName = "" }},
		{"no api address", func(c *Config) { c.APIAddr = "" }},
		{"bad key length", func(c *Config) { c.SecretKey = []byte("short") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig("x")
			tt.edit(&c)
			if m, err := Join(context.Background(), c); err == nil {
				m.Shutdown()
				t.Errorf("Join = nil error; want error")
			}
		})
	}
}

func TestNotifyMsgDropsWhenInboxFull(t *testing.T) {
	m := &Mesh{inbox: make(chan []byte, 1)}
	d := delegate{m}
	d.NotifyMsg([]byte{kindDelta, 1})
	d.NotifyMsg([]byte{kindDelta, 2})
	if got := <-m.inbox; got[1] != 1 {
		t.Errorf("inbox holds %v; want the first message", got)
	}
	if got := m.stats.inboxDrops.Load(); got != 1 {
		t.Errorf("inboxDrops = %d; want 1", got)
	}
}

func TestMeshCountsBadMessages(t *testing.T) {
	m := start(t, testConfig("solo"))
	var before = m.Stats().DecodeErrors
	for _, b := range [][]byte{{}, {0x00}, {kindDigest, 1, 2}, {kindNeedFull, 9}} {
		m.handle(b)
	}
	if got := m.Stats().DecodeErrors - before; got != 4 {
		t.Errorf("DecodeErrors = %d; want 4", got)
	}
}

// SetModels re-advertises the meta at once (meta updates are otherwise an
// hour apart here): an adapter loaded on n0 shows in n1's view, an unloaded
// one leaves it, and a list too long for the meta arrives truncated with
// the flag set, the base model first. The local view always has the whole
// list.
func TestMeshSetModels(t *testing.T) {
	ms := cluster(t, 2, func(_ int, c *Config) { c.MetaInterval = time.Hour })
	models := func(want []string, truncated bool) func() bool {
		return func() bool {
			v, ok := view(ms[1], "n0")
			return ok && slices.Equal(v.Models, want) && v.ModelsTruncated == truncated
		}
	}
	ms[0].SetModels([]string{"m", "alice"})
	waitFor(t, 5*time.Second, "alice listed on n1", models([]string{"m", "alice"}, false))
	ms[0].SetModels([]string{"m"})
	waitFor(t, 5*time.Second, "alice gone on n1", models([]string{"m"}, false))

	many := []string{"m"}
	for i := range 40 {
		many = append(many, fmt.Sprintf("adapter-with-a-long-name-%02d", i))
	}
	ms[0].SetModels(many)
	waitFor(t, 5*time.Second, "truncated list on n1", func() bool {
		v, ok := view(ms[1], "n0")
		return ok && v.ModelsTruncated && len(v.Models) > 1 && len(v.Models) < len(many) &&
			slices.Equal(v.Models, many[:len(v.Models)])
	})
	if v, _ := view(ms[0], "n0"); !slices.Equal(v.Models, many) || v.ModelsTruncated {
		t.Errorf("local view: %d models, truncated %v; want all %d, not truncated", len(v.Models), v.ModelsTruncated, len(many))
	}
}

// TestMeshEngineDownWithdrawsAtOnce checks that a node's engine state and
// a withdrawn digest reach every peer by the push, without waiting for the
// meta (an hour apart here), failure detection or LoadPushDelay (the claim
// below starts one, an hour long).
func TestMeshEngineDownWithdrawsAtOnce(t *testing.T) {
	ms := cluster(t, 3, func(i int, c *Config) { c.MetaInterval = time.Hour; c.LoadPushDelay = time.Hour })
	a := ms[0]
	if err := a.PublishDigest(testDigest("n0", 1, 1, 10, 11)); err != nil {
		t.Fatal(err)
	}
	a.Claim("n0", []route.Claim{{Key: 99, Keys: 3}})
	waitFor(t, 5*time.Second, "digest on every peer", func() bool {
		return holds(ms[1], "n0", 10, 11) && holds(ms[2], "n0", 10, 11)
	})
	a.SetEngine(route.EngineDown)
	a.WithdrawDigest()
	waitFor(t, 2*time.Second, "engine down and no digest on every peer", func() bool {
		for _, m := range ms[1:] {
			v, ok := view(m, "n0")
			if !ok || v.Engine != route.EngineDown || v.Digest != nil || len(v.Claims) != 0 {
				return false
			}
		}
		return true
	})
	if v, _ := view(a, "n0"); v.Engine != route.EngineDown || v.Digest != nil || len(v.Claims) != 0 {
		t.Errorf("local view: engine %v, digest %v, claims %d; want down, none, none", v.Engine, v.Digest != nil, len(v.Claims))
	}
	// Back: a new epoch, empty, before the engine is advertised as serving.
	if err := a.PublishDigest(testDigest("n0", 2, 1, 50)); err != nil {
		t.Fatal(err)
	}
	a.SetEngine(route.EngineServing)
	waitFor(t, 2*time.Second, "serving with the new epoch on every peer", func() bool {
		for _, m := range ms[1:] {
			v, ok := view(m, "n0")
			if !ok || v.Engine != route.EngineServing || !holds(m, "n0", 50) {
				return false
			}
		}
		return true
	})
	for _, m := range ms[1:] {
		if v, _ := view(m, "n0"); v.Digest.PrefixLen([]blockkey.Key{10, 11}) != 0 {
			t.Errorf("%s matches the old engine's keys", m.cfg.NodeName)
		}
	}
}

// TestMeshSelfSince checks that the local view says when the local cache
// began, as a peer's does: at every change of the engine's state or the
// digest's epoch, and at nothing else. The front's recent forwards to its
// own pod from before then are about a cache that is gone; before this,
// a conversation's next turn entering the same sidecar within the 5 s TTL
// of a restart was routed by affinity to blocks the new engine never had.
func TestMeshSelfSince(t *testing.T) {
	a := cluster(t, 1, nil)[0]
	since := func() time.Time { v, _ := view(a, "n0"); return v.Since }
	step := func(what string, change bool, do func()) {
		t.Helper()
		before, at := since(), time.Now()
		do()
		switch got := since(); {
		case change && got.Before(at):
			t.Errorf("%s: Since %v; want at or after %v", what, got, at)
		case !change && !got.Equal(before):
			t.Errorf("%s: Since moved %v -> %v; want it kept", what, before, got)
		}
	}
	step("serving, as it started", false, func() { a.SetEngine(route.EngineServing) })
	step("first digest", true, func() {
		if err := a.PublishDigest(testDigest("n0", 1, 1, 10)); err != nil {
			t.Fatal(err)
		}
	})
	step("same epoch, next version", false, func() {
		if err := a.PublishDigest(testDigest("n0", 1, 2, 10, 11)); err != nil {
			t.Fatal(err)
		}
	})
	step("serving again", false, func() { a.SetEngine(route.EngineServing) })
	step("engine down", true, func() { a.SetEngine(route.EngineDown) })
	step("digest withdrawn", true, a.WithdrawDigest)
	step("new epoch", true, func() {
		if err := a.PublishDigest(testDigest("n0", 2, 1)); err != nil {
			t.Fatal(err)
		}
	})
	step("back", true, func() { a.SetEngine(route.EngineServing) })
}

// TestMeshFullDigestResend checks the periodic full digest heals a copy
// that nothing else would: n0's only delta to n1 is lost, and the repair
// by meta lag is an hour away, so n1 catches up by the resend alone.
func TestMeshFullDigestResend(t *testing.T) {
	ms := clusterWith(t, 2, func(i int, c *Config) {
		c.FullDigestInterval = 100 * time.Millisecond
		c.RepairAfter = time.Hour
	}, func(i int, h *hooks) {
		if i == 0 {
			h.dropOut = func(peer string, b []byte) bool { return len(b) > 0 && b[0] == kindDelta }
		}
	})
	if err := ms[0].PublishDigest(testDigest("n0", 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "first digest on n1", func() bool { return digestVersion(ms[1], "n0") == 1 })
	before := ms[0].Stats().Sent.Digest.Msgs
	if err := ms[0].PublishDelta(bloom.Delta{Node: "n0", Epoch: 1, From: 1, To: 2, Keys: []blockkey.Key{2}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the lost delta's key on n1 by a full digest", func() bool { return holds(ms[1], "n0", 1, 2) })
	if s := ms[0].Stats(); s.Sent.Digest.Msgs <= before || s.Sent.Delta.Msgs != 0 || s.FullServed != 0 {
		t.Errorf("n0 Stats() = %+v; want more full digests, no delta sent, no need-full served", s)
	}
}

// A kicked meta change is broadcast twice, metaRepeat apart: memberlist
// sends each broadcast to a peer once in a small cluster, and a lost
// packet must not hide an unload until the next push-pull.
func TestKickedMetaIsSentAgain(t *testing.T) {
	ms := cluster(t, 2, func(_ int, c *Config) { c.MetaInterval = time.Hour })
	before := ms[0].Stats().MetaUpdates
	ms[0].SetModels([]string{"m", "alice"})
	waitFor(t, 5*time.Second, "two meta broadcasts", func() bool { return ms[0].Stats().MetaUpdates-before >= 2 })
	if v, ok := view(ms[1], "n0"); !ok || !slices.Equal(v.Models, []string{"m", "alice"}) {
		t.Fatalf("n1's view of n0: %v %v", v.Models, ok)
	}
}

// TestMetaQuiet: in a mesh of wire 2 and up, digest deltas and load changes
// do not re-broadcast the node meta (every member relays every meta update,
// about N a second at N pods); the load pushes carry both. An engine
// change still does.
func TestMetaQuiet(t *testing.T) {
	ms := cluster(t, 2, nil)
	a := ms[0]
	if err := a.PublishDigest(testDigest("n0", 1, 1)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the digest on n1", func() bool { return digestVersion(ms[1], "n0") == 1 })
	// The new epoch goes out in a meta update, as it must.
	waitFor(t, 5*time.Second, "n0's meta naming its digest on n1", func() bool {
		ms[1].tableMu.Lock()
		defer ms[1].tableMu.Unlock()
		p := ms[1].table.peers["n0"]
		return p != nil && p.meta.HasDigest && p.meta.DigestEpoch == 1
	})
	pushes := func() uint64 { return ms[1].Stats().Received.Load.Msgs }
	before := a.Stats().MetaUpdates
	for v := uint64(1); v <= 20; v++ {
		x := bloom.Delta{Node: "n0", Epoch: 1, From: v, To: v + 1, Keys: []blockkey.Key{blockkey.Key(100 + v)}}
		if err := a.PublishDelta(x); err != nil {
			t.Fatal(err)
		}
		a.SetServing(int(v), int(v)/2, 100*int(v), 0)
	}
	waitFor(t, 5*time.Second, "every delta and the last load on n1", func() bool {
		v, ok := view(ms[1], "n0")
		return digestVersion(ms[1], "n0") == 21 && ok && v.Load.Serving == 20 && v.Load.Prefilling == 10
	})
	// Three load refreshes (LoadRefresh apart) span several MetaIntervals.
	p1 := pushes()
	waitFor(t, 10*time.Second, "three more load pushes", func() bool { return pushes() >= p1+3 })
	if got := a.Stats().MetaUpdates - before; got != 0 {
		t.Errorf("%d meta updates for 20 deltas and load changes; want none", got)
	}
	a.SetEngine(route.EngineDown)
	waitFor(t, 5*time.Second, "a meta update for the engine", func() bool { return a.Stats().MetaUpdates > before })
}

// TestMeshMixedStrides checks peers of different routing strides match
// each other's digests in their own keys: a mesh can change its stride by
// a rolling update, and a pod of another stride is not cold to the rest.
func TestMeshMixedStrides(t *testing.T) {
	ms := cluster(t, 2, func(i int, c *Config) { c.RoutingStride = []int{16, 4}[i] })
	tokens := make([]uint32, 16*64+1) // 64 blocks: 4 keys at stride 16, 16 at 4
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	root := blockkey.Root("m", "", "")
	k16 := blockkey.Scheme{BlockSize: 16, Stride: 16}.Request(root, tokens)
	k4 := blockkey.Scheme{BlockSize: 16, Stride: 4}.Request(root, tokens)
	if err := ms[0].PublishDigest(testDigest("n0", 1, 1, k16[:3]...)); err != nil {
		t.Fatal(err)
	}
	if err := ms[1].PublishDigest(testDigest("n1", 1, 1, k4[:8]...)); err != nil {
		t.Fatal(err)
	}
	prefix := func(m *Mesh, id string, keys []blockkey.Key) int {
		v, ok := view(m, id)
		if !ok || v.Digest == nil {
			return -1
		}
		return v.Digest.PrefixLen(keys)
	}
	waitFor(t, 5*time.Second, "each digest at the other", func() bool {
		return prefix(ms[1], "n0", k4) > 0 && prefix(ms[0], "n1", k16) > 0
	})
	if got := prefix(ms[1], "n0", k4); got != 12 {
		t.Errorf("n1 (stride 4) matches %d of its keys at n0 (stride 16, 3 keys); want 12", got)
	}
	if got := prefix(ms[0], "n1", k16); got != 2 {
		t.Errorf("n0 (stride 16) matches %d of its keys at n1 (stride 4, 8 keys); want 2", got)
	}
	if v, _ := view(ms[1], "n1"); v.Digest.PrefixLen(k4) != 8 {
		t.Errorf("n1's own view matches %d; want its 8", v.Digest.PrefixLen(k4))
	}
}

// EachPeer visits this node's own view first, then every peer Snapshot
// has, and stops when told.
func TestEachPeer(t *testing.T) {
	ms := cluster(t, 3, nil)
	now := time.Now()
	var got []route.PeerView
	ms[1].EachPeer(now, func(v *route.PeerView) bool {
		got = append(got, *v)
		return true
	})
	if len(got) != 3 || got[0].ID != "n1" || !got[0].Local || got[1].ID != "n0" || got[2].ID != "n2" {
		t.Fatalf("EachPeer visited %v; want n1 (local), n0, n2", ids(got))
	}
	snap := ms[1].Snapshot(now)
	for _, v := range got[1:] {
		i := slices.IndexFunc(snap, func(s route.PeerView) bool { return s.ID == v.ID })
		if i < 0 || snap[i].Addr != v.Addr || snap[i].Load != v.Load || snap[i].Engine != v.Engine {
			t.Errorf("EachPeer's view of %s differs from Snapshot's", v.ID)
		}
	}
	n := 0
	ms[1].EachPeer(now, func(*route.PeerView) bool { n++; return false })
	if n != 1 {
		t.Errorf("visited %d views after stopping at the first", n)
	}
}

func ids(vs []route.PeerView) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.ID)
	}
	return out
}
