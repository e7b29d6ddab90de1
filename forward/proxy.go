package forward

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync/atomic"
	"time"
)

// target is one place a request may be served: a peer's sidecar (with a hop
// header, so it serves locally) or this pod's own vLLM.
type target struct {
	Peer string // node name; "" for the local vLLM
	URL  *url.URL
	// Prefill is the prompt tokens the target must compute, as the choice
	// predicted them: queued work there until the first answer byte.
	Prefill int
	// PrefillFor is how long that should take there, for an answer whose
	// first byte comes only at its end; 0 for a stream.
	PrefillFor time.Duration
	// Rank is RankHeader's value for the target's vLLM; "" leaves it be.
	Rank string
	// Prompt is the request's prompt tokens: what a data-parallel rank
	// that does not hold its prefix computes (placeRank).
	Prompt int
	// Direct: URL is Peer's vLLM itself, not its sidecar (direct.go).
	Direct bool
	// AfterDial: tried only when the attempt before it could not connect,
	// so nothing of the request was sent (a stored response's pod whose
	// sidecar just died, its vLLM alive: stored.go).
	AfterDial bool
}

// plan is one request's ordered list of targets, shared between the handler
// and the transport through the request context (reqState.plan). The
// transport records which target served.
type plan struct {
	targets []target
	// body is the request body, sent to every attempt; or stream, read
	// once by the only attempt (a hop's body passing through). length is
	// the body's size, -1 if unknown.
	body   []byte
	stream io.Reader
	length int64
	served int // index into targets; -1 until an attempt gets a response
	tried  []string
	// wrote is when the last attempt's request was written out (Unix
	// ns; the transport's write loop sets it through trace).
	wrote atomic.Int64
	trace httptrace.ClientTrace
}

// attempts is an http.RoundTripper that walks a request's plan: it tries
// each target in turn while retryable says the failure happened before the
// upstream could have started serving. ReverseProxy calls it once and writes
// nothing to the client until it returns, so every retry here is before the
// first response byte (docs/design.md D5).
type attempts struct {
	base  http.RoundTripper
	hop   Hop
	self  string
	retry RetryConfig
	now   func() time.Time
	// failed is told about a peer whose attempt failed, so routing avoids it.
	failed func(peer string, at time.Time)
	// localFailed, if set, is told of a local attempt that got no answer.
	localFailed func(error)
	// local, if set, lists the local attempts waiting for headers, so an
	// engine gone down abandons them (abandon.go).
	local *waiters
}

func (a *attempts) RoundTrip(r *http.Request) (*http.Response, error) {
	st, _ := r.Context().Value(stateKey{}).(*reqState)
	if st == nil || st.plan == nil {
		return a.base.RoundTrip(r)
	}
	p := st.plan
	// One trace for every attempt, set here because ReverseProxy's own,
	// which it composes with, is in r's context.
	p.trace = httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { p.wrote.Store(a.now().UnixNano()) },
	}
	traced := httptrace.WithClientTrace(r.Context(), &p.trace)
	var lastErr error
	for i, tg := range p.targets {
		if tg.AfterDial && !dialFailed(lastErr) {
			return nil, lastErr
		}
		// An attempt at the local engine runs under a context that
		// abandon cancels (abandon.go); the request is cloned once, under
		// the attempt's context.
		ctx, local := traced, tg.Peer == "" && a.local != nil
		var id uint64
		up := true
		if local {
			ctx, id, up = a.local.add(ctx)
		}
		out := r.Clone(ctx)
		out.URL.Scheme, out.URL.Host = tg.URL.Scheme, tg.URL.Host
		out.Host = tg.URL.Host
		out.Body, out.ContentLength = io.NopCloser(bytes.NewReader(p.body)), int64(len(p.body))
		if len(p.body) == 0 {
			out.Body = http.NoBody // a GET: no body, not one of unknown length
		}
		if p.stream != nil {
			out.Body, out.ContentLength = io.NopCloser(p.stream), p.length
		}
		out.Header.Del(HopHeader)
		out.Header.Del(PrefillHeader)
		out.Header.Del(RankChoiceHeader)
		if tg.Peer != "" && !tg.Direct {
			out.Header.Set(HopHeader, a.hop.Sign(a.self, tg.Peer, a.now()))
			out.Header.Set(PrefillHeader, prefillValue(tg))
			out.Header.Set(RankChoiceHeader, rankChoiceValue(tg))
		}
		setRank(out, tg)
		p.tried = append(p.tried, peerName(tg.Peer))
		var resp *http.Response
		var err error
		switch {
		case !up: // the local engine is down: a hung one would hold it
			err = errEngineDown
		case local:
			resp, err = a.roundTripLocal(out, r.Context(), id)
		default:
			resp, err = a.base.RoundTrip(out)
		}
		// A 503 is a refusal: a peer's sidecar that cannot serve, or a vLLM
		// whose engine is dead or restarting. Another pod may serve.
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable && i+1 < len(p.targets) && !p.targets[i+1].AfterDial {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			err = &UpstreamStatusError{Peer: peerName(tg.Peer), Status: resp.StatusCode}
		}
		if err == nil {
			p.served = i
			return resp, nil
		}
		lastErr = err
		if r.Context().Err() == nil {
			switch {
			case tg.Peer != "" && !tg.Direct && a.failed != nil:
				a.failed(tg.Peer, a.now())
			case tg.Peer == "" && a.localFailed != nil && err != errEngineDown: // the engine is known down
				a.localFailed(err)
			}
		}
		if !retryable(err, i, a.retry) {
			return nil, err
		}
	}
	return nil, lastErr
}

func peerName(p string) string {
	if p == "" {
		return "local"
	}
	return p
}
