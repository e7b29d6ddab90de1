package route

import "time"

// Config holds the knobs every policy shares. Start from DefaultConfig; a
// zero field means what its comment says, never a panic.
type Config struct {
	// FailFor keeps a peer out of every choice for this long after a
	// forward to it failed (docs/reference/style.md P5: health from evidence). Default
	// 10s. Longer protects clients from a flapping pod; shorter brings a
	// recovered pod's cache back sooner. 0 ignores failures.
	FailFor time.Duration

	// SilentFor keeps a Fronted peer (one whose sidecar pushes its load,
	// at least every 500 ms) out of every choice once its last push is this
	// old, or while it has none (no LoadAt: a pod just met, or one that died
	// before it pushed to us): a pod that died whole, sidecar and engine,
	// or one cut off by a partition, goes silent at once, while memberlist's
	// failure detection takes 5-10 s to remove it. A push brings the peer
	// back. Default 1.5 s, three missed refreshes: a peer is out 1.0-1.5 s
	// after its last push, within the 2 s the mesh promises for every
	// fault. The price is the refresh, 2 packets a second to each peer
	// (about 60 bytes each): at 63 peers 126 sent and 126 received per node
	// a second, ~8 KB/s each way, and only while the load stands still (a
	// change is pushed anyway, and restarts the refresh). Lower needs a
	// faster refresh for the same three misses; a single lost or late push
	// must never exclude a live pod. 0 ignores silence.
	SilentFor time.Duration

	// LoadTTL is how long a peer's reported load is trusted. Older reports
	// count as unknown and only InFlight is used. Default 5s, a few gossip
	// rounds. 0 trusts every report.
	LoadTTL time.Duration

	// DigestTTL ignores a digest whose DigestAt is older than this: a peer
	// whose digest stopped arriving may hold claims its cache dropped long
	// ago. Default 0 (never), since it needs gossip to refresh DigestAt on
	// every full filter; set it to a few full-filter intervals.
	DigestTTL time.Duration

	// Slack and MinHeadroom set the load bound (CHWBL, as KubeAI does):
	// with m the eligible peers' mean load counting this request,
	// Bound = max(m*(1+Slack), m+MinHeadroom), and a peer with Load+1 >
	// Bound is over it. Slack caps max/mean load at 1+Slack under pressure;
	// default 2. KubeAI's 0.25 (docs/reference/anchors.md §5.8) sheds holders exactly when
	// the cluster saturates and hits matter most: on the doc-QA workload
	// (4 pods, 32k-token documents) kvroute's hit rate was 51% at 0.25, 64%
	// at 0.5 and 81% at 1, with max/mean requests per pod 1.17, 1.06, 1.13
	// (kvbench, one run each). MinHeadroom, in requests,
	// keeps a lightly loaded cluster from spilling a prefix away from its
	// holder for a few requests of imbalance; default 8. Larger values
	// favour cache hits, smaller ones balance. Since the choice weighs the
	// work queued at each pod (QueuedWeight), the bound only has to stop
	// hot spots, not balance: against Slack 1 and MinHeadroom 4, 2 and 8
	// gave a TTFT p90 as low or lower on every run of doc-QA (3 seeds),
	// agentic and shared-prefix, at the knee and past it (4 pods; doc-QA
	// seed 1 at the knee 0.194 s against 0.380, with 90.0% hits against
	// 86.0%), max/mean requests per pod 1.04-1.31 past the knee
	// (docs/bench/2026-12-03/load-bound.md).
	Slack       float64
	MinHeadroom float64
	// IdleSlack and IdleHeadroom tighten the bound while some eligible
	// peer is idle (no load, no request waiting): a peer with requests
	// waiting for their first token is then over at max(m*(1+IdleSlack),
	// m+IdleHeadroom). Both 0 (the default) turn it off; 0.5 and 2 are
	// what was measured. Why: the loose bound lets a third of the pods
	// carry every request, and when a few pods hold the prefixes every new
	// session starts from (agentic on 8 pods: three agent types' system
	// prompts), they do, queueing and evicting while others idle (TTFT p90
	// 0.56-1.31 s against lmetric's 0.20-0.38; with the rule 0.14-0.35).
	// An idle pod computes a spilled prefix at no one's expense, and where
	// every pod is busy the loose bound still decides. A peer whose match
	// reaches further by what was just sent there (forwards, claims) is
	// spared: what waits there is a burst of this request's prefix. It is
	// off because it still costs where one prefix's requests keep a holder
	// a little busy: on 8 pods at the knee, shared-prefix's TTFT p90 0.195
	// s against 0.141 and agent fan-out's 0.643 against 0.582, 2 points
	// of hits (docs/bench/2026-12-06/agentic-8pods.md).
	IdleSlack    float64
	IdleHeadroom float64

	// MinMatchKeys is the shortest match, in routing keys, that Affinity
	// acts on. Below it, Affinity declines and the Chain moves on. Default
	// 2: a single-key Bloom false positive (≈1%) must not pull traffic.
	// Values below 1 mean 1.
	MinMatchKeys int

	// MinMatchFraction is the smallest share of the prompt a match must
	// cover for Affinity to act on it. Default 0.25 (SGLang's cache-aware
	// router uses a 0.3 match rate, docs/reference/anchors.md §1): a short shared preamble in
	// front of long unrelated prompts is not worth a queue, so such requests
	// are balanced by Rendezvous instead. 0 acts on any match.
	MinMatchFraction float64
	// LoadTokens is the price of one unit of load (a request at the peer,
	// see Load) in prefill tokens, on top of the queued prefill work the
	// peer reports: every request the engine runs shares its steps (a
	// decode token each, and the step's fixed overhead, about 100 tokens'
	// worth on the simulator's H100 model), so a peer with one more request
	// must save LoadTokens more tokens to win. Default 64: near-equal
	// matches go to the lighter peer, while a long match wins over a few
	// requests of imbalance. 0 ranks Affinity by saved and queued tokens
	// alone (Rendezvous and LeastLoad then count a request as 1 token).
	LoadTokens float64
	// IdleLoadTokens, when above LoadTokens, is Affinity's price of a
	// request of load at a peer with two or more requests waiting for
	// their first token, while some eligible peer is idle (no load,
	// nothing waiting): a queued holder of a short shared prefix then
	// yields its new requests to the idle pod, which computes the prefix
	// once and holds it too, while a long prefix still wins. Why: the few
	// pods holding the prefixes every agent session starts from (a system
	// prompt and tools, 2,400 tokens) otherwise took every new session
	// while others idled, as the prefix outweighed 64 tokens a request
	// (agentic on 8 pods at the knee, seeds 1-3: TTFT p90 0.62-1.13 s; with
	// this, 0.22-0.40; lmetric 0.20-0.38). A burst of a long prefix (agent
	// fan-out's 6,000 tokens) stays at its holder. From one request
	// waiting, a report a few milliseconds old that still showed a quiet
	// holder's last request moved a short prefix's follow-up
	// (docs/bench/2026-12-06/agentic-8pods.md). Default 512; 0: LoadTokens
	// always.
	IdleLoadTokens float64
	// ProductCost makes Affinity score a peer by LMetric's cost (OSDI'26),
	// -max(work, 1) × (Load + 1), work the prompt's tokens the peer does
	// not hold (Work), in place of the sum above: a comparison with the
	// lmetric baseline on the mesh's own view, off by default.
	ProductCost bool

	// RendezvousKeys is how many leading routing keys Rendezvous hashes,
	// and what Affinity and LeastLoad break ties with. Because keys are
	// chained, this is the single key at index RendezvousKeys-1 (or the
	// last key of a shorter prompt). Default 4 (64 tokens at 16 per key):
	// requests that share a system prompt meet on one pod, while unrelated
	// conversations under one short shared preamble spread. Values below 1
	// mean 1.
	RendezvousKeys int

	// ColdHeadroom, in requests, is how far above the least-loaded eligible
	// peer Rendezvous may place a prefix nobody holds. Default 0: least
	// load, with rendezvous weights breaking ties, so every sidecar still
	// names the same pod for the first request of a new prefix, and the
	// rest of a burst follows it by the claims it shares (Claim). With only
	// the affinity bound a random prompt could land on a pod four requests
	// busier than an idle one: on the no-reuse workload kvroute's TTFT p90
	// was 1.42x least-load's; at 1 it was 1.12x, at 0 1.01-1.16x (median
	// 1.03x of three seeds; kvbench, 4 pods, 10 req/s, 30 s).
	ColdHeadroom float64

	// ClaimTTL is how long a shared Claim counts: long enough for the
	// target's digest to show the prefix. Default 5s. 0 ignores claims.
	ClaimTTL time.Duration

	// KVWeight is the load, in requests, of a full KV cache: a pod near
	// full preempts or queues. Default 4. KVKnee is the usage below which
	// the KV cache adds nothing: the term rises from 0 at KVKnee to
	// KVWeight at 1. Default 0.8. Below the knee, usage is a scrape-old
	// echo of the requests Serving already counts; weighing it in full
	// (knee 0) made the no-reuse workload's TTFT p90 1.26x least-load's,
	// against 1.07x without it (kvbench, one run each).
	KVWeight float64
	KVKnee   float64

	// QueuedWeight is the price of one queued prefill token (Candidate.
	// Queued) in the wait, in saved tokens. Default 0.5: a token a request
	// must compute delays it and every request that queues behind it at
	// that pod, a token it waits for delays it alone, so a saved token
	// weighs twice a queued one. At 1 (the request's own TTFT alone) a
	// burst of one new prefix went to every idle pod in turn, each
	// computing it again, since waiting for the first pod's prefill and
	// computing it elsewhere tie (e2e TestBurstOfNewPrefixLandsOnOnePod).
	// Where requests wait for their first token (Candidate.Ahead), a
	// token saved weighs 1 + QueuedWeight × their mean over the peers
	// (Affinity's dupWeight): computing it again delays them as well.
	// 0 ignores the queued work and ranks by requests alone, as kvroute
	// did before (for side-by-side runs: the sidecar's
	// --route-load=requests).
	QueuedWeight float64

	// PrefillTokensPerSecond is the engine's prefill throughput, which
	// turns a candidate's cost in tokens into the expected time to first
	// token that /debug/route shows (Candidate.TTFT). The choice itself is
	// in tokens: the pods of one Deployment share one GPU type, so the
	// rate scales every candidate alike. Default 16667, the simulator's
	// Llama-3.1-8B on one H100 (60 µs a token); 0 shows no estimate.
	PrefillTokensPerSecond float64

	// CPULoadTokensPerSecond is how fast the engine loads a token's KV
	// from its CPU tier back into the GPU (host to device), which is what
	// a CPU-matched token costs instead of its prefill: a lower-tier token
	// is credited 1 - PrefillTokensPerSecond/CPULoadTokensPerSecond of a
	// GPU one (Config.saved, the one rule). Default 381470: Llama-3.1-8B's
	// 128 KiB of KV per token over pinned PCIe Gen5 x16 at 50 GB/s, the
	// simulator's timing model (vllmsim.LoadPerToken, 2.6 µs a token
	// against 60 µs to compute it), so a CPU token is credited 0.956. The
	// anchors credit 0.75 (Dynamo) and 0.8 (llm-d) as fixed weights; a
	// rate keeps the credit right for another model or link, and below
	// the GPU token's so a GPU match of the same length wins. 0 credits
	// no CPU match (the tier off, for comparison).
	CPULoadTokensPerSecond float64
	// DiskLoadTokensPerSecond is CPULoadTokensPerSecond for the disk tier
	// (and any medium not known). Default 38147: 5 GB/s, one NVMe Gen4
	// drive's sequential read (~7 GB/s) less the file system's share,
	// an estimate (the simulator has no disk tier): a disk token is
	// credited 0.56. 0 credits no disk match.
	DiskLoadTokensPerSecond float64
}

// Load rates of DefaultConfig (derivations on Config).
const (
	kvBytesPerToken                = 32 * 8 * 128 * 2 * 2 // Llama-3.1-8B, bf16 K and V
	DefaultCPULoadTokensPerSecond  = 50e9 / kvBytesPerToken
	DefaultDiskLoadTokensPerSecond = 5e9 / kvBytesPerToken
)

// DefaultConfig returns the defaults documented on Config.
func DefaultConfig() Config {
	return Config{
		FailFor:                 10 * time.Second,
		SilentFor:               1500 * time.Millisecond,
		LoadTTL:                 5 * time.Second,
		Slack:                   2,
		MinHeadroom:             8,
		MinMatchKeys:            2,
		MinMatchFraction:        0.25,
		LoadTokens:              64,
		IdleLoadTokens:          512,
		RendezvousKeys:          4,
		ColdHeadroom:            0,
		ClaimTTL:                5 * time.Second,
		KVWeight:                4,
		KVKnee:                  0.8,
		QueuedWeight:            0.5,
		PrefillTokensPerSecond:  16667,
		CPULoadTokensPerSecond:  DefaultCPULoadTokensPerSecond,
		DiskLoadTokensPerSecond: DefaultDiskLoadTokensPerSecond,
	}
}

// RecentConfig bounds the speculative entries of a Recent.
type RecentConfig struct {
	// TTL is how long a recorded forward counts as cached on its target:
	// long enough to cover the target's next digest, short enough that an
	// entry vLLM never kept (a failed request, an eviction) stops pulling
	// traffic soon. Default 5s. Values below 1ns mean the default.
	TTL time.Duration
	// MaxEntries caps memory, in stored (peer, key) entries of about 45
	// bytes (a map entry and a queue slot). A forward stores its chain's
	// checkpoints: all of a chain up to 32 keys, 97 of a 32k-token
	// prompt's 512. When full, the oldest entries go first, tail keys
	// before their prefixes. Default 65536 (≈3 MB): 130 forwards of 32k
	// tokens a second for the 5 s TTL. Values below 1 mean the default.
	MaxEntries int
}

// DefaultRecentConfig returns the defaults documented on RecentConfig.
func DefaultRecentConfig() RecentConfig {
	return RecentConfig{TTL: 5 * time.Second, MaxEntries: 1 << 16}
}
