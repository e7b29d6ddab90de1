package forward

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/respown"
	"github.com/kvroute/kvroute/route"
)

// Stored is the mesh's map of stored responses to the pods that hold them;
// *gossip.Mesh satisfies it. vLLM keeps its Responses store
// (VLLM_ENABLE_RESPONSES_API_STORE=1) in one process's memory, so a
// follow-up naming previous_response_id, GET /v1/responses/{id} and its
// cancel are served correctly by that pod alone: routing them there is
// serving, not an optimisation (docs/design.md D11).
type Stored interface {
	// AnnounceResponsesOf tells every member that node's pod holds ids:
	// this one's, or a peer's whose vLLM made them when this front sent it
	// their requests directly, past a sidecar that never saw them.
	AnnounceResponsesOf(node string, ids ...string)
	// LookupResponse returns the node that created id, whether it is in
	// the mesh, away (left a moment ago: it may be back with its store)
	// or gone, and when the entry was recorded; ok is false when no node
	// is known to hold it.
	LookupResponse(id string) (l respown.Lookup, ok bool)
	// AwayNodes returns the nodes that left a moment ago and may be back
	// with responses this map never heard of.
	AwayNodes() []string
}

// SetStored makes the front send requests about stored responses to the
// pod that holds them (call before serving).
func (h *Handler) SetStored(s Stored) { h.stored = s }

// ReasonStored is the routing reason of a request about a stored response.
const ReasonStored = "stored"

// PinnedHeader marks a forwarded request that only its target can serve
// (a stored response's): the target passes vLLM's 404 on to the client
// instead of refusing the hop so that the sender tries another pod.
const PinnedHeader = "X-Kvroute-Pinned"

// probeTimeout bounds asking every pod whether it holds a response that
// the mesh's map does not know (created a moment ago through another
// sidecar, or before this sidecar started).
const probeTimeout = time.Second

// storedWait is how long the entry holds a request about a stored response
// whose pod cannot serve it now but may soon (its sidecar restarting, its
// engine hung, the pod unreachable), asking again every storedPoll, before
// it answers a retryable 503. A restarting sidecar was back ~2 s after it
// left (chaos restart-sidecar); the SDKs' two retries add 0.5 s and 1 s
// waits, so three held attempts cover about 10 s. It costs a held
// connection per such request, and the client's first answer comes up to
// this late.
const (
	storedWait = 3 * time.Second
	storedPoll = 250 * time.Millisecond
)

// storedRetryAfter is the Retry-After of a retryable answer about a stored
// response, in seconds (the SDKs honour it).
const storedRetryAfter = "1"

// maxResponseID bounds the ids the front looks up (vLLM's are resp_ and 32
// hex digits).
const maxResponseID = 128

// serveContinued serves a Responses request that continues a stored one:
// on the pod holding it, whichever sidecar the Service picked.
func (h *Handler) serveContinued(c *gin.Context, body []byte, st *reqState, id string) {
	tg, status, msg := h.storedTarget(c.Request.Context(), id, storedWait)
	if status != 0 {
		h.storedError(c, st, status, msg)
		return
	}
	h.routeStored(c, st, tg)
	h.serve(c, body, st, h.storedPlan(tg))
}

// storedPlan is the targets of a request that only tg's pod can serve:
// tg, and when tg is a peer's sidecar whose vLLM address is known, that
// vLLM itself if the sidecar cannot be connected to. A sidecar killed a
// moment ago is still in the mesh for a second or two, and each entry
// sidecar learns it is dead only by failing to reach it: without this,
// every client retry that entered another sidecar failed the same way
// (chaos agentic-faults: a read of a killed sidecar's store lost after
// its three attempts, all within 1.5 s of the kill).
func (h *Handler) storedPlan(tg target) []target {
	if tg.Peer == "" || tg.Direct {
		return []target{tg}
	}
	d, _, ok := h.directTarget(tg.Peer)
	if !ok {
		return []target{tg}
	}
	d.AfterDial = true
	return []target{tg, d}
}

// serveStored serves GET /v1/responses/{id} and POST .../{id}/cancel from
// the pod that holds the response (locally when forwarded here).
func (h *Handler) serveStored(c *gin.Context) {
	h.active.Add(1)
	defer h.active.Done()
	r := c.Request
	now := h.now()
	st := &reqState{id: h.requestID(r), api: prompt.APIResponses, arrived: now, started: now}
	if _, ok := h.trustedHop(r, &st.id); ok {
		st.reason = "hop"
		h.metrics.decisions.WithLabelValues("local", "hop", st.api.String()).Inc()
		h.serveFrom(c, &plan{targets: []target{{URL: h.cfg.VLLM}}, served: -1}, st)
		return
	}
	if h.stored == nil {
		h.Passthrough(c)
		return
	}
	tg, status, msg := h.storedTarget(r.Context(), c.Param("id"), storedWait)
	if status != 0 {
		h.storedError(c, st, status, msg)
		return
	}
	h.routeStored(c, st, tg)
	h.serveFrom(c, &plan{targets: h.storedPlan(tg), served: -1}, st)
}

// storedError answers a request about a stored response that the front
// itself answers: a 404 for one that is gone, a retryable 503 otherwise.
func (h *Handler) storedError(c *gin.Context, st *reqState, status int, msg string) {
	reason := "stored_gone"
	if status == http.StatusServiceUnavailable {
		reason = "stored_unreachable"
		c.Header("Retry-After", storedRetryAfter)
	}
	h.metrics.badRequests.WithLabelValues(reason, st.api.String()).Inc()
	writeError(c, status, msg)
}

// routeStored labels and counts a request pinned to tg.
func (h *Handler) routeStored(c *gin.Context, st *reqState, tg target) {
	st.reason, st.routed = ReasonStored, h.now()
	st.decision = route.Decision{Target: tg.Peer, Local: tg.Peer == "", Reason: ReasonStored}
	outcome := "local"
	switch {
	case tg.Direct:
		outcome = "direct" // its sidecar is away
	case tg.Peer != "":
		outcome = "forwarded"
		c.Request.Header.Set(PinnedHeader, "1")
	}
	h.metrics.decisions.WithLabelValues(outcome, ReasonStored, st.api.String()).Inc()
}

// storedTarget is where the response id is stored (locateStored), asked
// again every storedPoll for up to wait while the answer is a retryable
// 503: the pod that holds it may be back within it.
func (h *Handler) storedTarget(ctx context.Context, id string, wait time.Duration) (tg target, status int, msg string) {
	deadline := h.now().Add(wait)
	for {
		tg, status, msg = h.locateStored(ctx, id)
		left := deadline.Sub(h.now())
		if status != http.StatusServiceUnavailable || left <= 0 {
			return tg, status, msg
		}
		t := time.NewTimer(min(storedPoll, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return tg, status, msg
		case <-t.C:
		}
	}
}

// locateStored is where the response id is stored, or the front's own
// answer (status not 0). The rule: a response is gone (a final 404) only
// when its engine's memory is known to be gone: its pod left the mesh
// respown.DefaultGrace ago or more, its engine began anew after the entry
// was recorded and no longer holds it, or, asked itself while its sidecar
// is away or not answering (direct.go), that engine does not hold it or
// no longer listens. Such an engine that holds it serves the request, as
// a draining pod does while its vLLM lives. While its pod may still hold
// it otherwise (the pod away, its engine hung, or not answering since a
// forward to it failed), the answer is a retryable 503. An id the map does not know goes to the pod that
// answers a probe; when every pod answered that it does not hold it and
// none is away, to the local vLLM, whose 404 says so; else a 503.
func (h *Handler) locateStored(ctx context.Context, id string) (tg target, status int, msg string) {
	local := target{URL: h.cfg.VLLM}
	if id == "" || len(id) > maxResponseID {
		return local, 0, ""
	}
	l, ok := h.stored.LookupResponse(id)
	if !ok {
		return h.probeUnknown(ctx, id)
	}
	switch l.Status {
	case respown.Gone:
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored on pod %s, which is gone", id, l.Node)
	case respown.Away:
		if tg, status, msg, ok := h.storedDirect(ctx, l.Node, id); ok {
			return tg, status, msg
		}
		return target{}, http.StatusServiceUnavailable,
			fmt.Sprintf("the pod that stores response '%s' (%s) left the mesh %s ago and may be back: retry",
				id, l.Node, h.now().Sub(l.Left).Round(100*time.Millisecond))
	}
	tg, pv, found := h.peerTarget(l.Node)
	if found && pv.StoreGone {
		// Its sidecar said so as it left, and the leaving has not reached
		// us yet (a gossip round; seconds when the message is lost).
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored on pod %s, which is gone (its vLLM exited)", id, l.Node)
	}
	if d, ok := h.pastDrain(tg, pv); ok { // not found: tg has no Peer
		return d, 0, ""
	}
	switch {
	case !found:
		if tg, status, msg, ok := h.storedDirect(ctx, l.Node, id); ok {
			return tg, status, msg
		}
		return target{}, http.StatusServiceUnavailable,
			fmt.Sprintf("the pod that stores response '%s' (%s) has no address here yet: retry", id, l.Node)
	case pv.Engine != route.EngineServing:
		// A hung engine does not answer; a dead one no longer listens, and
		// its sidecar, asked, says so.
		hd := h.holds(ctx, tg, id)
		if tg.Peer == "" && hd == unknown && h.localRefuses(ctx) {
			hd = absent // this pod's own vLLM is not running
		}
		switch hd {
		case held: // its meta is behind: it serves again
			return tg, 0, ""
		case absent:
			return target{}, http.StatusNotFound,
				fmt.Sprintf("Response with id '%s' not found: it was stored in the engine of pod %s, which is gone (it is not running)", id, l.Node)
		}
		if _, status, msg, ok := h.storedDirect(ctx, l.Node, id); ok && status != 0 {
			return target{}, status, msg
		}
		return target{}, http.StatusServiceUnavailable,
			fmt.Sprintf("the engine of the pod that stores response '%s' (%s) is %s: retry", id, l.Node, pv.Engine)
	}
	// Its cache began anew since the entry (l.At is rounded down, so this
	// also asks about some made just after): a restarted engine has an
	// empty store, a resumed hang or a restarted sidecar the old one; only
	// the engine can tell. A forward to it failed a moment ago: its sidecar
	// may be dead and not yet out of the mesh (memberlist takes seconds).
	renewed := !pv.Since.IsZero() && !pv.Since.Before(l.At)
	failed := tg.Peer != "" && !pv.LastFailure.IsZero() && h.now().Sub(pv.LastFailure) < h.cfg.Route.FailFor
	if !renewed && !failed {
		return tg, 0, ""
	}
	switch h.holds(ctx, tg, id) {
	case held:
		return tg, 0, ""
	case absent:
		if !renewed {
			return tg, 0, "" // its own 404 is the answer
		}
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored in the engine of pod %s, which is gone (it restarted)", id, l.Node)
	}
	if tg.Peer != "" {
		if tg, status, msg, ok := h.storedDirect(ctx, l.Node, id); ok {
			return tg, status, msg
		}
	}
	return target{}, http.StatusServiceUnavailable,
		fmt.Sprintf("the pod that stores response '%s' (%s) did not answer: retry", id, l.Node)
}

// pastDrain is the vLLM itself of tg's pod when tg is its sidecar and that
// sidecar drains (a restart, or the pod's deletion, whose vLLM serves on
// through the drain) while the engine serves: a stream through the sidecar
// would be cut when it exits, and each one it takes makes its drain
// longer. Every way the front finds a stored response's pod (the map, a
// probe) asks it.
func (h *Handler) pastDrain(tg target, pv route.PeerView) (target, bool) {
	if tg.Peer == "" || tg.Direct || !pv.Draining || pv.Engine != route.EngineServing {
		return target{}, false
	}
	d, _, ok := h.directTarget(tg.Peer)
	return d, ok
}

// storedDirect asks node's vLLM itself about response id (askEngine): ok
// when it told, with the target that serves it or the final 404.
func (h *Handler) storedDirect(ctx context.Context, node, id string) (tg target, status int, msg string, ok bool) {
	if node == h.cfg.Self {
		return target{}, 0, "", false
	}
	tg, hd := h.askEngine(ctx, node, id)
	switch hd {
	case held:
		return tg, 0, "", true
	case absent:
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored in the engine of pod %s, which is gone (it restarted: it no longer holds it)", id, node), true
	case vanished:
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored on pod %s, which is gone (its engine no longer listens at %s)", id, node, tg.URL.Host), true
	}
	return target{}, 0, "", false
}

// peerTarget is where to send a request for node (this node: the local
// vLLM) and its view; found is false when the peer table has no address
// for it. This node without a peer table is taken as serving.
func (h *Handler) peerTarget(node string) (target, route.PeerView, bool) {
	self := node == h.cfg.Self
	if h.peers == nil {
		return target{URL: h.cfg.VLLM}, route.PeerView{ID: node, Local: true, Engine: route.EngineServing}, self
	}
	for _, pv := range h.peers.AppendSnapshot(nil, h.now()) {
		switch {
		case pv.ID != node:
		case self || pv.Local:
			return target{URL: h.cfg.VLLM}, pv, true
		case pv.Addr != "":
			return target{Peer: node, URL: &url.URL{Scheme: "http", Host: pv.Addr}}, pv, true
		}
	}
	if self {
		return target{URL: h.cfg.VLLM}, route.PeerView{ID: node, Local: true, Engine: route.EngineServing}, true
	}
	return target{}, route.PeerView{}, false
}

// probeUnknown locates a response the map does not know (locateStored).
func (h *Handler) probeUnknown(ctx context.Context, id string) (target, int, string) {
	tg, pv, found, complete := h.probe(ctx, id)
	switch {
	case found:
		if d, ok := h.pastDrain(tg, pv); ok {
			return d, 0, ""
		}
		return tg, 0, ""
	case !complete:
		return target{}, http.StatusServiceUnavailable,
			fmt.Sprintf("response '%s' is not known to the mesh, and not every pod could be asked: retry", id)
	}
	if away := h.stored.AwayNodes(); len(away) > 0 {
		return target{}, http.StatusServiceUnavailable,
			fmt.Sprintf("response '%s' is not known to the mesh, and pods that left a moment ago may hold it (%s): retry",
				id, strings.Join(away, ", "))
	}
	return target{URL: h.cfg.VLLM}, 0, ""
}

// probe asks the local vLLM and every peer with an address, at once,
// whether it holds id (GET /v1/responses/{id}); the first to answer 200 is
// the target, with its view. complete is true when every one answered that
// it does not (404).
func (h *Handler) probe(ctx context.Context, id string) (tg target, pv route.PeerView, found, complete bool) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	type asked struct {
		tg target
		pv route.PeerView
	}
	tgs := []asked{{tg: target{URL: h.cfg.VLLM}}}
	if h.peers != nil {
		for _, pv := range h.peers.AppendSnapshot(nil, h.now()) {
			// Whatever its engine's state: a sidecar restarting serves a
			// read of its store before it is ready, and one that cannot
			// answer makes the probe incomplete.
			if !pv.Local && pv.Addr != "" {
				tgs = append(tgs, asked{target{Peer: pv.ID, URL: &url.URL{Scheme: "http", Host: pv.Addr}}, pv})
			}
		}
	}
	type answer struct {
		asked
		h holding
	}
	answers := make(chan answer, len(tgs))
	for _, a := range tgs {
		go func() { // ends within probeTimeout
			answers <- answer{a, h.holds(ctx, a.tg, id)}
		}()
	}
	complete = true
	for range tgs {
		a := <-answers
		switch a.h {
		case held:
			h.metrics.storedProbes.WithLabelValues("found").Inc()
			return a.tg, a.pv, true, false
		case unknown:
			complete = false
		}
	}
	if complete {
		h.metrics.storedProbes.WithLabelValues("not_found").Inc()
	} else {
		h.metrics.storedProbes.WithLabelValues("incomplete").Inc()
	}
	return target{}, route.PeerView{}, false, complete
}

// holding is what a pod answered about a stored response.
type holding uint8

const (
	unknown holding = iota // no answer, or one that does not tell
	held                   // 200
	absent                 // 404: its vLLM does not hold it
)

// holds asks tg whether it holds id, for up to probeTimeout. A peer is
// asked through its sidecar with a pinned hop, so that vLLM's 404 comes
// back as it is.
func (h *Handler) holds(ctx context.Context, tg target, id string) holding {
	hd, _ := h.ask(ctx, tg, id)
	return hd
}

// ask is holds with the error of a request that got no answer. A direct
// target (a peer's vLLM itself) is asked without hop headers.
func (h *Handler) ask(ctx context.Context, tg target, id string) (holding, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	u := *tg.URL
	u.Path = "/v1/responses/" + url.PathEscape(id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return unknown, err
	}
	if tg.Peer != "" && !tg.Direct {
		req.Header.Set(HopHeader, h.hop.Sign(h.cfg.Self, tg.Peer, h.now()))
		req.Header.Set(PinnedHeader, "1")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return unknown, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return held, nil
	case http.StatusNotFound:
		return absent, nil
	}
	return unknown, nil
}

// explainStored is the decision for a request about a stored response.
func (h *Handler) explainStored(ctx context.Context, id string) route.Decision {
	tg, status, msg := h.storedTarget(ctx, id, 0)
	if status != 0 {
		return route.Decision{Reason: ReasonStored, Note: msg}
	}
	d := route.Decision{Target: tg.Peer, Local: tg.Peer == "", Reason: ReasonStored,
		Note: "previous_response_id " + strconv.Quote(id) + " is stored there"}
	if d.Local {
		d.Target = h.cfg.Self
	}
	return d
}

// idTap passes a Responses answer through and calls found once with the
// response's id: the first "id" member of the body, which is the
// response's own in the JSON object and in a stream's response.created
// event. It looks at the first maxIDScan bytes only.
type idTap struct {
	rc    io.ReadCloser
	buf   []byte
	done  bool
	found func(string)
}

const maxIDScan = 16 << 10

func (t *idTap) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if !t.done && n > 0 {
		t.buf = append(t.buf, p[:n]...)
		if id, ok := firstID(t.buf); ok {
			t.done = true
			t.buf = nil
			if id != "" {
				t.found(id)
			}
		} else if len(t.buf) > maxIDScan {
			t.done, t.buf = true, nil
		}
	}
	return n, err
}

func (t *idTap) Close() error { return t.rc.Close() }

// firstID finds the value of the first "id" member in b. ok is false when b
// may still be too short to tell; id is "" when it is not a string.
func firstID(b []byte) (id string, ok bool) {
	const key = `"id"`
	for from := 0; ; {
		i := bytes.Index(b[from:], []byte(key))
		if i < 0 {
			return "", false
		}
		j := from + i + len(key)
		j = skipSpace(b, j)
		if j >= len(b) {
			return "", false
		}
		if b[j] != ':' {
			from = j // "id" was a value, not a member name
			continue
		}
		j = skipSpace(b, j+1)
		if j >= len(b) {
			return "", false
		}
		if b[j] != '"' {
			return "", true
		}
		end := bytes.IndexByte(b[j+1:], '"')
		if end < 0 {
			return "", len(b)-j > maxResponseID
		}
		v := b[j+1 : j+1+end]
		if len(v) > maxResponseID || bytes.IndexByte(v, '\\') >= 0 {
			return "", true
		}
		return string(v), true
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
