package main

import (
	"context"
	"encoding/json"
	"github.com/kvroute/kvroute/prompt"
	"io"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/cachestate"
	"github.com/kvroute/kvroute/forward"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/route"
)

// admin serves the admin port: metrics, explanations, probes and drain.
// It is kept off the API port so clients of the Service cannot reach it.
type admin struct {
	cfg   config
	reg   *prometheus.Registry
	mesh  *gossip.Mesh
	front *forward.Handler
	cache *cachestate.State
	log   zerolog.Logger

	mu       sync.Mutex
	draining bool
}

func newAdmin(cfg config, reg *prometheus.Registry, mesh *gossip.Mesh, front *forward.Handler, cache *cachestate.State, log zerolog.Logger) *admin {
	return &admin{cfg: cfg, reg: reg, mesh: mesh, front: front, cache: cache, log: log}
}

func (a *admin) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	m.HandleFunc("GET /debug/peers", a.peers)
	m.HandleFunc("POST /debug/route", a.route)
	m.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	m.HandleFunc("GET /readyz", a.ready)
	// Draining changes state, so a plain GET only reports it. POST drains
	// and POST /undrain takes it back; GET /drain/prestop is for Kubernetes
	// preStop httpGet hooks, which can only GET, on a path nobody types to
	// look around.
	m.HandleFunc("GET /drain", a.drainStatus)
	m.HandleFunc("POST /drain", a.drainHTTP)
	m.HandleFunc("GET /drain/prestop", a.drainHTTP)
	m.HandleFunc("POST /undrain", a.undrainHTTP)
	// Profiles, on the admin port only (never on the API port clients reach).
	m.HandleFunc("GET /debug/pprof/", pprof.Index)
	m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	m.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	return m
}

// peerJSON is one /debug/peers entry. Load is the peer's load as this
// sidecar uses it: running and waiting are vLLM's scraped gauges, serving
// is the count the peer's sidecar pushes, fronted says that every request
// the peer serves passes a sidecar (so serving is exact and wins), and
// in_flight is what this sidecar sent the peer that its report does not
// count yet.
type peerJSON struct {
	ID     string   `json:"id"`
	Addr   string   `json:"addr"`
	Local  bool     `json:"local"`
	Engine string   `json:"engine"` // serving, starting, down: as the peer advertises it
	Models []string `json:"models,omitempty"`
	// ModelsTruncated: the peer serves more models than its meta lists.
	ModelsTruncated bool       `json:"models_truncated,omitempty"`
	KeyScheme       int        `json:"key_scheme"`
	HasDigest       bool       `json:"has_digest"` // a digest of the peer's current epoch is held
	DigestAgeS      float64    `json:"digest_age_s"`
	Load            route.Load `json:"load"`
	LoadAgeS        float64    `json:"load_age_s"`
	LastFailure     *time.Time `json:"last_failure,omitempty"`
	Draining        bool       `json:"draining"`
	// Excluded says why this sidecar chooses the peer for no request now
	// (route's rules: engine down, draining, silent, a failed forward);
	// empty while it is a candidate. Not set for this pod itself.
	Excluded string `json:"excluded,omitempty"`
	// Local entry only: why the engine is in its state, and how far the
	// local index can be trusted.
	EngineReason string `json:"engine_reason,omitempty"`
	Index        string `json:"index,omitempty"`
	KVEvents     string `json:"kv_events,omitempty"`
	// Sent counts the requests this sidecar has sent the peer (the local
	// entry: served here) by API, since it started.
	Sent map[string]uint64 `json:"sent,omitempty"`
	// EngineAddr is where the peer's vLLM itself listens, as its sidecar
	// advertises it; EngineReached says this sidecar reached it there,
	// so it asks that vLLM about stored responses while the peer's
	// sidecar is away (forward/direct.go).
	EngineAddr    string `json:"engine_addr,omitempty"`
	EngineReached bool   `json:"engine_reached,omitempty"`
	// Ranks, the local entry of a pod of several data-parallel ranks
	// only: each rank's requests and queued prefill as this sidecar, which
	// names the rank of every request it sends its vLLM, counts them.
	Ranks []route.RankLoad `json:"ranks,omitempty"`
}

func (a *admin) peers(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	inflight, sent := a.front.InFlight(), a.front.Sent()
	var out []peerJSON
	for _, p := range a.mesh.Snapshot(now) {
		j := peerJSON{ID: p.ID, Addr: p.Addr, Local: p.Local, Engine: p.Engine.String(), Models: p.Models, ModelsTruncated: p.ModelsTruncated,
			KeyScheme: p.KeyScheme, HasDigest: p.Digest != nil, Draining: p.Draining,
			Load: p.Load}
		if !p.Local {
			j.Excluded = a.front.Excluded(p, now)
			j.EngineAddr, j.EngineReached = p.EngineAddr, a.front.EngineReached(p.ID)
		}
		if p.Local {
			var st route.Engine
			st, j.EngineReason = a.cache.Engine()
			j.Engine = st.String()
			j.Index, j.KVEvents = a.cache.Health()
			j.Ranks = a.front.RankLoads(now)
		}
		if !p.DigestAt.IsZero() {
			j.DigestAgeS = now.Sub(p.DigestAt).Seconds()
		}
		if !p.LoadAt.IsZero() {
			j.LoadAgeS = now.Sub(p.LoadAt).Seconds()
		}
		if !p.LastFailure.IsZero() {
			t := p.LastFailure
			j.LastFailure = &t
		}
		id := p.ID
		if p.Local {
			id = ""
		}
		j.Load.InFlight = inflight[id]
		j.Sent = sent[id]
		out = append(out, j)
	}
	writeJSONBody(w, http.StatusOK, out)
}

// route explains the choice for a request body. ?api= names its API
// (chat, completions, messages, responses); without it a body with
// "input" is a Responses request, one with a top-level "system" a Messages
// request, one with "messages" a chat completion (a Messages body without
// a system prompt needs ?api=messages), any other a completion.
func (a *admin) route(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	api, ok := explainAPI(r.URL.Query().Get("api"), body)
	if !ok {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"error": "api: want chat, completions, messages or responses"})
		return
	}
	d, nkeys, err := a.front.Explain(r.Context(), body, api)
	if err != nil {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	if r.URL.Query().Get("format") == "text" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, d.Table())
		return
	}
	writeJSONBody(w, http.StatusOK, map[string]any{"api": api.String(), "keys": nkeys, "decision": d, "table": d.Table()})
}

// explainAPI is the API /debug/route explains a body as.
func explainAPI(name string, body []byte) (prompt.API, bool) {
	for _, a := range []prompt.API{prompt.APIChat, prompt.APICompletions, prompt.APIMessages, prompt.APIResponses} {
		if name == a.String() {
			return a, true
		}
	}
	if name != "" {
		return 0, false
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
		Input    json.RawMessage `json:"input"`
		System   json.RawMessage `json:"system"`
	}
	_ = json.Unmarshal(body, &probe) // only a hint; Explain reports bad JSON
	switch {
	case len(probe.Input) > 0:
		return prompt.APIResponses, true
	case len(probe.System) > 0: // a chat has no top-level system; Messages mostly does
		return prompt.APIMessages, true
	case len(probe.Messages) > 0:
		return prompt.APIChat, true
	}
	return prompt.APICompletions, true
}

// ready answers 200 while this pod should get traffic: not draining and its
// engine serving. A degraded cache view (load-only routing) is still ready;
// its lines follow "ok" in the body.
func (a *admin) ready(w http.ResponseWriter, _ *http.Request) {
	if a.isDraining() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	if st, why := a.cache.Engine(); st != route.EngineServing {
		http.Error(w, "engine "+st.String()+": "+why, http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
	for _, d := range a.cache.Degraded() {
		io.WriteString(w, "degraded: "+d+"\n")
	}
}

func (a *admin) isDraining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

func (a *admin) drainStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSONBody(w, http.StatusOK, map[string]any{"draining": a.isDraining(), "inflight": a.front.InFlight(),
		"hint": "POST /drain to drain, POST /undrain to take it back"})
}

func (a *admin) drainHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	err := a.drain(r.Context())
	res := map[string]any{"drained": err == nil, "seconds": time.Since(start).Seconds(), "inflight": a.front.InFlight()}
	if err != nil {
		res["error"] = err.Error()
		writeJSONBody(w, http.StatusServiceUnavailable, res)
		return
	}
	writeJSONBody(w, http.StatusOK, res)
}

func (a *admin) undrainHTTP(w http.ResponseWriter, _ *http.Request) {
	a.setDraining(false)
	writeJSONBody(w, http.StatusOK, map[string]any{"draining": false})
}

// setDraining advertises the drain to peers (they stop choosing this node)
// and makes the front refuse forwards and /readyz fail, or takes all that
// back.
func (a *admin) setDraining(d bool) {
	a.mu.Lock()
	changed := a.draining != d
	a.draining = d
	a.mu.Unlock()
	if !changed {
		return
	}
	a.front.SetDraining(d)
	a.mesh.SetDraining(d)
	if d {
		a.log.Info().Msg("draining: refusing forwards, peers told")
	} else {
		a.log.Info().Msg("drain taken back: serving again")
	}
}

// drain refuses new forwards and waits (up to the drain timeout) for the
// requests in flight. Peers stop choosing this node when they see the
// draining flag; the node leaves the mesh only when it stops.
func (a *admin) drain(ctx context.Context) error {
	a.setDraining(true)
	wctx, cancel := context.WithTimeout(ctx, a.cfg.DrainTimeout)
	defer cancel()
	err := a.front.Wait(wctx)
	a.log.Info().Err(err).Msg("drain finished")
	return err
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
