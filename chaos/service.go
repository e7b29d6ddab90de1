package chaos

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// ServiceConfig configures a Service.
type ServiceConfig struct {
	// Addr is the listen address, e.g. "127.0.0.1:8000"; port 0 picks one.
	Addr string
	// Backends are endpoints without a readiness probe, always ready.
	Backends []string
	// Endpoints are probed endpoints (see Probe); a Service may have both.
	Endpoints []Endpoint
	// Seed seeds the per-connection choice, so a run can be repeated.
	Seed uint64
	// DialTimeout bounds connecting to the chosen backend (default 1s).
	// kube-proxy does not retry another endpoint: a dial failure closes the
	// client's connection, as a SYN to a dead pod would end in a reset.
	DialTimeout time.Duration
	// Probe is the readiness probe of Endpoints.
	Probe ProbeConfig
	// Progress gets a line per readiness change; nil: none.
	Progress io.Writer
}

// Endpoint is a probed backend: a pod's API address and its readiness URL.
type Endpoint struct {
	Name, Addr string
	// ReadyURL is probed with GET; 200-399 passes. "" means always ready.
	ReadyURL string
}

// ProbeConfig is a Kubernetes readinessProbe. The Service learns of a
// failure only after Period × FailureThreshold, as the endpoints controller
// does; a new endpoint takes traffic after SuccessThreshold passes.
type ProbeConfig struct {
	Period           time.Duration // default 1s (Kubernetes: 10s)
	Timeout          time.Duration // default 1s, as Kubernetes
	FailureThreshold int           // default 3, as Kubernetes
	SuccessThreshold int           // default 1, as Kubernetes
}

func (p ProbeConfig) withDefaults() ProbeConfig {
	if p.Period <= 0 {
		p.Period = time.Second
	}
	if p.Timeout <= 0 {
		p.Timeout = time.Second
	}
	if p.FailureThreshold <= 0 {
		p.FailureThreshold = 3
	}
	if p.SuccessThreshold <= 0 {
		p.SuccessThreshold = 1
	}
	return p
}

// Transition is one readiness change the Service saw.
type Transition struct {
	At    time.Time
	Name  string
	Ready bool
	Why   string
}

// ConnRecord is one accepted client connection: its client address, when
// it came, the endpoint it was spliced to and whether that dial failed.
type ConnRecord struct {
	Client  string
	At      time.Time
	Name    string // endpoint name; the address for a plain backend
	Backend string
	DialErr bool
}

// endpoint is an Endpoint's probe state.
type endpoint struct {
	Endpoint
	ready            bool
	passes, failures int
	terminating      bool
}

// Service is a Kubernetes ClusterIP Service as kube-proxy's iptables mode
// implements it: for every accepted connection it picks a ready endpoint
// uniformly at random and splices bytes both ways. Balancing is per
// connection, so a keep-alive client sends all its requests to one pod
// until the pod closes the connection, and per-request connections spread
// (kubernetes#64580). With no ready endpoint a connection is refused
// (closed at once), as kube-proxy's REJECT rule does.
type Service struct {
	cfg ServiceConfig
	ln  net.Listener
	hc  *http.Client

	mu       sync.Mutex
	rng      *rand.Rand
	backends []string
	eps      []*endpoint
	counts   map[string]int // connections accepted per backend
	failed   int            // dials that failed
	refused  int            // connections with no ready endpoint
	conns    map[net.Conn]struct{}
	log      []ConnRecord
	trans    []Transition
	closed   bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// ListenService listens on cfg.Addr and serves until Close. The accept
// loop, the probe loop and one goroutine pair per connection exit when
// Close is called.
func ListenService(cfg ServiceConfig) (*Service, error) {
	if len(cfg.Backends) == 0 && len(cfg.Endpoints) == 0 {
		return nil, errors.New("service: no backends")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	cfg.Probe = cfg.Probe.withDefaults()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("service: %w", err)
	}
	s := &Service{
		cfg:      cfg,
		ln:       ln,
		hc:       &http.Client{Timeout: cfg.Probe.Timeout, Transport: &http.Transport{DisableKeepAlives: true}},
		rng:      rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15)),
		backends: append([]string(nil), cfg.Backends...),
		counts:   make(map[string]int),
		conns:    make(map[net.Conn]struct{}),
		stop:     make(chan struct{}),
	}
	s.setEndpoints(cfg.Endpoints, true)
	s.wg.Go(s.accept)
	s.wg.Go(s.probeLoop)
	return s, nil
}

// Addr returns the address the Service listens on.
func (s *Service) Addr() string { return s.ln.Addr().String() }

// URL returns "http://" + Addr().
func (s *Service) URL() string { return "http://" + s.Addr() }

// SetBackends replaces the unprobed endpoint list for new connections;
// open connections stay. An empty list is ignored.
func (s *Service) SetBackends(b []string) {
	if len(b) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backends = append([]string(nil), b...)
}

// SetEndpoints replaces the probed endpoints, as a Deployment's pods come
// and go. An endpoint already known (same Name and Addr) keeps its state;
// a new one takes traffic only after its probe passes.
func (s *Service) SetEndpoints(eps []Endpoint) { s.setEndpoints(eps, false) }

// setEndpoints: initial endpoints of a new Service start ready, as the
// pods of an existing Deployment are.
func (s *Service) setEndpoints(eps []Endpoint, initial bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := make(map[Endpoint]*endpoint, len(s.eps))
	for _, e := range s.eps {
		old[e.Endpoint] = e
	}
	s.eps = s.eps[:0:0]
	for _, e := range eps {
		if o, ok := old[e]; ok {
			s.eps = append(s.eps, o)
			continue
		}
		s.eps = append(s.eps, &endpoint{Endpoint: e, ready: initial || e.ReadyURL == ""})
	}
}

// Terminate takes the endpoint named name out of rotation at once, as the
// endpoints controller does for a pod being deleted (before its preStop
// hook runs); open connections stay. SetEndpoints without it forgets it.
func (s *Service) Terminate(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.eps {
		if e.Name == name && !e.terminating {
			e.terminating = true
			s.transition(e, false, "terminating")
		}
	}
}

// transition records a readiness change; s.mu is held.
func (s *Service) transition(e *endpoint, ready bool, why string) {
	if e.ready == ready && why != "terminating" {
		return
	}
	e.ready = ready
	t := Transition{At: time.Now(), Name: e.Name, Ready: ready, Why: why}
	s.trans = append(s.trans, t)
	state := "not ready"
	if ready {
		state = "ready"
	}
	fmt.Fprintf(s.cfg.Progress, "service: %s %s (%s)\n", e.Name, state, why)
}

// Ready returns the names of the endpoints new connections may go to.
func (s *Service) Ready() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.eps {
		if e.ready && !e.terminating {
			out = append(out, e.Name)
		}
	}
	return out
}

// Transitions returns every readiness change so far.
func (s *Service) Transitions() []Transition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.trans)
}

// Conns returns every accepted connection so far, in order.
func (s *Service) Conns() []ConnRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
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

// Close stops accepting and probing, closes every open connection and
// waits for the Service's goroutines to exit.
func (s *Service) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// probeLoop probes every probed endpoint each Period until Close.
func (s *Service) probeLoop() {
	t := time.NewTicker(s.cfg.Probe.Period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		// Which endpoints to probe is read under mu: Terminate marks them.
		s.mu.Lock()
		var eps []*endpoint
		for _, e := range s.eps {
			if e.ReadyURL != "" && !e.terminating {
				eps = append(eps, e)
			}
		}
		s.mu.Unlock()
		var wg sync.WaitGroup
		for _, e := range eps {
			wg.Go(func() {
				ok, why := s.probe(e.ReadyURL)
				s.record(e, ok, why)
			})
		}
		wg.Wait()
	}
}

// probe runs one readiness check.
func (s *Service) probe(url string) (bool, string) {
	resp, err := s.hc.Get(url)
	if err != nil {
		return false, "probe: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return true, "probe passed"
	}
	return false, fmt.Sprintf("probe status %d", resp.StatusCode)
}

// record applies one probe result with the thresholds.
func (s *Service) record(e *endpoint, ok bool, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.terminating {
		return
	}
	if ok {
		e.failures = 0
		e.passes++
		if !e.ready && e.passes >= s.cfg.Probe.SuccessThreshold {
			s.transition(e, true, why)
		}
		return
	}
	e.passes = 0
	e.failures++
	if e.ready && e.failures >= s.cfg.Probe.FailureThreshold {
		s.transition(e, false, fmt.Sprintf("%d failed probes, last: %s", e.failures, why))
	}
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
		name, backend, ok := s.pick(c)
		if !ok {
			c.Close()
			continue
		}
		s.wg.Go(func() { s.splice(c, name, backend) })
	}
}

// pick chooses a ready backend and registers c for Close; false when
// closed or when no endpoint is ready.
func (s *Service) pick(c net.Conn) (name, addr string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", "", false
	}
	type cand struct{ name, addr string }
	var cands []cand
	for _, b := range s.backends {
		cands = append(cands, cand{b, b})
	}
	for _, e := range s.eps {
		if e.ready && !e.terminating {
			cands = append(cands, cand{e.Name, e.Addr})
		}
	}
	if len(cands) == 0 {
		s.refused++
		s.log = append(s.log, ConnRecord{Client: c.RemoteAddr().String(), At: time.Now(), DialErr: true})
		return "", "", false
	}
	s.conns[c] = struct{}{}
	pick := cands[s.rng.IntN(len(cands))]
	return pick.name, pick.addr, true
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
func (s *Service) splice(client net.Conn, name, backend string) {
	at := time.Now()
	up, err := net.DialTimeout("tcp", backend, s.cfg.DialTimeout)
	s.mu.Lock()
	s.log = append(s.log, ConnRecord{Client: client.RemoteAddr().String(), At: at, Name: name, Backend: backend, DialErr: err != nil})
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
