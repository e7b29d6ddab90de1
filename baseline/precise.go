package baseline

import (
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// PreciseConfig configures the central-precise policy.
type PreciseConfig struct {
	// Model is the base model name block keys are seeded with; a request
	// naming another model is keyed as a LoRA adapter of it, as the sidecar
	// does.
	Model string
	// Scheme must equal the sidecars' (block size 16, stride 1 by default).
	Scheme blockkey.Scheme
	// Route is the scoring configuration: route.DefaultConfig(), the same
	// as the sidecars.
	Route route.Config
	// Recent enables speculative entries (what this router just sent
	// where), as the sidecars and llm-d's speculativeIndexing do. nil
	// disables them.
	Recent *route.RecentConfig
	// ExactLoad takes each pod's load from this router's own count of
	// requests in flight there, which is exact because every request
	// passes the router, and ignores the scraped running and waiting
	// figures, as the sidecars treat their pushed counts (route.Load.Fronted).
	// KV usage still comes from the scrape. Off, load is the scrape plus
	// the in-flight count, as llm-d's EPP scrapes metrics.
	ExactLoad bool
}

// DefaultPreciseConfig returns the sidecars' scoring for model.
func DefaultPreciseConfig(model string) PreciseConfig {
	rc := route.DefaultRecentConfig()
	return PreciseConfig{Model: model, Scheme: blockkey.DefaultScheme(), Route: route.DefaultConfig(), Recent: &rc}
}

// Precise is the llm-d EPP architecture with kvroute's scoring: one central
// router with an exact index per pod, fed by every pod's KV events, scoring
// with route.DefaultChain. Against kvroute it has zero digest staleness and
// no Bloom false positives; it pays a central tokenize and N event streams.
type Precise struct {
	cfg     PreciseConfig
	chain   route.Chain
	recent  *route.Recent
	indexes []route.Matcher
}

// GPUOnly shows a pod's index to route as a plain route.Matcher, its GPU
// prefix alone: it hides TierPrefix, so route credits no CPU or disk copy
// however cheap its load (central-precise-gpu-only).
type GPUOnly struct{ M route.Matcher }

// PrefixLen implements route.Matcher.
func (g GPUOnly) PrefixLen(keys []blockkey.Key) int { return g.M.PrefixLen(keys) }

// NewPrecise returns the policy over one matcher per pod, in Pick's pod
// order (a *kvindex.Index each, which the event loop keeps applying to: it
// is safe for concurrent reads).
func NewPrecise(cfg PreciseConfig, indexes []route.Matcher) *Precise {
	if cfg.Scheme.BlockSize <= 0 {
		cfg.Scheme = blockkey.DefaultScheme()
	}
	p := &Precise{cfg: cfg, indexes: indexes}
	if cfg.Recent != nil {
		p.recent = route.NewRecent(*cfg.Recent)
	}
	p.chain = route.DefaultChain(cfg.Route, p.recent)
	return p
}

// Keys returns the routing keys of the request's tokens (nil without
// tokens): with its images' identifiers and its cache salt in the blocks
// vLLM puts them in, as the index keys the blocks it stores.
func (p *Precise) Keys(req Request) []blockkey.Key {
	if len(req.Tokens) == 0 {
		return nil
	}
	return p.cfg.Scheme.RequestMM(blockkey.ModelRoot(p.cfg.Model, req.Model), req.Tokens, req.MM, req.Salt)
}

// batchKeys returns the routing keys of each prompt of a batch (nil for a
// prompt whose tokens are unknown).
func (p *Precise) batchKeys(req Request) [][]blockkey.Key {
	out := make([][]blockkey.Key, len(req.Batch))
	for i, ids := range req.Batch {
		out[i] = p.Keys(Request{Model: req.Model, Tokens: ids, Salt: req.Salt})
	}
	return out
}

// batchMatcher matches a batch of completions against one pod's index:
// the pod saves the prefill of each prompt's cached prefix, so its match
// is the sum over the prompts (llm-d's precise producer sums its per-pod
// scores over a batch's prompts the same way, produceFromBlockKeys). It
// ignores the keys it is asked about: they stand for the prompts' keys end
// to end (flat), which route.Affinity counts and cuts at the batch's
// length. This router's recent forwards to the pod count per prompt here,
// since flat's keys match none.
type batchMatcher struct {
	m       route.Matcher
	prompts [][]blockkey.Key
	recent  *route.Recent
	pod     string
	now     time.Time
}

func (b batchMatcher) PrefixLen([]blockkey.Key) int {
	n := 0
	for _, keys := range b.prompts {
		m := b.m.PrefixLen(keys)
		if b.recent != nil {
			m = max(m, b.recent.PrefixLen(b.pod, keys, b.now))
		}
		n += m
	}
	return n
}

// batchTag marks flat's keys: a chain of keys end to end is no prompt's,
// and Recent's and the claims' prefix searches, which assume a chain,
// could count a later prompt's recorded keys after an earlier prompt's
// miss; tagged, they match nothing and batchMatcher alone counts.
const batchTag = 0x9e3779b97f4a7c15

// flat is the prompts' keys end to end, tagged.
func flat(prompts [][]blockkey.Key) []blockkey.Key {
	var out []blockkey.Key
	for _, keys := range prompts {
		for _, k := range keys {
			out = append(out, k^batchTag)
		}
	}
	return out
}

// Decide returns the route.Decision for the request, without recording it.
// A batch is scored as one request whose match at a pod is the sum of its
// prompts' matches there.
func (p *Precise) Decide(req Request, pods []Pod, now time.Time) (route.Decision, []blockkey.Key) {
	d, keys, _ := p.decide(req, pods, now)
	return d, keys
}

func (p *Precise) decide(req Request, pods []Pod, now time.Time) (route.Decision, []blockkey.Key, [][]blockkey.Key) {
	keys := p.Keys(req)
	tokens := len(req.Tokens)
	var prompts [][]blockkey.Key
	if req.Batch != nil {
		prompts = p.batchKeys(req)
		keys = flat(prompts)
		tokens = 0
		for _, ids := range req.Batch {
			tokens += len(ids)
		}
	}
	views := make([]route.PeerView, len(pods))
	for i, pod := range pods {
		v := route.PeerView{
			ID:        pod.Name,
			Addr:      pod.Name,
			KeyScheme: blockkey.Version,
			Load: route.Load{
				Running:  int(pod.Load.Running),
				Waiting:  int(pod.Load.Waiting),
				KVUsage:  pod.Load.KVUsage,
				InFlight: pod.InFlight,
			},
			LoadAt:   pod.LoadAt,
			DigestAt: now, // the index is live: never stale
		}
		if p.cfg.ExactLoad {
			v.Load = route.Load{Serving: pod.InFlight, Fronted: true, KVUsage: pod.Load.KVUsage}
			v.LoadAt = now // the count is current
		}
		if i < len(p.indexes) {
			v.Digest = p.indexes[i]
			if prompts != nil {
				v.Digest = batchMatcher{m: p.indexes[i], prompts: prompts, recent: p.recent, pod: pod.Name, now: now}
			}
		}
		views[i] = v
	}
	req2 := route.Request{Model: req.Model, Keys: keys, TokensPerKey: p.cfg.Scheme.TokensPerKey(), PromptTokens: tokens}
	return p.chain.Choose(req2, views, now), keys, prompts
}

// Pick implements Policy. Without a decision (no pods eligible) it falls
// back to the first pod.
func (p *Precise) Pick(req Request, pods []Pod, now time.Time) int {
	d, keys, prompts := p.decide(req, pods, now)
	for i, pod := range pods {
		if pod.Name == d.Target {
			if p.recent != nil && len(keys) > 0 {
				if prompts == nil {
					prompts = [][]blockkey.Key{keys}
				}
				for _, k := range prompts {
					if len(k) > 0 {
						p.recent.Record(pod.Name, k, now)
					}
				}
				p.recent.Expire(now)
			}
			return i
		}
	}
	return 0
}
