package route_test

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// chainSet is a stand-in for *bloom.Digest.
type chainSet map[blockkey.Key]bool

func (s chainSet) PrefixLen(keys []blockkey.Key) int {
	for i, k := range keys {
		if !s[k] {
			return i
		}
	}
	return len(keys)
}

// ExampleChain shows the call sequence of the sidecar's request path.
func ExampleChain() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	scheme := blockkey.DefaultScheme()
	prompt := make([]uint32, 800) // 12 routing keys of 64 tokens
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	keys := scheme.Request(blockkey.Root("llama", "", ""), prompt)

	held := chainSet{}
	for _, k := range keys[:8] {
		held[k] = true
	}
	peers := []route.PeerView{
		{ID: "pod-a", Local: true, KeyScheme: blockkey.Version, LoadAt: now, Load: route.Load{Running: 2}},
		{ID: "pod-b", KeyScheme: blockkey.Version, Digest: held, DigestAt: now, LoadAt: now, Load: route.Load{Running: 3}},
	}
	recent := route.NewRecent(route.DefaultRecentConfig())
	policy := route.DefaultChain(route.DefaultConfig(), recent)

	req := route.Request{Model: "llama", Keys: keys, TokensPerKey: scheme.TokensPerKey()}
	d := policy.Choose(req, peers, now)
	if d.Target != "" && !d.Local {
		recent.Record(d.Target, req.Keys, now) // then forward once
	}
	fmt.Print(d.Table())
	// Output:
	// target pod-b  reason affinity  local false
	// eligible 2/2  mean 3.00  bound 11.00
	//   peer    keys  tokens    load  queued    ttft      score  status
	//   pod-a      0       0    2.00       0       -   -128.000  local, no digest
	// * pod-b      8     512    3.00       0       -    320.000
}
