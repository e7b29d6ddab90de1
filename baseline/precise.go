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
// tokens).
func (p *Precise) Keys(req Request) []blockkey.Key {
	if len(req.Tokens) == 0 {
		return nil
	}
	return p.cfg.Scheme.Request(blockkey.ModelRoot(p.cfg.Model, req.Model), req.Tokens)
}

// Decide returns the route.Decision for the request, without recording it.
func (p *Precise) Decide(req Request, pods []Pod, now time.Time) (route.Decision, []blockkey.Key) {
	keys := p.Keys(req)
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
		}
		views[i] = v
	}
	req2 := route.Request{Model: req.Model, Keys: keys, TokensPerKey: p.cfg.Scheme.TokensPerKey(), PromptTokens: len(req.Tokens)}
	return p.chain.Choose(req2, views, now), keys
}

// Pick implements Policy. Without a decision (no pods eligible) it falls
// back to the first pod.
func (p *Precise) Pick(req Request, pods []Pod, now time.Time) int {
	d, keys := p.Decide(req, pods, now)
	for i, pod := range pods {
		if pod.Name == d.Target {
			if p.recent != nil && len(keys) > 0 {
				p.recent.Record(pod.Name, keys, now)
				p.recent.Expire(now)
			}
			return i
		}
	}
	return 0
}
