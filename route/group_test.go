package route_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/route"
)

// TestGroupedChoiceIsTheSame: the default chain decides exactly as it does
// with each peer's own digest when some of the digests come from a Group:
// peers of one rank or more, with lower-tier entries or none, stamps the
// group has moved on from, a second group whose slots and stamps are the
// first's, a Grouped that is not a *route.Member, batches, loads that tie.
func TestGroupedChoiceIsTheSame(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	now := time.Unix(1_800_000_000, 0)
	params := bloom.ParamsFor(3000, 0.01)
	chains := sharingChains(rng, 6, 60, 8)
	policy := route.DefaultChain(route.DefaultConfig(), nil)
	for n := range 300 {
		g, g2 := bloom.NewTransposed(), bloom.NewTransposed()
		npeers := 1 + rng.IntN(70)
		plain := make([]route.PeerView, npeers)
		for i := range plain {
			var held []blockkey.Key
			for range rng.IntN(3) {
				c := chains[rng.IntN(len(chains))]
				held = append(held, c[:rng.IntN(len(c)+1)]...)
			}
			switch rng.IntN(8) {
			case 0:
				held = append(held, bloom.TierMarker(8))
			case 1:
				held = append(held, bloom.RankMarker(1))
			}
			id := fmt.Sprintf("p%02d", i)
			plain[i] = route.PeerView{ID: id, Addr: id, Local: i == 0, KeyScheme: blockkey.Version,
				Digest: bloom.Build(bloom.Header{Node: id, Params: params}, held), DigestAt: now,
				Load: route.Load{Running: rng.IntN(3)}, LoadAt: now, Ranks: rng.IntN(3)}
		}
		views := append([]route.PeerView(nil), plain...)
		for i := range views {
			d := views[i].Digest.(*bloom.Digest)
			if rng.IntN(6) == 0 {
				continue // not in the group
			}
			in := g
			if i > 0 && rng.IntN(8) == 0 {
				in = g2 // not the group the choice asks (the first peer's)
			}
			slot, stamp := in.Put(-1, d)
			if slot < 0 {
				continue
			}
			m := &route.Member{TierMatcher: d, G: in, Slot: slot, Stamp: stamp}
			views[i].Digest = m
			if rng.IntN(4) == 0 {
				views[i].Digest = otherGrouped{m}
			}
			if rng.IntN(10) == 0 { // the group moved on: a newer digest of the peer
				in.Put(slot, bloom.Build(bloom.Header{Node: views[i].ID, Params: params}, chains[0]))
			}
		}
		c := chains[rng.IntN(len(chains))]
		req := route.Request{Keys: c[:1+rng.IntN(len(c))], TokensPerKey: 16}
		if rng.IntN(5) == 0 {
			req.Batch = [][]blockkey.Key{chains[rng.IntN(len(chains))][:10]}
		}
		req.PromptTokens = 16 * len(req.Keys)
		want := policy.Choose(req, plain, now)
		got := policy.Choose(req, views, now)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("case %d: with a group the choice is\n%+v\nwithout\n%+v", n, got, want)
		}
	}
}

// otherGrouped is a Grouped that is not a *route.Member: a choice asks
// it for its group through the interface.
type otherGrouped struct{ *route.Member }

// sharingChains returns n random chains of length keys whose first shared
// keys are the same: prompts behind one system prompt.
func sharingChains(rng *rand.Rand, n, length, shared int) [][]blockkey.Key {
	chains := make([][]blockkey.Key, n)
	for i := range chains {
		chains[i] = make([]blockkey.Key, length)
		for j := range chains[i] {
			chains[i][j] = blockkey.Key(rng.Uint64())
		}
		if i > 0 {
			copy(chains[i][:shared], chains[0][:shared])
		}
	}
	return chains
}
