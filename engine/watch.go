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
// refused request) and a hung one within HungAfter × ProbeTimeout plus an
// interval: about 2.25 s.
type Config struct {
	// ProbeInterval is how often /health is asked. Default 250 ms.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe; past it the probe counts as a timeout.
	// Default 1 s: vLLM answers /health from its API process in
	// milliseconds even under full load.
	ProbeTimeout time.Duration
	// HungAfter is how many timeouts in a row make the engine down.
	// Default 2, so one slow answer does not clear the cache's index.
	HungAfter int
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{ProbeInterval: 250 * time.Millisecond, ProbeTimeout: time.Second, HungAfter: 2}
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

// Run probes until ctx is done, then closes Transitions.
func (w *Watcher) Run(ctx context.Context) {
	defer close(w.out)
	tk := NewTracker(w.cfg.HungAfter)
	t := time.NewTicker(w.cfg.ProbeInterval)
	defer t.Stop()
	for {
		tr, ok := w.probe(ctx, tk)
		w.emit(ctx, tr, ok)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case r := <-w.reports:
			if refused(r.err) {
				tr, ok := tk.Failed("request refused: "+r.err.Error(), r.at)
				w.emit(ctx, tr, ok)
				// The next tick probes; a restarted engine answers it.
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		}
	}
}

func (w *Watcher) probe(ctx context.Context, tr *Tracker) (Transition, bool) {
	pctx, cancel := context.WithTimeout(ctx, w.cfg.ProbeTimeout)
	err := w.prober.Health(pctx)
	cancel()
	switch {
	case ctx.Err() != nil:
		return Transition{}, false
	case err == nil:
		return tr.Observe(ProbeOK, "", w.now())
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return tr.Observe(ProbeTimeout, err.Error(), w.now())
	}
	return tr.Observe(ProbeFailed, err.Error(), w.now())
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
