package gossip

import (
	"fmt"
	"github.com/hashicorp/memberlist"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// BenchmarkPropagation measures, on loopback with 8 meshes, the time from
// PublishDelta at one node to the delta's keys being testable in every other
// node's view, and the digest bytes each node sends, while `publishers`
// nodes each publish 50 deltas/s of 8 keys over a 25k-key (1% FP) digest.
// b.N is the number of deltas per publisher; run with e.g. -benchtime=200x.
// Memberlist runs its DefaultLANConfig. Reported: p50/p99/max latency over every (delta, receiver) pair, and
// payload bytes/s sent per node (deltas, full digests), excluding
// memberlist's own probes and framing.
func BenchmarkPropagation(b *testing.B) {
	for _, publishers := range []int{1, 8} {
		b.Run(fmt.Sprintf("publishers=%d", publishers), func(b *testing.B) {
			benchPropagation(b, 8, publishers, 50, 8)
		})
	}
}

func benchPropagation(b *testing.B, n, publishers, rate, keysPerDelta int) {
	type obs struct {
		mu   sync.Mutex
		seen map[string]uint64       // origin → highest version seen
		at   map[[2]uint64]time.Time // (origin index, version) → when testable
	}
	recv := make([]*obs, n)
	for i := range recv {
		recv[i] = &obs{seen: map[string]uint64{}, at: map[[2]uint64]time.Time{}}
	}
	origin := func(name string) uint64 {
		var i uint64
		fmt.Sscanf(name, "n%d", &i)
		return i
	}
	ms := clusterWith(b, n, func(i int, c *Config) {
		c.Memberlist = lanTimings // as in pods
		c.FullDigestInterval = 10 * time.Second
		c.MetaInterval = time.Second
	}, func(i int, h *hooks) {
		o := recv[i]
		h.applied = func(from string, v uint64) {
			now := time.Now()
			o.mu.Lock()
			defer o.mu.Unlock()
			for w := o.seen[from] + 1; w <= v; w++ {
				o.at[[2]uint64{origin(from), w}] = now
			}
			o.seen[from] = max(o.seen[from], v)
		}
	})
	params := bloom.ParamsFor(25000, 0.01)
	for i := range publishers {
		name := fmt.Sprintf("n%d", i)
		if err := ms[i].PublishDigest(bloom.Build(bloom.Header{Node: name, Epoch: 1, Version: 1, Params: params}, nil)); err != nil {
			b.Fatal(err)
		}
	}
	waitFor(b, 10*time.Second, "first digests", func() bool {
		for r := range ms {
			for i := range publishers {
				if i != r && digestVersion(ms[r], fmt.Sprintf("n%d", i)) != 1 {
					return false
				}
			}
		}
		return true
	})
	before := make([]Stats, n)
	for i, m := range ms {
		before[i] = m.Stats()
	}

	sentAt := make([][]time.Time, publishers)
	for i := range sentAt {
		sentAt[i] = make([]time.Time, b.N+2)
	}
	b.ResetTimer()
	start := time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	for k := range b.N {
		<-tick.C
		for i := range publishers {
			keys := make([]blockkey.Key, keysPerDelta)
			for j := range keys {
				keys[j] = blockkey.Key(uint64(i)<<48 | uint64(k)<<8 | uint64(j))
			}
			v := uint64(k + 1)
			sentAt[i][v+1] = time.Now()
			if err := ms[i].PublishDelta(bloom.Delta{Node: fmt.Sprintf("n%d", i), Epoch: 1, From: v, To: v + 1, Keys: keys}); err != nil {
				b.Fatal(err)
			}
		}
	}
	tick.Stop()
	last := uint64(b.N + 1)
	waitFor(b, 20*time.Second, "last delta everywhere", func() bool {
		for r := range ms {
			for i := range publishers {
				if i != r && digestVersion(ms[r], fmt.Sprintf("n%d", i)) < last {
					return false
				}
			}
		}
		return true
	})
	elapsed := time.Since(start)
	b.StopTimer()

	var lat []time.Duration
	for r, o := range recv {
		o.mu.Lock()
		for i := range publishers {
			if i == r {
				continue
			}
			for v := uint64(2); v <= last; v++ {
				if at, ok := o.at[[2]uint64{uint64(i), v}]; ok {
					lat = append(lat, at.Sub(sentAt[i][v]))
				}
			}
		}
		o.mu.Unlock()
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	var deltaB, fullB, needB, held, fulls uint64
	for i, m := range ms {
		s := m.Stats()
		deltaB += s.Sent.Delta.Bytes - before[i].Sent.Delta.Bytes
		fullB += s.Sent.Digest.Bytes - before[i].Sent.Digest.Bytes
		needB += s.Sent.NeedFull.Bytes - before[i].Sent.NeedFull.Bytes
		held += s.Held - before[i].Held
		fulls += s.FullRequests - before[i].FullRequests
	}
	sec := elapsed.Seconds()
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(pct(1), "max-ms")
	b.ReportMetric(float64(deltaB)/sec/float64(n), "delta-B/s/node")
	b.ReportMetric(float64(fullB)/sec/float64(n), "full-B/s/node")
	b.ReportMetric(float64(needB)/sec/float64(n), "needfull-B/s/node")
	b.ReportMetric(float64(held), "held")
	b.ReportMetric(float64(fulls), "full-requests")
	b.ReportMetric(float64(len(lat)), "samples")
}

// lanTimings puts memberlist's DefaultLANConfig timings, a pod's, on a
// configuration LocalConfig made.
func lanTimings(mc *memberlist.Config) {
	lan := memberlist.DefaultLANConfig()
	mc.TCPTimeout = lan.TCPTimeout
	mc.IndirectChecks = lan.IndirectChecks
	mc.RetransmitMult = lan.RetransmitMult
	mc.SuspicionMult = lan.SuspicionMult
	mc.SuspicionMaxTimeoutMult = lan.SuspicionMaxTimeoutMult
	mc.PushPullInterval = lan.PushPullInterval
	mc.ProbeInterval = lan.ProbeInterval
	mc.ProbeTimeout = lan.ProbeTimeout
	mc.GossipInterval = lan.GossipInterval
	mc.GossipNodes = lan.GossipNodes
	mc.GossipToTheDeadTime = lan.GossipToTheDeadTime
}

// BenchmarkViews is what the front pays per request before the choice:
// the peer table as route.PeerViews (Mesh.Snapshot), one per member with a
// digest, models and load.
func BenchmarkViews(b *testing.B) {
	table := func(n int) *table {
		tb := newTable(4)
		for i := range n {
			id := fmt.Sprintf("pod-%03d", i)
			m := metaAt(1, 1)
			m.Models = []string{"m", "m-lora"}
			tb.upsert(id, m, true, t0)
			tb.applyDigest(testDigest(id, 1, 1, blockkey.Key(i)), t0)
		}
		return tb
	}
	for _, n := range []int{8, 64, 1000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			tb := table(n)
			b.ReportAllocs()
			for b.Loop() {
				if vs := tb.views(); len(vs) != n {
					b.Fatalf("views = %d; want %d", len(vs), n)
				}
			}
		})
		// Over a buffer kept from the last call, as the front's request
		// path builds them (Mesh.AppendSnapshot).
		b.Run(fmt.Sprintf("peers=%d-kept", n), func(b *testing.B) {
			tb := table(n)
			var buf []route.PeerView
			b.ReportAllocs()
			for b.Loop() {
				if buf = tb.viewsWith(buf, nil); len(buf) != n {
					b.Fatalf("views = %d; want %d", len(buf), n)
				}
			}
		})
	}
}

// BenchmarkClaim is what the front pays per request after the choice: a
// request's claims (five, route.ClaimsFor's for a prompt five times its
// rendezvous depth) on the pod it was sent to, this one or a peer, whose
// claim list is full (keepClaims).
func BenchmarkClaim(b *testing.B) {
	ms := cluster(b, 2, func(i int, c *Config) { c.MetaInterval = time.Hour })
	cs := make([]route.Claim, 5)
	for i := range cs {
		cs[i] = route.Claim{Key: blockkey.Key(i + 1), Keys: 4 << i}
	}
	for _, to := range []string{"n0", "n1"} {
		b.Run("to="+to, func(b *testing.B) {
			waitFor(b, 5*time.Second, to+" claimed", func() bool {
				ms[0].Claim(to, cs)
				v, _ := view(ms[0], to)
				return len(v.Claims) >= keepClaims
			})
			b.ReportAllocs()
			for b.Loop() {
				ms[0].Claim(to, cs)
			}
		})
	}
}

// BenchmarkTableChoice is a front's choice among 128 to a thousand peers
// on the table as a busy mesh fills it: every peer's digest in the group, its
// load pushed, and (claimed) a full list of other requests' claims.
// views: every view, then the choice; shortlist: the briefs and the few
// views a route.Shortlist reads, then the choice.
func BenchmarkTableChoice(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]blockkey.Key, 512) // a 32k-token prompt at stride 4
	for i := range keys {
		keys[i] = blockkey.Key(rng.Uint64())
	}
	for _, c := range []struct {
		npeers  int
		claimed bool
	}{{128, false}, {256, false}, {1000, false}, {1000, true}} {
		claimed := c.claimed
		tb := newTable(4)
		for i := range c.npeers {
			id := fmt.Sprintf("pod-%03d", i)
			m := metaAt(1, 1)
			m.KeyScheme, m.Stride = blockkey.Version, 4
			tb.upsert(id, m, true, t0)
			held := slices.Clone(keys[:4])
			if i == c.npeers/2 {
				held = keys[:384]
			}
			for range 2000 {
				held = append(held, blockkey.Key(rng.Uint64()))
			}
			tb.applyDigest(bloom.Build(bloom.Header{Node: id, Epoch: 1, Params: bloom.ParamsFor(25_000, 0.01)}, held), t0)
			tb.applyLoad(loadReport{Node: id, Seq: 1, Load: route.Load{Serving: i % 3, Fronted: true}}, t0)
			if claimed {
				for range keepClaims {
					tb.claim(id, t0, route.Claim{Key: blockkey.Key(rng.Uint64()), Keys: 1 + rng.IntN(600)})
				}
			}
		}
		self := route.PeerView{ID: "pod-000a", Local: true, KeyScheme: blockkey.Version, LoadAt: t0}
		cfg := route.DefaultConfig()
		chain := route.DefaultChain(cfg, nil)
		req := route.Request{Keys: keys, TokensPerKey: 64, PromptTokens: 32768}
		for _, short := range []bool{false, true} {
			name := fmt.Sprintf("peers=%d/%s", c.npeers, map[bool]string{false: "views", true: "shortlist"}[short])
			if claimed {
				name += "-claimed"
			}
			b.Run(name, func(b *testing.B) {
				var buf []route.PeerView
				b.ReportAllocs()
				for b.Loop() {
					q := req
					var d route.Decision
					if short {
						sl := route.GetShortlist()
						list, at := tb.briefsWith(&self)
						var ok bool
						buf, ok = sl.Make(&cfg, &q, list, tb.group, nil, nil, &tb.claims, t0, func(i int, v *route.PeerView) {
							if i == at {
								*v = self
							} else {
								tb.view(v, tb.briefs.order[i])
							}
						}, buf)
						if !ok {
							b.Fatal("no shortlist")
						}
						d = chain.Choose(q, buf, t0)
						route.PutShortlist(sl)
					} else {
						buf = tb.viewsWith(buf, &self)
						d = chain.Choose(q, buf, t0)
					}
					if d.Target != fmt.Sprintf("pod-%03d", c.npeers/2) {
						b.Fatalf("chose %s (%s)", d.Target, d.Reason)
					}
				}
				b.ReportMetric(float64(len(buf)), "views")
			})
		}
	}
}
