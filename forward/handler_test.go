package forward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

func init() { gin.SetMode(gin.ReleaseMode) }

// keySet is a digest stand-in holding an exact set of keys.
type keySet map[blockkey.Key]bool

func (s keySet) PrefixLen(keys []blockkey.Key) int {
	for i, k := range keys {
		if !s[k] {
			return i
		}
	}
	return len(keys)
}

type fakePeers struct {
	mu         sync.Mutex
	views      []route.PeerView
	failed     []string
	serving    []int     // every SetServing's requests, in order
	prefilling []int     // and how many wait for their first token
	queued     []int     // and its prefill tokens
	shares     []float64 // and its prefill share
	claims     []string  // the peer of every Claim, in order
	depths     [][]int   // and its claims' depths
}

func (f *fakePeers) Claim(peer string, cs []route.Claim) {
	f.mu.Lock()
	f.claims = append(f.claims, peer)
	var ds []int
	for _, c := range cs {
		ds = append(ds, c.Keys)
	}
	f.depths = append(f.depths, ds)
	f.mu.Unlock()
}

func (f *fakePeers) SetServing(n, prefilling, queued int, share float64) {
	f.mu.Lock()
	f.serving = append(f.serving, n)
	f.prefilling = append(f.prefilling, prefilling)
	f.queued = append(f.queued, queued)
	f.shares = append(f.shares, share)
	f.mu.Unlock()
}

func (f *fakePeers) AppendSnapshot(buf []route.PeerView, _ time.Time) []route.PeerView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(buf[:0], f.views...)
}

func (f *fakePeers) EachPeer(_ time.Time, fn func(*route.PeerView) bool) {
	for i := 0; ; i++ {
		f.mu.Lock()
		if i >= len(f.views) {
			f.mu.Unlock()
			return
		}
		v := f.views[i]
		f.mu.Unlock()
		if !fn(&v) {
			return
		}
	}
}

func (f *fakePeers) MarkFailed(p string, _ time.Time) {
	f.mu.Lock()
	f.failed = append(f.failed, p)
	f.mu.Unlock()
}

// tokTokenizer tokenizes a completion text as one token per byte.
type byteTokenizer struct{}

func (byteTokenizer) Tokenize(_ context.Context, p prompt.Prompt) ([]uint32, error) {
	out := make([]uint32, len(p.Text))
	for i := range p.Text {
		out[i] = uint32(p.Text[i])
	}
	return out, nil
}

// vllmStub answers like vLLM and says which pod it is.
func vllmStub(t testing.TB, name string) (*httptest.Server, *[]http.Header) {
	var mu sync.Mutex
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("X-Pod", name)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","usage":{"prompt_tokens":64,"prompt_tokens_details":{"cached_tokens":48}}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

type node struct {
	h     *Handler
	srv   *httptest.Server
	vllm  *httptest.Server
	seen  *[]http.Header
	peers *fakePeers
}

func newNode(t testing.TB, name string) *node {
	vllm, seen := vllmStub(t, name)
	u, _ := url.Parse(vllm.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey = name, u, "m", []byte("k")
	cfg.Scheme = perBlock
	cfg.MaxBodyBytes = 1 << 10
	fp := &fakePeers{}
	h := New(cfg, fp, byteTokenizer{}, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	e.NoRoute(h.Passthrough)
	srv := httptest.NewUnstartedServer(e)
	// A handler's panic is recovered by net/http, which logs it and drops
	// the connection: the test fails instead.
	srv.Config.ErrorLog = log.New(panicLog{t}, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return &node{h: h, srv: srv, vllm: vllm, seen: seen, peers: fp}
}

// panicLog fails the test on a server's log line about a panic.
type panicLog struct{ t testing.TB }

func (p panicLog) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("panic")) {
		p.t.Errorf("server: %s", bytes.TrimSpace(b))
	}
	return len(b), nil
}

func hostOf(s *httptest.Server) string { u, _ := url.Parse(s.URL); return u.Host }

func post(t *testing.T, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// perBlock keys every 16-token block, so the short test prompt has 4 keys.
var perBlock = blockkey.Scheme{BlockSize: 16, Stride: 1}

const testPrompt = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdefZ" // 4 blocks + 1

func promptKeys() []blockkey.Key {
	toks, _ := byteTokenizer{}.Tokenize(context.Background(), prompt.Prompt{Text: testPrompt})
	return perBlock.Request(blockkey.Root("m", "", ""), toks)
}

// holderPair returns nodes a and b where b holds the test prompt and a's
// peer table says so.
func holderPair(t testing.TB) (a, b *node) {
	a, b = newNode(t, "a"), newNode(t, "b")
	held := keySet{}
	for _, k := range promptKeys() {
		held[k] = true
	}
	now := time.Now()
	a.peers.views = []route.PeerView{
		{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now},
		{ID: "b", Addr: hostOf(b.srv), KeyScheme: blockkey.Version, Digest: held, LoadAt: now},
	}
	return a, b
}

func TestRoutesToHolder(t *testing.T) {
	a, b := holderPair(t)
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "b" || resp.Header.Get(ServedByHeader) != "b" {
		t.Fatalf("status %d pod %q served-by %q; want 200 from b", resp.StatusCode, resp.Header.Get("X-Pod"), resp.Header.Get(ServedByHeader))
	}
	if got := resp.Header.Get(DecisionHeader); got != route.ReasonAffinity {
		t.Errorf("decision = %q; want affinity", got)
	}
	if len(*b.seen) != 1 || (*b.seen)[0].Get(HopHeader) != "" || (*b.seen)[0].Get(PrefillHeader) != "" {
		t.Errorf("b's vLLM saw %d requests (hop and prefill headers must be stripped): %v", len(*b.seen), *b.seen)
	}
	if len(*a.seen) != 0 {
		t.Errorf("a's vLLM served %d requests; want 0", len(*a.seen))
	}
}

// TestClaimsWhatTheTargetLacks: a front claims, at the pod it sends a
// request to, the prompt's depths past what the choice found there: those
// every member sees in the pod's digest already are no news.
func TestClaimsWhatTheTargetLacks(t *testing.T) {
	a, _ := holderPair(t)
	keys := promptKeys()
	a.peers.views[1].Digest = keySet{keys[0]: true, keys[1]: true}
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(ServedByHeader) != "b" {
		t.Fatalf("served by %q; want b", resp.Header.Get(ServedByHeader))
	}
	a.peers.mu.Lock()
	claims, depths := slices.Clone(a.peers.claims), slices.Clone(a.peers.depths)
	a.peers.mu.Unlock()
	var want []int
	for _, c := range route.ClaimsFor(a.h.cfg.Route, keys, 0) {
		if c.Keys > 2 {
			want = append(want, c.Keys)
		}
	}
	if len(want) == 0 || len(claims) != 1 || claims[0] != "b" || !slices.Equal(depths[0], want) {
		t.Errorf("a claimed %v at depths %v; want b at %v, past the 2 keys b holds", claims, depths, want)
	}
}

func TestDeadPeerFallsBackToLocal(t *testing.T) {
	a := newNode(t, "a")
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := l.Addr().String()
	l.Close()
	held := keySet{}
	for _, k := range promptKeys() {
		held[k] = true
	}
	now := time.Now()
	a.peers.views = []route.PeerView{
		{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now},
		{ID: "dead", Addr: dead, KeyScheme: blockkey.Version, Digest: held, LoadAt: now},
	}
	resp := post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "a" {
		t.Fatalf("status %d pod %q; want 200 from a", resp.StatusCode, resp.Header.Get("X-Pod"))
	}
	if got := resp.Header.Get(DecisionHeader); got != "affinity-retried" {
		t.Errorf("decision = %q; want affinity-retried", got)
	}
	if len(a.peers.failed) != 1 || a.peers.failed[0] != "dead" {
		t.Errorf("MarkFailed calls = %v; want [dead]", a.peers.failed)
	}
}

func TestForgedHopIsRouted(t *testing.T) {
	a, _ := holderPair(t)
	now := time.Now()
	forged := NewHop([]byte("not the key"), time.Minute).Sign("b", "a", now)
	resp := post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, map[string]string{HopHeader: forged})
	if resp.Header.Get("X-Pod") != "b" {
		t.Fatalf("forged hop header was trusted: served by %q; want b", resp.Header.Get("X-Pod"))
	}
	valid := NewHop([]byte("k"), time.Minute).Sign("b", "a", now)
	resp = post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, map[string]string{HopHeader: valid})
	if resp.Header.Get("X-Pod") != "a" || resp.Header.Get(DecisionHeader) != "hop" {
		t.Fatalf("valid hop: served by %q decision %q; want a, hop", resp.Header.Get("X-Pod"), resp.Header.Get(DecisionHeader))
	}
}

func TestBadInput(t *testing.T) {
	a := newNode(t, "a")
	tests := []struct {
		name, path, body string
		status           int
		typ              string
	}{
		{"malformed json", "/v1/chat/completions", `{"messages":`, 400, "BadRequestError"},
		{"not an object", "/v1/completions", `[]`, 400, "BadRequestError"},
		{"too large", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "RequestEntityTooLargeError"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, a.srv.URL+tt.path, tt.body, nil)
			var e apiError
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.status || e.Error.Type != tt.typ || e.Error.Code != tt.status || e.Error.Message == "" {
				t.Errorf("status %d body %+v; want %d %s", resp.StatusCode, e, tt.status, tt.typ)
			}
		})
	}
	// No prompt at all is still served (vLLM answers it), never refused here.
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m"}`, nil)
	if resp.StatusCode != 200 {
		t.Errorf("promptless request: status %d; want 200 from vLLM", resp.StatusCode)
	}
}

func TestStreamingFlushesPerEvent(t *testing.T) {
	release := make(chan struct{})
	vllm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer vllm.Close()
	u, _ := url.Parse(vllm.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM = "a", u
	h := New(cfg, nil, nil, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	srv := httptest.NewServer(e)
	defer srv.Close()
	resp := post(t, srv.URL+"/v1/completions", `{"prompt":"hi","stream":true}`, nil)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: {\"n\":1}\n" {
		t.Fatalf("first event %q, %v: not flushed before the stream ended", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: [DONE]\n\n" {
		t.Errorf("rest of stream = %q", rest)
	}
}

func TestUsageTap(t *testing.T) {
	body := `data: {"choices":[]}` + "\n\n" + `data: {"usage":{"prompt_tokens_details":{"cached_tokens": 1234}}}` + "\n\n"
	for split := 1; split < len(body); split++ {
		got := -1
		u := &usageTap{rc: io.NopCloser(strings.NewReader("")), field: cachedField, found: func(v int) { got = v }}
		u.scan([]byte(body[:split]))
		u.scan([]byte(body[split:]))
		if got != 1234 {
			t.Fatalf("split at %d: found %d; want 1234", split, got)
		}
	}
	// A stream read in pieces of every size, events before the figure's
	// included: the buffer reused from read to read keeps each intact.
	stream := strings.Repeat(`data: {"choices":[{"text":"x"}]}`+"\n\n", 20) + body
	for size := 1; size <= len(stream); size++ {
		got, calls := -1, 0
		u := &usageTap{rc: io.NopCloser(strings.NewReader(stream)), field: cachedField, found: func(v int) { got, calls = v, calls+1 }}
		buf := make([]byte, size)
		for {
			n, err := u.Read(buf)
			clear(buf[:n]) // the caller reuses its buffer too
			if err != nil {
				break
			}
		}
		if got != 1234 || calls != 1 {
			t.Fatalf("reads of %d bytes: found %d, %d times; want 1234 once", size, got, calls)
		}
	}
}

// TestReportsServing checks the front reports its local vLLM's request
// count and queued prefill tokens on every change: a forwarded request
// counts where it is served, not at the sidecar that forwarded it; its
// uncached tokens, as the sender predicted them (the hop's PrefillHeader),
// are queued from its arrival to its first answer byte.
func TestReportsServing(t *testing.T) {
	a, b := holderPair(t)
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.Header.Get(ServedByHeader) != "b" {
		t.Fatalf("served by %q; want b", resp.Header.Get(ServedByHeader))
	}
	// The server finishes its bookkeeping after the client has the body.
	var gotA, gotB, queuedB []int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.peers.mu.Lock()
		gotB, queuedB = slices.Clone(b.peers.serving), slices.Clone(b.peers.queued)
		b.peers.mu.Unlock()
		if len(gotB) >= 3 && gotB[len(gotB)-1] == 0 {
			break
		}
	}
	a.peers.mu.Lock()
	gotA = slices.Clone(a.peers.serving)
	a.peers.mu.Unlock()
	a.peers.mu.Lock()
	claims := slices.Clone(a.peers.claims)
	a.peers.mu.Unlock()
	if len(claims) != 0 {
		t.Errorf("a claimed %v at b, which holds the whole prompt; want none (no news)", claims)
	}
	// Reports: sent, answered, done, and for this non-streamed answer
	// maybe one when its prefill's time is up (1 ms), in any order among
	// the middle ones.
	if len(gotB) < 3 || gotB[0] != 1 || gotB[len(gotB)-1] != 0 || len(gotA) != 0 {
		t.Errorf("serving reports: a %v, b %v; want a [], b [1 ... 0]", gotA, gotB)
	}
	// b holds the prompt's 4 full blocks: its last token is b's to compute.
	if len(queuedB) < 3 || queuedB[0] != len(testPrompt)-4*16 || slices.Max(queuedB[1:]) != 0 {
		t.Errorf("queued prefill reports at b %v; want [%d 0 ... 0]", queuedB, len(testPrompt)-4*16)
	}
}

func TestReadBody(t *testing.T) {
	big := strings.Repeat("y", 1<<20+10) // above presizeMax
	for _, tc := range []struct {
		name    string
		body    string
		cl      int64 // Content-Length as sent; -1: chunked
		limit   int64
		wantErr bool
		tooBig  bool
	}{
		{name: "sized", body: "hello", cl: 5, limit: 100},
		{name: "chunked", body: "hello", cl: -1, limit: 100},
		{name: "empty", body: "", cl: 0, limit: 100},
		{name: "above presize", body: big, cl: int64(len(big)), limit: 2 << 20},
		{name: "chunked too large", body: strings.Repeat("z", 200), cl: -1, limit: 100, wantErr: true, tooBig: true},
		{name: "sized too large", body: strings.Repeat("z", 200), cl: 200, limit: 100, wantErr: true, tooBig: true},
		{name: "shorter than its Content-Length", body: "abc", cl: 10, limit: 100, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/completions", io.NopCloser(strings.NewReader(tc.body)))
			r.ContentLength = tc.cl
			got, err := readBody(httptest.NewRecorder(), r, tc.limit)
			var mbe *http.MaxBytesError
			switch {
			case tc.wantErr && err == nil:
				t.Fatalf("read %d bytes; want an error", len(got))
			case !tc.wantErr && err != nil:
				t.Fatal(err)
			case tc.tooBig != errors.As(err, &mbe):
				t.Fatalf("error %v; MaxBytesError wanted: %v", err, tc.tooBig)
			case !tc.wantErr && string(got) != tc.body:
				t.Fatalf("read %d bytes; want %d", len(got), len(tc.body))
			}
		})
	}
}

// An adapter's request is keyed with its name, as vLLM hashes its blocks;
// another name of the base model (--served-model-name) is keyed as the
// base model, and without IsAdapter every other name is an adapter.
func TestKeysSeedAdaptersNotAliases(t *testing.T) {
	toks, _ := byteTokenizer{}.Tokenize(context.Background(), prompt.Prompt{Text: testPrompt})
	root := func(lora string) []blockkey.Key { return perBlock.Request(blockkey.Root("m", lora, ""), toks) }
	isAdapter := func(m string) bool { return m != "alias" }
	tests := []struct {
		model     string
		isAdapter func(string) bool
		want      []blockkey.Key
	}{
		{"", isAdapter, root("")},
		{"m", isAdapter, root("")},
		{"alias", isAdapter, root("")},
		{"alice", isAdapter, root("alice")},
		{"alias", nil, root("alias")},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		cfg.Model, cfg.Scheme, cfg.IsAdapter = "m", perBlock, tt.isAdapter
		h := New(cfg, nil, byteTokenizer{}, nil, zerolog.Nop())
		got, _ := h.keys(context.Background(), prompt.Prompt{Model: tt.model, Text: testPrompt}, nil)
		if !slices.Equal(got, tt.want) {
			t.Errorf("keys(model %q, IsAdapter set %v) differ from the expected seed", tt.model, tt.isAdapter != nil)
		}
	}
}

// The answer says, in a W3C Server-Timing header, how long each sidecar
// took: the serving one's part (its body streams through: no read of its
// own) lies inside the entry one's, and choosing inside the whole.
func TestServerTiming(t *testing.T) {
	a, _ := holderPair(t)
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	io.Copy(io.Discard, resp.Body)
	dur := map[string]float64{}
	for _, h := range resp.Header.Values("Server-Timing") {
		for _, m := range strings.Split(h, ",") {
			name, param, ok := strings.Cut(strings.TrimSpace(m), ";dur=")
			v, err := strconv.ParseFloat(param, 64)
			if !ok || err != nil || v < 0 {
				t.Fatalf("Server-Timing %q: metric %q", h, m)
			}
			dur[name] = v
		}
	}
	hop, hopOK := dur["kvroute-hop"]
	route, routeOK := dur["kvroute-route"]
	total, totalOK := dur["kvroute"]
	_, readOK := dur["kvroute-read"]
	send, sendOK := dur["kvroute-send"]
	hopSend, hopSendOK := dur["kvroute-hop-send"]
	want := 5
	if hopSendOK {
		want++
	}
	if !hopOK || !routeOK || !totalOK || !readOK || !sendOK || hopSend > hop || hop > total || route+send > total || len(dur) != want {
		t.Fatalf("Server-Timing %q; want the reads, kvroute-hop and kvroute-route, the hop's within kvroute", resp.Header.Values("Server-Timing"))
	}
}

// A forwarded request's body streams through the serving sidecar: its
// vLLM has the first half before the sender writes the second.
func TestHopBodyStreams(t *testing.T) {
	got := make(chan int, 256)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf, n := make([]byte, 4096), 0
		for {
			k, err := r.Body.Read(buf)
			if n += k; k > 0 {
				got <- n
			}
			if err != nil {
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"read":%d}`, n)
	}))
	srv := frontOf(t, engine)

	half := bytes.Repeat([]byte("x"), 64<<10)
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() }) // before the servers close: a failed run leaves the body open
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", pr)
	req.ContentLength = int64(2 * len(half))
	req.Header.Set(HopHeader, NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now()))
	type result struct {
		status int
		body   string
		err    error
	}
	done := make(chan result, 1)
	go func() { // ends when the request does (the server closes at cleanup)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		done <- result{resp.StatusCode, string(b), err}
	}()
	if _, err := pw.Write(half); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(10 * time.Second)
	for n := 0; n < len(half); {
		select {
		case n = <-got:
		case <-deadline:
			t.Fatalf("the engine got %d of the first %d bytes while the rest was not yet sent: the serving sidecar holds the body back", n, len(half))
		}
	}
	pw.Write(half)
	pw.Close()
	r := <-done
	if r.err != nil || r.status != http.StatusOK || r.body != fmt.Sprintf(`{"read":%d}`, 2*len(half)) {
		t.Fatalf("answer %d %q (%v); want 200 with the whole body read", r.status, r.body, r.err)
	}
}

// A forwarded body over the limit is refused before any of it is sent on.
func TestHopBodyTooLarge(t *testing.T) {
	a := newNode(t, "a")
	body := `{"prompt":"` + strings.Repeat("x", 2000) + `"}`
	resp := post(t, a.srv.URL+"/v1/completions", body, map[string]string{HopHeader: NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now())})
	if resp.StatusCode != http.StatusRequestEntityTooLarge || len(*a.seen) != 0 {
		t.Fatalf("status %d, vLLM saw %d requests; want 413 and none", resp.StatusCode, len(*a.seen))
	}
}

// A forwarded body still streaming to the engine after the engine began
// its answer is left to the transport: the serving sidecar's server does
// not drain and close it when the answer's headers go out (full duplex),
// which would cut the answer on its way.
func TestHopBodyStreamsWhileAnswered(t *testing.T) {
	const head, tail = 1 << 10, 64 << 10
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		if _, err := io.ReadFull(r.Body, make([]byte, head)); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "data: rest %d %v\n\n", n, err)
	}))
	srv := frontOf(t, engine)

	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", pr)
	req.ContentLength = head + tail
	req.Header.Set(HopHeader, NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now()))
	answered := make(chan *http.Response, 1)
	failed := make(chan error, 1)
	go func() { // ends with the request
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			failed <- err
			return
		}
		answered <- resp
	}()
	pw.Write(make([]byte, head))
	var resp *http.Response
	select {
	case resp = <-answered:
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no answer's headers while the body was still coming: the serving sidecar's server drains the body before the headers go out (no full duplex)")
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "data: first\n" {
		t.Fatalf("first event %q (%v)", line, err)
	}
	pw.Write(make([]byte, tail))
	pw.Close()
	rest, err := io.ReadAll(rd)
	if want := fmt.Sprintf("\ndata: rest %d <nil>\n\n", tail); err != nil || string(rest) != want {
		t.Fatalf("rest of the answer %q (%v); want %q: the answer was cut", rest, err, want)
	}
}

// frontOf returns node "a"'s front (hop key "k") in front of engine, and
// closes both at cleanup.
func frontOf(t *testing.T, engine *httptest.Server) *httptest.Server {
	t.Cleanup(engine.Close)
	u, _ := url.Parse(engine.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey = "a", u, "m", []byte("k")
	h := New(cfg, &fakePeers{}, byteTokenizer{}, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

// A forwarded body without a Content-Length (chunked) cannot be capped at
// its length, so the serving sidecar reads it whole before sending it on.
func TestHopChunkedBodyIsReadWhole(t *testing.T) {
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, `{"read":%d,"err":%q}`, n, fmt.Sprint(err))
	}))
	srv := frontOf(t, engine)
	pr, pw := io.Pipe()
	go func() { // ends once the body is written
		pw.Write(make([]byte, 40<<10))
		pw.Close()
	}()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/completions", pr) // no ContentLength: chunked
	req.Header.Set(HopHeader, NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if want := fmt.Sprintf(`{"read":%d,"err":"<nil>"}`, 40<<10); resp.StatusCode != http.StatusOK || string(got) != want {
		t.Fatalf("status %d, engine saw %s; want 200 and %s", resp.StatusCode, got, want)
	}
}

// TestServerTimingFormat pins the header's text, metric by metric, for a
// routed request and a hop, with and without the upstream write's time.
func TestServerTimingFormat(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(f float64) time.Time { return t0.Add(time.Duration(f * float64(time.Millisecond))) }
	routed := &reqState{arrived: t0, started: ms(1.5), routed: ms(1.75), plan: &plan{}}
	if got, want := serverTiming(routed, ms(12)), "kvroute-read;dur=1.500, kvroute-route;dur=0.250, kvroute;dur=10.500"; got != want {
		t.Errorf("routed: %q; want %q", got, want)
	}
	routed.plan.wrote.Store(ms(2.0005).UnixNano())
	if got, want := serverTiming(routed, ms(12)), "kvroute-read;dur=1.500, kvroute-route;dur=0.250, kvroute-send;dur=0.251, kvroute;dur=10.500"; got != want {
		t.Errorf("routed, written: %q; want %q", got, want)
	}
	hop := &reqState{arrived: t0, started: t0, plan: &plan{}}
	if got, want := serverTiming(hop, ms(3)), "kvroute-hop;dur=3.000"; got != want {
		t.Errorf("hop: %q; want %q", got, want)
	}
	hop.plan.wrote.Store(ms(0.25).UnixNano())
	if got, want := serverTiming(hop, ms(3)), "kvroute-hop;dur=3.000, kvroute-hop-send;dur=0.250"; got != want {
		t.Errorf("hop, written: %q; want %q", got, want)
	}
}

// logSink hands each log line to the test, whatever goroutine wrote it.
type logSink chan string

func (s logSink) Write(b []byte) (int, error) {
	s <- string(b)
	return len(b), nil
}

// TestRoutedLogNamesRequest: the routed debug line names a request by its
// client's X-Request-Id, else by the front's name and its arrival order,
// and lists every candidate with its terms, the chosen one marked.
func TestRoutedLogNamesRequest(t *testing.T) {
	n := newNode(t, "a")
	n.peers.views = []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: time.Now()}}
	logs := make(logSink, 64)
	n.h.log = zerolog.New(logs).Level(zerolog.DebugLevel)
	for _, id := range []string{"", "client-7", ""} {
		hdr := map[string]string{}
		if id != "" {
			hdr["X-Request-Id"] = id
		}
		resp := post(t, n.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, hdr)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var got []string
	for timeout := time.After(5 * time.Second); len(got) < 3; {
		select {
		case l := <-logs:
			var line struct {
				Req, Message string
				Candidates   []route.Candidate
			}
			if json.Unmarshal([]byte(l), &line) == nil && line.Message == "routed" {
				got = append(got, line.Req)
				if i := slices.IndexFunc(line.Candidates, func(c route.Candidate) bool { return c.Chosen }); i < 0 || line.Candidates[i].ID != "a" {
					t.Errorf("%s: candidates %+v; want pod a chosen", line.Req, line.Candidates)
				}
			}
		case <-timeout:
			t.Fatalf("routed lines %q; want 3", got)
		}
	}
	if want := []string{"a-1", "client-7", "a-2"}; !slices.Equal(got, want) {
		t.Errorf("routed lines name %q; want %q", got, want)
	}
}
