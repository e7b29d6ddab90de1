package forward

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/respown"
	"github.com/kvroute/kvroute/route"
)

// fakeStored is the mesh's map of stored responses, shared by the nodes
// of a test as the mesh would share it.
type fakeStored struct {
	mu    *sync.Mutex // shared by the views
	owner map[string]string
	gone  map[string]bool      // owner → left long ago
	away  map[string]time.Time // owner → left at, within the grace
	at    map[string]time.Time // id → recorded; zero: the zero time
}

func newFakeStored() *fakeStored {
	return &fakeStored{mu: new(sync.Mutex), owner: map[string]string{}, gone: map[string]bool{}, away: map[string]time.Time{}, at: map[string]time.Time{}}
}

// view is the map as node's mesh shares it (every announcement names its
// owner, so the views are alike).
func (f *fakeStored) view(node string) *fakeStored {
	return &fakeStored{mu: f.mu, owner: f.owner, gone: f.gone, away: f.away, at: f.at}
}

func (f *fakeStored) AnnounceResponsesOf(node string, ids ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		f.owner[id] = node
	}
}

func (f *fakeStored) LookupResponse(id string) (respown.Lookup, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.owner[id]
	if !ok {
		return respown.Lookup{}, false
	}
	l := respown.Lookup{Node: n, Status: respown.Live, At: f.at[id]}
	if left, ok := f.away[n]; ok {
		l.Status, l.Left = respown.Away, left
	}
	if f.gone[n] {
		l.Status = respown.Gone
	}
	return l, true
}

func (f *fakeStored) AwayNodes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.away {
		out = append(out, n)
	}
	return out
}

// storeEngine is a vLLM with its Responses store on: POST /v1/responses
// makes resp_<pod>_<n>, GET and cancel find only its own.
type storeEngine struct {
	name string
	mu   sync.Mutex
	ids  map[string]bool
	n    int
}

func (e *storeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("X-Pod", e.name)
	w.Header().Set("Content-Type", "application/json")
	e.mu.Lock()
	defer e.mu.Unlock()
	id := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/responses/"), "/cancel")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/responses":
		e.n++
		id = fmt.Sprintf("resp_%s_%d", e.name, e.n)
		e.ids[id] = true
		fmt.Fprintf(w, `{"id":%q,"object":"response","usage":{"input_tokens":10,"input_tokens_details":{"cached_tokens":0}}}`, id)
	case e.ids[id]:
		fmt.Fprintf(w, `{"id":%q,"object":"response"}`, id)
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, id)
	}
}

type storeNode struct {
	h   *Handler
	srv *httptest.Server
	eng *storeEngine
	es  *httptest.Server // eng's
}

// storeMesh starts n fronts, each with a store engine, every front's peer
// table listing all of them and one shared fakeStored map.
func storeMesh(t *testing.T, n int) ([]*storeNode, *fakeStored) {
	shared := newFakeStored()
	nodes := make([]*storeNode, n)
	for i := range nodes {
		name := fmt.Sprintf("p%d", i)
		eng := &storeEngine{name: name, ids: map[string]bool{}}
		es := httptest.NewServer(eng)
		t.Cleanup(es.Close)
		u, _ := url.Parse(es.URL)
		cfg := DefaultConfig()
		cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey, cfg.Scheme = name, u, "m", []byte("k"), perBlock
		h := New(cfg, &fakePeers{}, byteTokenizer{}, nil, zerolog.Nop())
		h.SetStored(shared.view(name))
		e := gin.New()
		h.Register(e)
		e.NoRoute(h.Passthrough)
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		nodes[i] = &storeNode{h: h, srv: srv, eng: eng, es: es}
	}
	now := time.Now()
	for i, a := range nodes {
		fp := a.h.peers.(*fakePeers)
		for j, b := range nodes {
			fp.views = append(fp.views, route.PeerView{ID: b.h.cfg.Self, Addr: hostOf(b.srv), Local: i == j,
				KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now})
		}
	}
	return nodes, shared
}

func do(t *testing.T, method, u, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// A stored response is read, cancelled and continued from every front,
// always at the pod that made it; the mesh learns the owner from the
// answer passing the owner's front.
func TestStoredResponseFromEveryFront(t *testing.T) {
	nodes, shared := storeMesh(t, 3)
	resp, body := do(t, "POST", nodes[1].srv.URL+"/v1/responses", `{"model":"m","input":"hi"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	var created struct{ ID string }
	json.Unmarshal([]byte(body), &created)
	owner := resp.Header.Get("X-Pod")
	if l, ok := shared.LookupResponse(created.ID); !ok || l.Node != owner {
		t.Fatalf("the mesh has %q for %s, want %q", l.Node, created.ID, owner)
	}
	for _, n := range nodes {
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/v1/responses/" + created.ID, ""},
			{"POST", "/v1/responses/" + created.ID + "/cancel", ""},
			{"POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"` + created.ID + `"}`},
		} {
			resp, body := do(t, c.method, n.srv.URL+c.path, c.body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != owner || resp.Header.Get(DecisionHeader) != ReasonStored {
				t.Errorf("%s %s via %s: %d from %s (%s): %s", c.method, c.path, n.h.cfg.Self, resp.StatusCode,
					resp.Header.Get("X-Pod"), resp.Header.Get(DecisionHeader), body)
			}
		}
	}
}

// An id the mesh has not heard of (made a moment ago, or before this
// front started) is found by asking every pod.
func TestStoredResponseUnknownToTheMapIsProbed(t *testing.T) {
	nodes, _ := storeMesh(t, 3)
	nodes[2].eng.ids["resp_made_elsewhere"] = true
	resp, body := do(t, "GET", nodes[0].srv.URL+"/v1/responses/resp_made_elsewhere", "")
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "p2" {
		t.Fatalf("probe: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Pod"), body)
	}
	// Nobody holds it: vLLM's own 404, in OpenAI's shape, not a 502.
	resp, body = do(t, "GET", nodes[0].srv.URL+"/v1/responses/resp_nowhere", "")
	if resp.StatusCode != 404 || !strings.Contains(body, "not found") {
		t.Fatalf("unknown id: %d %s", resp.StatusCode, body)
	}
}

// A response whose pod left the mesh gets a 404 that says so.
func TestStoredResponseOnGonePod(t *testing.T) {
	nodes, shared := storeMesh(t, 2)
	shared.owner["resp_x"] = "p9"
	shared.gone["p9"] = true
	for _, path := range []string{"/v1/responses/resp_x"} {
		resp, body := do(t, "GET", nodes[0].srv.URL+path, "")
		var e apiError
		json.Unmarshal([]byte(body), &e)
		if resp.StatusCode != 404 || !strings.Contains(e.Error.Message, "p9, which is gone") {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, body)
		}
	}
	resp, body := do(t, "POST", nodes[1].srv.URL+"/v1/responses", `{"model":"m","input":"x","previous_response_id":"resp_x"}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "gone") {
		t.Fatalf("continued: %d %s", resp.StatusCode, body)
	}
}

// Errors of /v1/messages have Anthropic's shape, the others OpenAI's; a
// malformed body never reaches an engine and is never a 502.
func TestErrorsHaveTheirAPIsShape(t *testing.T) {
	a := newNode(t, "a")
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"m","messages":`},
		{"/v1/messages", `[]`},
		{"/v1/responses", `{"input":`},
		{"/v1/completions", `{"prompt":[1,"x"`},
		{"/v1/chat/completions", `nope`},
	} {
		resp := post(t, a.srv.URL+tc.path, tc.body, nil)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 {
			t.Errorf("%s %q: status %d: %s", tc.path, tc.body, resp.StatusCode, b)
			continue
		}
		if tc.path == "/v1/messages" {
			var e anthropicError
			if json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
				t.Errorf("%s: not Anthropic's error: %s", tc.path, b)
			}
			continue
		}
		var e apiError
		if json.Unmarshal(b, &e) != nil || e.Error.Code != 400 || e.Error.Message == "" {
			t.Errorf("%s: not OpenAI's error: %s", tc.path, b)
		}
	}
	if n := len(*a.seen); n != 0 {
		t.Fatalf("%d malformed bodies reached the engine", n)
	}
}

func TestFirstID(t *testing.T) {
	for _, tc := range []struct {
		in, id string
		ok     bool
	}{
		{`{"id":"resp_1","object":"response"}`, "resp_1", true},
		{`event: response.created` + "\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id": "resp_2"`, "resp_2", true},
		{`{"type":"id","id":"resp_3"}`, "resp_3", true},
		{`{"id":"resp_`, "", false},
		{`{"id":42}`, "", true},
		{`{"object":"x"`, "", false},
	} {
		id, ok := firstID([]byte(tc.in))
		if id != tc.id || ok != tc.ok {
			t.Errorf("%q: %q %v, want %q %v", tc.in, id, ok, tc.id, tc.ok)
		}
	}
	// Split over reads of one byte, the id is still found, once.
	var got []string
	tap := &idTap{rc: io.NopCloser(iotest.OneByteReader(strings.NewReader(`{"id":"resp_9","x":{"id":"other"}}`))),
		found: func(id string) { got = append(got, id) }}
	io.ReadAll(tap)
	if len(got) != 1 || got[0] != "resp_9" {
		t.Fatalf("tap found %q", got)
	}
}

// The front counts what it sent where by API (/debug/peers shows it).
func TestSentByAPI(t *testing.T) {
	a := newNode(t, "a")
	post(t, a.srv.URL+"/v1/messages", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, nil)
	post(t, a.srv.URL+"/v1/responses", `{"model":"m","input":"hi"}`, nil)
	post(t, a.srv.URL+"/v1/responses", `{"model":"m","input":"again"}`, nil)
	got := a.h.Sent()[""]
	if got["messages"] != 1 || got["responses"] != 2 || got["chat"] != 0 {
		t.Fatalf("sent to the local vLLM by API: %v", got)
	}
}

// FuzzFirstID: the id tap reads bytes of a pod's answer; it never panics,
// and an id it finds is in the input and within the length bound.
func FuzzFirstID(f *testing.F) {
	for _, s := range []string{`{"id":"resp_1"}`, `data: {"response":{"id":"resp_2"`, `{"id":`, `{"x":"\"id\":\"y\""}`, `"id" : "a\"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		id, ok := firstID(b)
		if id != "" && (!ok || len(id) > maxResponseID || !strings.Contains(string(b), id)) {
			t.Fatalf("firstID(%q) = %q, %v", b, id, ok)
		}
	})
}

// A response whose pod cannot be reached (dead, not yet out of the mesh)
// gets a retryable 503 that says why, not a 502.
func TestStoredResponseOnUnreachablePod(t *testing.T) {
	nodes, shared := storeMesh(t, 2)
	shared.owner["resp_y"] = "p1"
	nodes[1].srv.Close()
	resp, body := do(t, "GET", nodes[0].srv.URL+"/v1/responses/resp_y", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "cannot be reached") {
		t.Fatalf("%d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
}

// locateStored's rule: a final 404 only when the response's engine memory
// is known gone (its pod gone past the grace, or its engine restarted and
// no longer holding it); a retryable 503 while it may still hold it, or
// while an unknown id could be on a pod nobody could ask.
func TestLocateStored(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		setup func(nodes []*storeNode, s *fakeStored, p1 *route.PeerView)
		id    string
		// want: the target's pod ("" for none), or the status and a piece
		// of the message.
		pod    string
		status int
		msg    string
	}{
		{name: "live owner", pod: "p1"},
		{name: "owner away: may be back", status: 503, msg: "(p1) left the mesh 2s ago and may be back",
			setup: func(_ []*storeNode, s *fakeStored, _ *route.PeerView) {
				s.away["p1"] = time.Now().Add(-2 * time.Second)
			}},
		{name: "owner gone past the grace", status: 404, msg: "stored on pod p1, which is gone",
			setup: func(_ []*storeNode, s *fakeStored, _ *route.PeerView) { s.gone["p1"] = true }},
		{name: "owner draining: its vLLM still holds it", pod: "p1",
			setup: func(_ []*storeNode, _ *fakeStored, p1 *route.PeerView) { p1.Draining = true }},
		{name: "owner's engine down as its meta says, but it answers: its meta is behind", pod: "p1",
			setup: func(_ []*storeNode, _ *fakeStored, p1 *route.PeerView) { p1.Engine = route.EngineDown }},
		{name: "owner's engine dead: nothing listens, its sidecar says so", status: 404, msg: "engine of pod p1, which is gone (it is not running)",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				n[1].es.Close()
				p1.Engine = route.EngineDown
			}},
		{name: "owner's engine hung: it may resume", status: 503, msg: "(p1) is down",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				hang := make(chan struct{})
				n[1].es.Config.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang })
				n[1].es.Config.SetKeepAlivesEnabled(false)
				n[1].srv.Config.SetKeepAlivesEnabled(false)
				go func() { time.Sleep(3 * time.Second); close(hang) }()
				p1.Engine = route.EngineDown
			}},
		{name: "owner's engine restarted empty", status: 404, msg: "engine of pod p1, which is gone",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				delete(n[1].eng.ids, "resp_a")
				p1.Since = t0.Add(time.Second)
			}},
		{name: "owner's cache began anew, its store alive (a hang resumed, a sidecar restarted)", pod: "p1",
			setup: func(_ []*storeNode, _ *fakeStored, p1 *route.PeerView) { p1.Since = t0.Add(time.Second) }},
		{name: "owner's cache began before the entry: not asked", pod: "p1",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				delete(n[1].eng.ids, "resp_a")
				p1.Since = t0.Add(-time.Second)
			}},
		{name: "owner's cache began anew, it does not answer", status: 503, msg: "(p1) did not answer",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				n[1].srv.Close()
				p1.Since = t0.Add(time.Second)
			}},
		{name: "a forward to the owner failed a moment ago, it answers again", pod: "p1",
			setup: func(_ []*storeNode, _ *fakeStored, p1 *route.PeerView) { p1.LastFailure = time.Now() }},
		{name: "a forward to the owner failed a moment ago, it does not answer (its sidecar dead, still a member)",
			status: 503, msg: "(p1) did not answer",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				n[1].srv.Close()
				p1.LastFailure = time.Now()
			}},
		{name: "a forward to the owner failed long ago: not asked", pod: "p1",
			setup: func(n []*storeNode, _ *fakeStored, p1 *route.PeerView) {
				n[1].srv.Close()
				p1.LastFailure = time.Now().Add(-time.Hour)
			}},
		{name: "unknown id, held by a pod whose engine is starting", id: "resp_b", pod: "p2",
			setup: func(n []*storeNode, _ *fakeStored, _ *route.PeerView) {
				n[2].eng.ids["resp_b"] = true
				n[0].h.peers.(*fakePeers).views[2].Engine = route.EngineStarting
			}},
		{name: "unknown id, nobody holds it, every pod asked: vLLM's 404", id: "resp_b", pod: "local"},
		{name: "unknown id, a pod away (partitioned, restarting)", id: "resp_b", status: 503, msg: "may hold it (p9)",
			setup: func(_ []*storeNode, s *fakeStored, _ *route.PeerView) { s.away["p9"] = time.Now() }},
		{name: "unknown id, a pod that cannot be asked", id: "resp_b", status: 503, msg: "not every pod could be asked",
			setup: func(n []*storeNode, _ *fakeStored, _ *route.PeerView) { n[2].srv.Close() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes, shared := storeMesh(t, 3)
			nodes[1].eng.ids["resp_a"] = true
			shared.owner["resp_a"], shared.at["resp_a"] = "p1", t0
			fp := nodes[0].h.peers.(*fakePeers)
			if tt.setup != nil {
				tt.setup(nodes, shared, &fp.views[1])
			}
			id := tt.id
			if id == "" {
				id = "resp_a"
			}
			tg, status, msg := nodes[0].h.storedTarget(t.Context(), id, 0)
			pod := tg.Peer
			if tg.URL != nil && pod == "" {
				pod = "local"
			}
			if status != tt.status || !strings.Contains(msg, tt.msg) || pod != tt.pod {
				t.Errorf("storedTarget(%s) = pod %q, %d %q; want pod %q, %d containing %q", id, pod, status, msg, tt.pod, tt.status, tt.msg)
			}
		})
	}
}

// While the pod that stores a response may be back in a moment, the entry
// holds the request, asking again, for up to storedWait; then it answers a
// retryable 503 with Retry-After, in the API's error shape.
func TestStoredWaitsForTheOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey = "p0", &url.URL{Scheme: "http", Host: "p0.invalid"}, "m", []byte("k")
		h := New(cfg, &fakePeers{views: []route.PeerView{{ID: "p0", Local: true}, {ID: "p1", Addr: "p1.invalid:80"}}},
			byteTokenizer{}, nil, zerolog.Nop())
		s := newFakeStored()
		h.SetStored(s)
		s.owner["resp_a"], s.away["p1"] = "p1", time.Now()

		// Its sidecar is back a second later.
		start := time.Now()
		go func() {
			time.Sleep(time.Second)
			s.mu.Lock()
			delete(s.away, "p1")
			s.mu.Unlock()
		}()
		tg, status, msg := h.storedTarget(t.Context(), "resp_a", storedWait)
		if took := time.Since(start); status != 0 || tg.Peer != "p1" || took < time.Second || took > time.Second+storedPoll {
			t.Errorf("storedTarget with p1 back after 1s = %q, %d %q after %v; want p1 within a poll of 1s", tg.Peer, status, msg, took)
		}

		// It is not back: a 503 with Retry-After once storedWait is over.
		s.away["p1"] = time.Now()
		start = time.Now()
		w := httptest.NewRecorder()
		c, _ := gin.CreateTestContext(w)
		c.Request = httptest.NewRequest(http.MethodGet, "/v1/responses/resp_a", nil)
		c.Params = gin.Params{{Key: "id", Value: "resp_a"}}
		h.serveStored(c)
		var e apiError
		json.Unmarshal(w.Body.Bytes(), &e)
		if took := time.Since(start); w.Code != 503 || w.Header().Get("Retry-After") != storedRetryAfter ||
			e.Error.Code != 503 || !strings.Contains(e.Error.Message, "may be back") || took != storedWait {
			t.Errorf("GET of p1's response, p1 away throughout: %d (Retry-After %q) after %v: %s; want 503, Retry-After %s, after %v",
				w.Code, w.Header().Get("Retry-After"), took, w.Body, storedRetryAfter, storedWait)
		}
	})
}

// While a stored response's pod is away (its sidecar restarting or dead,
// its vLLM alive), the front asks that vLLM itself, where it once reached
// it: a vLLM that holds the response serves the request, one that does not
// or no longer listens gets the final 404 at once; one never reached is
// not relied on (a NetworkPolicy may close its port to peers).
func TestStoredAtTheEngineWhileItsSidecarIsAway(t *testing.T) {
	const id = "resp_a"
	tests := []struct {
		name string
		// setup breaks p1 after node 0 has reached its engine.
		setup  func(p1 *storeNode, s *fakeStored, v *route.PeerView, engine *httptest.Server)
		reach  bool // node 0 reached p1's engine first
		status int
		msg    string // for an error: a piece of the message
		direct bool   // node 0 sent straight to p1's engine, not through its sidecar
	}{
		{name: "sidecar away, engine holds it: served there", reach: true, status: 200,
			setup: func(p1 *storeNode, s *fakeStored, _ *route.PeerView, _ *httptest.Server) {
				p1.srv.Close()
				s.away["p1"] = time.Now()
			}},
		{name: "sidecar dead but still a member (a forward failed): served there", reach: true, status: 200,
			setup: func(p1 *storeNode, _ *fakeStored, v *route.PeerView, _ *httptest.Server) {
				p1.srv.Close()
				v.LastFailure = time.Now()
			}},
		{name: "sidecar away, engine restarted empty", reach: true, status: 404, msg: "p1, which is gone (it restarted",
			setup: func(p1 *storeNode, s *fakeStored, _ *route.PeerView, _ *httptest.Server) {
				p1.srv.Close()
				s.away["p1"] = time.Now()
				delete(p1.eng.ids, id)
			}},
		// Still in the mesh, its failure not yet seen by this entry: the
		// refused dial to its sidecar sends the same request to its vLLM.
		{name: "sidecar just killed, its vLLM alive", reach: true, status: 200,
			setup: func(p1 *storeNode, _ *fakeStored, _ *route.PeerView, _ *httptest.Server) {
				p1.srv.Close()
			}},
		// Its sidecar drains (restarting, or the pod deleted) while its
		// vLLM serves on: the request goes to the vLLM, not through the
		// sidecar, which would cut it when it exits.
		{name: "sidecar draining, its vLLM serving", reach: true, status: 200, direct: true,
			setup: func(_ *storeNode, _ *fakeStored, v *route.PeerView, _ *httptest.Server) {
				v.Draining = true
			}},
		// The pod is being deleted: its sidecar drains, and its vLLM has
		// already exited. The direct attempt is refused where it was
		// reached before: the store is gone, and the 404 says so at once
		// (it was a retryable 503 until the sidecar left the mesh).
		// The same when the map has not heard of the response yet (it was
		// made a moment ago, or while no sidecar of p1's announced it): the
		// probe finds it through p1's sidecar, and the request still goes
		// to the vLLM. Through the sidecar, chaos agentic-faults saw a
		// stream cut when a restarting sidecar was killed at its grace's
		// end.
		{name: "sidecar draining, response found by the probe", reach: true, status: 200, direct: true,
			setup: func(_ *storeNode, s *fakeStored, v *route.PeerView, _ *httptest.Server) {
				v.Draining = true
				delete(s.owner, id)
			}},
		{name: "sidecar draining, its vLLM gone", reach: true, status: 404, msg: "p1, which is gone (its engine no longer listens", direct: true,
			setup: func(_ *storeNode, _ *fakeStored, v *route.PeerView, engine *httptest.Server) {
				v.Draining = true
				engine.Close()
			}},
		{name: "sidecar draining, its vLLM never reached: a refusal proves nothing", status: 503, msg: "cannot be reached", direct: true,
			setup: func(_ *storeNode, _ *fakeStored, v *route.PeerView, _ *httptest.Server) {
				v.Draining = true
			}},
		{name: "pod gone: nothing listens where its engine was", reach: true, status: 404, msg: "p1, which is gone (its engine no longer listens",
			setup: func(p1 *storeNode, s *fakeStored, _ *route.PeerView, engine *httptest.Server) {
				p1.srv.Close()
				engine.Close()
				s.away["p1"] = time.Now()
			}},
		{name: "engine down as its live sidecar says, and not listening", reach: true, status: 404, msg: "which is gone (it is not running)",
			setup: func(p1 *storeNode, _ *fakeStored, v *route.PeerView, engine *httptest.Server) {
				engine.Close()
				p1.es.Close()
				v.Engine = route.EngineDown
			}},
		// Its vLLM exited, then its sidecar, saying so as it left; the
		// leaving has not reached node 0 yet (a lost gossip message): its
		// meta is the proof, reached or not.
		{name: "sidecar gone after saying its vLLM exited, its leaving not yet here", status: 404, msg: "p1, which is gone (its vLLM exited)",
			setup: func(p1 *storeNode, _ *fakeStored, v *route.PeerView, _ *httptest.Server) {
				p1.srv.Close()
				v.Engine, v.StoreGone = route.EngineDown, true
			}},
		{name: "never reached: a refusal proves nothing", status: 503, msg: "may be back",
			setup: func(p1 *storeNode, s *fakeStored, _ *route.PeerView, engine *httptest.Server) {
				p1.srv.Close()
				engine.Close()
				s.away["p1"] = time.Now()
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes, shared := storeMesh(t, 3)
			// p1's engine on a server of its own, so that closing it is
			// seen by its address.
			engine := httptest.NewServer(nodes[1].eng)
			t.Cleanup(engine.Close)
			nodes[1].eng.ids[id] = true
			shared.owner[id] = "p1"
			fp := nodes[0].h.peers.(*fakePeers)
			fp.views[1].EngineAddr, fp.views[1].Engine = hostOf(engine), route.EngineServing
			if !tt.reach {
				engine.Close() // the check's dial is refused
			}
			e := nodes[0].h.engines
			e.observe(t.Context(), fp.views, time.Now())
			deadline := time.Now().Add(5 * time.Second)
			for checked := false; !checked; {
				if time.Now().After(deadline) {
					t.Fatal("p1's engine not checked within 5 s")
				}
				time.Sleep(10 * time.Millisecond)
				e.mu.Lock()
				checked = !e.m["p1"].checking
				e.mu.Unlock()
			}
			if _, reached := e.lookup("p1"); reached != tt.reach {
				t.Fatalf("p1's engine reached %v; want %v", reached, tt.reach)
			}
			tt.setup(nodes[1], shared, &fp.views[1], engine)
			direct := nodes[0].h.metrics.decisions.WithLabelValues("direct", ReasonStored, "responses")
			before := count(direct)
			for _, c := range []struct{ method, path, body string }{
				{"GET", "/v1/responses/" + id, ""},
				{"POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"` + id + `"}`},
			} {
				resp, body := do(t, c.method, nodes[0].srv.URL+c.path, c.body)
				switch {
				case resp.StatusCode != tt.status:
					t.Errorf("%s %s: %d %s; want %d", c.method, c.path, resp.StatusCode, body, tt.status)
				case tt.status == 200 && (resp.Header.Get("X-Pod") != "p1" || resp.Header.Get(ServedByHeader) != "p1"):
					t.Errorf("%s %s: served by %q (engine %q); want p1's engine", c.method, c.path,
						resp.Header.Get(ServedByHeader), resp.Header.Get("X-Pod"))
				case tt.status != 200 && !strings.Contains(body, tt.msg):
					t.Errorf("%s %s: %d %s; want a message containing %q", c.method, c.path, resp.StatusCode, body, tt.msg)
				case tt.status == 200 && c.method == "POST":
					// The new response is p1's in the map, whoever could say so:
					// p1's sidecar, or node 0 when it went past it.
					var made struct{ ID string }
					json.Unmarshal([]byte(body), &made)
					if l, ok := shared.LookupResponse(made.ID); !ok || l.Node != "p1" {
						t.Errorf("the response %q that p1's engine made is %+v, %v in the map; want p1's", made.ID, l, ok)
					}
				}
			}
			if got := count(direct) - before; tt.direct && got != 2 {
				t.Errorf("%v of the 2 requests sent straight to p1's engine; want both", got)
			}
		})
	}
}

// A draining pod's vLLM still holds its stored responses: their requests
// are served there (a pod deleted gracefully drains first), and once its
// vLLM has exited, its sidecar answers the final 404 that says so.
func TestStoredOnADrainingPod(t *testing.T) {
	nodes, shared := storeMesh(t, 3)
	nodes[1].eng.ids["resp_d"] = true
	shared.owner["resp_d"] = "p1"
	nodes[1].h.SetDraining(true)
	for _, n := range nodes {
		n.h.peers.(*fakePeers).views[1].Draining = true
	}
	reqs := []struct{ method, path, body string }{
		{"GET", "/v1/responses/resp_d", ""},
		{"POST", "/v1/responses", `{"model":"m","input":"more","previous_response_id":"resp_d"}`},
	}
	for _, n := range nodes {
		for _, c := range reqs {
			resp, body := do(t, c.method, n.srv.URL+c.path, c.body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "p1" {
				t.Errorf("%s %s via %s, p1 draining: %d from %q: %s; want p1's answer", c.method, c.path, n.h.cfg.Self, resp.StatusCode, resp.Header.Get("X-Pod"), body)
			}
		}
	}
	// A request that is not p1's alone is still refused there.
	resp, _ := do(t, "POST", nodes[1].srv.URL+"/v1/responses", `{"model":"m","input":"new"}`)
	if resp.StatusCode == 200 && resp.Header.Get("X-Pod") == "p1" {
		t.Error("a new Responses request entering draining p1 was served there")
	}
	// Its vLLM exits (the pod's main container stops before the sidecar).
	nodes[1].es.Close()
	nodes[1].h.SetLocalReady(false)
	for _, n := range nodes {
		n.h.peers.(*fakePeers).views[1].Engine = route.EngineDown
	}
	for _, n := range nodes {
		for _, c := range reqs {
			resp, body := do(t, c.method, n.srv.URL+c.path, c.body)
			if resp.StatusCode != 404 || !strings.Contains(body, "p1, which is gone") {
				t.Errorf("%s %s via %s, p1's vLLM exited: %d %s; want the 404 that says p1 is gone", c.method, c.path, n.h.cfg.Self, resp.StatusCode, body)
			}
		}
	}
}
