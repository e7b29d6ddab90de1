package forward

import (
	"slices"
	"time"
)

// flights are this front's requests in flight by first target ("" is the
// local vLLM), with their start times. A peer's pushed load report already
// counts the requests we sent before it arrived; only later ones are ours
// to add (route.Load.InFlight).
type flights map[string][]time.Time

func (f flights) add(peer string, at time.Time) { f[peer] = append(f[peer], at) }

// done removes one request to peer that started at at.
func (f flights) done(peer string, at time.Time) {
	ts := f[peer]
	if i := slices.IndexFunc(ts, at.Equal); i >= 0 {
		ts = slices.Delete(ts, i, i+1)
	}
	if len(ts) == 0 {
		delete(f, peer)
		return
	}
	f[peer] = ts
}

// since counts the requests to peer that started after t (all of them for
// a zero t).
func (f flights) since(peer string, t time.Time) int {
	n := 0
	for _, s := range f[peer] {
		if s.After(t) {
			n++
		}
	}
	return n
}
