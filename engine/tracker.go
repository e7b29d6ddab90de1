package engine

import (
	"time"

	"github.com/kvroute/kvroute/route"
)

// Probe is the outcome of one look at the engine.
type Probe uint8

const (
	// ProbeOK: /health answered 200.
	ProbeOK Probe = iota
	// ProbeFailed: refused, reset or a non-200 answer. vLLM answers /health
	// only once its engine is loaded and 503 once it is dead, so one failure
	// is proof enough.
	ProbeFailed
	// ProbeTimeout: no answer within the probe timeout. A hung engine looks
	// like this, and so does a busy one: vLLM's API server answers /health
	// late when it is saturated (over 1 s, and 2 s, have been reported in
	// deployments that probe it). HungAfter of them in a row are needed,
	// and the engine must also have shown no progress (Progress) for
	// QuietFor: a busy engine keeps computing, a hung one does not.
	ProbeTimeout
)

// Transition is a change of the engine's state that the caller must carry
// out. Restarted is set when the engine comes back after being down: its
// cache is gone, so the caller starts a new epoch with an empty index
// before it advertises the engine as serving; unless Resumed is set too.
type Transition struct {
	From, To  route.Engine
	Restarted bool
	// Hung is set on a move to down by probe timeouts alone: the engine
	// stopped answering, its process and cache may live on.
	Hung bool
	// Resumed is set with Restarted when the engine was down by a hang and
	// nothing since was refused or failed: the same process answers
	// again, with its cache as it was. A new process is still seen by its
	// start time and its event sequence (cachestate), which the caller
	// keeps watching.
	Resumed bool
	Reason  string
	At      time.Time
}

// Tracker is the engine state machine. It starts in route.EngineStarting.
// It is not safe for concurrent use; Watcher owns one.
type Tracker struct {
	hungAfter  int
	quietFor   time.Duration
	state      route.Engine
	timeouts   int       // consecutive probe timeouts
	okAt       time.Time // last healthy probe
	progressAt time.Time // last sign of work (Progress); zero: none seen
	hung       bool      // down by a hang, and nothing refused or failed since
}

// NewTracker returns a tracker in route.EngineStarting. hungAfter is how
// many probe timeouts in a row make the engine down (at least 1), and
// quietFor how long it must also have shown no progress (0: progress is
// not considered).
func NewTracker(hungAfter int, quietFor time.Duration) *Tracker {
	return &Tracker{hungAfter: max(hungAfter, 1), quietFor: max(quietFor, 0), state: route.EngineStarting}
}

// Progress records that the engine did work at at: a KV event arrived,
// which the engine publishes as it computes blocks, in prefill and in
// decode alike. A saturated engine that answers /health late still does
// this; a hung one cannot.
func (t *Tracker) Progress(at time.Time) {
	if at.After(t.progressAt) {
		t.progressAt = at
	}
}

// State returns the current state.
func (t *Tracker) State() route.Engine { return t.state }

// Observe applies one probe outcome; reason says what was seen (an error
// text). It reports the transition, if the state changed.
func (t *Tracker) Observe(p Probe, reason string, now time.Time) (Transition, bool) {
	switch p {
	case ProbeOK:
		t.timeouts, t.okAt = 0, now
		return t.move(route.EngineServing, "healthy", now)
	case ProbeTimeout:
		t.timeouts++
		if t.timeouts < t.hungAfter || t.busy(now) {
			return Transition{}, false
		}
		tr, ok := t.move(route.EngineDown, "hung: "+reason, now)
		if ok {
			t.hung, tr.Hung = true, true
		}
		return tr, ok
	default:
		t.timeouts = 0
		t.hung = false // refused or a failure answer: no live, healthy process
		if t.state == route.EngineStarting {
			return Transition{}, false // still loading: vLLM listens only once ready
		}
		return t.move(route.EngineDown, reason, now)
	}
}

// Failed applies a request to the engine, made at at, whose connection was
// refused: a live engine would have taken it. The engine is down at once;
// the next good probe brings it back. A failure older than the last good
// probe is stale: the engine answered since.
func (t *Tracker) Failed(reason string, at time.Time) (Transition, bool) {
	if !at.After(t.okAt) {
		return Transition{}, false
	}
	t.hung = false // refused: no process listens
	if t.state != route.EngineServing {
		return Transition{}, false
	}
	return t.move(route.EngineDown, reason, at)
}

// busy reports whether the engine did work within quietFor of now.
func (t *Tracker) busy(now time.Time) bool {
	return t.quietFor > 0 && !t.progressAt.IsZero() && now.Sub(t.progressAt) < t.quietFor
}

func (t *Tracker) move(to route.Engine, reason string, now time.Time) (Transition, bool) {
	if t.state == to {
		return Transition{}, false
	}
	tr := Transition{From: t.state, To: to, Reason: reason, At: now,
		Restarted: t.state == route.EngineDown && to == route.EngineServing}
	tr.Resumed = tr.Restarted && t.hung
	if to == route.EngineServing {
		t.hung = false
	}
	t.state = to
	return tr, true
}
