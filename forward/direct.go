package forward

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/route"
)

// A pod's vLLM keeps its stored responses while its sidecar is away: a
// sidecar that restarts or was killed leaves the mesh with its vLLM
// alive. So while a stored response's pod is away, the front asks that
// vLLM itself, at the address its sidecar advertised (PeerView.EngineAddr):
// it serves the request there when the response is held, and answers the
// final 404 at once when that vLLM says it does not hold it or nothing
// listens there any more (the process, and the store in its memory, are
// gone). Without this, such a pod's follow-ups got retryable 503s for
// respown.DefaultGrace before the 404, and follow-ups of a pod whose
// sidecar alone was away waited for it to come back.
//
// A refused or unreachable address is taken as proof only where this
// sidecar once reached it: the Deployment's NetworkPolicy may close the
// port to peers (then every dial fails alike, and nothing is concluded),
// and vLLM may listen on loopback only.

// engines remembers where peers' vLLMs listen, past the peers' leaving,
// and whether this sidecar has reached each there.
type engines struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu sync.Mutex
	m  map[string]*engineAddr // by node
}

type engineAddr struct {
	addr     string
	reached  bool      // a connection to addr succeeded
	tried    time.Time // the last dial to find out
	seen     time.Time // last in a snapshot
	checking bool
}

// Bounds of engines' memory.
const (
	// engineForget is how long a peer's address is kept after it was last
	// seen: past respown.DefaultGrace, after which its responses are
	// taken as gone anyway.
	engineForget = time.Minute
	// engineRecheck spaces dials to an address that did not answer.
	engineRecheck = 10 * time.Second
	// engineDial bounds one check's dial.
	engineDial = time.Second
)

func newEngines(dial func(ctx context.Context, network, addr string) (net.Conn, error)) *engines {
	return &engines{dial: dial, m: map[string]*engineAddr{}}
}

// observe records the engine addresses of peers in views (those whose
// engine serves are checked once, by a dial in the background) and
// forgets those unseen for engineForget.
func (e *engines) observe(ctx context.Context, views []route.PeerView, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, pv := range views {
		if pv.Local || pv.EngineAddr == "" {
			continue
		}
		a := e.m[pv.ID]
		if a == nil || a.addr != pv.EngineAddr {
			a = &engineAddr{addr: pv.EngineAddr}
			e.m[pv.ID] = a
		}
		a.seen = now
		if a.reached || a.checking || pv.Engine != route.EngineServing || now.Sub(a.tried) < engineRecheck {
			continue
		}
		a.checking, a.tried = true, now
		go e.check(ctx, pv.ID, a) // ends within engineDial
	}
	for id, a := range e.m {
		if now.Sub(a.seen) > engineForget {
			delete(e.m, id)
		}
	}
}

func (e *engines) check(ctx context.Context, node string, a *engineAddr) {
	err := e.connect(ctx, a.addr)
	e.mu.Lock()
	a.checking = false
	a.reached = a.reached || err == nil
	e.mu.Unlock()
}

// connect dials addr and hangs up, within engineDial.
func (e *engines) connect(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, engineDial)
	defer cancel()
	c, err := e.dial(ctx, "tcp", addr)
	if err == nil {
		c.Close()
	}
	return err
}

// noListener reports a dial that found no process listening at the
// address (refused), or no host there any more.
func noListener(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH)
}

// lookup returns node's engine address, and whether it was reached there.
func (e *engines) lookup(node string) (addr string, reached bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if a := e.m[node]; a != nil {
		return a.addr, a.reached
	}
	return "", false
}

// LocalEngineGone reports whether the local vLLM's address refuses
// connections: no process listens there, so none holds a store. A hung
// vLLM still accepts them. The sidecar asks as it leaves the mesh
// (gossip's SetStoreGone).
func (h *Handler) LocalEngineGone(ctx context.Context) bool { return h.localRefuses(ctx) }

// localRefuses is LocalEngineGone.
func (h *Handler) localRefuses(ctx context.Context) bool {
	return errors.Is(h.engines.connect(ctx, h.cfg.VLLM.Host), syscall.ECONNREFUSED)
}

// EngineReached reports whether this front reached node's vLLM at the
// address its sidecar advertised (/debug/peers).
func (h *Handler) EngineReached(node string) bool {
	_, reached := h.engines.lookup(node)
	return reached
}

// directTarget is node's vLLM itself, where its sidecar advertised it,
// and whether this front reached it there; ok is false when no address
// is known.
func (h *Handler) directTarget(node string) (tg target, reached, ok bool) {
	addr, reached := h.engines.lookup(node)
	if addr == "" {
		return target{}, false, false
	}
	return target{Peer: node, URL: &url.URL{Scheme: "http", Host: addr}, Direct: true}, reached, true
}

// vanished is a holding: nothing listens where the engine was reached.
const vanished holding = absent + 1

// storeVanished reports whether p's last attempt, failed with err, was at a
// peer's vLLM itself that this front reached there before and where
// nothing listens now: the node and the address, the proof askEngine
// takes for a store that is gone.
func (h *Handler) storeVanished(p *plan, err error) (node, addr string, ok bool) {
	if p == nil || len(p.tried) == 0 || len(p.tried) > len(p.targets) || !noListener(err) {
		return "", "", false
	}
	tg := p.targets[len(p.tried)-1]
	if !tg.Direct || tg.Peer == "" {
		return "", "", false
	}
	known, reached := h.engines.lookup(tg.Peer)
	if !reached || known != tg.URL.Host {
		return "", "", false
	}
	return tg.Peer, known, true
}

// askEngine asks node's vLLM itself whether it holds response id. It
// answers unknown for an engine this sidecar never reached; vanished when
// the address refuses connections or has no host any more.
func (h *Handler) askEngine(ctx context.Context, node, id string) (target, holding) {
	tg, reached, ok := h.directTarget(node)
	if !ok {
		return target{}, unknown
	}
	hd, err := h.ask(ctx, tg, id)
	if hd == unknown && reached && noListener(err) {
		hd = vanished
	}
	h.metrics.storedProbes.WithLabelValues(engineResult[hd]).Inc()
	return tg, hd
}

// engineResult labels askEngine's answers in stored_response_probes_total.
var engineResult = map[holding]string{
	unknown: "engine_unknown", held: "engine_found", absent: "engine_not_found", vanished: "engine_vanished"}

// WatchEngines keeps the front's memory of peers' engine addresses
// (direct.go) until ctx ends, reading the peer table every interval.
func (h *Handler) WatchEngines(ctx context.Context, interval time.Duration) {
	if h.peers == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		h.engines.observe(ctx, h.peers.AppendSnapshot(nil, h.now()), h.now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
