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
