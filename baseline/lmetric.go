package baseline

import (
	"encoding/binary"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// LMetric is LMetric's choice (Zhang et al., OSDI'26, arXiv:2603.15202;
// the llm-d lmetric-scorer, router PR #2351) on central-precise's exact
// index: the pod with the lowest
//
//	uncached prompt tokens × (requests in flight there + 1)
//
// wins, with no weights and no load bound. The uncached tokens are the
// prompt's less the prefix the pod's index (or this router's speculative
// entries, as central-precise's) holds; a batch's are the sum over its
// prompts. In flight is this router's own count (Pod.InFlight): every
// request passes it, so the count is exact and never stale. Ties go to
// the highest rendezvous weight of (seed, pod, the request's rendezvous
// key), so one seed gives one answer.
type LMetric struct {
	p    *Precise // keys requests; its indexes and Recent are the view
	seed uint64
}

// NewLMetric returns the policy over one matcher per pod, in Pick's pod
// order, as NewPrecise. cfg.Route only sets the rendezvous key of ties;
// cfg.ExactLoad is ignored (the load is always the router's own count).
func NewLMetric(cfg PreciseConfig, indexes []route.Matcher, seed uint64) *LMetric {
	return &LMetric{p: NewPrecise(cfg, indexes), seed: seed}
}

// lmetricCost is LMetric's cost of one pod. Uncached counts at least one
// token: vLLM recomputes a prompt's last token even when all of it is
// cached (blockkey.Scheme.Request never keys it), so a known prompt
// always has one; the floor also keeps a request whose tokens are unknown
// (a /tokenize that failed) from costing 0 everywhere, so it goes to the
// least loaded pod.
func lmetricCost(uncachedTokens, inFlight int) int {
	return max(uncachedTokens, 1) * (inFlight + 1)
}

// cheapest returns the index of the lowest cost, ties to the highest rank.
func cheapest(costs []int, rank []uint64) int {
	best := 0
	for i := 1; i < len(costs); i++ {
		if costs[i] < costs[best] || (costs[i] == costs[best] && rank[i] > rank[best]) {
			best = i
		}
	}
	return best
}

// Costs returns every pod's cost for the request, in pods' order.
func (l *LMetric) Costs(req Request, pods []Pod, now time.Time) []int {
	chains, tokens := promptChains(l.p, req)
	out := make([]int, len(pods))
	for i, pod := range pods {
		uncached := 0
		for j, chain := range chains {
			uncached += tokens[j] - min(l.matched(i, pod.Name, chain, now)*l.p.cfg.Scheme.TokensPerKey(), tokens[j])
		}
		out[i] = lmetricCost(uncached, pod.InFlight)
	}
	return out
}

// matched is how many leading keys of chain pod i holds by its index or
// this router's recent forwards to it.
func (l *LMetric) matched(i int, pod string, chain []blockkey.Key, now time.Time) int {
	var m route.Matcher = prefixNone{}
	if i < len(l.p.indexes) {
		m = l.p.indexes[i]
	}
	return batchMatcher{m: m, prompts: [][]blockkey.Key{chain}, recent: l.p.recent, pod: pod, now: now}.PrefixLen(nil)
}

// Pick implements Policy, and records the request's chains as this
// router's recent forwards to the pod chosen.
func (l *LMetric) Pick(req Request, pods []Pod, now time.Time) int {
	chains, _ := promptChains(l.p, req)
	best := cheapest(l.Costs(req, pods, now), ranks(l.seed, pods, tieKey(chains, l.p.cfg.Route.RendezvousKeys)))
	recordChains(l.p.recent, pods[best].Name, chains, now)
	return best
}

// promptChains returns the routing keys of each of the request's prompts
// (a batch's, or its one prompt) as central-precise keys them, and each
// prompt's tokens. A prompt whose tokens are unknown has no keys and 0
// tokens.
func promptChains(p *Precise, req Request) ([][]blockkey.Key, []int) {
	if req.Batch == nil {
		return [][]blockkey.Key{p.Keys(req)}, []int{len(req.Tokens)}
	}
	tokens := make([]int, len(req.Batch))
	for i, ids := range req.Batch {
		tokens[i] = len(ids)
	}
	return p.batchKeys(req), tokens
}

// recordChains records each chain as a recent forward to pod (r may be
// nil), then expires r's old entries.
func recordChains(r *route.Recent, pod string, chains [][]blockkey.Key, now time.Time) {
	if r == nil {
		return
	}
	for _, c := range chains {
		r.Record(pod, c, now)
	}
	r.Expire(now)
}

// tieKey is the request's rendezvous key, as route's Config.RendezvousKeys
// picks it: the key at index n-1 of the first prompt with keys, or the
// last of a shorter chain; 0 without keys. Requests sharing their first n
// keys rank pods alike.
func tieKey(chains [][]blockkey.Key, n int) blockkey.Key {
	for _, c := range chains {
		if len(c) > 0 {
			return c[min(max(n, 1), len(c))-1]
		}
	}
	return 0
}

// ranks returns each pod's rendezvous weight for key under seed: hashing
// the pod and the key together, as rendezvous hashing must.
func ranks(seed uint64, pods []Pod, key blockkey.Key) []uint64 {
	out := make([]uint64, len(pods))
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], seed)
	binary.LittleEndian.PutUint64(buf[8:], uint64(key))
	for i, p := range pods {
		var d xxhash.Digest
		d.Reset()
		d.Write(buf[:])
		d.WriteString(p.Name)
		out[i] = d.Sum64()
	}
	return out
}

// prefixNone holds nothing: a pod with no index.
type prefixNone struct{}

func (prefixNone) PrefixLen([]blockkey.Key) int { return 0 }
