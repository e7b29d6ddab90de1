package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

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
	log   zerolog.Logger

	once     sync.Once
	started  chan struct{} // closed when draining begins
	drainErr error
}

func newAdmin(cfg config, reg *prometheus.Registry, mesh *gossip.Mesh, front *forward.Handler, log zerolog.Logger) *admin {
	return &admin{cfg: cfg, reg: reg, mesh: mesh, front: front, log: log, started: make(chan struct{})}
}

func (a *admin) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{Registry: a.reg}))
	m.HandleFunc("GET /debug/peers", a.peers)
	m.HandleFunc("POST /debug/route", a.route)
	m.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	m.HandleFunc("GET /readyz", a.ready)
	// POST is the API; GET exists for Kubernetes preStop httpGet hooks.
	m.HandleFunc("POST /drain", a.drainHTTP)
	m.HandleFunc("GET /drain", a.drainHTTP)
	// Profiles, on the admin port only (never on the API port clients reach).
	m.HandleFunc("GET /debug/pprof/", pprof.Index)
	m.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	return m
}

type peerJSON struct {
	ID     string   `json:"id"`
	Addr   string   `json:"addr"`
	Local  bool     `json:"local"`
	Models []string `json:"models,omitempty"`
	// ModelsTruncated: the peer serves more models than its meta lists.
	ModelsTruncated bool       `json:"models_truncated,omitempty"`
	KeyScheme       int        `json:"key_scheme"`
	HasDigest       bool       `json:"has_digest"`
	DigestAgeS      float64    `json:"digest_age_s"`
	Load            route.Load `json:"load"`
	LoadAgeS        float64    `json:"load_age_s"`
	LastFailure     *time.Time `json:"last_failure,omitempty"`
	Draining        bool       `json:"draining"`
}

func (a *admin) peers(w http.ResponseWriter, _ *http.Request) {
	now := time.Now()
	inflight := a.front.InFlight()
	var out []peerJSON
	for _, p := range a.mesh.Snapshot(now) {
		j := peerJSON{ID: p.ID, Addr: p.Addr, Local: p.Local, Models: p.Models, ModelsTruncated: p.ModelsTruncated, KeyScheme: p.KeyScheme,
			HasDigest: p.Digest != nil, Load: p.Load, Draining: p.Draining}
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
		out = append(out, j)
	}
	writeJSONBody(w, http.StatusOK, out)
}

// route explains the choice for a request body. ?api=chat or a body with
// "messages" is treated as a chat completion.
func (a *admin) route(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	var probe struct {
		Messages json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(body, &probe) // only a hint; Explain reports bad JSON
	chat := r.URL.Query().Get("api") == "chat" || len(probe.Messages) > 0
	d, nkeys, err := a.front.Explain(r.Context(), body, chat)
	if err != nil {
		writeJSONBody(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	if r.URL.Query().Get("format") == "text" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, d.Table())
		return
	}
	writeJSONBody(w, http.StatusOK, map[string]any{"keys": nkeys, "decision": d, "table": d.Table()})
}

func (a *admin) ready(w http.ResponseWriter, _ *http.Request) {
	select {
	case <-a.started:
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	default:
	}
	io.WriteString(w, "ok\n")
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

// drain leaves the mesh, refuses new forwards and waits (up to the drain
// timeout) for requests in flight. It runs once; later calls wait for the
// first to finish.
func (a *admin) drain(ctx context.Context) error {
	a.once.Do(func() {
		close(a.started)
		a.log.Info().Msg("draining: refusing forwards, leaving the mesh")
		a.front.SetDraining(true)
		a.mesh.SetDraining(true)
		if lerr := a.mesh.Leave(5 * time.Second); lerr != nil {
			a.log.Warn().Err(lerr).Msg("leave mesh")
		}
		wctx, cancel := context.WithTimeout(ctx, a.cfg.DrainTimeout)
		defer cancel()
		a.drainErr = a.front.Wait(wctx)
		a.log.Info().Err(a.drainErr).Msg("drain finished")
	})
	return a.drainErr
}

func writeJSONBody(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
