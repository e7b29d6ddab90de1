package forward

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/route"
)

// flights are this front's requests in flight by first target ("" is the
// local vLLM). A peer's pushed load report already counts the requests we
// sent before it arrived; only later ones are ours to add
// (route.Load.InFlight and InFlightPrefillTokens).
type flights map[string][]flight

// flight is one request in flight: when it was sent, and the prompt tokens
// its target must compute (predicted uncached), which are queued prefill
// work until its first answer byte comes back.
type flight struct {
	at       time.Time
	prefill  int
	answered bool // the first byte of the answer came back: prefill is done
	// until, if set, is when the prefill should be done by the engine's
	// rate: a non-streamed answer's first byte is its last, so its
	// prefill would otherwise stay queued through its decode.
	until time.Time
	// rank is the local vLLM's data-parallel rank the request was sent
	// to (RankHeader), or -1: not named, or not the local vLLM.
	rank int
}

// queued reports whether fl's prefill is still work ahead at now: no
// answer byte yet, and, for a plain answer, not past its predicted end.
func (fl flight) queued(now time.Time) bool {
	return !fl.answered && (fl.until.IsZero() || now.Before(fl.until))
}

// add records a request to peer sent at at; rank is the local vLLM's
// rank it names (-1: none).
func (f flights) add(peer string, at time.Time, prefill int, prefillFor time.Duration, rank int) {
	fl := flight{at: at, prefill: max(prefill, 0), rank: rank}
	if prefillFor > 0 {
		fl.until = at.Add(prefillFor)
	}
	f[peer] = append(f[peer], fl)
}

// answered marks the request to peer that started at at as past its
// prefill.
func (f flights) answered(peer string, at time.Time) {
	if i := f.find(peer, at); i >= 0 {
		f[peer][i].answered = true
	}
}

// done removes one request to peer that started at at.
func (f flights) done(peer string, at time.Time) {
	i := f.find(peer, at)
	if i < 0 {
		return
	}
	ts := slices.Delete(f[peer], i, i+1)
	if len(ts) == 0 {
		delete(f, peer)
		return
	}
	f[peer] = ts
}

func (f flights) find(peer string, at time.Time) int {
	return slices.IndexFunc(f[peer], func(fl flight) bool { return fl.at.Equal(at) })
}

// since counts the requests to peer that started after t (all of them for
// a zero t), and at now those not yet answered and their prefill tokens.
func (f flights) since(peer string, t, now time.Time) (n, prefilling, prefill int) {
	for _, fl := range f[peer] {
		if fl.at.After(t) {
			n++
			if fl.queued(now) {
				prefilling++
				prefill += fl.prefill
			}
		}
	}
	return n, prefilling, prefill
}

// ranks is the local vLLM's load per data-parallel rank, of n ranks, at
// now: the requests that named each rank and their prefill not yet done.
func (f flights) ranks(n int, now time.Time) []route.RankLoad {
	out := make([]route.RankLoad, n)
	for _, fl := range f[""] {
		if fl.rank < 0 || fl.rank >= n {
			continue
		}
		out[fl.rank].Serving++
		if fl.queued(now) {
			out[fl.rank].Queued += fl.prefill
		}
	}
	return out
}

// next is the earliest until after now among peer's queued flights: when
// its queued prefill drops without an event. Zero if none.
func (f flights) next(peer string, now time.Time) time.Time {
	var t time.Time
	for _, fl := range f[peer] {
		if !fl.answered && fl.until.After(now) && (t.IsZero() || fl.until.Before(t)) {
			t = fl.until
		}
	}
	return t
}
