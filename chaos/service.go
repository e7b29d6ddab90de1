package chaos

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// Addr is the listen address, e.g. "127.0.0.1:8000"; port 0 picks one.
	Addr string
	// Backends are the endpoints' host:port addresses.
	Backends []string
	// Seed seeds the per-connection choice, so a run can be repeated.
	Seed uint64
	// DialTimeout bounds connecting to the chosen backend (default 1s).
	// kube-proxy does not retry another endpoint: a dial failure closes the
	// client's connection, as a SYN to a dead pod would end in a reset.
	DialTimeout time.Duration
}

// Service is a Kubernetes ClusterIP Service as kube-proxy's iptables mode
// implements it: for every accepted connection it picks a backend uniformly
// at random and splices bytes both ways. Balancing is per connection, so a
// keep-alive client sends all its requests to one pod, and per-request
// connections spread (kubernetes#64580).
type Service struct {
	cfg ServiceConfig
	ln  net.Listener

	mu       sync.Mutex
	rng      *rand.Rand
	backends []string
	counts   map[string]int // connections accepted per backend
	failed   int            // dials that failed
	conns    map[net.Conn]struct{}
	closed   bool

	wg sync.WaitGroup
}

// ListenService listens on cfg.Addr and serves until Close. The accept
// loop and one goroutine pair per connection exit when Close is called.
func ListenService(cfg ServiceConfig) (*Service, error) {
	if len(cfg.Backends) == 0 {
		return nil, errors.New("service: no backends")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	s := &Service{
		cfg:      cfg,
		ln:       ln,
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		backends: append([]string(nil), cfg.Backends...),
		counts:   make(map[string]int),
		conns:    make(map[net.Conn]struct{}),
	}
	s.wg.Go(s.accept)
	return s, nil
}

// Addr returns the address the Service listens on.
func (s *Service) Addr() string { return s.ln.Addr().String() }

// URL returns "http://" + Addr().
func (s *Service) URL() string { return "http://" + s.Addr() }

// SetBackends replaces the endpoint list for new connections, as the
// endpoints controller does when a pod turns unready; open connections stay.
// An empty list is ignored.
func (s *Service) SetBackends(b []string) {
	if len(b) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backends = append([]string(nil), b...)
}

// Counts returns how many connections went to each backend so far, and how
// many dials failed.
func (s *Service) Counts() (perBackend map[string]int, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out, s.failed
}

// Close stops accepting, closes every open connection and waits for the
// Service's goroutines to exit.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// accept runs until the listener is closed.
func (s *Service) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors or similar: back off as net/http does
			// rather than spin or give up.
			time.Sleep(5 * time.Millisecond)
			continue
		}
		backend, ok := s.pick(c)
		if !ok {
			c.Close()
			return
		}
		s.wg.Go(func() { s.splice(c, backend) })
	}
}

// pick chooses a backend and registers c for Close; false when closed.
func (s *Service) pick(c net.Conn) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", false
	}
	s.conns[c] = struct{}{}
	return s.backends[s.rng.IntN(len(s.backends))], true
}

func (s *Service) forget(cs ...net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cs {
		delete(s.conns, c)
		c.Close()
	}
}

// splice connects client to backend and copies both ways until both
// directions end; it returns when both connections are closed.
func (s *Service) splice(client net.Conn, backend string) {
	up, err := net.DialTimeout("tcp", backend, s.cfg.DialTimeout)
	s.mu.Lock()
	if err != nil {
		s.failed++
	} else {
		s.counts[backend]++
		if s.closed {
			up.Close()
		} else {
			s.conns[up] = struct{}{}
		}
	}
	s.mu.Unlock()
	if err != nil {
		s.forget(client)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { pipe(up, client) })
	pipe(client, up)
	wg.Wait()
	s.forget(client, up)
}

// pipe copies src to dst, then half-closes dst so the peer sees EOF while
// the other direction keeps flowing (an HTTP client may close its write side
// while it reads a long SSE answer).
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
		_ = cw.CloseWrite() // the peer may be gone already
		return
	}
	// An error (reset, Close) ends both directions.
	dst.Close()
	src.Close()
}
