package baseline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/vllmclient"
)

// ServedByHeader names the pod that served a request, as the sidecars'
// forward.ServedByHeader does (a test holds the two equal; importing
// forward would pull its HTTP front into every baseline).
const ServedByHeader = "X-Kvroute-Served-By"

// Backend is one simulated pod behind the proxy.
type Backend struct {
	Name string // reported in ServedByHeader
	URL  string // the simulator's base URL, e.g. http://127.0.0.2:8001
	// Events, Replay and Topic are the pod's KV-event endpoints; only
	// central-precise subscribes. Replay may be empty.
	Events, Replay, Topic string
}

// Config configures a Proxy. Zero fields take DefaultConfig's values.
type Config struct {
	// Policy is one of Names.
	Policy   string
	Backends []Backend
	// Model is the served base model (central-precise seeds keys with it).
	Model string
	// BlockSize is vLLM's block size (default 16).
	BlockSize int
	// Seed seeds approx-prefix's tie-breaking.
	Seed uint64
	// ScrapeInterval is how often approx-prefix and the central policies scrape
	// every pod's /metrics (default 200ms, GIE's metrics refresh interval
	// is 50ms; 200ms keeps 2 cores free for the pods).
	ScrapeInterval time.Duration
	// TokenizeTimeout bounds the central policies' /tokenize call; past it the
	// request is routed by load alone (default 2s).
	TokenizeTimeout time.Duration
	// MaxBodyBytes bounds request bodies (default 32 MiB, as the sidecar).
	MaxBodyBytes int64
	// CHWBL, Approx and Precise tune their policies; Precise.Model and
	// Scheme are filled from Model and BlockSize when empty.
	CHWBL   CHWBLConfig
	Approx  ApproxConfig
	Precise PreciseConfig
}

// DefaultConfig returns the defaults; Policy, Backends and Model must be set.
func DefaultConfig() Config {
	return Config{
		BlockSize:       16,
		ScrapeInterval:  200 * time.Millisecond,
		TokenizeTimeout: 2 * time.Second,
		MaxBodyBytes:    32 << 20,
		CHWBL:           DefaultCHWBLConfig(),
		Approx:          DefaultApproxConfig(),
		Precise:         DefaultPreciseConfig(""),
	}
}

// Proxy is a central HTTP reverse proxy that picks a pod per request with
// one Policy. Use it as an http.Handler; Run drives its background work.
type Proxy struct {
	cfg      Config
	backends []*backend
	clients  []*vllmclient.Client
	scrape   bool
	indexes  []*kvindex.Index // central-precise and central-exact only

	mu     sync.Mutex // serialises Pick and the InFlight counts
	policy Policy
	tok    int // next backend to tokenize with
}

type backend struct {
	Backend
	rp *httputil.ReverseProxy

	// guarded by Proxy.mu
	inFlight int
	served   int
	load     Load
	loadAt   time.Time
}

// New builds a Proxy. It opens no sockets; Run does.
func New(cfg Config) (*Proxy, error) {
	d := DefaultConfig()
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = d.BlockSize
	}
	if cfg.ScrapeInterval <= 0 {
		cfg.ScrapeInterval = d.ScrapeInterval
	}
	if cfg.TokenizeTimeout <= 0 {
		cfg.TokenizeTimeout = d.TokenizeTimeout
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = d.MaxBodyBytes
	}
	if len(cfg.Backends) == 0 {
		return nil, errors.New("proxy: no backends")
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	p := &Proxy{cfg: cfg}
	names := make([]string, len(cfg.Backends))
	for i, b := range cfg.Backends {
		u, err := url.Parse(b.URL)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("proxy: backend %q: bad URL %q", b.Name, b.URL)
		}
		if b.Name == "" {
			b.Name = u.Host
		}
		names[i] = b.Name
		be := &backend{Backend: b}
		be.rp = &httputil.ReverseProxy{
			Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(u) },
			Transport:     transport,
			FlushInterval: -1, // SSE: every event as it comes
			ErrorHandler:  errorHandler,
		}
		p.backends = append(p.backends, be)
		p.clients = append(p.clients, vllmclient.New(vllmclient.ClientConfig{BaseURL: b.URL, Timeout: cfg.TokenizeTimeout}))
	}
	switch cfg.Policy {
	case NameRoundRobin:
		p.policy = &RoundRobin{}
	case NameLeastLoaded:
		p.policy = LeastLoaded{}
	case NameCHWBL:
		p.policy = NewCHWBL(names, cfg.CHWBL)
	case NameApproxPrefix:
		p.policy = NewApproxPrefix(len(names), cfg.Approx, rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5851f42d4c957f2d)))
		p.scrape = true
	case NameCentralPrecise, NameCentralExact:
		pc := cfg.Precise
		if pc == (PreciseConfig{}) {
			pc = d.Precise
		}
		if pc.Model == "" {
			pc.Model = cfg.Model
		}
		if pc.Scheme.BlockSize <= 0 {
			pc.Scheme = blockkey.Scheme{BlockSize: cfg.BlockSize, Stride: 1}
		}
		if pc.Route == (route.Config{}) {
			pc.Route = route.DefaultConfig()
		}
		matchers := make([]route.Matcher, len(names))
		for i := range names {
			ix := kvindex.New(kvindex.Config{Model: pc.Model, Scheme: pc.Scheme})
			p.indexes = append(p.indexes, ix)
			matchers[i] = ix
		}
		for _, b := range cfg.Backends {
			if b.Events == "" {
				return nil, fmt.Errorf("proxy: %s needs every backend's KV-event endpoint (%s has none)", cfg.Policy, b.Name)
			}
		}
		pc.ExactLoad = cfg.Policy == NameCentralExact
		p.policy = NewPrecise(pc, matchers)
		p.scrape = true
	default:
		return nil, fmt.Errorf("proxy: %q: %w", cfg.Policy, ErrPolicy)
	}
	return p, nil
}

// errorHandler answers 502 when the chosen pod cannot be reached. The
// baselines do not retry, as KubeAI and the EPP leave retries to Envoy.
func errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(r.Context().Err(), context.Canceled) {
		return // the client left; nobody reads the answer
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, `{"error":{"message":%q,"type":"BadGateway","code":502}}`, "upstream: "+err.Error())
}

// ServeHTTP picks a pod for the request and proxies it there. GET /health
// is answered by the proxy itself.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		w.WriteHeader(http.StatusOK)
		return
	}
	var req Request
	chat := r.URL.Path == "/v1/chat/completions"
	if r.Method == http.MethodPost && (chat || r.URL.Path == "/v1/completions") {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			status := http.StatusBadRequest
			if errors.As(err, &mbe) {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "read body: "+err.Error(), status)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		// A body routing cannot read is still served (the pod answers the
		// client's error), chosen by load alone.
		if prompt, err := prompt.Parse(body, chat); err == nil {
			req = requestFrom(prompt)
			if p.indexes != nil && req.Tokens == nil {
				req.Tokens = p.tokenize(r.Context(), prompt)
			}
		}
	}
	be := p.pick(req, time.Now())
	defer p.done(be)
	w.Header().Set(ServedByHeader, be.Name)
	be.rp.ServeHTTP(w, r)
}

// tokenize asks one simulator, in turn, for the prompt's token ids; nil on
// failure (the policy then routes by load).
func (p *Proxy) tokenize(ctx context.Context, pr prompt.Prompt) []uint32 {
	p.mu.Lock()
	c := p.clients[p.tok%len(p.clients)]
	p.tok++
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.TokenizeTimeout)
	defer cancel()
	ids, err := c.Tokenize(ctx, vllmclient.TokenizeRequestFor(pr))
	if err != nil {
		return nil
	}
	return ids
}

// pick runs the policy under the lock and counts the request in flight.
func (p *Proxy) pick(req Request, now time.Time) *backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]Pod, len(p.backends))
	for i, b := range p.backends {
		pods[i] = Pod{Name: b.Name, InFlight: b.inFlight, Load: b.load, LoadAt: b.loadAt}
	}
	i := p.policy.Pick(req, pods, now)
	if i < 0 || i >= len(p.backends) {
		i = 0 // a policy bug must not take the proxy down
	}
	be := p.backends[i]
	be.inFlight++
	be.served++
	return be
}

func (p *Proxy) done(be *backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	be.inFlight--
}

// PodStats is one backend's counters.
type PodStats struct {
	Name             string
	Served, InFlight int
	Load             Load
	LoadAt           time.Time
	// IndexKeys is the routing keys central-precise's index holds for the
	// pod (0 for other policies).
	IndexKeys int
}

// Stats returns every backend's counters in backend order.
func (p *Proxy) Stats() []PodStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PodStats, len(p.backends))
	for i, b := range p.backends {
		out[i] = PodStats{Name: b.Name, Served: b.served, InFlight: b.inFlight, Load: b.load, LoadAt: b.loadAt}
		if p.indexes != nil {
			out[i].IndexKeys = p.indexes[i].Len()
		}
	}
	return out
}

// Run scrapes metrics (approx-prefix, central-precise) and applies every
// pod's KV events (central-precise) until ctx is done. Its goroutines, one
// scraper and one event loop per pod, all exit before it returns. It
// returns the first subscription error, or nil when ctx ended.
func (p *Proxy) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(p.backends))
	if p.scrape {
		wg.Go(func() { p.scrapeLoop(ctx) })
	}
	for i := range p.indexes {
		b := p.backends[i].Backend
		sub, err := vllmclient.Subscribe(ctx, subscriberConfig(b))
		if err != nil {
			cancel()
			wg.Wait()
			return fmt.Errorf("proxy: subscribe %s: %w", b.Name, err)
		}
		wg.Go(func() {
			applyEvents(sub.Items(), p.indexes[i])
			if err := sub.Err(); err != nil {
				errc <- fmt.Errorf("proxy: events of %s: %w", b.Name, err)
				cancel()
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func subscriberConfig(b Backend) vllmclient.Config {
	c := vllmclient.LocalConfig()
	c.Endpoint, c.ReplayEndpoint, c.Topic = b.Events, b.Replay, b.Topic
	return c
}

// applyEvents feeds a pod's index until items closes. Lost events leave the
// index uncertain: it may claim blocks the pod evicted until they are
// stored or removed again; a central router has no better source.
func applyEvents(items <-chan vllmclient.Item, ix *kvindex.Index) {
	for it := range items {
		vllmclient.ApplyItem(ix, it)
	}
}

// scrapeLoop scrapes every pod each ScrapeInterval until ctx is done. A
// failed scrape keeps the previous load, which then ages (route's LoadTTL).
func (p *Proxy) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		var wg sync.WaitGroup
		for i, c := range p.clients {
			wg.Go(func() {
				sctx, cancel := context.WithTimeout(ctx, p.cfg.ScrapeInterval*5)
				defer cancel()
				l, err := c.Load(sctx)
				if err != nil {
					return
				}
				now := time.Now()
				p.mu.Lock()
				b := p.backends[i]
				b.load = Load{Running: l.Running, Waiting: l.Waiting, KVUsage: l.KVUsage, NumGPUBlocks: l.NumGPUBlocks}
				b.loadAt = now
				p.mu.Unlock()
			})
		}
		wg.Wait()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
