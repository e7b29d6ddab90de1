// Package baseline holds the central-proxy routing policies kvroute is
// compared with, and the proxy that runs them in front of the same
// simulated pods (cmd/kvproxy):
//
//   - round-robin: the next pod in turn.
//   - least-loaded: fewest requests in flight from this proxy (KubeAI
//     LeastLoad); ties to the lowest index.
//   - chwbl: KubeAI PrefixHash, consistent hashing with bounded loads on the
//     first 100 characters of the prompt, 256 virtual nodes per pod, load
//     factor 1.25.
//   - approx-prefix: the Gateway API Inference Extension's approximate
//     prefix scorer: 64-character blocks hashed in a chain, a per-pod LRU of
//     what was sent where (routing history), weights queue 2, kv-cache 2,
//     prefix 3, max score with seeded random ties.
//   - central-precise: one router holding an exact kvindex per pod, fed by
//     every pod's KV events, scoring with kvroute's own route.DefaultChain
//     (the llm-d EPP architecture with no gossip staleness and no Bloom
//     false positives).
//   - central-exact: central-precise with exact load: each pod's load is the
//     router's own count of requests in flight there (every request passes
//     it), as the sidecars use pushed counts, instead of the scrape plus
//     that count. The strongest central baseline: it tells how much of
//     kvroute's margin over central-precise is the load view.
//   - lmetric: central-precise's exact index with LMetric's cost (OSDI'26,
//     llm-d's lmetric-scorer): the pod with the lowest uncached prompt
//     tokens × (requests in flight there + 1), no weights, no bound; ties
//     by seeded rendezvous weight.
//   - uncoordinated: the independent-gateways setup SGLang's gateway
//     measured (0.66 hit rate at 8 gateways against 0.95 with a shared
//     index): a front per pod, a request to a front at random, each front
//     exact about its own pod's cache (that pod's KV events) and knowing
//     its peers only by what it sent them (a bounded LRU), loaded by its
//     own in-flight counts; longest predicted match, a cold prefix to its
//     own pod. One policy holds the N front states, so it runs in this
//     process like the others.
//
// The proxy reads every API's request (prompt.ParseAPI): completions, a
// batch of completions (each prompt's tokens; the exact-index policies
// score the pod by the sum of the prompts' matches and send the batch
// whole), chat, and Anthropic Messages and OpenAI Responses as vLLM
// converts them to chat (tokenized with /tokenize's chat variant on the converted messages; a
// prompt with images through the chat render endpoint, whose features place
// them, so that the blocks they overlap are keyed with their identifiers).
// Whatever the policy, a request about a stored response (a Responses
// follow-up naming previous_response_id, GET /v1/responses/{id}, its
// cancel) goes to the pod that created it: the proxy sees every answer and
// records its id (stored.go).
//
// The "service" baseline is no proxy policy: it is chaos.Service straight to
// the simulators, a random pod per connection, so a stored response's
// follow-up reaches another pod, which answers 404, as often as not.
//
// A Policy is a value machine: it gets the request, every pod's state and
// now, and returns an index. The Proxy does the I/O (body parsing,
// tokenizing, metric scrapes, event subscriptions) and serialises calls to
// Pick, so policies need no locks of their own. A policy that counts its
// own requests in flight (uncoordinated's fronts) also gets, serialised
// the same way, the end of each request it chose a pod for (tracker).
package baseline
