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

// TestListedIsTheWholeDecision checks that a Decision among more than
// ListPeers peers, which lists only some candidates, is the one the whole
// list gives: the same target, reason, note and bound, each listed
// candidate as the whole list has it, the failover order the same for
// every MaxAttempts it is exact for, and the chosen, local, longest-match
// and best-scored peers listed.
func TestListedIsTheWholeDecision(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	now := time.Unix(1_800_000_000, 0)
	params := bloom.ParamsFor(3000, 0.01)
	chains := sharingChains(rng, 5, 40, 4)
	listedCases := 0
	for n := range 200 {
		recent := route.NewRecent(route.DefaultRecentConfig())
		policy := route.DefaultChain(route.DefaultConfig(), recent)
		npeers := route.ListPeers - 4 + rng.IntN(300)
		peers := make([]route.PeerView, npeers)
		for i := range peers {
			var held []blockkey.Key
			if rng.IntN(3) > 0 {
				c := chains[rng.IntN(len(chains))]
				held = c[:rng.IntN(len(c)+1)]
			}
			id := fmt.Sprintf("p%03d", i)
			peers[i] = route.PeerView{ID: id, Addr: id, Local: i == 7, KeyScheme: blockkey.Version,
				Digest: bloom.Build(bloom.Header{Node: id, Params: params}, held), DigestAt: now,
				Load: route.Load{Running: rng.IntN(4), KVUsage: rng.Float64()}, LoadAt: now}
			switch rng.IntN(12) {
			case 0:
				peers[i].Draining = true
			case 1:
				peers[i].LastFailure = now.Add(-time.Second)
			case 2:
				peers[i].LoadAt = time.Time{} // stale load
			case 3:
				recent.Record(id, chains[rng.IntN(len(chains))][:20], now.Add(-time.Second))
			case 4:
				peers[i].KeyScheme = blockkey.Version + 1
			}
		}
		c := chains[rng.IntN(len(chains))]
		req := route.Request{Keys: c[:1+rng.IntN(len(c))], TokensPerKey: 16}
		if rng.IntN(4) == 0 {
			req.Keys = []blockkey.Key{blockkey.Key(rng.Uint64())} // nobody holds it
		}
		req.PromptTokens = 16 * len(req.Keys)
		whole := req
		whole.Explain = true
		want := policy.Choose(whole, peers, now)
		got := policy.Choose(req, peers, now)
		if len(want.Candidates) != npeers || want.Omitted != 0 {
			t.Fatalf("case %d: Explain listed %d of %d peers, omitted %d", n, len(want.Candidates), npeers, want.Omitted)
		}
		if npeers <= route.ListPeers {
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("case %d: %d peers, not more than ListPeers: listed\n%+v\nwhole\n%+v", n, npeers, got, want)
			}
			continue
		}
		listedCases++
		if got.Target != want.Target || got.Reason != want.Reason || got.Note != want.Note ||
			got.Bound != want.Bound || got.Mean != want.Mean || got.Eligible != want.Eligible {
			t.Fatalf("case %d: listed %+v; whole %+v", n, header(got), header(want))
		}
		if len(got.Candidates)+got.Omitted != npeers || len(got.Candidates) > 16 {
			t.Fatalf("case %d: listed %d, omitted %d, of %d peers", n, len(got.Candidates), got.Omitted, npeers)
		}
		last := -1
		for _, c := range got.Candidates {
			if c.Index <= last {
				t.Fatalf("case %d: candidates out of the peers' order at %s", n, c.ID)
			}
			last = c.Index
			if w := want.Candidates[c.Index]; !reflect.DeepEqual(c, w) {
				t.Fatalf("case %d: listed\n%+v\nwhole\n%+v", n, c, w)
			}
		}
		for max := 1; max <= 9; max++ {
			if g, w := route.Attempts(got, max), route.Attempts(want, max); !reflect.DeepEqual(g, w) {
				t.Fatalf("case %d: Attempts(%d) listed %v; whole %v", n, max, g, w)
			}
		}
		listed := map[string]bool{}
		for _, c := range got.Candidates {
			listed[c.ID] = true
		}
		held, scored := -1, 0
		for i, c := range want.Candidates {
			if (c.Chosen || c.Local) && !listed[c.ID] {
				t.Fatalf("case %d: %s (chosen %t, local %t) not listed", n, c.ID, c.Chosen, c.Local)
			}
			if c.Eligible && (held < 0 || c.MatchedKeys > want.Candidates[held].MatchedKeys) {
				held = i
			}
			if c.Scored {
				scored++
			}
		}
		if held >= 0 && !listed[want.Candidates[held].ID] {
			t.Fatalf("case %d: the longest match, %s, not listed", n, want.Candidates[held].ID)
		}
		// The listed scores include the 4 best: no peer left out scores
		// above the 4th best listed.
		var top []float64
		for _, c := range got.Candidates {
			if c.Scored {
				top = append(top, c.Score)
			}
		}
		slices.Sort(top)
		slices.Reverse(top)
		if len(top) < min(4, scored) {
			t.Fatalf("case %d: %d scored listed of %d", n, len(top), scored)
		}
		if len(top) >= 4 {
			for _, c := range want.Candidates {
				if c.Scored && !listed[c.ID] && c.Score > top[3] {
					t.Fatalf("case %d: %s scores %v, above the 4th best listed %v, and is not listed", n, c.ID, c.Score, top[3])
				}
			}
		}
	}
	if listedCases < 150 {
		t.Fatalf("only %d cases had more than ListPeers peers", listedCases)
	}
}

func header(d route.Decision) route.Decision {
	d.Candidates, d.Omitted = nil, 0
	return d
}

// TestListedFailoverTies checks the failover order a Decision among many
// peers lists against the whole list's where most peers tie on load, by
// IDs out of the peers' order: at a few loads, and at NaN loads (a KV
// knee of -Inf), which before orders by ID as it does equal ones.
func TestListedFailoverTies(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	now := time.Unix(1_800_000_000, 0)
	for n := range 100 {
		cfg := route.DefaultConfig()
		if n%2 == 1 {
			cfg.KVKnee = math.Inf(-1)
		}
		policy := route.DefaultChain(cfg, nil)
		peers := make([]route.PeerView, route.ListPeers+1+rng.IntN(200))
		for i, id := range rng.Perm(len(peers)) {
			peers[i] = route.PeerView{ID: fmt.Sprintf("p%04d", id), Local: i == 3, KeyScheme: blockkey.Version,
				Load: route.Load{Running: rng.IntN(3), Waiting: rng.IntN(2) * 20}, LoadAt: now}
			if rng.IntN(4) == 0 {
				peers[i].LoadAt = time.Time{} // stale: InFlight alone, never NaN
				peers[i].Load.InFlight = rng.IntN(2)
			}
		}
		req := route.Request{Keys: []blockkey.Key{blockkey.Key(rng.Uint64())}, TokensPerKey: 16, PromptTokens: 16}
		whole := req
		whole.Explain = true
		got, want := policy.Choose(req, peers, now), policy.Choose(whole, peers, now)
		if got.Omitted == 0 {
			t.Fatalf("case %d: nothing omitted of %d peers", n, len(peers))
		}
		for max := 1; max <= 9; max++ {
			if g, w := route.Attempts(got, max), route.Attempts(want, max); !reflect.DeepEqual(g, w) {
				t.Fatalf("case %d: Attempts(%d) listed %v; whole %v", n, max, g, w)
			}
		}
	}
}
