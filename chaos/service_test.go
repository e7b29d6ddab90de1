package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// backends starts n HTTP servers that answer with their own name.
func backends(t *testing.T, n int) (addrs []string, names map[string]string) {
	t.Helper()
	names = make(map[string]string)
	for i := range n {
		name := fmt.Sprintf("b%d", i)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			io.WriteString(w, name)
		}))
		t.Cleanup(srv.Close)
		addr := strings.TrimPrefix(srv.URL, "http://")
		addrs = append(addrs, addr)
		names[addr] = name
	}
	return addrs, names
}

func listenService(t *testing.T, cfg ServiceConfig) *Service {
	t.Helper()
	cfg.Addr = "127.0.0.1:0"
	s, err := ListenService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestServiceSpreadsPerConnection(t *testing.T) {
	addrs, _ := backends(t, 3)
	s := listenService(t, ServiceConfig{Backends: addrs, Seed: 7})
	// A new connection per request, as a client without keep-alive.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	const n = 300
	seen := map[string]int{}
	for range n {
		seen[get(t, c, s.URL())]++
	}
	for _, b := range []string{"b0", "b1", "b2"} {
		// Uniform: 100 expected each; 60 is > 5 standard deviations away.
		if seen[b] < 60 {
			t.Errorf("backend %s got %d of %d connections; want about %d", b, seen[b], n, n/3)
		}
	}
	counts, failed := s.Counts()
	total := 0
	for _, v := range counts {
		total += v
	}
	if total != n || failed != 0 {
		t.Errorf("Counts() = %v total, %d failed; want %d, 0", total, failed, n)
	}
}

func TestServiceKeepAliveSticks(t *testing.T) {
	addrs, _ := backends(t, 3)
	s := listenService(t, ServiceConfig{Backends: addrs, Seed: 1})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	first := get(t, c, s.URL())
	for i := range 20 {
		if got := get(t, c, s.URL()); got != first {
			t.Fatalf("request %d on a keep-alive connection served by %s; want %s (per-connection balancing)", i, got, first)
		}
	}
}

func TestServiceSeedReproducible(t *testing.T) {
	addrs, _ := backends(t, 4)
	sequence := func(seed uint64) string {
		s := listenService(t, ServiceConfig{Backends: addrs, Seed: seed})
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		var b strings.Builder
		for range 30 {
			b.WriteString(get(t, c, s.URL()))
		}
		return b.String()
	}
	a, b, other := sequence(42), sequence(42), sequence(43)
	if a != b {
		t.Errorf("same seed gave %q and %q", a, b)
	}
	if a == other {
		t.Errorf("seeds 42 and 43 gave the same 30 choices %q", a)
	}
}

func TestServiceDeadBackendClosesConnection(t *testing.T) {
	// A port nobody listens on: bind, note, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	s := listenService(t, ServiceConfig{Backends: []string{dead}})
	conn, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := bufio.NewReader(conn).ReadByte(); err == nil {
		t.Fatal("read a byte through a Service whose only backend is down; want EOF or reset")
	}
	if _, failed := s.Counts(); failed != 1 {
		t.Errorf("failed dials = %d; want 1", failed)
	}
}

func TestServiceCloseEndsOpenConnections(t *testing.T) {
	// A backend that accepts and never answers holds the splice open.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	s, err := ListenService(ServiceConfig{Addr: "127.0.0.1:0", Backends: []string{ln.Addr().String()}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("backend never saw the spliced connection")
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return with a connection open")
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil {
		t.Error("client connection still open after Close")
	}
}

func TestServiceSetBackends(t *testing.T) {
	addrs, _ := backends(t, 3)
	s := listenService(t, ServiceConfig{Backends: addrs, Seed: 3})
	s.SetBackends(addrs[2:])
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 20 {
		if got := get(t, c, s.URL()); got != "b2" {
			t.Fatalf("after SetBackends([b2]) a connection went to %s", got)
		}
	}
}

// probedBackend is an HTTP server that answers with its name and whose
// /readyz can be switched off.
type probedBackend struct {
	Endpoint
	ready atomic.Bool
}

func newProbed(t *testing.T, name string) *probedBackend {
	t.Helper()
	b := &probedBackend{}
	b.ready.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			if !b.ready.Load() {
				http.Error(w, "engine down", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
			return
		}
		io.WriteString(w, name)
	}))
	t.Cleanup(srv.Close)
	b.Endpoint = Endpoint{Name: name, Addr: strings.TrimPrefix(srv.URL, "http://"), ReadyURL: srv.URL + "/readyz"}
	return b
}

// waitFor polls cond every 5ms for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServiceReadinessProbe(t *testing.T) {
	a, b := newProbed(t, "a"), newProbed(t, "b")
	s := listenService(t, ServiceConfig{Endpoints: []Endpoint{a.Endpoint, b.Endpoint}, Seed: 3,
		Probe: ProbeConfig{Period: 10 * time.Millisecond, FailureThreshold: 3}})
	if got := s.Ready(); len(got) != 2 {
		t.Fatalf("Ready() = %v at start; want both initial endpoints", got)
	}
	b.ready.Store(false)
	failedAt := time.Now()
	waitFor(t, "b to leave the endpoints", func() bool { return len(s.Ready()) == 1 })
	// Three failed probes at a 10ms period: not before ~20ms.
	if d := time.Since(failedAt); d < 20*time.Millisecond {
		t.Errorf("b removed %v after its probe failed; want >= 2 periods (threshold 3)", d)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 20 {
		if got := get(t, hc, s.URL()); got != "a" {
			t.Fatalf("new connection went to %q while b is unready", got)
		}
	}
	tr := s.Transitions()
	if len(tr) != 1 || tr[0].Name != "b" || tr[0].Ready || !strings.Contains(tr[0].Why, "status 503") {
		t.Errorf("Transitions() = %+v; want one: b not ready after status 503", tr)
	}

	// A new pod takes traffic only once its probe passed.
	c := newProbed(t, "c")
	c.ready.Store(false)
	s.SetEndpoints([]Endpoint{a.Endpoint, b.Endpoint, c.Endpoint})
	time.Sleep(50 * time.Millisecond) // several periods: c must stay out
	if got := s.Ready(); len(got) != 1 || got[0] != "a" {
		t.Fatalf("Ready() = %v with c failing its probe; want [a]", got)
	}
	c.ready.Store(true)
	waitFor(t, "c to become ready", func() bool { return len(s.Ready()) == 2 })

	// Terminating takes a pod out at once, whatever its probe says.
	s.Terminate("a")
	if got := s.Ready(); len(got) != 1 || got[0] != "c" {
		t.Errorf("Ready() = %v after Terminate(a); want [c]", got)
	}
	s.Terminate("c")
	// No endpoint ready: the connection is refused (closed at once).
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); err == nil {
		t.Errorf("read %d bytes from a Service without ready endpoints; want the connection closed", n)
	}
	logged := s.Conns()
	if len(logged) == 0 || !logged[len(logged)-1].DialErr {
		t.Errorf("Conns() last = %+v; want the refused connection recorded", logged)
	}
}
