package gossip

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// TestBriefsFollowTheTable drives the table through joins, metas that
// cannot be read, digests, deltas, load pushes, failures, claims, group
// rebuilds and departures, and checks after each step that its briefs,
// kept as it changes, are the briefs of the views it would hand out now.
func TestBriefsFollowTheTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	tb := newTable(4)
	chain := make([]blockkey.Key, 30)
	for i := range chain {
		chain[i] = blockkey.Key(rng.Uint64())
	}
	ids := []string{"a", "c", "e", "g", "i", "k", "m", "o", "q", "s", "u", "w"}
	epochs, seq := map[string]uint64{}, map[string]uint64{}
	now := t0
	self := route.PeerView{ID: "f", Local: true, Addr: "f:8000", KeyScheme: blockkey.Version}
	lastG, rebuilt := tb.group, 0
	for step := range 1500 {
		now = now.Add(100 * time.Millisecond)
		id := ids[rng.IntN(len(ids))]
		switch op := rng.IntN(12); {
		case op < 2:
			if rng.IntN(3) == 0 {
				epochs[id]++
			}
			m := metaAt(epochs[id], 1)
			m.Running, m.Stride, m.KeyScheme = rng.IntN(5), 4*(1+rng.IntN(8)/7), blockkey.Version
			tb.upsert(id, m, rng.IntN(6) > 0, now)
		case op < 4:
			// The digests change shape every 500 steps: the group is rebuilt.
			params := bloom.ParamsFor(200+2800*(step/500%2), 0.01)
			tb.applyDigest(bloom.Build(bloom.Header{Node: id, Epoch: epochs[id], Version: uint64(rng.IntN(4)), Params: params},
				chain[:rng.IntN(len(chain))]), now)
		case op < 5:
			if p := tb.peers[id]; p != nil && p.digest != nil {
				h := p.digest.Header()
				tb.applyDelta(bloom.Delta{Node: id, Epoch: h.Epoch, From: h.Version, To: h.Version + 1,
					Keys: chain[:rng.IntN(len(chain))]}, now)
			}
		case op < 8:
			seq[id]++
			r := loadReport{Node: id, Seq: seq[id], HasState: rng.IntN(2) == 0, Engine: route.EngineServing, Epoch: epochs[id],
				Load: route.Load{Serving: rng.IntN(4), Fronted: true, KVUsage: rng.Float64(), QueuedPrefillTokens: rng.IntN(900)}}
			if rng.IntN(8) == 0 {
				r.Engine = route.EngineDown
			}
			tb.applyLoad(r, now)
		case op < 9:
			tb.markFailed(id, now)
		case op < 10:
			var cs []route.Claim
			for range 1 + rng.IntN(20) { // sometimes more than keepClaims in a list: the oldest go
				d := 1 + rng.IntN(len(chain))
				cs = append(cs, route.Claim{Key: chain[d-1], Keys: d})
			}
			tb.claim(id, now, cs...)
		case op < 11:
			tb.remove(id)
		default:
			self.Load.Serving = rng.IntN(3)
		}
		if g := tb.group; g != lastG {
			rebuilt++
			lastG = g
		}
		list, at := tb.briefsWith(&self)
		if step == 1499 && rebuilt < 2 {
			t.Fatalf("the group was rebuilt %d times; the test wants it rebuilt", rebuilt)
		}
		views := tb.viewsWith(nil, &self)
		want := make([]route.Brief, len(views))
		for i := range views {
			want[i] = route.BriefOf(&views[i])
		}
		if !sameBriefs(list, want) || views[at].ID != self.ID {
			t.Fatalf("step %d: briefs\n%+v\nthe views'\n%+v", step, list, want)
		}
		// The claims' index holds the claims the peers hold, no more.
		var fresh route.ClaimIndex
		held := 0
		for id, p := range tb.peers {
			fresh.Add(id, p.claims)
			held += len(p.claims)
		}
		found, all := tb.claims.Peers(chain, nil), fresh.Peers(chain, nil)
		slices.Sort(found)
		slices.Sort(all)
		if tb.claims.Len() != held || !slices.Equal(found, all) {
			t.Fatalf("step %d: the index holds %d claims, the peers %d; it finds %v, the peers' %v", step, tb.claims.Len(), held, found, all)
		}
		if !slices.IsSortedFunc(list, func(a, b route.Brief) int { return strings.Compare(a.ID, b.ID) }) {
			t.Fatalf("step %d: briefs out of order", step)
		}
	}
}

// sameBriefs compares briefs whose groups are the same one, not only
// alike (reflect.DeepEqual would look into them).
func sameBriefs(a, b []route.Brief) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x.G != y.G {
			return false
		}
		x.G, y.G = nil, nil
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// TestBriefsAfterRegroup: a digest of a new shape that makes the group be
// rebuilt for it moves every other peer's digest to a new slot; their
// briefs follow.
func TestBriefsAfterRegroup(t *testing.T) {
	tb := newTable(4)
	self := route.PeerView{ID: "z", Local: true}
	small, large := bloom.ParamsFor(200, 0.01), bloom.ParamsFor(3000, 0.01)
	for i, id := range []string{"a", "b", "c", "d", "e"} {
		m := metaAt(1, 1)
		m.KeyScheme = blockkey.Version
		tb.upsert(id, m, true, t0)
		params := small
		if i >= 2 {
			params = large // c and d misfits; e makes three against two
		}
		tb.briefsWith(&self)
		tb.applyDigest(bloom.Build(bloom.Header{Node: id, Epoch: 1, Params: params}, []blockkey.Key{1, 2}), t0)
	}
	if tb.group.Shape() != large {
		t.Fatal("the group was not rebuilt for the larger digests")
	}
	list, _ := tb.briefsWith(&self)
	views := tb.viewsWith(nil, &self)
	if list[2].ID != "c" || list[2].G != tb.group {
		t.Fatalf("c's brief is not in the group: %+v", list[2])
	}
	for i := range views {
		if want := route.BriefOf(&views[i]); !sameBriefs(list[i:i+1], []route.Brief{want}) {
			t.Errorf("%s: brief %+v; its view's %+v", views[i].ID, list[i], want)
		}
	}
}

// TestTableShortlistIsTheViews: the default chain decides on the table's
// shortlist, this node's view in its place and the caller's counts added
// to each view it reads, as on every view the table hands out.
func TestTableShortlistIsTheViews(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	tb := newTable(4)
	chains := make([][]blockkey.Key, 5)
	for i := range chains {
		chains[i] = make([]blockkey.Key, 30)
		for j := range chains[i] {
			chains[i][j] = blockkey.Key(rng.Uint64())
		}
		copy(chains[i][:3], chains[0][:3])
	}
	now := t0.Add(time.Minute)
	for i := range 150 {
		id := fmt.Sprintf("pod-%03d", i)
		m := metaAt(1, 1)
		m.KeyScheme, m.Stride = blockkey.Version, 4
		tb.upsert(id, m, true, now)
		c := chains[rng.IntN(len(chains))]
		tb.applyDigest(bloom.Build(bloom.Header{Node: id, Epoch: 1, Params: bloom.ParamsFor(500, 0.01)},
			append(slices.Clone(chains[0][:3]), c[:rng.IntN(len(c))]...)), now)
		tb.applyLoad(loadReport{Node: id, Seq: 1, Load: route.Load{Serving: rng.IntN(4), Fronted: true,
			QueuedPrefillTokens: rng.IntN(2) * 3000}}, now.Add(-time.Duration(rng.IntN(800))*time.Millisecond))
		if rng.IntN(4) == 0 {
			d := 4 + rng.IntN(20)
			tb.claim(id, now, route.Claim{Key: c[d-1], Keys: d})
		}
	}
	// This node drains: out of the choice, as its view (not a brief) says.
	self := route.PeerView{ID: "pod-077a", Local: true, KeyScheme: blockkey.Version, LoadAt: now,
		Load: route.Load{Serving: 1, Fronted: true}, Draining: true}
	cfg := route.DefaultConfig()
	chain := route.DefaultChain(cfg, nil)
	// The caller's own counts: a burst in flight at every tenth peer,
	// which puts it over the bound.
	fresh := func(v *route.PeerView) {
		if !v.Local && v.ID[len(v.ID)-1] == '0' {
			v.Load.InFlight, v.Load.InFlightPrefillTokens = 20, 9000
		}
	}
	also := []string{}
	for i := 0; i < 150; i += 10 {
		also = append(also, fmt.Sprintf("pod-%03d", i))
	}
	for q := range 100 {
		c := chains[rng.IntN(len(chains))]
		req := route.Request{Keys: c[:1+rng.IntN(len(c))], TokensPerKey: 64}
		req.PromptTokens = 64 * len(req.Keys)
		views := tb.viewsWith(nil, &self)
		for i := range views {
			fresh(&views[i])
		}
		want := chain.Choose(req, views, now)
		sl := route.GetShortlist()
		short, ok := tb.shortlist(sl, &cfg, &req, also, nil, &self, now, fresh, nil)
		if !ok {
			t.Fatal("no shortlist among 151 peers")
		}
		got := chain.Choose(req, short, now)
		route.PutShortlist(sl)
		if got.Target != want.Target || got.Reason != want.Reason || got.Eligible != want.Eligible ||
			math.Abs(got.Mean-want.Mean) > 1e-9 || !slices.Equal(route.Attempts(got, 4), route.Attempts(want, 4)) ||
			len(short) >= len(views) {
			t.Fatalf("request %d: shortlisted %s (%s, %d eligible, mean %v, %v) on %d views; every view %s (%s, %d, %v, %v)", q,
				got.Target, got.Reason, got.Eligible, got.Mean, route.Attempts(got, 4), len(short),
				want.Target, want.Reason, want.Eligible, want.Mean, route.Attempts(want, 4))
		}
	}
}
