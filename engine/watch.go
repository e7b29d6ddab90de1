package engine

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/route"
)

// Config of a Watcher. DefaultConfig documents the defaults; they detect a
// dead engine within ProbeInterval (a refused probe, or at once from a
// refused request) and a hung one within ProbeInterval plus HungAfter ×
// ProbeTimeout: 1.0-1.25 s, which leaves the push to peers and their next
// choice well inside the 2 s the mesh promises for every fault.
type Config struct {
	// ProbeInterval is how often /health is asked. Default 250 ms.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe; past it the probe counts as a timeout.
	// Default 500 ms. An idle vLLM answers /health from its API process in
	// milliseconds; a saturated one can take over a second, which is why a
	// timeout alone never proves a hang (QuietFor).
	ProbeTimeout time.Duration
	// HungAfter is how many timeouts in a row make the engine down, with
	// no progress for QuietFor. Default 2, so one slow answer does not
	// clear the cache's index.
	HungAfter int
	// Progress, when set, counts the engine's work as the sidecar sees it
	// (the KV-event messages received: vLLM publishes them as it computes
	// blocks, in prefill and decode). It is read every progressEvery and
	// must not block. Nil: timeouts alone decide, and a saturated engine
	// whose /health answers late HungAfter times is taken for hung.
	Progress func() uint64
	// QuietFor is how long the engine must have shown no progress for
	// timeouts to make it hung. Default 750 ms: events an engine published
	// just before it froze arrive within milliseconds, so a hang is still
	// seen at the HungAfter-th timeout, while a busy engine (an event every
	// step; a step takes tens of milliseconds, a long prefill chunk a few
	// hundred) never goes that long without one.
	QuietFor time.Duration
}

// progressEvery is how often Config.Progress is read: fine enough that
// QuietFor is measured to a few percent.
const progressEvery = 50 * time.Millisecond

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{ProbeInterval: 250 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond, HungAfter: 2,
		QuietFor: 750 * time.Millisecond}
}

// Prober asks the engine whether it is healthy; *vllmclient.Client fits.
type Prober interface {
	Health(ctx context.Context) error
}

// Watcher runs a Tracker against the engine. Its methods are safe for
// concurrent use.
type Watcher struct {
	cfg     Config
	prober  Prober
	now     func() time.Time
	reports chan report
	out     chan Transition
	state   atomic.Uint32 // route.Engine
}

// NewWatcher returns a watcher in route.EngineStarting; zero fields of cfg
// take DefaultConfig's values. now is the clock (nil: time.Now).
func NewWatcher(cfg Config, p Prober, now func() time.Time) *Watcher {
	d := DefaultConfig()
	if cfg.ProbeInterval <= 0 {
		cfg.ProbeInterval = d.ProbeInterval
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = d.ProbeTimeout
	}
	if cfg.HungAfter <= 0 {
		cfg.HungAfter = d.HungAfter
	}
	if cfg.QuietFor <= 0 {
		cfg.QuietFor = d.QuietFor
	}
	if now == nil {
		now = time.Now
	}
	w := &Watcher{cfg: cfg, prober: p, now: now, reports: make(chan report, 64), out: make(chan Transition, 16)}
	w.state.Store(uint32(route.EngineStarting))
	return w
}

// Transitions delivers every state change in order. Read it promptly: the
// watcher waits for the reader.
func (w *Watcher) Transitions() <-chan Transition { return w.out }

// State is the engine's state as of the last transition delivered to
// Transitions' buffer.
func (w *Watcher) State() route.Engine { return route.Engine(w.state.Load()) }

// Report tells the watcher that a request to the engine failed before an
// answer. A refused connection makes the engine down at once; any other
// error makes the watcher probe now. It never blocks.
func (w *Watcher) Report(err error) {
	select {
	case w.reports <- report{err: err, at: w.now()}:
	default: // a probe is already due
	}
}

// Run probes until ctx is done, then closes Transitions. One probe runs
// at a time, in a goroutine of its own that ends with the probe (ctx
// bounds it), so Progress is read while a probe waits; a tick that comes
// during a probe starts the next one as soon as it ends.
func (w *Watcher) Run(ctx context.Context) {
	defer close(w.out)
	tk := NewTracker(w.cfg.HungAfter, w.cfg.QuietFor)
	tick := time.NewTicker(w.cfg.ProbeInterval)
	defer tick.Stop()
	var progress <-chan time.Time
	var seen uint64
	if w.cfg.Progress != nil {
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		progress, seen = t.C, w.cfg.Progress()
	}
	results := make(chan probeResult, 1)
	probing, due := false, false
	probe := func() {
		probing, due = true, false
		go func() { results <- w.probe(ctx) }() // buffered: never blocks
	}
	probe()
	for {
		select {
		case <-ctx.Done():
			if probing {
				<-results // ctx ends the probe
			}
			return
		case r := <-results:
			probing = false
			if ctx.Err() != nil {
				continue
			}
			tr, ok := tk.Observe(r.probe, r.reason, w.now())
			w.emit(ctx, tr, ok)
			if due {
				probe()
			}
		case <-tick.C:
			if probing {
				due = true
			} else {
				probe()
			}
		case <-progress:
			if n := w.cfg.Progress(); n != seen {
				seen = n
				tk.Progress(w.now())
			}
		case r := <-w.reports:
			if refused(r.err) {
				// The next tick probes; a restarted engine answers it.
				tr, ok := tk.Failed("request refused: "+r.err.Error(), r.at)
				w.emit(ctx, tr, ok)
			} else if !probing {
				probe()
			}
		}
	}
}

// probeResult is one probe's outcome, for the Tracker.
type probeResult struct {
	probe  Probe
	reason string
}

func (w *Watcher) probe(ctx context.Context) probeResult {
	pctx, cancel := context.WithTimeout(ctx, w.cfg.ProbeTimeout)
	err := w.prober.Health(pctx)
	cancel()
	switch {
	case err == nil:
		return probeResult{probe: ProbeOK}
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return probeResult{probe: ProbeTimeout, reason: err.Error()}
	}
	return probeResult{probe: ProbeFailed, reason: err.Error()}
}

func (w *Watcher) emit(ctx context.Context, t Transition, ok bool) {
	if !ok {
		return
	}
	w.state.Store(uint32(t.To))
	select {
	case w.out <- t:
	case <-ctx.Done():
	}
}

type report struct {
	err error
	at  time.Time
}

// refused reports a connection that could not be made: nothing listens, so
// the engine is gone (vLLM listens only while it can serve).
func refused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
