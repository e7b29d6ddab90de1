package route

// RankLoad is one data-parallel rank's work at a pod, as the pod's own
// sidecar counts it: every request it sends its vLLM names a rank
// (X-data-parallel-rank), so the count is exact where vLLM's per-rank
// gauges are a scrape old.
type RankLoad struct {
	Serving int `json:"serving"`       // requests at the rank's engine core
	Queued  int `json:"queued_tokens"` // their prompt tokens not yet prefilled
}

// PickRank chooses the data-parallel rank of this pod that serves a
// request: where it gets its first token soonest, by the rule Affinity
// ranks pods by (saved tokens less the wait, the one cost, wait). pinned
// is the rank the mesh's choice pinned the request to because it holds
// the prefix there (NoRank: none holds more than another), work the
// request's tokens to compute there, and prompt all its tokens, which
// any other rank computes whole (its own cache is not known here: the
// request's keys stay at the sidecar that chose). So a hot prefix's
// follow-ups stay on its rank until the queue there costs more than the
// prefix saves, and then the next goes to a rank with room, where it is
// computed once and cached too. Ties go to the pinned rank, then the
// lowest. ranks must not be empty.
func (cfg Config) PickRank(ranks []RankLoad, pinned, work, prompt int) int {
	best, bestCost := -1, 0.0
	for r, l := range ranks {
		own := work
		if pinned != NoRank && r != pinned {
			own = max(prompt, work)
		}
		cost := wait(&cfg, max(l.Queued, 0), float64(max(l.Serving, 0)), cfg.LoadTokens) + float64(own)
		if best < 0 || cost < bestCost || (cost == bestCost && r == pinned) {
			best, bestCost = r, cost
		}
	}
	return best
}
