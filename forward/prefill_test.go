package forward

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// TestSentPrefillCounts checks that a request sent to a peer raises the
// work queued there, as this front sees it, by the tokens the peer must
// compute, from the send to the answer's first byte, and that the hop
// tells the peer the same figure.
func TestSentPrefillCounts(t *testing.T) {
	firstByte, finish := make(chan struct{}), make(chan struct{})
	gotPrefill := make(chan string, 1)
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		gotPrefill <- r.Header.Get(PrefillHeader)
		<-firstByte
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		<-finish
	}))
	t.Cleanup(peer.Close)
	t.Cleanup(func() { close(finish) })

	a := newNode(t, "a")
	held := keySet{}
	for _, k := range promptKeys()[:2] { // b holds two of the prompt's four blocks
		held[k] = true
	}
	now := time.Now()
	a.peers.views = []route.PeerView{
		{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now},
		{ID: "b", Addr: hostOf(peer), KeyScheme: blockkey.Version, Digest: held, LoadAt: now},
	}
	body := `{"model":"m","prompt":"` + testPrompt + `","stream":true}`
	want := len(testPrompt) - 2*16
	queuedAtB := func() (int, int) {
		d, _, err := a.h.Explain(t.Context(), []byte(body), prompt.APICompletions)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Candidates {
			if c.ID == "b" {
				return c.Queued, int(c.Load)
			}
		}
		t.Fatal("no candidate b")
		return 0, 0
	}
	if q, _ := queuedAtB(); q != 0 {
		t.Fatalf("before any send: %d tokens queued at b; want 0", q)
	}

	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest("POST", a.srv.URL+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			close(done)
			return
		}
		done <- resp
	}()
	select {
	case v := <-gotPrefill:
		if v != strconv.Itoa(want) {
			t.Errorf("hop's %s = %q; want %d", PrefillHeader, v, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request never reached b")
	}
	if q, l := queuedAtB(); q != want || l != 1 {
		t.Errorf("sent, no answer yet: b has %d tokens queued, load %d; want %d and 1", q, l, want)
	}
	close(firstByte)
	resp := <-done
	if resp == nil {
		return
	}
	defer resp.Body.Close()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	// The client has the first byte, so the front's tap has seen it.
	if q, l := queuedAtB(); q != 0 || l != 1 {
		t.Errorf("first byte back: b has %d tokens queued, load %d; want 0 and 1 (it still decodes)", q, l)
	}
}

// TestClientPrefillIgnored checks that a client cannot inflate a pod's
// queued work: PrefillHeader counts only on a trusted hop, and vLLM never
// sees it.
func TestClientPrefillIgnored(t *testing.T) {
	a := newNode(t, "a") // no peers: served locally
	resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`,
		map[string]string{PrefillHeader: "999999"})
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	a.peers.mu.Lock()
	queued := append([]int(nil), a.peers.queued...)
	prefilling := append([]int(nil), a.peers.prefilling...)
	a.peers.mu.Unlock()
	if len(queued) == 0 || queued[0] != len(testPrompt) {
		t.Errorf("queued reports %v; want the prompt's %d tokens first (nothing cached, no peer)", queued, len(testPrompt))
	}
	// One request waits for its first token, then none (answered, done).
	if len(prefilling) < 2 || prefilling[0] != 1 || prefilling[len(prefilling)-1] != 0 {
		t.Errorf("prefilling reports %v; want 1 first and 0 last", prefilling)
	}
	if len(*a.seen) != 1 || (*a.seen)[0].Get(PrefillHeader) != "" {
		t.Errorf("vLLM saw %v; want one request without %s", *a.seen, PrefillHeader)
	}
}

// FuzzHopPrefill: a peer's X-Kvroute-Prefill never panics, never yields
// negative or capped-over figures, and what prefillValue writes reads back.
func FuzzHopPrefill(f *testing.F) {
	for _, s := range []string{"", "1048", "24; for=63", "-1", "5;for=", "9999999999999999999999", "1; for=3600000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r, _ := http.NewRequest("POST", "/", nil)
		r.Header.Set(PrefillHeader, v)
		n, d := hopPrefill(r)
		if n < 0 || n > maxPrefill || d < 0 || d >= time.Hour {
			t.Fatalf("%q: %d tokens, %v", v, n, d)
		}
		r.Header.Set(PrefillHeader, prefillValue(target{Prefill: n, PrefillFor: d}))
		if n2, d2 := hopPrefill(r); n2 != n || d2 != d.Truncate(time.Millisecond) {
			t.Fatalf("%q: %d, %v wrote and read back as %d, %v", v, n, d, n2, d2)
		}
	})
}

// A Responses stream's prefill ends at the first event after vLLM's
// preamble (response.created, response.in_progress), however the bytes
// are cut; a stream of other events ends it at their first.
func TestFirstOutput(t *testing.T) {
	preamble := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"" +
		strings.Repeat("x", 3000) + "\"}}\n\n" +
		"event: response.in_progress\r\ndata: {}\r\n\r\n"
	output := "event: response.output_item.added\ndata: {}\n\n"
	for _, tt := range []struct {
		name, stream string
		at           int // bytes read when fn must have run; -1: at EOF
	}{
		// fn runs once the output event's first line is read.
		{"preamble then output", preamble + output, len(preamble) + strings.Index(output, "\n") + 1},
		{"no preamble", output, strings.Index(output, "\n") + 1},
		{"preamble only", preamble, -1},
	} {
		for _, chunk := range []int{1, 7, 4096} {
			called, read, fired := -1, 0, false
			f := newFirstOutput(io.NopCloser(&chunked{s: tt.stream, n: chunk}), func() { fired = true })
			buf := make([]byte, chunk)
			for {
				n, err := f.Read(buf)
				read += n
				if fired && called < 0 {
					called = read
				}
				if err != nil {
					break
				}
			}
			want := tt.at
			if want < 0 {
				want = len(tt.stream)
			}
			// fn runs on the read that crossed the point: within a chunk of it.
			if called < want || called > want+chunk {
				t.Errorf("%s, reads of %d: fn at byte %d; want on the read past byte %d", tt.name, chunk, called, want)
			}
		}
	}
}

// chunked returns s at most n bytes a read.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}

// A prefix the chosen pod holds on its CPU tier is loaded, not computed,
// and not free either: the target's queued work counts its tokens at
// their load's cost (route.Config.Work), where it counted them as none.
func TestWithPrefillCountsLoadedTokens(t *testing.T) {
	cfg := route.DefaultConfig()
	cfg.CPULoadTokensPerSecond = 4 * cfg.PrefillTokensPerSecond // a CPU token costs a quarter
	d := route.Decision{Candidates: []route.Candidate{
		{ID: "a", Local: true},
		{ID: "b", MatchedTokens: 3000, GPUTokens: 1000, CPUTokens: 2000, Queued: 500},
	}}
	ts := []target{{Peer: "b"}, {}}
	withPrefill(ts, d, 4000, false, cfg)
	if b := ts[0]; b.Prompt != 4000 || b.Prefill != 1000+500 {
		t.Errorf("b: prompt %d, prefill %d; want 4000, 1500 (1000 uncached, 2000 loaded at a quarter)", b.Prompt, b.Prefill)
	}
	if want := time.Duration(float64(500+1500) / cfg.PrefillTokensPerSecond * float64(time.Second)); ts[0].PrefillFor != want {
		t.Errorf("b: prefill for %v; want %v", ts[0].PrefillFor, want)
	}
	if a := ts[1]; a.Prefill != 4000 {
		t.Errorf("local: prefill %d; want the whole prompt", a.Prefill)
	}
}

// TestRepushAt: the timer that reports the local queue again is armed
// once for a time (reports at the same time leave it be), disarmed by a
// zero time, and once it fired and reported, disarmed until armed again.
func TestRepushAt(t *testing.T) {
	a := newNode(t, "a")
	h := a.h
	reports := func() int {
		a.peers.mu.Lock()
		defer a.peers.mu.Unlock()
		return len(a.peers.serving)
	}
	now := time.Now()
	later := now.Add(time.Hour)
	h.mu.Lock()
	h.repushAt(later, now)
	timer := h.repush
	h.repushAt(later, now.Add(time.Second))
	if h.repush != timer || !h.repushDue.Equal(later) {
		t.Errorf("armed again for the same time: due %v", h.repushDue)
	}
	h.repushAt(time.Time{}, now)
	if !h.repushDue.IsZero() || h.repush.Stop() {
		t.Errorf("a zero time left it armed (due %v)", h.repushDue)
	}
	n := reports()
	h.repushAt(time.Now().Add(time.Millisecond), time.Now())
	h.mu.Unlock()
	for deadline := time.Now().Add(5 * time.Second); reports() == n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the timer never reported")
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.repushDue.IsZero() {
		t.Errorf("fired, but due %v", h.repushDue)
	}
	h.repushAt(later, now)
	if !h.repushDue.Equal(later) || !h.repush.Stop() {
		t.Errorf("not armed again after firing (due %v)", h.repushDue)
	}
}
