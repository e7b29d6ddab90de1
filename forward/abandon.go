package forward

import (
	"context"
	"errors"
	"net/http"
	"sync"
)

// A hung engine (a stopped process, a wedged API server) accepts
// connections and answers nothing, so a request sent to it before the
// engine watcher declared it down would wait for its client to give up.
// When the local engine leaves serving (SetLocalReady(false)), every
// attempt still waiting for its answer's headers there is abandoned, and
// until it serves again no attempt is made there (the local engine is
// every plan's last resort, and the hung one would hold it): it
// fails with errEngineDown, which is retried on the plan's next target like
// a refused connection, and answers 503 with Retry-After (a hop: a refusal
// its sender retries elsewhere) when there is none. An attempt that has its
// headers is streaming and is left alone: its client has had bytes.

// errEngineDown fails an attempt abandoned at a local engine gone down.
var errEngineDown = errors.New("the local engine stopped serving before it answered")

// waiters are the attempts at the local engine waiting for its headers.
type waiters struct {
	mu   sync.Mutex
	down bool // the engine is not serving: an attempt there fails at once
	next uint64
	m    map[uint64]context.CancelCauseFunc
}

// add returns ctx for one attempt, abandoned by abandon, and the id that
// takes it off the list (remove) once the attempt has its answer or
// failed; ok is false, and there is no attempt to make, while the engine
// is down: a plan's last resort is the local engine, and a hung one would
// hold it.
func (w *waiters) add(ctx context.Context) (_ context.Context, id uint64, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.down {
		return ctx, 0, false
	}
	ctx, cancel := context.WithCancelCause(ctx)
	if w.m == nil {
		w.m = map[uint64]context.CancelCauseFunc{}
	}
	id = w.next
	w.next++
	w.m[id] = cancel
	return ctx, id, true
}

// remove takes the attempt of id (add) off the list.
func (w *waiters) remove(id uint64) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

// abandon marks the engine down and fails every waiting attempt with
// errEngineDown.
func (w *waiters) abandon() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down = true
	for id, cancel := range w.m {
		cancel(errEngineDown)
		delete(w.m, id)
	}
}

// serving marks the engine serving again.
func (w *waiters) serving() {
	w.mu.Lock()
	w.down = false
	w.mu.Unlock()
}

// watch returns ctx for the front's own calls to the local engine on a
// request's path (/tokenize, render), and the func to call when they are
// done: canceled at once while the engine is down and when it goes down,
// so a hung engine costs a request no TokenizeTimeout; the request is
// then routed without those keys (docs/design.md D6).
func (w *waiters) watch(ctx context.Context) (context.Context, func()) {
	wctx, id, ok := w.add(ctx)
	if !ok {
		wctx, cancel := context.WithCancelCause(ctx)
		cancel(errEngineDown)
		return wctx, func() {}
	}
	return wctx, func() { w.remove(id) }
}

// abandoned reports whether an attempt under ctx failed because it was
// abandoned, rather than by its client (parent) going away.
func abandoned(ctx, parent context.Context) bool {
	return parent.Err() == nil && errors.Is(context.Cause(ctx), errEngineDown)
}

// roundTripLocal is an attempt at the local engine, out under the context
// a.local.add gave it with id: failed with errEngineDown when the engine
// goes down before it answers.
func (a *attempts) roundTripLocal(out *http.Request, parent context.Context, id uint64) (*http.Response, error) {
	defer a.local.remove(id)
	resp, err := a.base.RoundTrip(out)
	if err != nil && abandoned(out.Context(), parent) {
		return nil, errEngineDown
	}
	return resp, err
}
