package forward

import (
	"time"

	"github.com/kvroute/kvroute/route"
)

// prefillShare is the local engine's route.Load.PrefillShare: whether
// prompt tokens were queued for its prefill, averaged over
// route.ShareWindow. track sets it on every change of the local queue,
// which is exact (the front sees every request its vLLM serves).
type prefillShare struct {
	v     float64   // the share at since
	busy  bool      // tokens queued from since on
	since time.Time // zero: never busy
}

// at returns the share at t.
func (s prefillShare) at(t time.Time) float64 {
	if s.since.IsZero() {
		return 0
	}
	return route.ShareAt(s.v, s.busy, t.Sub(s.since))
}

// set records that from t the engine is busy or not.
func (s *prefillShare) set(t time.Time, busy bool) {
	if s.since.IsZero() && !busy {
		return
	}
	s.v, s.busy, s.since = s.at(t), busy, t
}
