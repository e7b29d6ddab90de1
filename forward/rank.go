package forward

import (
	"net/http"
	"strconv"

	"github.com/kvroute/kvroute/route"
)

// RankHeader is vLLM's header pinning a request to one data-parallel rank
// of its engine (vLLM serves it on that rank's engine core). Route chooses
// the rank (route.Decision.RankOf, the rank holding the prompt's prefix);
// forward only carries it: on a hop it passes through the peer's sidecar
// to its vLLM unchanged.
const RankHeader = "X-data-parallel-rank"

// rankFor is RankHeader's value for the decision's candidate peer ("" for
// the local one), or "" when the engine there chooses.
func rankFor(d route.Decision, peer string) string {
	if r, ok := d.RankOf(peer); ok {
		return strconv.Itoa(r)
	}
	return ""
}

// setRank pins out to t's rank, if the choice named one; otherwise the
// request keeps whatever its client sent.
func setRank(out *http.Request, t target) {
	if t.Rank != "" {
		out.Header.Set(RankHeader, t.Rank)
	}
}
