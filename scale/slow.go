package scale

import (
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/route"
)

// Slow motion (Config.Slow K): every node's mesh runs K times slower on
// the wall clock. Engines store a K-th of the blocks a second; every
// interval, timeout and TTL of the mesh (memberlist's probes and gossip
// included) and of the choice is K times longer; the harness's own
// cadences (the load loop's block budget, the samples, the poll) follow.
// Each node then sends the messages it would at K = 1, K times further
// apart, for a K-th of the CPU a wall second, and Run reports in the
// mesh's own time: rates times K, durations over K.
//
// Why: the mesh's work grows as N² × churn (every node applies every
// other node's deltas), and 256 nodes at 200 blocks/s each did not fit
// two cores: one pass of the load loop took 42 s (docs/scale). Not
// scaled: each message's bytes, and the choice's own time, measured as
// it runs (a CPU cost, not a wait).

// slow is K, at least 1.
func (c Config) slow() float64 { return max(c.Slow, 1) }

// stretch is d on the wall clock of a mesh K times slower.
func (c Config) stretch(d time.Duration) time.Duration {
	return time.Duration(float64(d) * c.slow())
}

// stretchOr stretches *v, def first when *v is 0 or less (a config's
// "the default").
func (c Config) stretchOr(v *time.Duration, def time.Duration) {
	if *v <= 0 {
		*v = def
	}
	*v = c.stretch(*v)
}

// slowGossip stretches g's intervals and memberlist's timings; a field at
// 0 takes its default first (gossip.DefaultConfig). Claims pushed at once
// stay at once, and a hook g already had (membership.Config.Memberlist)
// runs after and wins.
func (c Config) slowGossip(g gossip.Config) gossip.Config {
	if c.slow() == 1 {
		return g
	}
	d := gossip.DefaultConfig()
	at := c.stretchOr
	at(&g.FullDigestInterval, d.FullDigestInterval)
	at(&g.MetaInterval, d.MetaInterval)
	at(&g.LoadPushInterval, d.LoadPushInterval)
	at(&g.RepairAfter, d.RepairAfter)
	at(&g.ReorderWait, d.ReorderWait)
	at(&g.NeedFullInterval, d.NeedFullInterval)
	at(&g.LoadRefresh, d.LoadRefresh)
	at(&g.RejoinInterval, d.RejoinInterval)
	if g.ClaimPushInterval > 0 { // 0: the load's interval; negative: at once
		g.ClaimPushInterval = c.stretch(g.ClaimPushInterval)
	}
	if g.LoadPushDelay >= 0 { // negative: none
		at(&g.LoadPushDelay, d.LoadPushDelay)
	}
	g.Settle = c.stretch(g.Settle)
	prev := g.Memberlist
	g.Memberlist = func(mc *memberlist.Config) {
		for _, v := range []*time.Duration{&mc.ProbeInterval, &mc.ProbeTimeout, &mc.GossipInterval,
			&mc.PushPullInterval, &mc.TCPTimeout, &mc.GossipToTheDeadTime, &mc.DeadNodeReclaimTime} {
			*v = c.stretch(*v)
		}
		if prev != nil {
			prev(mc)
		}
	}
	return g
}

// slowCachestate stretches cs's publishing and its watches.
func (c Config) slowCachestate(cs cachestate.Config) cachestate.Config {
	if c.slow() == 1 {
		return cs
	}
	d := cachestate.DefaultConfig()
	c.stretchOr(&cs.PublishInterval, d.PublishInterval)
	c.stretchOr(&cs.RebuildEvery, d.RebuildEvery)
	c.stretchOr(&cs.SilenceWindow, d.SilenceWindow)
	return cs
}

// routeConfig is the choice's configuration every node and the harness
// use: route.DefaultConfig, its times stretched.
func (c Config) routeConfig() route.Config {
	rc := route.DefaultConfig()
	for _, v := range []*time.Duration{&rc.FailFor, &rc.SilentFor, &rc.LoadTTL, &rc.DigestTTL, &rc.ClaimTTL} {
		*v = c.stretch(*v)
	}
	return rc
}

// recentConfig is every node's Recent: route.DefaultRecentConfig, its TTL
// stretched.
func (c Config) recentConfig() route.RecentConfig {
	r := route.DefaultRecentConfig()
	r.TTL = c.stretch(r.TTL)
	return r
}

// inMeshTime converts r, measured on the wall clock of a mesh K times
// slower, to the mesh's own time.
func (r Result) inMeshTime(k float64) Result {
	r.Slow = k
	if k == 1 {
		return r
	}
	for _, v := range []*float64{&r.StoredPerNodePerSec, &r.SentBytesPerNode, &r.RecvBytesPerNode, &r.SocketBytesPerNode} {
		*v *= k
	}
	for _, m := range []map[string]float64{r.SentByKind, r.RecvByKind} {
		for kind := range m {
			m[kind] *= k
		}
	}
	for _, v := range []*float64{&r.WindowSeconds, &r.StoredP50Ms, &r.StoredP99Ms, &r.EvictedP50Ms, &r.EvictedP99Ms,
		&r.JoinSeconds, &r.DetectSeconds, &r.PollIntervalMs} {
		*v /= k
	}
	return r
}
