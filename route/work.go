package route

// Work tracks the average uncached prompt tokens of the requests a router
// places: the prefill work that one more queued request adds to a peer.
// Affinity prices load in these tokens (Request.LoadTokens), so a shared
// prefix spills to a lighter peer as soon as the queue it would wait behind
// costs more prefill than the cache saves. In a workload of long prompts
// with little reuse (the Mooncake conversation trace) that is almost at
// once; in one where most of every prompt is cached, affinity holds until
// the imbalance is real.
//
// Work is a value updated by its owner; it is not safe for concurrent use.
type Work struct {
	avg float64
	n   int
}

// workWindow is the effective memory of the moving average, in requests.
const workWindow = 64

// Observe records a placed request: its prompt length and the tokens the
// decision expects the chosen peer to have cached.
func (w *Work) Observe(promptTokens, cachedTokens int) {
	u := float64(max(promptTokens-cachedTokens, 0))
	w.n = min(w.n+1, workWindow)
	w.avg += (u - w.avg) / float64(w.n)
}

// LoadTokens returns the price of one unit of load: half the average
// uncached tokens per request (0 before the first observation). Half,
// because with chunked prefill a new request shares each step's token
// budget with the queue ahead of it instead of waiting for all of it; the
// factor is a heuristic, checked only against the simulator's scheduler.
func (w *Work) LoadTokens() float64 { return w.avg / 2 }

// Expected returns the tokens the decision predicts cached at its target.
func (d Decision) Expected() int {
	for _, c := range d.Candidates {
		if c.Chosen {
			return c.MatchedTokens
		}
	}
	return 0
}
