package forward

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// loneNode is a one-pod mesh whose vLLM is upstream.
func loneNode(t *testing.T, upstream http.Handler, edit func(*Config)) *node {
	vllm := httptest.NewServer(upstream)
	t.Cleanup(vllm.Close)
	u, _ := url.Parse(vllm.URL)
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey, cfg.Scheme = "a", u, "m", []byte("k"), perBlock
	edit(&cfg)
	fp := &fakePeers{views: []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, LoadAt: time.Now()}}}
	h := New(cfg, fp, byteTokenizer{}, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	srv := httptest.NewUnstartedServer(e)
	srv.Config.ErrorLog = log.New(panicLog{t}, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	return &node{h: h, srv: srv, vllm: vllm, peers: fp}
}

func errorsOf(h *Handler, kind, api string) float64 {
	var m dto.Metric
	h.metrics.badRequests.WithLabelValues(kind, api).Write(&m)
	return m.GetCounter().GetValue()
}

// TestTrickledBodyIsCutOff sends a request's headers and part of its body,
// then nothing: the front answers 408 in the API's error shape once
// BodyTimeout has passed, and no engine sees the request.
func TestTrickledBodyIsCutOff(t *testing.T) {
	upstreamHit := make(chan struct{}, 4)
	n := loneNode(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { upstreamHit <- struct{}{} }),
		func(c *Config) { c.BodyTimeout = 200 * time.Millisecond })
	for _, tt := range []struct{ path, api string }{{"/v1/completions", "completions"}, {"/v1/messages", "messages"}} {
		conn, err := net.Dial("tcp", hostOf(n.srv))
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"model\":\"m\",\"prompt\":\"012", tt.path)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second)) // a hang fails the test, not the suite
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer to a trickled body within 5 s: %v", tt.path, err)
		}
		took := time.Since(t0)
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("%s: status %d body %s; want 408", tt.path, resp.StatusCode, body)
		}
		if took < 200*time.Millisecond {
			t.Errorf("%s: cut off after %v, before the 200ms body timeout", tt.path, took)
		}
		switch tt.api {
		case "messages":
			var e anthropicError
			if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" {
				t.Errorf("%s: body %s: not Anthropic's error shape (%v)", tt.path, body, err)
			}
		default:
			var e apiError
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != 408 || e.Error.Type != "RequestTimeoutError" {
				t.Errorf("%s: body %s: not an OpenAI 408 (%v)", tt.path, body, err)
			}
		}
		if got := errorsOf(n.h, bodyTimeoutKind, tt.api); got != 1 {
			t.Errorf("%s: request_errors_total{kind=body_timeout} = %v; want 1", tt.path, got)
		}
		t.Logf("%s: 408 after %v", tt.path, took.Round(time.Millisecond))
	}
	select {
	case <-upstreamHit:
		t.Error("the engine was sent a request whose body never arrived")
	default:
	}
	// A body that arrives in time on the same settings is served, and the
	// deadline does not outlive it on a kept-alive connection.
	resp := post(t, n.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("a prompt body: status %d; want 200", resp.StatusCode)
	}
	io.Copy(io.Discard, resp.Body)
}

// TestSlowStreamReaderIsCutOff streams an endless SSE answer to a client
// that never reads: once the socket buffers are full a write blocks, and
// after WriteTimeout the front gives up, which cancels the engine's request
// (its slot is free) and counts a write_timeout.
func TestSlowStreamReaderIsCutOff(t *testing.T) {
	canceled := make(chan time.Duration, 1)
	chunk := "data: " + strings.Repeat("x", 32<<10) + "\n\n"
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		t0 := time.Now()
		for {
			if _, err := io.WriteString(w, chunk); err != nil {
				break
			}
			w.(http.Flusher).Flush()
			if r.Context().Err() != nil {
				break
			}
		}
		<-r.Context().Done() // the front closed the engine's connection
		canceled <- time.Since(t0)
	})
	n := loneNode(t, upstream, func(c *Config) { c.WriteTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", hostOf(n.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4 << 10) // fill up sooner
	body := `{"model":"m","stream":true,"prompt":"` + testPrompt + `"}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// ... and never read. The engine's request must end within 10 s (the
	// buffers fill in well under a second on loopback).
	select {
	case d := <-canceled:
		t.Logf("the engine's request was canceled after %v of streaming to a client that does not read", d.Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("a stream to a client that never reads still holds the engine after 10 s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for errorsOf(n.h, writeTimeoutKind, "completions") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("request_errors_total{kind=write_timeout} = %v; want 1", errorsOf(n.h, writeTimeoutKind, "completions"))
		}
		time.Sleep(10 * time.Millisecond) // polling a counter, with a deadline
	}
	// The front's in-flight count is back to 0: nothing holds the slot.
	deadline = time.Now().Add(5 * time.Second)
	for n.h.InFlight()[""] != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("in flight at the local engine = %d; want 0", n.h.InFlight()[""])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStreamToReadingClientIsNotCut checks the write and body bounds do not
// cut a stream a client reads, however long it lasts, nor, on the kept-alive
// connection, an answer written later without the bound (an error the
// front writes itself) after a pause longer than the bound.
func TestStreamToReadingClientIsNotCut(t *testing.T) {
	const events = 40
	upstream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range events {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond) // the engine's pace, not synchronization
		}
	})
	const bound = 200 * time.Millisecond
	n := loneNode(t, upstream, func(c *Config) { c.WriteTimeout, c.BodyTimeout = bound, bound })
	var reused []bool
	do := func(body string) (int, string) {
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), "POST", n.srv.URL+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		return resp.StatusCode, string(b)
	}
	status, b := do(`{"model":"m","stream":true,"prompt":"` + testPrompt + `"}`)
	if status != 200 || strings.Count(b, "data: ") != events {
		t.Fatalf("stream: status %d, %d events; want 200 and %d events over %v, 4x the bound", status, strings.Count(b, "data: "), events, events*20*time.Millisecond)
	}
	time.Sleep(2 * bound) // the pause under test: past the deadline the stream's last write set
	if status, b = do(`{"model":`); status != 400 {
		t.Fatalf("bad JSON after the pause: status %d body %s; want the front's own 400", status, b)
	}
	if len(reused) != 2 || !reused[1] {
		t.Errorf("connection reuse %v; want the second request on the first one's connection", reused)
	}
	if got := errorsOf(n.h, writeTimeoutKind, "completions"); got != 0 {
		t.Errorf("write_timeout = %v; want 0", got)
	}
}

// TestHungEngineRequestsAreAbandoned sends requests to a local engine that
// takes them and never answers (a hung one), then has the engine watcher
// declare it down: the waiting client request gets a retryable 503 and the
// waiting hop a refusal its sender retries elsewhere, within a second of
// the verdict, not a hang.
func TestHungEngineRequestsAreAbandoned(t *testing.T) {
	arrived := make(chan struct{}, 4)
	hung := make(chan struct{})
	defer close(hung)
	n := loneNode(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select { // hung: no byte of an answer, until the test ends
		case <-hung:
		case <-r.Context().Done():
		}
	}), func(*Config) {})
	type answer struct {
		resp *http.Response
		body []byte
		err  error
		at   time.Time
	}
	send := func(hdr map[string]string) chan answer {
		ch := make(chan answer, 1)
		go func() { // exits when the request is answered or the server closes
			req, _ := http.NewRequest("POST", n.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"`+testPrompt+`"}`))
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			a := answer{resp: resp, err: err}
			if err == nil {
				a.body, _ = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			a.at = time.Now()
			ch <- a
		}()
		return ch
	}
	client := send(nil)
	hop := send(map[string]string{HopHeader: NewHop([]byte("k"), time.Minute).Sign("b", "a", time.Now())})
	for range 2 {
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			t.Fatal("the requests never reached the engine")
		}
	}
	down := time.Now()
	n.h.SetLocalReady(false) // the watcher's verdict: hung
	for name, ch := range map[string]chan answer{"client": client, "hop": hop} {
		select {
		case a := <-ch:
			if a.err != nil {
				t.Fatalf("%s: %v", name, a.err)
			}
			took := a.at.Sub(down)
			if a.resp.StatusCode != 503 || took >= time.Second {
				t.Fatalf("%s: status %d after %v (%s); want 503 within 1 s of the engine going down", name, a.resp.StatusCode, took, a.body)
			}
			if name == "client" && (a.resp.Header.Get("Retry-After") == "" || a.resp.Header.Get(RefusedHeader) != "") {
				t.Errorf("client: Retry-After %q, %s %q; want a Retry-After and no refusal marker", a.resp.Header.Get("Retry-After"), RefusedHeader, a.resp.Header.Get(RefusedHeader))
			}
			if name == "hop" && a.resp.Header.Get(RefusedHeader) == "" {
				t.Errorf("hop: no %s; its sender would not retry elsewhere", RefusedHeader)
			}
			t.Logf("%s: 503 %v after the engine went down", name, took.Round(time.Microsecond))
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer 5 s after the engine went down: a hang", name)
		}
	}
	// Later requests are refused at once, before the engine is tried.
	t0 := time.Now()
	resp := post(t, n.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || time.Since(t0) >= time.Second {
		t.Errorf("after: status %d Retry-After %q in %v; want a retryable 503 within 1 s", resp.StatusCode, resp.Header.Get("Retry-After"), time.Since(t0))
	}
}

// TestAbandonedAttemptIsRetried checks an attempt abandoned at a hung
// local engine goes on to the plan's next target, which serves it.
func TestAbandonedAttemptIsRetried(t *testing.T) {
	arrived := make(chan struct{}, 1)
	hung := make(chan struct{})
	defer close(hung)
	a := loneNode(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	}), func(*Config) {})
	b := newNode(t, "b")
	held := keySet{}
	for _, k := range promptKeys() {
		held[k] = true
	}
	now := time.Now()
	a.peers.views = []route.PeerView{ // a holds the prompt: it is tried first
		{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: held, LoadAt: now},
		{ID: "b", Addr: hostOf(b.srv), KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now},
	}
	done := make(chan *http.Response, 1)
	go func() { // exits when the request is answered or fails
		resp, err := http.Post(a.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"`+testPrompt+`"}`))
		if err != nil {
			t.Error(err)
			resp = nil
		}
		done <- resp
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached a's engine")
	}
	a.h.SetLocalReady(false)
	select {
	case resp := <-done:
		if resp == nil {
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "b" {
			t.Fatalf("status %d from %q; want 200 from b after a's engine went down", resp.StatusCode, resp.Header.Get("X-Pod"))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer 5 s after a's engine went down")
	}
	if !retryable(errEngineDown, 0, RetryConfig{MaxAttempts: 3}) || retryable(errEngineDown, 2, RetryConfig{MaxAttempts: 3}) {
		t.Error("errEngineDown: want retryable while attempts remain, and only then")
	}
}

// hangingTokenizer is a hung engine's /tokenize: no answer until ctx ends
// (a canceled one: at once, as an HTTP client's).
type hangingTokenizer struct{ called chan struct{} }

func (h hangingTokenizer) Tokenize(ctx context.Context, _ prompt.Prompt) ([]uint32, error) {
	h.called <- struct{}{}
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestHungTokenizerDoesNotHoldRequests checks a request is not held for
// TokenizeTimeout by a hung local engine: tokenizing stops when the engine
// goes down, and is not tried while it is down; the request is routed by
// load to a peer that serves it.
func TestHungTokenizerDoesNotHoldRequests(t *testing.T) {
	b := newNode(t, "b")
	u, _ := url.Parse(b.vllm.URL) // any URL: the local engine is never reached here
	cfg := DefaultConfig()
	cfg.Self, cfg.VLLM, cfg.Model, cfg.HopKey, cfg.Scheme = "a", u, "m", []byte("k"), perBlock
	cfg.TokenizeTimeout = time.Minute
	now := time.Now()
	fp := &fakePeers{views: []route.PeerView{
		{ID: "a", Local: true, KeyScheme: blockkey.Version, LoadAt: now},
		{ID: "b", Addr: hostOf(b.srv), KeyScheme: blockkey.Version, LoadAt: now},
	}}
	tok := hangingTokenizer{called: make(chan struct{}, 4)}
	h := New(cfg, fp, tok, nil, zerolog.Nop())
	e := gin.New()
	h.Register(e)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	answered := make(chan *http.Response, 1)
	go func() { // exits when the request is answered or fails
		resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"`+testPrompt+`"}`))
		if err != nil {
			t.Error(err)
		}
		answered <- resp
	}()
	select {
	case <-tok.called:
	case <-time.After(5 * time.Second):
		t.Fatal("the request was never tokenized")
	}
	down := time.Now()
	h.SetLocalReady(false)
	for i, why := range []string{"tokenizing when the engine went down", "sent while it is down"} {
		if i == 1 {
			go func() { // as above
				resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"`+testPrompt+`"}`))
				if err != nil {
					t.Error(err)
				}
				answered <- resp
			}()
			down = time.Now()
		}
		select {
		case resp := <-answered:
			if resp == nil {
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "b" || time.Since(down) >= time.Second {
				t.Errorf("%s: status %d from %q after %v; want 200 from b within 1 s", why, resp.StatusCode, resp.Header.Get("X-Pod"), time.Since(down))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer within 5 s; the hung tokenizer holds it", why)
		}
	}
}
