package forward

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// TestDrainingPeerRefusesAndNextServes: a holder that drains refuses the
// hop with 503 and the refused header; the sender marks it failed and the
// next pod serves, and the handler still serves the draining pod's own
// clients.
func TestDrainingPeerRefusesAndNextServes(t *testing.T) {
	a, b, _ := threeNodes(t)
	b.h.SetDraining(true)
	resp := post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "c" || resp.Header.Get(DecisionHeader) != "affinity-retried" {
		t.Fatalf("status %d pod %q decision %q; want 200 from c, affinity-retried", resp.StatusCode, resp.Header.Get("X-Pod"), resp.Header.Get(DecisionHeader))
	}
	if len(a.peers.failed) != 1 || a.peers.failed[0] != "b" {
		t.Errorf("MarkFailed %v; want [b]", a.peers.failed)
	}
	valid := NewHop([]byte("k"), time.Minute).Sign("a", "b", time.Now())
	hop := post(t, b.srv.URL+"/v1/completions", `{"prompt":"x"}`, map[string]string{HopHeader: valid})
	if hop.StatusCode != 503 || hop.Header.Get(RefusedHeader) != "draining" {
		t.Errorf("hop to a draining node: %d, refused %q; want 503 draining", hop.StatusCode, hop.Header.Get(RefusedHeader))
	}
	own := post(t, b.srv.URL+"/v1/completions", `{"prompt":"x"}`, nil)
	if own.StatusCode != 200 || own.Header.Get("X-Pod") != "b" {
		t.Errorf("a draining node's own client: %d from %q; want 200 from b", own.StatusCode, own.Header.Get("X-Pod"))
	}
}

// gatedNode is a node whose vLLM runs handler instead of the stub.
func gatedNode(t *testing.T, handler http.HandlerFunc) *node {
	t.Helper()
	vllm := httptest.NewServer(handler)
	t.Cleanup(vllm.Close)
	u, _ := url.Parse(vllm.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey, cfg.Scheme = "a", u, "m", []byte("k"), perBlock
	fp := &fakePeers{views: []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, LoadAt: time.Now()}}}
	h := New(cfg, fp, byteTokenizer{}, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return &node{h: h, srv: srv, vllm: vllm, peers: fp}
}

// TestClientDisconnectCancelsUpstream: a client that goes away mid-answer
// cancels the request at vLLM (which then frees the sequence), and nothing
// is retried.
func TestClientDisconnectCancelsUpstream(t *testing.T) {
	started, canceled := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	n := gatedNode(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
		close(canceled)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", n.srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"hi","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if line, _ := bufio.NewReader(resp.Body).ReadString('\n'); line != "data: {}\n" {
		t.Fatalf("first line %q", line)
	}
	<-started
	cancel()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("vLLM's request was not canceled within 5 s of the client leaving")
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("vLLM saw %d calls; want 1 (no retry after the first byte)", c)
	}
}

// TestUpstreamDiesMidStream: an engine that dies after the first event cuts
// the client's stream: the answer had begun, so no retry can make it whole,
// and none is tried.
func TestUpstreamDiesMidStream(t *testing.T) {
	var calls atomic.Int32
	n := gatedNode(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"x\":1}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // the engine process died
		}
	})
	resp := post(t, n.srv.URL+"/v1/completions", `{"prompt":"hi","stream":true}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d; want the 200 the engine began with", resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `data: {"x":1}`) || strings.Contains(string(body), "[DONE]") {
		t.Errorf("body %q (err %v); want the first event and no end", body, err)
	}
	if c := calls.Load(); c != 1 {
		t.Errorf("vLLM saw %d calls; want 1", c)
	}
}

// TestHopForUnservedModelIsRefused: a forwarded request whose model the
// local vLLM does not serve (an adapter unloaded since the sender looked)
// is refused, so the sender tries a pod that serves it, and the models
// watcher is told.
func TestHopForUnservedModelIsRefused(t *testing.T) {
	n := gatedNode(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"object":"error","message":"The model `+"`alice`"+` does not exist.","type":"NotFoundError","code":404}`)
	})
	var told atomic.Int32
	n.h.cfg.ModelsChanged = func() { told.Add(1) }
	valid := NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now())
	resp := post(t, n.srv.URL+"/v1/completions", `{"model":"alice","prompt":"x"}`, map[string]string{HopHeader: valid})
	if resp.StatusCode != 503 || resp.Header.Get(RefusedHeader) != "model" {
		t.Fatalf("hop: %d, refused %q; want 503 model", resp.StatusCode, resp.Header.Get(RefusedHeader))
	}
	if told.Load() != 1 {
		t.Errorf("ModelsChanged called %d times; want 1", told.Load())
	}
	own := post(t, n.srv.URL+"/v1/completions", `{"model":"alice","prompt":"x"}`, nil)
	if own.StatusCode != 404 {
		t.Errorf("a client's own request: %d; want vLLM's 404 passed through", own.StatusCode)
	}
}

// TestAPIOfRoute checks that every routed path's errors take its API's
// shape, at the engine's root and under a group's prefix, and that any
// other path's take chat's.
func TestAPIOfRoute(t *testing.T) {
	want := map[string]prompt.API{storedPath: prompt.APIResponses, storedPath + "/cancel": prompt.APIResponses}
	for _, rt := range routes {
		want[rt.path] = rt.api
	}
	var got prompt.API
	record := func(c *gin.Context) { got = apiOf(c) }
	e := gin.New()
	for _, prefix := range []string{"", "/pre"} {
		g := e.Group(prefix)
		for path := range want {
			g.POST(path, record)
		}
	}
	e.NoRoute(record)
	for _, prefix := range []string{"", "/pre"} {
		for path, api := range want {
			got = 255
			url := prefix + strings.Replace(path, ":id", "resp_1", 1)
			e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", url, nil))
			if got != api {
				t.Errorf("%s: apiOf = %v; want %v", url, got, api)
			}
		}
	}
	got = 255
	e.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/models", nil))
	if got != prompt.APIChat {
		t.Errorf("unrouted: apiOf = %v; want chat", got)
	}
}
