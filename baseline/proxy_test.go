package baseline

import (
	"github.com/kvroute/kvroute/forward"

	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakePod answers every request with its name and the body it received.
func fakePod(t *testing.T, name string, h http.HandlerFunc) Backend {
	t.Helper()
	if h == nil {
		h = func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s:%s", name, b)
		}
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return Backend{Name: name, URL: srv.URL}
}

func newProxy(t *testing.T, cfg Config) *httptest.Server {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, body string) (served, answer string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Header.Get(ServedByHeader), string(b), resp.StatusCode
}

func TestProxyRoundRobinHeaderAndBody(t *testing.T) {
	srv := newProxy(t, Config{Policy: NameRoundRobin, Model: "m",
		Backends: []Backend{fakePod(t, "pod1", nil), fakePod(t, "pod2", nil)}})
	body := `{"model":"m","prompt":"hello"}`
	for i, want := range []string{"pod1", "pod2", "pod1"} {
		served, answer, status := post(t, srv.URL, body)
		if status != 200 || served != want || answer != want+":"+body {
			t.Errorf("request %d: status %d, served by %q, answer %q; want 200, %q, the body echoed", i, status, served, answer, want)
		}
	}
}

func TestProxyLeastLoadedCountsInFlight(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	blocking := func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		<-release
	}
	p, err := New(Config{Policy: NameLeastLoaded, Model: "m", Backends: []Backend{
		fakePod(t, "pod1", blocking), fakePod(t, "pod2", blocking), fakePod(t, "pod3", blocking)}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	defer close(release)
	// Six requests held open, sent one after the other: least-loaded must
	// spread them two per pod.
	for range 6 {
		arrived.Add(1)
		go func() {
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x"}`))
			if err == nil {
				resp.Body.Close()
			}
		}()
		arrived.Wait()
	}
	for _, s := range p.Stats() {
		if s.InFlight != 2 {
			t.Errorf("Stats() = %+v; want 2 in flight on every pod", p.Stats())
			break
		}
	}
}

func TestProxyStreamsUnbuffered(t *testing.T) {
	release := make(chan struct{})
	sse := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-release
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
	srv := newProxy(t, Config{Policy: NameRoundRobin, Backends: []Backend{fakePod(t, "pod1", sse)}})
	defer close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"x","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The first event must arrive while the pod still holds the stream.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: first\n" {
		t.Fatalf("first line %q, %v; want the first event before the stream ends", line, err)
	}
}

func TestProxyDeadBackend502(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	srv := newProxy(t, Config{Policy: NameRoundRobin, Backends: []Backend{{Name: "gone", URL: dead}}})
	served, _, status := post(t, srv.URL, `{"prompt":"x"}`)
	if status != http.StatusBadGateway || served != "gone" {
		t.Errorf("status %d served by %q; want 502 naming the chosen pod", status, served)
	}
}

func TestProxyCHWBLSticksByPrefix(t *testing.T) {
	srv := newProxy(t, Config{Policy: NameCHWBL, Model: "m", Backends: []Backend{
		fakePod(t, "pod1", nil), fakePod(t, "pod2", nil), fakePod(t, "pod3", nil)}})
	seen := map[string]bool{}
	for i := range 30 {
		first, _, _ := post(t, srv.URL, fmt.Sprintf(`{"model":"m","prompt":"conversation %d: hello"}`, i))
		again, _, _ := post(t, srv.URL, fmt.Sprintf(`{"model":"m","prompt":"conversation %d: hello"}`, i))
		if first != again {
			t.Errorf("conversation %d: %s then %s", i, first, again)
		}
		seen[first] = true
	}
	if len(seen) != 3 {
		t.Errorf("30 prefixes reached %v; want all 3 pods", seen)
	}
}

func TestNewErrors(t *testing.T) {
	b := []Backend{{Name: "a", URL: "http://127.0.0.1:1"}}
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"unknown policy", Config{Policy: "random", Backends: b}, ErrPolicy},
		{"no backends", Config{Policy: NameRoundRobin}, nil},
		{"bad url", Config{Policy: NameRoundRobin, Backends: []Backend{{URL: "::"}}}, nil},
		{"precise without events", Config{Policy: NameCentralPrecise, Backends: b}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("New error %v; want %v", err, tt.want)
			}
		})
	}
}

func TestProxyHealth(t *testing.T) {
	srv := newProxy(t, Config{Policy: NameRoundRobin, Backends: []Backend{{Name: "a", URL: "http://127.0.0.1:1"}}})
	resp, err := http.Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/health = %d; want 200 from the proxy itself", resp.StatusCode)
	}
}

func TestServedByHeaderMatchesForward(t *testing.T) {
	if ServedByHeader != forward.ServedByHeader {
		t.Errorf("baseline.ServedByHeader %q; forward's is %q", ServedByHeader, forward.ServedByHeader)
	}
}
