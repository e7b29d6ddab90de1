package route

import (
	"github.com/kvroute/kvroute/blockkey"
)

// TierMatcher is a Matcher that also knows where a pod holds each key: on
// which data-parallel rank, and on the GPU or a lower tier (bloom's
// tier.go). *bloom.Digest and *kvindex.Index satisfy it. A peer's Digest
// that is only a Matcher is read as one rank with a GPU alone.
type TierMatcher interface {
	Matcher
	// Ranks is how many data-parallel ranks the pod runs (at least 1).
	Ranks() int
	// TierPrefix returns how many leading keys rank holds on its GPU, and
	// how many of the keys after them on the CPU and on disk.
	TierPrefix(keys []blockkey.Key, rank int) (gpu, cpu, disk int)
}

// NoRank is Candidate.Rank when no rank of the peer holds more of the
// prompt than another (or it runs one), or the match is known only from
// this sidecar's own forwards (Recent, claims): the engine chooses.
const NoRank = -1

// placed is where among a peer's data-parallel ranks a match is held:
// rank (NoRank: none holds more than another) of ranks looked at, and
// whether ranks is the count the peer advertises (PeerView.Ranks), the
// only one a request may be pinned within.
type placed struct {
	rank, ranks int
	exact       bool
}

// pinned reports whether the request goes to rank p.rank: a rank of a pod
// that advertises more than one, and holds more of the prompt than the
// others.
func (p placed) pinned() bool {
	return p.exact && p.ranks > 1 && p.rank >= 0 && p.rank < p.ranks
}

// match is what one peer holds of a request, in routing keys: on the GPU
// and, beyond it, on the lower tiers, and on which rank.
type match struct {
	gpu, cpu, disk int
	placed
}

func (m match) keys() int { return m.gpu + m.cpu + m.disk }

func (m match) add(x match) match {
	m.gpu, m.cpu, m.disk = m.gpu+x.gpu, m.cpu+x.cpu, m.disk+x.disk
	return m
}

// rankCount is how many ranks of pv's digest tm to look at, and whether
// that is exact: the count pv advertises, else the digest's rank markers,
// which a Bloom false positive can extend (good enough to find a match,
// never to pin one: vLLM answers 400 to a rank it does not run).
func rankCount(pv *PeerView, tm TierMatcher) (int, bool) {
	if pv.Ranks > 0 {
		return pv.Ranks, true
	}
	return max(tm.Ranks(), 1), false
}

// digestMatch sets per[i] to what pv's digest holds of prompts[i] (the
// request's keys, then a batch's further prompts, served by one engine
// request each on the same rank), on the rank where their sum saves the
// most work (Config.saved), and where that is. Ranks that hold them
// alike, or not at all, are the engine's to balance (vLLM's own rule
// picks the least loaded): the rank is then NoRank, and the columns are
// the first best rank's. So is a match shorter than MinMatchKeys: it may
// be a Bloom false positive, which must not pull a request off the rank
// vLLM would balance it to any more than onto a pod. A pod with one rank and
// no lower-tier entries costs one PrefixLen per prompt, as before tiers.
// cur is scratch of per's length.
func digestMatch(cfg *Config, pv *PeerView, prompts [][]blockkey.Key, tpk int, per, cur []match) (at placed) {
	tm, ok := pv.Digest.(TierMatcher)
	if !ok {
		for i, ks := range prompts {
			per[i].gpu = pv.Digest.PrefixLen(ks)
		}
		return placed{rank: NoRank, ranks: 1}
	}
	at.ranks, at.exact = rankCount(pv, tm)
	var bestSaved float64
	bestKeys, tie := 0, false
	for r := range at.ranks {
		var sum match
		for i, ks := range prompts {
			g, c, dk := tm.TierPrefix(ks, r)
			cur[i] = match{gpu: g, cpu: c, disk: dk}
			sum = sum.add(cur[i])
		}
		s := cfg.saved(sum.gpu*tpk, sum.cpu*tpk, sum.disk*tpk)
		switch {
		case r == 0 || s > bestSaved:
			copy(per, cur)
			at.rank, bestSaved, bestKeys, tie = r, s, sum.keys(), false
		case s == bestSaved:
			tie = true
		}
	}
	if tie || at.ranks == 1 || bestSaved == 0 || bestKeys < max(cfg.MinMatchKeys, 1) {
		at.rank = NoRank
	}
	return at
}

// extend raises m's GPU prefix to n keys known from elsewhere (Recent,
// claims: a forward just sent there computes or loads them onto a GPU);
// the lower-tier keys they now cover count as GPU keys.
func (m match) extend(n int) match {
	if n <= m.gpu {
		return m
	}
	over := n - m.gpu
	m.gpu = n
	take := min(over, m.cpu)
	m.cpu -= take
	m.disk = max(m.disk-(over-take), 0)
	return m
}

// tierCost is the cost of serving one token of a lower tier's match, in
// tokens computed: its load time (CPULoadTokensPerSecond or
// DiskLoadTokensPerSecond) over its recompute time (PrefillTokensPerSecond,
// DefaultConfig's when unset, since only the ratio matters here). A tier
// whose load rate is 0 costs as much as recomputing: it is not credited.
func (cfg *Config) tierCost(loadTokensPerSecond float64) float64 {
	if loadTokensPerSecond <= 0 {
		return 1
	}
	prefill := cfg.PrefillTokensPerSecond
	if prefill <= 0 {
		prefill = DefaultConfig().PrefillTokensPerSecond
	}
	return prefill / loadTokensPerSecond
}

// saved is the prefill work, in tokens computed, that a match of gpu, cpu
// and disk tokens spares a request: a GPU token all of its cost, a
// lower-tier token its cost less its load (tierCost). It is the one rule
// by which a match is credited: Affinity scores by it and estimate prices
// the expected TTFT with it. A load slower than computing gives a negative
// credit: the engine loads what it holds all the same.
func (cfg *Config) saved(gpu, cpu, disk int) float64 {
	if cpu == 0 && disk == 0 {
		return float64(gpu) // most matches: no tier's cost to weigh (inlined)
	}
	return cfg.savedTiers(gpu, cpu, disk)
}

// savedTiers is saved for a match with lower-tier tokens.
func (cfg *Config) savedTiers(gpu, cpu, disk int) float64 {
	return float64(gpu) + float64(cpu)*(1-cfg.tierCost(cfg.CPULoadTokensPerSecond)) +
		float64(disk)*(1-cfg.tierCost(cfg.DiskLoadTokensPerSecond))
}

// Work is the prefill work, in tokens computed, of a request of prompt
// tokens at candidate c: what c's match does not save (saved: a lower
// tier's tokens cost their load, a GPU's nothing). It is what the request
// adds to c's queue (route.Load.QueuedPrefillTokens) and its own share of
// c's expected TTFT.
func (cfg *Config) Work(c *Candidate, prompt int) float64 {
	return cfg.work(prompt, c.GPUTokens, c.CPUTokens, c.DiskTokens)
}

// work is Work for a match of gpu, cpu and disk tokens.
func (cfg *Config) work(prompt, gpu, cpu, disk int) float64 {
	return max(float64(prompt)-cfg.saved(gpu, cpu, disk), 0)
}

// setMatch sets r's match from m, in tokens of tpk per key, capped at
// the prompt's tokens (prompt > 0); the cap takes the tail of the chain,
// where the lower tiers are.
func (r *row) setMatch(m *match, tpk, prompt int) {
	// By pointer: a match passed by value was spilled and reloaded in
	// wider words than stored, a stall per peer (16 ns of 1000-peer
	// choices' ~150 µs).
	r.keys = m.gpu + m.cpu + m.disk
	gpu, cpu, disk := m.gpu*tpk, m.cpu*tpk, m.disk*tpk
	if prompt > 0 {
		over := max(gpu+cpu+disk-prompt, 0)
		d := min(over, disk)
		disk, over = disk-d, over-d
		d = min(over, cpu)
		cpu, over = cpu-d, over-d
		gpu -= over
	}
	r.gpu, r.cpu, r.disk = gpu, cpu, disk
	r.rank, r.ranks = m.rank, m.ranks
	if m.pinned() {
		r.flags |= rowPinned
	}
}

// setGPU is setMatch for groupMatch's match of n keys: on a GPU, one
// rank, none pinned; its cap at the prompt is the GPU's alone.
func (r *row) setGPU(n, tpk, prompt int) {
	r.keys, r.gpu, r.cpu, r.disk, r.rank, r.ranks = n, gpuTokens(n, tpk, prompt), 0, 0, NoRank, 1
}

// gpuTokens is the tokens n keys of tpk tokens hold on a GPU, capped at
// the prompt's tokens (prompt > 0).
func gpuTokens(n, tpk, prompt int) int {
	if prompt > 0 {
		return min(n*tpk, prompt)
	}
	return n * tpk
}

// RankOf returns the data-parallel rank the decision pins the request to
// at candidate id (the local candidate for id ""), and false when the
// engine there chooses: a pod that advertises one rank or none
// (PeerView.Ranks), or no rank holds more of the prompt. The caller sets
// it as vLLM's X-data-parallel-rank.
func (d Decision) RankOf(id string) (int, bool) {
	if c := d.candidate(id); c != nil {
		return c.Rank, c.Pinned
	}
	return 0, false
}
