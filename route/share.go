package route

import (
	"math"
	"time"
)

// ShareWindow is the time constant of Load.PrefillShare's exponential
// average: long enough that one 32k-token prompt (about 2 s of prefill)
// does not make an idle engine look busy, short enough that a sustained
// backlog shows within seconds (from 0 to 0.9 in ShareWindow × ln 10,
// 11.5 s, of prefill without a break).
const ShareWindow = 5 * time.Second

// ShareAt is a prefill share of share, with the engine busy (prompt
// tokens queued) or not since, dt later: the average moves toward 1 while
// busy and toward 0 while not. Every sidecar extrapolates a peer's pushed
// share so, between the peer's reports, with the queue the report gave.
func ShareAt(share float64, busy bool, dt time.Duration) float64 {
	if !(share > 0) { // also NaN
		share = 0
	}
	share = min(share, 1)
	if dt <= 0 {
		return share
	}
	keep := math.Exp(-float64(dt) / float64(ShareWindow))
	if busy {
		return 1 - (1-share)*keep
	}
	return share * keep
}

// ShareCrossing is how long after a share of share, with the engine not
// busy, its average falls to below: 0 when it already is, and never for a
// below of 0 or less.
func ShareCrossing(share, below float64) time.Duration {
	switch {
	case share <= below:
		return 0
	case below <= 0:
		return math.MaxInt64
	}
	return time.Duration(float64(ShareWindow)*math.Log(share/below)) + time.Millisecond
}
