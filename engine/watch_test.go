package engine

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute/route"
)

// fakeEngine answers Health as told: nil, an error, or a hang until the
// probe's deadline.
type fakeEngine struct {
	mu   sync.Mutex
	err  error
	hang bool
}

func (f *fakeEngine) set(err error, hang bool) {
	f.mu.Lock()
	f.err, f.hang = err, hang
	f.mu.Unlock()
}

func (f *fakeEngine) Health(ctx context.Context) error {
	f.mu.Lock()
	err, hang := f.err, f.hang
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	return err
}

func next(t *testing.T, w *Watcher, limit time.Duration) Transition {
	t.Helper()
	select {
	case tr, ok := <-w.Transitions():
		if !ok {
			t.Fatal("transitions closed")
		}
		return tr
	case <-time.After(limit):
		t.Fatalf("no transition within %v (state %v)", limit, w.State())
	}
	return Transition{}
}

// TestWatcherAgainstAFakeEngine drives the loop with real timers: dead,
// hung and refused-request failures each bring the engine down, and a good
// probe brings it back as a restart.
func TestWatcherAgainstAFakeEngine(t *testing.T) {
	f := &fakeEngine{}
	w := NewWatcher(Config{ProbeInterval: 10 * time.Millisecond, ProbeTimeout: 20 * time.Millisecond, HungAfter: 2}, f, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	want := func(what string, to route.Engine, restarted bool) {
		t.Helper()
		tr := next(t, w, 5*time.Second)
		if tr.To != to || tr.Restarted != restarted {
			t.Fatalf("%s: transition %+v; want to %v, restarted %v", what, tr, to, restarted)
		}
	}
	want("first good probe", route.EngineServing, false)
	f.set(errors.New("503"), false)
	want("dead engine", route.EngineDown, false)
	f.set(nil, false)
	want("back", route.EngineServing, true)
	f.set(nil, true)
	want("hung engine", route.EngineDown, false)
	f.set(nil, false)
	want("resumed", route.EngineServing, true)
	w.Report(&net.OpError{Op: "dial", Err: errors.New("connection refused")})
	want("refused request", route.EngineDown, false)
	want("probe still fine", route.EngineServing, true)
	w.Report(errors.New("connection reset by peer")) // only probes
	select {
	case tr := <-w.Transitions():
		t.Fatalf("a reset with a healthy engine moved it: %+v", tr)
	case <-time.After(100 * time.Millisecond):
	}
	if w.State() != route.EngineServing {
		t.Errorf("State() = %v; want serving", w.State())
	}
}

// TestWatcherTiming runs the defaults on synctest's clock: a hang is seen
// within ProbeInterval + HungAfter × ProbeTimeout (1.25 s), and an engine
// whose /health stops answering while it keeps publishing events (a
// saturated vLLM) is never taken for hung, until its events stop too.
func TestWatcherTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeEngine{}
		var events atomic.Uint64
		cfg := DefaultConfig()
		cfg.Progress = events.Load
		w := NewWatcher(cfg, f, nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go w.Run(ctx)
		if tr := <-w.Transitions(); tr.To != route.EngineServing {
			t.Fatalf("first transition %+v; want serving", tr)
		}

		time.Sleep(10*time.Second + 130*time.Millisecond) // an arbitrary phase against the probe ticks
		f.set(nil, true)
		hungAt := time.Now()
		tr := <-w.Transitions()
		if d := time.Since(hungAt); tr.To != route.EngineDown || d < time.Second || d > 1250*time.Millisecond {
			t.Fatalf("hang: %+v after %v; want down within 1.0-1.25 s", tr, d)
		}
		f.set(nil, false)
		if tr := <-w.Transitions(); tr.To != route.EngineServing || !tr.Restarted {
			t.Fatalf("resumed: %+v; want serving, restarted", tr)
		}

		// Saturated: /health hangs, an event every 300 ms, for a minute.
		f.set(nil, true)
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(300 * time.Millisecond):
					events.Add(1)
				}
			}
		}()
		select {
		case tr := <-w.Transitions():
			t.Fatalf("a busy engine moved: %+v", tr)
		case <-time.After(time.Minute):
		}
		close(stop)
		quietAt := time.Now()
		tr = <-w.Transitions()
		// The last event came within 300 ms before; quiet for 750 ms, then
		// the next timeout (every 500 ms back to back) says so.
		if d := time.Since(quietAt); tr.To != route.EngineDown || d > 750*time.Millisecond+500*time.Millisecond+progressEvery {
			t.Fatalf("events stopped: %+v after %v; want down within 1.3 s", tr, d)
		}
		cancel()
		for range w.Transitions() { // closed once Run returns
		}
	})
}
