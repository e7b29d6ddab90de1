// Package route chooses the pod that serves a request and explains why
// (docs/design.md D4, D6). It is pure: peers, the request and now come in, a
// Decision comes out. There are no clocks, goroutines, locks or logs. The
// one package-level value is a sync.Pool of scratch rows (list.go):
// memory reused between choices, never state a choice can see.
//
// # The choice
//
// The sidecar builds a []PeerView from its peer table (the local pod
// included), a Request from the prompt's routing keys, and calls a Policy:
//
//	d := route.DefaultChain(cfg, recent).Choose(req, peers, now)
//	switch {
//	case d.Target == "" || d.Local:
//		// serve locally (D6: routing is an optimisation)
//	default:
//		recent.Record(d.Target, req.Keys, now) // speculative entry
//		// forward once to d.Target
//	}
//
// DefaultChain tries three policies, each in its own file:
//
//  1. Affinity: the peer that saves the most prefill tokens, among peers
//     within the load bound. It declines when the best match is shorter
//     than MinMatchKeys, so a one-key Bloom false positive, or a short
//     preamble every prompt shares, does not pull traffic.
//  2. Rendezvous: for prefixes nobody holds, the highest random weight of
//     (peer, first RendezvousKeys keys) within the bound, so independent
//     sidecars send a burst of new same-prefix requests to one pod.
//  3. LeastLoad: the lightest eligible peer; ties by rendezvous weight.
//
// # Eligibility
//
// A peer is eligible unless it is draining, a forward to it failed less
// than FailFor ago, or it does not serve the request's model (empty Models
// serves all). A peer with another key scheme is eligible but matches
// nothing.
//
// A peer's model list can be truncated (ModelsTruncated: more adapters than
// its node meta holds). Such a peer is still a candidate for a model it
// does not list when its digest holds the request's first MinMatchKeys
// keys: keys are seeded with the model name, so only a pod that served the
// model recently holds them. It is never chosen for an unlisted model by
// load alone: a pod without the adapter answers 404, which the client
// would see, while routing by load to the pods that do list the model
// costs at most a cache miss. With no eligible peer the Decision has no Target and Reason
// "none", and the caller serves locally.
//
// # Load
//
// Load is one number, in requests:
//
//	Running + Waiting + InFlight + KVWeight*KVUsage
//
// and beside it the work a new request would queue behind, in prefill
// tokens (Candidate.Queued):
//
//	QueuedPrefillTokens + InFlightPrefillTokens
//
// A peer's sidecar pushes Serving (its requests at vLLM, exact: every one
// passes it) and QueuedPrefillTokens (their uncached prompt tokens, as
// predicted, until each one's first answer byte) on every change.
// Running, Waiting, KVUsage and QueuedPrefillTokens count only while the
// report is younger than LoadTTL; a stale or missing report leaves
// InFlight and InFlightPrefillTokens, what this sidecar itself has
// outstanding there. They are added even though the report may already
// count some of those requests: the double count errs towards spreading,
// and it makes every forward raise the target's load at once, which stops
// the herd of one metrics interval (dynamo#589).
//
// # The load bound
//
// With m the mean load of eligible peers counting this request, a peer is
// over the bound when Load+1 > max(m*(1+Slack), m+MinHeadroom). This is
// consistent hashing with bounded loads (KubeAI's CHWBL, 125%): under
// pressure no peer takes more than 1+Slack times its share, so a prefix
// every request shares (the Mooncake conversation trace) cannot make a hot
// spot; in a quiet cluster MinHeadroom lets a holder keep its prefix.
// With IdleSlack or IdleHeadroom set (off by default), while some
// eligible peer is idle a peer with requests waiting for their first token
// is over a tighter bound, max(m*(1+IdleSlack), m+IdleHeadroom): the few
// pods holding the prefixes every session starts from would otherwise
// queue while others idle. A peer whose match reaches further by what was
// just sent there (Recent, claims) is spared: its queue is a burst of the
// request's own prefix.
// Affinity and Rendezvous pass over peers above the bound unless all are.
//
// # Score
//
// Affinity scores a peer in prefill tokens, by the time to the request's
// first token there and the work it adds for the requests behind it
// (LMetric, OSDI'26, prices the same two terms as a product; a sum is what
// a first-come-first-served prefill queue costs):
//
//	Score = (1 + QueuedWeight*Waiting)*MatchedTokens
//	        - QueuedWeight*Queued - LoadTokens*Load
//
// MatchedTokens is MatchedKeys*TokensPerKey: the work the peer skips,
// which spares the request and every request queued behind it there.
// Queued is the work ahead of the request there, which delays it alone:
// QueuedWeight 0.5 weighs it half a saved token. LoadTokens prices each
// request the engine runs alongside (its decode step and overhead), so a
// near-equal match goes to the lighter peer. A 6,000-token miss queued at
// the holder weighs 6,000 tokens, a 50-token hit 50: a count of requests
// cannot tell them apart. Waiting is the mean number of requests waiting
// for their first token at the eligible peers (Candidate.Ahead): a token
// computed again where another peer holds it delays each of them too, as
// the queues drain as one (dupWeight). With no queue it is 0 and the
// score is the request's own wait; without it the choice balanced queues
// by spreading prefixes past the knee, the spread lowered the hit rate,
// the work grew, and the queues with it. Rendezvous and LeastLoad rank
// by the same wait.
//
// While some eligible peer is idle (no load, nothing waiting), Affinity
// prices a request of load at a peer with two or more requests waiting at
// IdleLoadTokens (512) instead: a queued holder of
// a short prefix that every new session starts from (an agent's system
// prompt and tools) yields the next to the idle pod, which computes the
// prefix once and holds it too, while a long prefix stays. A bound, which
// counts requests, cannot tell the two apart.
// The bound, in requests, not the score, is what keeps affinity from
// piling up. Ties, here and in every policy, go to the higher rendezvous
// weight and then to the smaller ID, never to the order of peers: sidecars
// that see the same table agree. Candidate.TTFT shows each cost in seconds
// at PrefillTokensPerSecond.
//
// # Speculation
//
// Recent records what this sidecar forwarded where, for a short TTL, and
// Affinity counts it as cached (the max of digest and Recent). It keeps a
// chain's checkpoints, not every key, so a long prefix is known to within
// 1/16 of its length; the claims hold a chain's exact end. Recent is
// not safe for concurrent use: the caller holds one lock around it.
//
// # Explanation
//
// A Decision lists each peer's eligibility, matched keys and tokens, load
// and score; Decision.Table renders it for /debug/route. The golden
// scenarios in testdata show the table for each rule.
//
// Policies weigh a compact row per peer and build a Candidate, with its
// strings, only for the peers the Decision lists. Among at most ListPeers
// peers, or when the Request says Explain (/debug/route), that is every
// peer; among more, the chosen and local ones, the failover order's next
// (Attempts reads no other), the best scores and the longest match, and
// Decision.Omitted counts the rest. At a thousand peers a choice is bound
// by the memory it touches per peer: building every Candidate was most of
// it.
package route
