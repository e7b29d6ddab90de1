package route_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// TestClaimIndex: the peers an index finds for a request are those whose
// claims the request matches at the claim's depth, once per claim, as
// claims are added and dropped at random.
func TestClaimIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	chains := sharingChains(rng, 4, 40, 6)
	var x route.ClaimIndex
	held := map[string][]route.Claim{}
	now := time.Unix(1_800_000_000, 0)
	for step := range 3000 {
		id := fmt.Sprintf("p%d", rng.IntN(20))
		if rng.IntN(3) == 0 && len(held[id]) > 0 {
			n := 1 + rng.IntN(len(held[id]))
			x.Drop(id, held[id][:n])
			held[id] = held[id][n:]
		} else {
			c := chains[rng.IntN(len(chains))]
			d := 1 + rng.IntN(len(c))
			cs := []route.Claim{{Key: c[d-1], Keys: d, At: now}}
			x.Add(id, cs)
			held[id] = append(held[id], cs...)
		}
		keys := chains[rng.IntN(len(chains))]
		keys = keys[:1+rng.IntN(len(keys))]
		var want []string
		total := 0
		for id, cs := range held {
			total += len(cs)
			for _, c := range cs {
				if c.Keys <= len(keys) && route.ClaimTag(keys[c.Keys-1]) == route.ClaimTag(c.Key) {
					want = append(want, id)
				}
			}
		}
		got := x.Peers(keys, nil)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) || x.Len() != total {
			t.Fatalf("step %d: found %v (of %d claims); want %v (of %d)", step, got, x.Len(), want, total)
		}
	}
}

// BenchmarkClaimIndex is a Shortlist's lookup for a 32k-token prompt
// (512 keys) among a thousand peers' last 32 claims each, at depths
// spread over every prompt length.
func BenchmarkClaimIndex(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	var x route.ClaimIndex
	for i := range 1000 {
		for range 32 {
			x.Add(fmt.Sprintf("pod-%03d", i), []route.Claim{{Key: blockkey.Key(rng.Uint64()), Keys: 1 + rng.IntN(600)}})
		}
	}
	keys := make([]blockkey.Key, 512)
	for i := range keys {
		keys[i] = blockkey.Key(rng.Uint64())
	}
	var dst []string
	for b.Loop() {
		dst = x.Peers(keys, dst[:0])
	}
}
