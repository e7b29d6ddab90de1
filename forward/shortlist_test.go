package forward

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// shortPeers is a fakePeers that shortlists, as gossip.Mesh does: on the
// briefs of its views (made once: the views must not change) and the
// group of their digests.
type shortPeers struct {
	*fakePeers
	g      route.Group
	briefs []route.Brief
}

func (s *shortPeers) Shortlist(sl *route.Shortlist, cfg *route.Config, req *route.Request, also []string, r *route.Recent,
	now time.Time, fresh func(*route.PeerView), buf []route.PeerView) ([]route.PeerView, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.briefs) != len(s.views) {
		s.briefs = make([]route.Brief, len(s.views))
		for i := range s.views {
			s.briefs[i] = route.BriefOf(&s.views[i])
		}
	}
	return sl.Make(cfg, req, s.briefs, s.g, also, r, nil, now, func(i int, v *route.PeerView) {
		*v = s.views[i]
		fresh(v)
	}, buf)
}

// groupedViews returns n peers' views with real digests in a group, one
// of them local: each holds a shared system prompt and some of a few
// conversations, with loads of every kind.
func groupedViews(rng *rand.Rand, n int, convs [][]blockkey.Key, now time.Time) ([]route.PeerView, route.Group) {
	g := bloom.NewTransposed()
	params := bloom.ParamsFor(2000, 0.01)
	views := make([]route.PeerView, n)
	for i := range views {
		id := fmt.Sprintf("pod-%03d", i)
		held := slices.Clone(convs[0][:4])
		c := convs[rng.IntN(len(convs))]
		held = append(held, c[:rng.IntN(len(c))]...)
		d := bloom.Build(bloom.Header{Node: id, Params: params}, held)
		slot, stamp := g.Put(-1, d)
		views[i] = route.PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
			Digest: &route.Member{TierMatcher: d, G: g, Slot: slot, Stamp: stamp}, DigestAt: now,
			Load:   route.Load{Serving: rng.IntN(4), Fronted: true, QueuedPrefillTokens: rng.IntN(3) * 1000, Prefilling: rng.IntN(2)},
			LoadAt: now.Add(-time.Duration(rng.IntN(900)) * time.Millisecond)}
	}
	return views, g
}

// TestShortlistedIsTheFrontsChoice: among many peers the front chooses on
// a shortlist of its table exactly as on every view, with its own
// requests in flight (added to peers' loads) and its recent forwards
// (which extend peers' matches) as they build up request by request.
func TestShortlistedIsTheFrontsChoice(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	n := newNode(t, "pod-000")
	now := n.h.now()
	// One moment for both choices: the loads' ages near SilentFor must
	// not cross it between them.
	n.h.now = func() time.Time { return now }
	convs := make([][]blockkey.Key, 6)
	for i := range convs {
		convs[i] = make([]blockkey.Key, 40)
		for j := range convs[i] {
			convs[i][j] = blockkey.Key(rng.Uint64())
		}
		copy(convs[i][:4], convs[0][:4])
	}
	views, g := groupedViews(rng, 300, convs, now)
	n.peers.views = views
	sp := &shortPeers{fakePeers: n.peers, g: g}
	n.h.peers = sp
	shortened := 0
	for q := range 200 {
		c := convs[rng.IntN(len(convs))]
		k := keyed{keys: c[:1+rng.IntN(len(c))], tokens: 16 * len(c)}
		n.h.cfg.NoShortlist = true
		want, _ := n.h.choose("", k, false, nil)
		n.h.cfg.NoShortlist = false
		got, peers := n.h.choose("", k, false, nil)
		if len(peers) < len(views) {
			shortened++
		}
		if got.Target != want.Target || got.Reason != want.Reason || got.Eligible != want.Eligible ||
			!slices.Equal(got.Attempts, want.Attempts) {
			t.Fatalf("request %d: shortlisted %s (%s) %v, %d eligible; every view %s (%s) %v, %d",
				q, got.Target, got.Reason, got.Attempts, got.Eligible, want.Target, want.Reason, want.Attempts, want.Eligible)
		}
		// What the front does after a choice: its request in flight
		// there, its forward recorded, until some finish.
		if got.Target != "" {
			n.h.mu.Lock()
			n.h.flights.add(got.Target, now.Add(time.Duration(q)*time.Microsecond), 500, 0, -1)
			n.h.recent.Record(got.Target, k.keys, now)
			if rng.IntN(4) == 0 { // an earlier forward, done: a longer prompt to a random pod
				n.h.recent.Record(views[rng.IntN(len(views))].ID, c, now)
			}
			if rng.IntN(3) == 0 {
				for id := range n.h.flights {
					n.h.flights[id] = n.h.flights[id][1:]
					if len(n.h.flights[id]) == 0 {
						delete(n.h.flights, id)
					}
					break
				}
			}
			n.h.mu.Unlock()
		}
	}
	if shortened < 190 {
		t.Errorf("%d of 200 choices read fewer views than peers", shortened)
	}
}
