package route

import (
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// Matcher reports how many leading keys of a chain a peer holds.
// *bloom.Digest and *kvindex.Index satisfy it. PrefixLen must stop at the
// first miss and must be safe for concurrent reads if the caller shares it.
type Matcher interface {
	PrefixLen(keys []blockkey.Key) int
}

// Load is a peer's reported work, plus what this sidecar knows it sent.
type Load struct {
	Running int `json:"running"` // requests vLLM is running (vllm:num_requests_running)
	Waiting int `json:"waiting"` // requests vLLM has queued (vllm:num_requests_waiting)
	// KVUsage is the fraction of KV-cache blocks in use, 0..1
	// (vllm:kv_cache_usage_perc). Values outside 0..1 are clamped.
	KVUsage float64 `json:"kv_usage"`
	// Serving is the number of requests the peer's own sidecar has at its
	// vLLM, as last reported; the sidecar pushes it on every change.
	Serving int `json:"serving"`
	// Fronted means every request the peer serves passes its sidecar, so
	// Serving is its exact count and the scraped Running and Waiting, up
	// to a scrape interval old, are ignored: a request that finished since
	// the scrape made the pod look busy, which alone cost the no-reuse
	// workload a third of its TTFT p90 against least-load. Otherwise load
	// counts the larger of the two.
	Fronted bool `json:"fronted"`
	// InFlight is the number of requests this sidecar sent to the peer that
	// the peer's report does not count yet (sent after LoadAt; all of them
	// when the report is stale). It is the only load signal that is never
	// stale.
	InFlight int `json:"in_flight"`
	// QueuedPrefillTokens is the prompt tokens the peer's engine must
	// still compute before the requests it has now get their first token:
	// each request's uncached tokens, as its front predicted them, until
	// its first answer byte. The peer's sidecar pushes it with Serving; 0
	// from a peer that does not (a baseline's pod, an older sidecar).
	QueuedPrefillTokens int `json:"queued_prefill_tokens"`
	// InFlightPrefillTokens is QueuedPrefillTokens' InFlight: the uncached
	// tokens of the requests this sidecar sent to the peer that its report
	// does not count yet, and whose first byte has not come back.
	InFlightPrefillTokens int `json:"in_flight_prefill_tokens"`
	// Prefilling is how many of the requests QueuedPrefillTokens counts
	// there are: the requests at the peer still waiting for their first
	// token. InFlightPrefilling is its InFlight, the ones of
	// InFlightPrefillTokens. 0 from a peer that does not push it.
	Prefilling         int `json:"prefilling"`
	InFlightPrefilling int `json:"in_flight_prefilling"`
	// PrefillShare is the share of the recent past in which the peer's
	// engine had prompt tokens queued for prefill (an average over
	// ShareWindow, ShareAt), as of the report: 1 means every engine step
	// carried a prefill chunk, so the requests it was decoding got a token
	// a step at prefill speed. The peer's sidecar pushes it with
	// QueuedPrefillTokens; 0 from one that does not.
	PrefillShare float64 `json:"prefill_share"`
}

// Engine is a pod's vLLM as its sidecar sees it (docs/design.md D10). The zero
// value is EngineServing, so a peer that advertises nothing (a baseline's
// pod, a sidecar of an earlier version) is taken as serving.
type Engine uint8

const (
	EngineServing  Engine = iota // healthy; its digest is current
	EngineStarting               // not yet seen healthy since the sidecar started
	EngineDown                   // dead or hung; its cache is gone or unknown
)

func (e Engine) String() string {
	switch e {
	case EngineServing:
		return "serving"
	case EngineStarting:
		return "starting"
	case EngineDown:
		return "down"
	}
	return "unknown"
}

// MarshalText makes an Engine read as its name in JSON (/debug/peers).
func (e Engine) MarshalText() ([]byte, error) { return []byte(e.String()), nil }

// PeerView is one peer as the caller's peer table sees it at the moment of
// the choice. Policies read it and never keep it.
type PeerView struct {
	// The fields a choice reads for every peer come first, in the order
	// it reads them: at a thousand peers a choice is bound by the cache
	// lines it touches (route.ListPeers), and these span four of a
	// PeerView's five.
	ID    string
	Local bool // the pod this sidecar runs in
	// Draining: the peer's sidecar is leaving; it takes no new request.
	Draining bool
	// Engine is the peer's vLLM as its sidecar last advertised it; a peer
	// whose engine is not serving is never chosen.
	Engine Engine
	// ModelsTruncated says Models is incomplete: the peer serves more than
	// its node meta could list. See the package doc (Eligibility).
	ModelsTruncated bool
	KeyScheme       int // the peer's blockkey.Version; others get no matches
	// Ranks is how many data-parallel ranks the peer's engine runs, as its
	// sidecar advertises it (the node meta): exact, where the digest's rank
	// markers (TierMatcher.Ranks) can be extended by a Bloom false
	// positive, and vLLM refuses a request pinned to a rank it does not
	// run. A request is pinned to a rank only within this count; 0 (a
	// sidecar that does not advertise it) pins none.
	Ranks       int
	Load        Load
	LoadAt      time.Time // when Load's reported fields were measured
	LastFailure time.Time // last forward to the peer that failed; zero if none
	Digest      Matcher   // nil until the first digest arrives
	// DigestAt is when Digest was last received or confirmed (a full filter
	// or a delta). Config.DigestTTL ignores digests older than that.
	DigestAt time.Time
	// Claims are prefixes sidecars just sent to the peer (Claim). The
	// slice is shared with the peer table: read it, never modify it.
	Claims []Claim
	Models []string // models served; empty means every model
	// Since is when the peer's current cache began, as the caller's table
	// saw it: its engine came back or its digest epoch changed. Recent
	// entries from before are about a cache that is gone and never match.
	// Zero: no such change seen.
	Since time.Time
	Addr  string
	// EngineAddr is where the peer's vLLM itself can be reached, as its
	// sidecar advertises it; empty: not said. Never a routing target: the
	// front asks it only about a stored response while the peer's sidecar
	// is away.
	EngineAddr string
	// StoreGone: the peer's sidecar said, leaving, that its vLLM no longer
	// listens, so the stored responses in its memory are gone. Never read
	// by a choice: the front answers their follow-ups' final 404 by it
	// while the peer's leaving is still on its way.
	StoreGone bool
}

// Request is what a policy needs to know about one request.
type Request struct {
	Model string
	// Keys are the prompt's routing keys (blockkey.Scheme.Request): a chain,
	// so Keys[i] stands for every token up to the end of routing block i.
	Keys []blockkey.Key
	// TokensPerKey is how many prompt tokens one routing key covers
	// (blockkey.Scheme.TokensPerKey); values below 1 mean DefaultTokensPerKey.
	TokensPerKey int
	// PromptTokens, when above 0, caps MatchedTokens (a match can never save
	// more than the prompt). For a batch it is every prompt's tokens.
	PromptTokens int
	// Batch holds the routing keys of a batch request's further prompts
	// (Keys is the first's). A batch is served whole by one pod, one engine
	// request per prompt, so a peer's match is the sum of its matches of
	// every prompt (llm-d's precise scorer sums them too).
	Batch [][]blockkey.Key
	// Explain lists every peer in the Decision's Candidates however many
	// there are (/debug/route). Otherwise a choice among more than
	// ListPeers peers lists only those its caller uses (Decision.Omitted).
	Explain bool
	// Rest, when set, is what a choice made on a Shortlist's peers knows
	// of the peers it was not handed: they count in the eligible peers'
	// mean load and queue (so in the bound and in Decision.Eligible and
	// Omitted) as if they had been.
	Rest *Rest
	// Prefixes, when set, is the Group's answer for Keys that a Shortlist
	// computed: Affinity reads it rather than ask the Group again.
	Prefixes *Prefixes
}

// DefaultTokensPerKey is vLLM's default block size, used when a Request
// does not say.
const DefaultTokensPerKey = 16

// Reasons a Decision names. They are stable strings: metrics label by them.
const (
	ReasonAffinity   = "affinity"
	ReasonRendezvous = "rendezvous"
	ReasonLeastLoad  = "least-load"
	ReasonNone       = "none" // no target: the caller serves locally (D6)
)

// Candidate explains how one peer fared in a Decision. Candidates appear
// in the order of the peers passed to Choose (Index).
type Candidate struct {
	ID string `json:"id"`
	// Index is the peer's place in the peers the Decision was made on.
	Index    int  `json:"-"`
	Local    bool `json:"local"`
	Eligible bool `json:"eligible"`
	// Excluded says why the peer is not eligible: "draining",
	// "failed 3s ago", "model". Empty when Eligible.
	Excluded string `json:"excluded,omitempty"`
	// MatchedKeys is the longest cached prefix, in routing keys, from the
	// peer's digest or this sidecar's Recent entries, whichever is longer.
	// Only Affinity computes it; 0 for a peer with another key scheme.
	MatchedKeys   int `json:"matched_keys"`
	MatchedTokens int `json:"matched_tokens"`
	// GPUTokens, CPUTokens and DiskTokens split MatchedTokens by where the
	// peer holds them: the GPU prefix, then beyond it a lower tier, which
	// vLLM loads rather than computes and counts cached. Score credits a
	// lower tier's tokens at their cost (Config.CPULoadTokensPerSecond).
	GPUTokens  int `json:"gpu_tokens"`
	CPUTokens  int `json:"cpu_tokens"`
	DiskTokens int `json:"disk_tokens"`
	// Rank is the data-parallel rank whose match the columns show, or
	// NoRank: no rank holds more than another. Ranks is how many ranks
	// were looked at (0 or 1: no data parallelism). Pinned says the
	// request is pinned to Rank there (X-data-parallel-rank, RankOf): only
	// within the count the peer advertises (PeerView.Ranks).
	Rank   int  `json:"rank"`
	Ranks  int  `json:"ranks,omitempty"`
	Pinned bool `json:"pinned,omitempty"`
	// Load is the peer's load as one number, in requests (see doc.go).
	Load float64 `json:"load"`
	// Queued is the prefill work ahead of this request at the peer, in
	// tokens: its reported QueuedPrefillTokens (while fresh) plus
	// InFlightPrefillTokens.
	Queued int `json:"queued_tokens"`
	// Ahead is how many requests Queued is: those at the peer still
	// waiting for their first token (Load.Prefilling while fresh, plus
	// InFlightPrefilling). Affinity weighs saved tokens by their mean
	// over the peers (Config.QueuedWeight).
	Ahead int `json:"ahead"`
	// TTFT is the expected time to this request's first token at the
	// peer, in seconds (Config.PrefillTokensPerSecond): its wait and its
	// uncached tokens at the engine's prefill rate. 0 when unknown.
	TTFT float64 `json:"ttft_s"`
	// Over is set when Load+1 exceeds the Decision's Bound, or, while an
	// eligible peer is idle and this one has requests waiting, the tighter
	// bound the Decision's note names (Config.IdleSlack): affinity and
	// rendezvous pass the peer over unless every eligible peer is over.
	Over bool `json:"over"`
	// Scored is set when the policy that decided ranked this peer; Score is
	// meaningful only then. Higher is better in every policy.
	Scored bool    `json:"scored"`
	Score  float64 `json:"score"`
	Chosen bool    `json:"chosen"`
	// Note lists facts that shaped the numbers: "stale load", "no digest",
	// "scheme 2", "recent".
	Note string `json:"note,omitempty"`
}

// Decision is a policy's choice and its explanation.
type Decision struct {
	Target string `json:"target"` // peer ID; "" when no peer was chosen
	Local  bool   `json:"local"`  // Target is the local peer
	Reason string `json:"reason"` // one of the Reason constants
	// Bound is the load bound: a peer with Load+1 > Bound is over it.
	Bound float64 `json:"bound"`
	// Mean is the eligible peers' mean load counting this request.
	Mean     float64 `json:"mean"`
	Eligible int     `json:"eligible"`       // eligible peers
	Note     string  `json:"note,omitempty"` // why earlier policies of a Chain declined
	// Candidates are the peers, in the order they were passed; among more
	// than ListPeers peers, only those the caller uses (list), unless the
	// Request said Explain. Omitted counts the peers left out.
	Candidates []Candidate `json:"candidates"`
	Omitted    int         `json:"omitted,omitempty"`
	// Attempts is the failover order, filled by the caller with Attempts
	// (the policies leave it empty): candidate IDs, first to last.
	Attempts []string `json:"attempts,omitempty"`
}

// Policy chooses the peer that serves a request. Implementations are pure:
// the same arguments give the same Decision, whatever the order of peers.
type Policy interface {
	Choose(req Request, peers []PeerView, now time.Time) Decision
}
