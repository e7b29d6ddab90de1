package forward

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// Stored is the mesh's map of stored responses to the pods that hold them;
// *gossip.Mesh satisfies it. vLLM keeps its Responses store
// (VLLM_ENABLE_RESPONSES_API_STORE=1) in one process's memory, so a
// follow-up naming previous_response_id, GET /v1/responses/{id} and its
// cancel are served correctly by that pod alone: routing them there is
// serving, not an optimisation (docs/design.md D11).
type Stored interface {
	// AnnounceResponses tells every member that this pod holds ids.
	AnnounceResponses(ids ...string)
	// ResponseOwner returns the node that created id, whether it is a live
	// member now, and whether any node is known to hold it.
	ResponseOwner(id string) (node string, alive, ok bool)
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

// maxResponseID bounds the ids the front looks up (vLLM's are resp_ and 32
// hex digits).
const maxResponseID = 128

// serveContinued serves a Responses request that continues a stored one:
// on the pod holding it, whichever sidecar the Service picked.
func (h *Handler) serveContinued(c *gin.Context, body []byte, st *reqState, id string) {
	tg, status, msg := h.storedTarget(c.Request.Context(), id)
	if status != 0 {
		h.metrics.badRequests.WithLabelValues("stored_gone", st.api.String()).Inc()
		writeError(c, status, msg)
		return
	}
	h.routeStored(c, st, tg)
	h.serve(c, body, st, []target{tg})
}

// serveStored serves GET /v1/responses/{id} and POST .../{id}/cancel from
// the pod that holds the response (locally when forwarded here).
func (h *Handler) serveStored(c *gin.Context) {
	h.active.Add(1)
	defer h.active.Done()
	c.Set(apiKey, prompt.APIResponses)
	r := c.Request
	now := h.now()
	st := &reqState{id: h.requestID(r), api: prompt.APIResponses, arrived: now, started: now}
	if _, ok := h.trustedHop(r, st.id); ok {
		st.reason = "hop"
		h.metrics.decisions.WithLabelValues("local", "hop", st.api.String()).Inc()
		h.serveFrom(c, &plan{targets: []target{{URL: h.cfg.VLLM}}, served: -1}, st)
		return
	}
	if h.stored == nil {
		h.Passthrough(c)
		return
	}
	tg, status, msg := h.storedTarget(r.Context(), c.Param("id"))
	if status != 0 {
		h.metrics.badRequests.WithLabelValues("stored_gone", st.api.String()).Inc()
		writeError(c, status, msg)
		return
	}
	h.routeStored(c, st, tg)
	h.serveFrom(c, &plan{targets: []target{tg}, served: -1}, st)
}

// routeStored labels and counts a request pinned to tg.
func (h *Handler) routeStored(c *gin.Context, st *reqState, tg target) {
	st.reason, st.routed = ReasonStored, h.now()
	st.decision = route.Decision{Target: tg.Peer, Local: tg.Peer == "", Reason: ReasonStored}
	outcome := "local"
	if tg.Peer != "" {
		outcome = "forwarded"
		c.Request.Header.Set(PinnedHeader, "1")
	}
	h.metrics.decisions.WithLabelValues(outcome, ReasonStored, st.api.String()).Inc()
}

// storedTarget is where the response id is stored: the pod the mesh's map
// names, or, when it names none, the pod that answers a probe; the local
// vLLM when nobody knows it (it answers vLLM's own 404). A response whose
// pod has left the mesh gets a 404 that says so, as vLLM would answer for
// an id it does not hold.
func (h *Handler) storedTarget(ctx context.Context, id string) (tg target, status int, msg string) {
	local := target{URL: h.cfg.VLLM}
	if id == "" || len(id) > maxResponseID {
		return local, 0, ""
	}
	node, alive, ok := h.stored.ResponseOwner(id)
	if ok && !alive {
		return target{}, http.StatusNotFound,
			fmt.Sprintf("Response with id '%s' not found: it was stored on pod %s, which is gone", id, node)
	}
	if ok {
		if t, found := h.peerTarget(node); found {
			return t, 0, ""
		}
	}
	if t, found := h.probe(ctx, id); found {
		return t, 0, ""
	}
	return local, 0, ""
}

// peerTarget is where to send a request for node (this node: the local
// vLLM); found is false when the peer table has no address for it.
func (h *Handler) peerTarget(node string) (target, bool) {
	if node == h.cfg.Self {
		return target{URL: h.cfg.VLLM}, true
	}
	if h.peers == nil {
		return target{}, false
	}
	for _, pv := range h.peers.Snapshot(h.now()) {
		if pv.ID == node && pv.Addr != "" {
			return target{Peer: node, URL: &url.URL{Scheme: "http", Host: pv.Addr}}, true
		}
	}
	return target{}, false
}

// probe asks the local vLLM and every live peer, at once, whether it holds
// id (GET /v1/responses/{id}); the first to answer 200 is the target.
func (h *Handler) probe(ctx context.Context, id string) (target, bool) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	tgs := []target{{URL: h.cfg.VLLM}}
	if h.peers != nil {
		for _, pv := range h.peers.Snapshot(h.now()) {
			if !pv.Local && pv.Addr != "" && pv.Engine == route.EngineServing {
				tgs = append(tgs, target{Peer: pv.ID, URL: &url.URL{Scheme: "http", Host: pv.Addr}})
			}
		}
	}
	found := make(chan target, len(tgs))
	for _, tg := range tgs {
		go func() { // ends within probeTimeout
			if h.holds(ctx, tg, id) {
				found <- tg
			} else {
				found <- target{}
			}
		}()
	}
	for range tgs {
		if t := <-found; t.URL != nil {
			h.metrics.storedProbes.WithLabelValues("found").Inc()
			return t, true
		}
	}
	h.metrics.storedProbes.WithLabelValues("not_found").Inc()
	return target{}, false
}

func (h *Handler) holds(ctx context.Context, tg target, id string) bool {
	u := *tg.URL
	u.Path = "/v1/responses/" + url.PathEscape(id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false
	}
	if tg.Peer != "" {
		req.Header.Set(HopHeader, h.hop.Sign(h.cfg.Self, tg.Peer, h.now()))
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// explainStored is the decision for a request about a stored response.
func (h *Handler) explainStored(ctx context.Context, id string) route.Decision {
	tg, status, msg := h.storedTarget(ctx, id)
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
