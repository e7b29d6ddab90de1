package route_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// shortMesh is a random mesh as a peer table and a front hand it to a
// choice: views (the front's counts in them), their briefs, the group of
// their plain digests, the peers with this front's requests in flight.
type shortMesh struct {
	views  []route.PeerView
	briefs []route.Brief
	g      *bloom.Transposed
	also   []string
	recent *route.Recent
	claims route.ClaimIndex // of every view's claims
	req    route.Request
}

func newShortMesh(rng *rand.Rand, chains [][]blockkey.Key, params bloom.Params, now time.Time) shortMesh {
	var m shortMesh
	m.g = bloom.NewTransposed()
	m.recent = route.NewRecent(route.DefaultRecentConfig())
	npeers := route.ShortlistMin + rng.IntN(300)
	m.views = make([]route.PeerView, npeers)
	ago := func(d time.Duration) time.Time { return now.Add(-time.Duration(rng.Int64N(int64(d)))) }
	for i := range m.views {
		id := fmt.Sprintf("p%03d", i)
		var held []blockkey.Key
		for range rng.IntN(3) {
			c := chains[rng.IntN(len(chains))]
			held = append(held, c[:rng.IntN(len(c)+1)]...)
		}
		if rng.IntN(40) == 0 {
			held = append(held, bloom.TierMarker(8)) // a lower tier: read whole
		}
		d := bloom.Build(bloom.Header{Node: id, Params: params}, held)
		v := route.PeerView{ID: id, Addr: id, Local: i == npeers/3, KeyScheme: blockkey.Version,
			Digest: d, DigestAt: ago(2 * time.Second), LoadAt: ago(time.Second), Since: ago(time.Minute),
			Load: route.Load{Running: rng.IntN(4), Waiting: rng.IntN(2), KVUsage: rng.Float64(),
				Serving: rng.IntN(4), Fronted: rng.IntN(2) == 0,
				QueuedPrefillTokens: rng.IntN(3) * rng.IntN(4000), Prefilling: rng.IntN(3)}}
		if slot, stamp := m.g.Put(-1, d); slot >= 0 && rng.IntN(30) != 0 {
			v.Digest = &route.Member{TierMatcher: d, G: m.g, Slot: slot, Stamp: stamp}
			if rng.IntN(40) == 0 { // the group moved on since
				m.g.Put(slot, bloom.Build(bloom.Header{Node: id, Params: params}, chains[0]))
			}
		}
		switch rng.IntN(30) {
		case 0:
			v.Engine = route.EngineDown
		case 1:
			v.Draining = true
		case 2:
			v.LastFailure = ago(20 * time.Second)
		case 3:
			v.LoadAt = now.Add(-10 * time.Second) // stale and silent
		case 4:
			v.LoadAt = time.Time{}
		case 5:
			v.KeyScheme = blockkey.Version + 1
		case 6:
			v.Digest = nil
		case 7:
			v.Ranks = 2
		case 8:
			v.Models = []string{"a", "b"}
		}
		if rng.IntN(6) == 0 {
			c := chains[rng.IntN(len(chains))]
			n := 1 + rng.IntN(len(c))
			v.Claims = []route.Claim{{Key: c[n-1], Keys: n, At: ago(8 * time.Second)}}
			m.claims.Add(id, v.Claims)
		}
		if rng.IntN(15) == 0 {
			c := chains[rng.IntN(len(chains))]
			m.recent.Record(id, c[:1+rng.IntN(len(c))], ago(7*time.Second))
		}
		m.briefs = append(m.briefs, route.BriefOf(&v))
		// This front's own counts, which the table's briefs lack: its
		// requests in flight there, and the local pod's exact load.
		if rng.IntN(20) == 0 {
			v.Load.InFlight, v.Load.InFlightPrefillTokens, v.Load.InFlightPrefilling = 1+rng.IntN(3), rng.IntN(5000), 1
			m.also = append(m.also, id)
		}
		if v.Local {
			v.Load.Serving, v.LoadAt = rng.IntN(5), now
		}
		m.views[i] = v
	}
	c := chains[rng.IntN(len(chains))]
	m.req = route.Request{Keys: c[:1+rng.IntN(len(c))], TokensPerKey: 64}
	switch rng.IntN(8) {
	case 2: // a prompt shorter than a block: LeastLoad's
		m.req.Keys = nil
	case 0, 1, 7: // a new prompt behind the system prompt: nobody holds it
		m.req.Keys = slices.Clone(chains[0][:4])
		for range 1 + rng.IntN(60) {
			m.req.Keys = append(m.req.Keys, blockkey.Key(rng.Uint64()))
		}
	case 3, 4:
		m.req.Keys = append(slices.Clone(m.req.Keys), blockkey.Key(rng.Uint64()))
	}
	m.req.PromptTokens = 64*len(m.req.Keys) - rng.IntN(64)
	if rng.IntN(10) == 0 {
		m.req.Model = "b"
	}
	return m
}

// TestShortlistDecidesAsAll: the default chain decides on a shortlist's
// views, with its Rest, as on every view: the target, the reason, the
// load bound and mean, the eligible count, the chosen candidate, the
// failover order at every length Attempts is exact for; under several
// configurations, over meshes with every kind of peer a Brief cannot
// judge alone, its claims read from an index of them or one by one.
func TestShortlistDecidesAsAll(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	now := time.Unix(1_800_000_000, 0)
	params := bloom.ParamsFor(3000, 0.01)
	chains := sharingChains(rng, 12, 80, 4)
	cfgs := map[string]route.Config{"default": route.DefaultConfig()}
	c := route.DefaultConfig()
	c.IdleSlack, c.IdleHeadroom, c.ColdHeadroom, c.DigestTTL = 0.5, 2, 1, 1500*time.Millisecond
	cfgs["idle bound, cold headroom, digest TTL"] = c
	c = route.DefaultConfig()
	c.ProductCost, c.QueuedWeight = true, 0
	cfgs["product cost"] = c
	shortened := 0
	for name, cfg := range cfgs {
		for n := range 150 {
			m := newShortMesh(rng, chains, params, now)
			policy := route.DefaultChain(cfg, m.recent)
			want := policy.Choose(m.req, m.views, now)
			req := m.req
			sl := route.GetShortlist()
			claims := &m.claims // every other case: every brief's claims read
			if n%2 == 0 {
				claims = nil
			}
			short, ok := sl.Make(&cfg, &req, m.briefs, m.g, m.also, m.recent, claims, now,
				func(i int, v *route.PeerView) { *v = m.views[i] }, nil)
			if !ok {
				t.Fatalf("%s, case %d: no shortlist of %d peers", name, n, len(m.views))
			}
			got := policy.Choose(req, short, now)
			route.PutShortlist(sl)
			if len(short) < len(m.views) {
				shortened++
			}
			where := fmt.Sprintf("%s, case %d (%d peers, %d read)", name, n, len(m.views), len(short))
			// The mean sums the loads in another order: equal to the last
			// bits.
			if got.Target != want.Target || got.Reason != want.Reason || !near(got.Bound, want.Bound) ||
				!near(got.Mean, want.Mean) || got.Eligible != want.Eligible {
				t.Fatalf("%s: shortlisted %s (%s) bound %v mean %v eligible %d; every view %s (%s) %v %v %d\n%s",
					where, got.Target, got.Reason, got.Bound, got.Mean, got.Eligible,
					want.Target, want.Reason, want.Bound, want.Mean, want.Eligible, want.Table())
			}
			if len(got.Candidates)+got.Omitted != len(m.views) {
				t.Fatalf("%s: listed %d and omitted %d", where, len(got.Candidates), got.Omitted)
			}
			if want.Target != "" && !reflect.DeepEqual(chosen(got), chosen(want)) {
				t.Fatalf("%s: the chosen candidate is\n%+v\nwith every view\n%+v", where, chosen(got), chosen(want))
			}
			// What every view's Decision lists (the failover order's
			// next, the best scores, the longest match) the shortlist
			// read, and weighed alike.
			for _, c := range want.Candidates {
				j := slices.IndexFunc(got.Candidates, func(g route.Candidate) bool { return g.ID == c.ID })
				if j < 0 {
					t.Fatalf("%s: %s, listed with every view, is not on the shortlist\n%s", where, c.ID, want.Table())
				}
				g := got.Candidates[j]
				g.Index, c.Index = 0, 0
				if !near(g.Score, c.Score) || !near(g.Load, c.Load) {
					t.Fatalf("%s: %s is\n%+v\nwith every view\n%+v", where, c.ID, g, c)
				}
				g.Score, c.Score = 0, 0
				if !reflect.DeepEqual(g, c) {
					t.Fatalf("%s: %s is\n%+v\nwith every view\n%+v", where, c.ID, g, c)
				}
			}
			for k := 1; k <= 9; k++ {
				if a, b := route.Attempts(got, k), route.Attempts(want, k); !slices.Equal(a, b) {
					t.Fatalf("%s: failover order %v; every view %v", where, a, b)
				}
			}
		}
	}
	if shortened < 300 {
		t.Errorf("only %d of 450 choices read fewer views than peers", shortened)
	}

}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*max(1, math.Abs(b)) }

func chosen(d route.Decision) *route.Candidate {
	for i := range d.Candidates {
		if d.Candidates[i].Chosen {
			c := d.Candidates[i]
			c.Index = 0 // its place among the views handed over
			return &c
		}
	}
	return nil
}
