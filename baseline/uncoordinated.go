package baseline

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// UncoordinatedConfig is one uncoordinated front's rule: SGLang's
// cache-aware policy with the current gateway's defaults
// (docs/reference/anchors.md §1), except that a cold prefix goes to the
// front's own pod.
type UncoordinatedConfig struct {
	// MinMatchFraction is SGLang's cache_threshold: a front acts on its
	// longest predicted match only when it covers more than this share of
	// the prompt; otherwise the prefix counts as cold and the front's own
	// pod serves it. Default 0.3. 0 acts on any match.
	MinMatchFraction float64
	// BalanceAbs and BalanceRel are SGLang's balance thresholds: when the
	// front's own in-flight counts satisfy max−min > BalanceAbs and
	// max > BalanceRel×min, it sends to its least loaded pod whatever the
	// match. Defaults 64 and 1.5. Each front counts only what it sent,
	// about 1/N of the true load, so the gate rarely opens (SMG PR #2150,
	// the independent-gateways measurement); that is the setup being
	// measured.
	BalanceAbs int
	BalanceRel float64
	// MemoryKeys bounds a front's memory of what it sent to each peer, in
	// routing keys, least recent first out. 0 sizes it as the front's own
	// pod's cache (its scraped num_gpu_blocks, over the scheme's stride:
	// a front knows its own engine and takes its peers to be alike), and
	// until that is known as ApproxConfig's CapacityBlocks default, GIE's.
	MemoryKeys int
	// ColdLeastLoaded sends a cold prefix to the front's least loaded pod
	// by its own counts, ties at random (seeded), as SGLang's gateways do,
	// instead of to its own pod; ties elsewhere are random too, and its own
	// pod has no precedence. On by default. With it off a front forwards
	// to a peer only when its balance gate opens, which with 1/N of the
	// load it hardly does: its memory of its peers stays empty and the
	// policy routes as the Service does (a random pod), save the stored
	// responses. On, fronts spread cold prefixes and then follow what they
	// sent where, the setup SGLang's 0.66 figure measured. Random, not
	// rendezvous, ties: hashing the prefix would make every front name the
	// same pod for it, coordination through the hash (kvroute's D4).
	ColdLeastLoaded bool
}

// DefaultUncoordinatedConfig returns the defaults documented on
// UncoordinatedConfig.
func DefaultUncoordinatedConfig() UncoordinatedConfig {
	return UncoordinatedConfig{MinMatchFraction: 0.3, BalanceAbs: 64, BalanceRel: 1.5, ColdLeastLoaded: true}
}

// Uncoordinated is the independent-gateways setup SGLang's gateway
// measured (SMG PR #2394: 0.66 hit rate at 8 gateways against 0.95 with a
// shared index): every pod has its own front, a request reaches a front at
// random (as through a Service), and fronts share nothing. A front knows
// its own pod's cache exactly (that pod's KV events, plus its own recent
// forwards there until the events show them, as a sidecar does) and its
// peers' only by its own past forwards (the keys it sent each, in a
// bounded LRU); its load is its own in-flight counts. It sends a request
// to the pod of the longest predicted match (frontChoice), a cold prefix
// to its least loaded pod by its own counts (ColdLeastLoaded; off: to its
// own pod, which makes it the Service with stored responses pinned).
//
// It runs as one policy in this process holding N independent front
// states, one picked at random (seeded) per request, so kvbench needs no
// new processes. The fronts share the proxy's mechanics only: its
// tokenizer, its event subscriptions (front i reads pod i's index alone)
// and its stored-response owners (a Responses follow-up still reaches the
// pod that created its response, so the comparison is of cache routing
// alone). The proxy's own in-flight counts (Pod.InFlight) are not used.
type Uncoordinated struct {
	cfg    UncoordinatedConfig
	p      *Precise // keys requests; p.indexes[i] is pod i's index, read by front i alone
	seed   uint64
	rng    *rand.Rand
	fronts []*front
}

// front is one pod's gateway: all it knows.
type front struct {
	own int
	// recent is its forwards to its own pod, until the events show them.
	recent *route.Recent
	// sent[i] is the keys it forwarded to pod i (nil for its own).
	sent     []*blockLRU
	inFlight []int
}

// NewUncoordinated returns the policy for the pods named, in Pick's pod
// order, over one matcher per pod (pod i's index, read only by front i).
// pc keys requests as for central-precise; pc.Recent sizes each front's
// recent forwards to its own pod (nil: none). seed picks the front of
// each request and breaks ties.
func NewUncoordinated(names []string, pc PreciseConfig, cfg UncoordinatedConfig, indexes []route.Matcher, seed uint64) *Uncoordinated {
	recent := pc.Recent
	pc.Recent = nil // the fronts keep their own; nothing is shared
	u := &Uncoordinated{cfg: cfg, p: NewPrecise(pc, indexes), seed: seed,
		rng: rand.New(rand.NewPCG(seed, seed^0x756e636f6f7264))}
	capacity := cfg.MemoryKeys
	if capacity <= 0 {
		capacity = DefaultApproxConfig().CapacityBlocks
	}
	for i := range names {
		f := &front{own: i, sent: make([]*blockLRU, len(names)), inFlight: make([]int, len(names))}
		if recent != nil {
			f.recent = route.NewRecent(*recent)
		}
		for j := range names {
			if j != i {
				f.sent[j] = newBlockLRU(capacity)
			}
		}
		u.fronts = append(u.fronts, f)
	}
	return u
}

// frontChoice is one front's rule, a pure function of what it knows: per
// pod, the prompt tokens it predicts cached there (saved) and its own
// requests in flight there; own is its own pod, rank breaks ties. With its
// counts imbalanced it sends to its least loaded pod. Otherwise it sends
// to the longest predicted match when that covers more than
// MinMatchFraction of the prompt; a prefix that does not is cold and goes
// to its own pod (or, with ColdLeastLoaded, its least loaded pod). Among
// equal matches or loads its own pod comes first (its view of it is
// exact, of the others a guess; not with ColdLeastLoaded), then the
// lighter pod, then rank.
func frontChoice(c UncoordinatedConfig, own int, saved []int, promptTokens int, inFlight []int, rank []uint64) int {
	// prefer says whether i goes before j when they tie on what is compared.
	prefer := func(i, j int) bool {
		if !c.ColdLeastLoaded && (i == own || j == own) {
			return i == own
		}
		if inFlight[i] != inFlight[j] {
			return inFlight[i] < inFlight[j]
		}
		return rank[i] > rank[j]
	}
	least := func() int {
		best := 0
		for i := 1; i < len(inFlight); i++ {
			if inFlight[i] < inFlight[best] || (inFlight[i] == inFlight[best] && prefer(i, best)) {
				best = i
			}
		}
		return best
	}
	lo, hi := inFlight[0], inFlight[0]
	for _, n := range inFlight {
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > c.BalanceAbs && float64(hi) > c.BalanceRel*float64(lo) {
		return least()
	}
	best := own
	for i := range saved {
		if saved[i] > saved[best] || (saved[i] == saved[best] && prefer(i, best)) {
			best = i
		}
	}
	if saved[best] == 0 || float64(saved[best]) <= c.MinMatchFraction*float64(promptTokens) {
		if c.ColdLeastLoaded {
			return least()
		}
		return own
	}
	return best
}

// Saved returns, for a request reaching front f, the prompt tokens f
// predicts cached at each pod, in pods' order: its own pod's by that
// pod's index and f's recent forwards there, a peer's by f's memory of
// what it sent there; a batch's summed over its prompts.
func (u *Uncoordinated) Saved(f int, req Request, pods []Pod, now time.Time) []int {
	chains, tokens := promptChains(u.p, req)
	return u.saved(u.fronts[f], chains, tokens, pods, now)
}

func (u *Uncoordinated) saved(fr *front, chains [][]blockkey.Key, tokens []int, pods []Pod, now time.Time) []int {
	tpk := u.p.cfg.Scheme.TokensPerKey()
	out := make([]int, len(pods))
	for j, chain := range chains {
		if len(chain) == 0 {
			continue
		}
		hashes := keyHashes(chain)
		for i := range pods {
			var n int
			switch {
			case i == fr.own:
				var m route.Matcher = prefixNone{}
				if i < len(u.p.indexes) {
					m = u.p.indexes[i]
				}
				n = batchMatcher{m: m, prompts: [][]blockkey.Key{chain}, recent: fr.recent, pod: pods[i].Name, now: now}.PrefixLen(nil)
			case i < len(fr.sent):
				n = fr.sent[i].prefixLen(hashes)
			}
			out[i] += min(n*tpk, tokens[j])
		}
	}
	return out
}

// Pick implements Policy: a front at random routes the request and
// remembers the forward. It does not count the request in flight at the
// front, since Pick has no end to uncount it; the proxy calls Track.
func (u *Uncoordinated) Pick(req Request, pods []Pod, now time.Time) int {
	_, pod := u.pick(req, pods, now)
	return pod
}

// Track is Pick counting the request in flight at its front until end is
// called (the proxy's tracker).
func (u *Uncoordinated) Track(req Request, pods []Pod, now time.Time) (int, func()) {
	fr, pod := u.pick(req, pods, now)
	fr.inFlight[pod]++
	return pod, func() { fr.inFlight[pod]-- }
}

// pick draws the front the request reaches and lets it route.
func (u *Uncoordinated) pick(req Request, pods []Pod, now time.Time) (*front, int) {
	fr := u.fronts[u.rng.IntN(len(u.fronts))]
	return fr, u.route(fr, req, pods, now)
}

// route is front fr's choice, recorded in its memory: the keys sent to a
// peer, or a recent forward to its own pod.
func (u *Uncoordinated) route(fr *front, req Request, pods []Pod, now time.Time) int {
	if len(pods) != len(u.fronts) {
		return min(fr.own, len(pods)-1) // not the pods it was built for: no view
	}
	if b := pods[fr.own].Load.NumGPUBlocks; b > 0 && u.cfg.MemoryKeys <= 0 {
		for _, l := range fr.sent {
			if l != nil {
				l.setCapacity(max(b/max(u.p.cfg.Scheme.Stride, 1), 1))
			}
		}
	}
	chains, tokens := promptChains(u.p, req)
	total := 0
	for _, n := range tokens {
		total += n
	}
	saved := u.saved(fr, chains, tokens, pods, now)
	var rank []uint64
	if u.cfg.ColdLeastLoaded {
		rank = make([]uint64, len(pods))
		for i := range rank {
			rank[i] = u.rng.Uint64()
		}
	} else {
		rank = ranks(u.seed, pods, tieKey(chains, u.p.cfg.Route.RendezvousKeys))
	}
	pod := frontChoice(u.cfg, fr.own, saved, total, fr.inFlight, rank)
	if pod == fr.own {
		recordChains(fr.recent, pods[pod].Name, chains, now)
		return pod
	}
	for _, chain := range chains {
		fr.sent[pod].add(keyHashes(chain))
	}
	return pod
}

// keyHashes is a chain as the uint64 hashes blockLRU holds.
func keyHashes(chain []blockkey.Key) []uint64 {
	out := make([]uint64, len(chain))
	for i, k := range chain {
		out[i] = uint64(k)
	}
	return out
}
