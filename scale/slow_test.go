package scale

import (
	"math"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/route"
)

// TestSlowStretchesEveryTiming: in slow motion ×4 every interval of the
// mesh, memberlist's timings, the digests' publishing and the choice's
// TTLs are four times their defaults; claims at once stay at once, and a
// hook the caller set still wins. At ×1 nothing changes.
func TestSlowStretchesEveryTiming(t *testing.T) {
	c := Config{Slow: 4}
	d := gossip.DefaultConfig()
	g := d
	g.Memberlist = func(mc *memberlist.Config) { mc.GossipNodes = 7; mc.TCPTimeout = time.Second }
	s := c.slowGossip(g)
	for name, got := range map[string][2]time.Duration{
		"FullDigestInterval": {s.FullDigestInterval, d.FullDigestInterval},
		"MetaInterval":       {s.MetaInterval, d.MetaInterval},
		"LoadPushInterval":   {s.LoadPushInterval, d.LoadPushInterval},
		"LoadPushDelay":      {s.LoadPushDelay, d.LoadPushDelay},
		"RepairAfter":        {s.RepairAfter, d.RepairAfter},
		"ReorderWait":        {s.ReorderWait, d.ReorderWait},
		"NeedFullInterval":   {s.NeedFullInterval, d.NeedFullInterval},
		"LoadRefresh":        {s.LoadRefresh, d.LoadRefresh},
		"RejoinInterval":     {s.RejoinInterval, d.RejoinInterval},
		"Settle":             {s.Settle, d.Settle},
	} {
		if got[1] <= 0 || got[0] != 4*got[1] {
			t.Errorf("%s slowed ×4 = %v; want 4 × %v", name, got[0], got[1])
		}
	}
	if s.ClaimPushInterval != d.ClaimPushInterval {
		t.Errorf("ClaimPushInterval slowed = %v; want %v (at once stays at once)", s.ClaimPushInterval, d.ClaimPushInterval)
	}
	mc, lan := memberlist.DefaultLANConfig(), memberlist.DefaultLANConfig()
	s.Memberlist(mc)
	if mc.ProbeInterval != 4*lan.ProbeInterval || mc.GossipInterval != 4*lan.GossipInterval ||
		mc.PushPullInterval != 4*lan.PushPullInterval || mc.ProbeTimeout != 4*lan.ProbeTimeout {
		t.Errorf("memberlist slowed ×4: probe %v/%v, gossip %v, push-pull %v; want 4 × %v/%v, %v, %v",
			mc.ProbeInterval, mc.ProbeTimeout, mc.GossipInterval, mc.PushPullInterval,
			lan.ProbeInterval, lan.ProbeTimeout, lan.GossipInterval, lan.PushPullInterval)
	}
	if mc.GossipNodes != 7 || mc.TCPTimeout != time.Second {
		t.Errorf("the caller's hook lost: gossip nodes %d, TCP timeout %v; want 7, 1s", mc.GossipNodes, mc.TCPTimeout)
	}

	cd := cachestate.DefaultConfig()
	if cs := c.slowCachestate(cachestate.Config{}); cs.PublishInterval != 4*cd.PublishInterval || cs.RebuildEvery != 4*cd.RebuildEvery {
		t.Errorf("cachestate slowed ×4: publish %v, rebuild %v; want 4 × %v, %v", cs.PublishInterval, cs.RebuildEvery, cd.PublishInterval, cd.RebuildEvery)
	}
	rd, rc := route.DefaultConfig(), c.routeConfig()
	if rc.SilentFor != 4*rd.SilentFor || rc.LoadTTL != 4*rd.LoadTTL || rc.ClaimTTL != 4*rd.ClaimTTL || rc.FailFor != 4*rd.FailFor {
		t.Errorf("route slowed ×4: silent %v, load TTL %v, claim TTL %v, fail %v", rc.SilentFor, rc.LoadTTL, rc.ClaimTTL, rc.FailFor)
	}
	if got, want := c.recentConfig().TTL, 4*route.DefaultRecentConfig().TTL; got != want {
		t.Errorf("recent TTL slowed ×4 = %v; want %v", got, want)
	}

	one := Config{Slow: 0.5} // below 1: real time
	if s := one.slowGossip(d); s.LoadRefresh != d.LoadRefresh || s.Memberlist != nil {
		t.Errorf("slowGossip ×1 changed the config: refresh %v, hook set %v", s.LoadRefresh, s.Memberlist != nil)
	}
	if rc := one.routeConfig(); rc.SilentFor != rd.SilentFor {
		t.Errorf("routeConfig ×1: silent %v; want %v", rc.SilentFor, rd.SilentFor)
	}
}

// TestInMeshTime: rates measured on the wall clock of a mesh K times
// slower are K times the mesh's own, and durations a K-th.
func TestInMeshTime(t *testing.T) {
	r := Result{N: 4, WindowSeconds: 80, StoredPerNodePerSec: 50, SentBytesPerNode: 1000, RecvBytesPerNode: 2000,
		SocketBytesPerNode: 4000, SentByKind: map[string]float64{"delta": 600}, RecvByKind: map[string]float64{"load": 300},
		StoredP50Ms: 400, StoredP99Ms: 800, EvictedP50Ms: 40, EvictedP99Ms: 80, JoinSeconds: 8, DetectSeconds: 6,
		PollIntervalMs: 40, ChoiceP99Us: 30, JoinBytes: 5000, Requests: 9}
	got := r.inMeshTime(4)
	want := Result{N: 4, Slow: 4, WindowSeconds: 20, StoredPerNodePerSec: 200, SentBytesPerNode: 4000, RecvBytesPerNode: 8000,
		SocketBytesPerNode: 16000, SentByKind: map[string]float64{"delta": 2400}, RecvByKind: map[string]float64{"load": 1200},
		StoredP50Ms: 100, StoredP99Ms: 200, EvictedP50Ms: 10, EvictedP99Ms: 20, JoinSeconds: 2, DetectSeconds: 1.5,
		PollIntervalMs: 10, ChoiceP99Us: 30, JoinBytes: 5000, Requests: 9}
	if got.N != want.N || got.Slow != want.Slow || got.WindowSeconds != want.WindowSeconds ||
		got.StoredPerNodePerSec != want.StoredPerNodePerSec || got.SentBytesPerNode != want.SentBytesPerNode ||
		got.RecvBytesPerNode != want.RecvBytesPerNode || got.SocketBytesPerNode != want.SocketBytesPerNode ||
		got.SentByKind["delta"] != 2400 || got.RecvByKind["load"] != 1200 || got.StoredP50Ms != want.StoredP50Ms ||
		got.StoredP99Ms != want.StoredP99Ms || got.EvictedP50Ms != want.EvictedP50Ms || got.EvictedP99Ms != want.EvictedP99Ms ||
		got.JoinSeconds != want.JoinSeconds || got.DetectSeconds != want.DetectSeconds || got.PollIntervalMs != want.PollIntervalMs ||
		got.ChoiceP99Us != want.ChoiceP99Us || got.JoinBytes != want.JoinBytes || got.Requests != want.Requests {
		t.Errorf("inMeshTime(4) = %+v\nwant %+v", got, want)
	}
	if r := (Result{JoinSeconds: math.NaN()}).inMeshTime(2); !math.IsNaN(r.JoinSeconds) {
		t.Errorf("a join never timed stays NaN, got %v", r.JoinSeconds)
	}
}

// TestRunSlow runs three real nodes in slow motion ×2 and checks that the
// results are in the mesh's time: the window and the store rate are the
// configured ones, not half or twice them.
func TestRunSlow(t *testing.T) {
	wall := time.Now()
	r, err := Run(meshContext(t, "runs a 3-node mesh in slow motion for about 15 s"), Config{Nodes: 3, Addr: "127.0.96.9", BasePort: 27300,
		CapacityBlocks: 300, BlocksPerSecond: 200, Warmup: 2 * time.Second, Window: 3 * time.Second,
		FullDigestInterval: 2 * time.Second, Requests: Synthetic(2000, 1), LongPromptBlocks: 256, Seed: 1, Slow: 2})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("%+v", r)
	if took := time.Since(wall); took < 10*time.Second {
		t.Errorf("a run of 5 s of the mesh's time at ×2 took %s of the wall clock; want at least 10 s", took)
	}
	if r.Slow != 2 || r.WindowSeconds < 2.9 || r.WindowSeconds > 4 || r.PollIntervalMs != 10 {
		t.Errorf("slow %v, window %v s, poll %v ms; want 2, the configured 3 s and the poll's 10 ms in the mesh's time",
			r.Slow, r.WindowSeconds, r.PollIntervalMs)
	}
	// On the wall clock the engines stored 100 blocks/s each.
	if r.StoredPerNodePerSec < 150 || r.StoredPerNodePerSec > 250 {
		t.Errorf("stored %v blocks/s per node; want about the configured 200 in the mesh's time", r.StoredPerNodePerSec)
	}
	if r.SentByKind["delta"] <= 0 || r.StoredSamples == 0 || !(r.DetectSeconds > 0) || !(r.JoinSeconds >= 0) {
		t.Errorf("deltas %v B/s, %d stored samples, detect %v s, join %v s; want each measured",
			r.SentByKind["delta"], r.StoredSamples, r.DetectSeconds, r.JoinSeconds)
	}
}
