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
	"strings"
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
	// Events, Replay and Topic are the pod's KV-event endpoints; only the
	// exact-index policies (central-*, lmetric, uncoordinated) subscribe.
	// Replay may be empty.
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
	// MaxStoredResponses bounds the Responses ids whose creating pod the
	// proxy remembers (default 100,000, some 10 MB); a follow-up of an id
	// forgotten is routed as a new request and its pod answers 404.
	MaxStoredResponses int
	// CHWBL, Approx and Precise tune their policies; Precise.Model and
	// Scheme are filled from Model and BlockSize when empty.
	CHWBL   CHWBLConfig
	Approx  ApproxConfig
	Precise PreciseConfig
	// Uncoordinated tunes the uncoordinated fronts' rule; lmetric and
	// uncoordinated key and index requests as Precise says.
	Uncoordinated UncoordinatedConfig
}

// DefaultConfig returns the defaults; Policy, Backends and Model must be set.
func DefaultConfig() Config {
	return Config{
		BlockSize:          16,
		ScrapeInterval:     200 * time.Millisecond,
		TokenizeTimeout:    2 * time.Second,
		MaxBodyBytes:       32 << 20,
		MaxStoredResponses: 100_000,
		CHWBL:              DefaultCHWBLConfig(),
		Approx:             DefaultApproxConfig(),
		Precise:            DefaultPreciseConfig(""),
		Uncoordinated:      DefaultUncoordinatedConfig(),
	}
}

// Proxy is a central HTTP reverse proxy that picks a pod per request with
// one Policy. Use it as an http.Handler; Run drives its background work.
type Proxy struct {
	cfg      Config
	backends []*backend
	clients  []*vllmclient.Client
	scrape   bool
	indexes  []*kvindex.Index // the exact-index policies only (central-*, lmetric, uncoordinated)
	owners   *owners          // stored responses' creating backends

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
	stored   int
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
	if cfg.MaxStoredResponses <= 0 {
		cfg.MaxStoredResponses = d.MaxStoredResponses
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
	p := &Proxy{cfg: cfg, owners: newOwners(cfg.MaxStoredResponses)}
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
			Rewrite:        func(r *httputil.ProxyRequest) { r.SetURL(u) },
			Transport:      transport,
			FlushInterval:  -1, // SSE: every event as it comes
			ErrorHandler:   errorHandler,
			ModifyResponse: p.tapIDs(i),
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
	case NameCentralPrecise, NameCentralPreciseGPU, NameCentralExact, NameLMetric, NameUncoordinated:
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
			if cfg.Policy == NameCentralPreciseGPU {
				matchers[i] = GPUOnly{ix}
			}
		}
		for _, b := range cfg.Backends {
			if b.Events == "" {
				return nil, fmt.Errorf("proxy: %s needs every backend's KV-event endpoint (%s has none)", cfg.Policy, b.Name)
			}
		}
		pc.ExactLoad = cfg.Policy == NameCentralExact
		switch cfg.Policy {
		case NameLMetric:
			p.policy = NewLMetric(pc, matchers, cfg.Seed) // its cost reads no scrape
		case NameUncoordinated:
			p.policy = NewUncoordinated(names, pc, cfg.Uncoordinated, matchers, cfg.Seed)
			p.scrape = true // each front sizes its forward memory by its own pod's cache
		default:
			p.policy = NewPrecise(pc, matchers)
			p.scrape = true
		}
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

// apiOf is the API of a generation path whose body routing reads.
func apiOf(path string) (prompt.API, bool) {
	switch path {
	case "/v1/completions":
		return prompt.APICompletions, true
	case "/v1/chat/completions":
		return prompt.APIChat, true
	case "/v1/messages":
		return prompt.APIMessages, true
	case "/v1/responses":
		return prompt.APIResponses, true
	}
	return 0, false
}

// ServeHTTP picks a pod for the request and proxies it there: a request
// about a stored response (previous_response_id, GET /v1/responses/{id},
// .../cancel) goes to the pod that created it, any other by the policy.
// GET /health is answered by the proxy itself.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" && r.Method == http.MethodGet {
		w.WriteHeader(http.StatusOK)
		return
	}
	var req Request
	owner := -1
	if api, ok := apiOf(r.URL.Path); ok && r.Method == http.MethodPost {
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
		pr, err := prompt.ParseAPI(body, api)
		if pr.PreviousResponseID != "" && (err == nil || errors.Is(err, prompt.ErrNoPrompt)) {
			if i, ok := p.owners.get(pr.PreviousResponseID); ok {
				owner = i
			}
		}
		if err == nil && owner < 0 {
			req = requestFrom(pr)
			if p.indexes != nil {
				p.tokens(r.Context(), pr, &req)
			}
		}
	} else if id, ok := storedID(r.URL.Path); ok {
		if i, ok := p.owners.get(id); ok {
			owner = i
		}
	}
	var be *backend
	var end func()
	if owner >= 0 {
		be = p.pin(owner)
	} else {
		be, end = p.pick(req, time.Now())
	}
	defer p.done(be, end)
	w.Header().Set(ServedByHeader, be.Name)
	be.rp.ServeHTTP(w, r)
}

// tokens fills req's token ids the way vLLM will compute them: a batch's
// text prompts one by one with /tokenize; a chat with images by the chat
// render endpoint, whose features place the images (their identifiers key
// the blocks they overlap), or /tokenize without it; any other text or
// chat (Messages and Responses as converted) with /tokenize. On failure
// the ids stay nil and the policy routes by load.
func (p *Proxy) tokens(ctx context.Context, pr prompt.Prompt, req *Request) {
	switch {
	case req.Batch != nil:
		for i, ids := range req.Batch {
			if ids == nil && i < len(pr.Texts) {
				req.Batch[i] = p.tokenize(ctx, vllmclient.TokenizeRequest{Model: pr.Model, Prompt: pr.Texts[i], AddSpecialTokens: pr.AddSpecialTokens})
			}
		}
	case req.Tokens != nil:
	case pr.Chat && len(pr.Images) > 0:
		if ids, mm, ok := p.render(ctx, pr); ok {
			req.Tokens, req.MM = ids, mm
			return
		}
		req.Tokens = p.tokenize(ctx, vllmclient.TokenizeRequestFor(pr))
	default:
		req.Tokens = p.tokenize(ctx, vllmclient.TokenizeRequestFor(pr))
	}
}

// client returns the next simulator to tokenize with, in turn.
func (p *Proxy) client() *vllmclient.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clients[p.tok%len(p.clients)]
	p.tok++
	return c
}

// tokenize asks one simulator, in turn, for the prompt's token ids; nil on
// failure (the policy then routes by load).
func (p *Proxy) tokenize(ctx context.Context, tr vllmclient.TokenizeRequest) []uint32 {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.TokenizeTimeout)
	defer cancel()
	ids, err := p.client().Tokenize(ctx, tr)
	if err != nil {
		return nil
	}
	return ids
}

// render asks one simulator, in turn, to render a chat prompt: the chat
// body as the client sent it, or the chat request a Messages or Responses
// body converts to. ok is false when it has no render endpoint (vLLM
// serves them with --enable-scale-out) or failed.
func (p *Proxy) render(ctx context.Context, pr prompt.Prompt) ([]uint32, []blockkey.MM, bool) {
	body := pr.Raw
	if pr.API != prompt.APIChat {
		body = prompt.ChatBody(pr, pr.MaxTokens)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.TokenizeTimeout)
	defer cancel()
	out, err := p.client().Render(ctx, "/v1/chat/completions/render", body)
	if err != nil || len(out) != 1 {
		return nil, nil, false
	}
	var mm []blockkey.MM
	for _, m := range out[0].MM {
		mm = append(mm, blockkey.MM{ID: m.ID, Offset: m.Offset, Length: m.Length})
	}
	return out[0].Tokens, mm, true
}

// tapIDs records, for backend i, the id of every response it creates.
func (p *Proxy) tapIDs(i int) func(*http.Response) error {
	return func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK || resp.Request.Method != http.MethodPost || resp.Request.URL.Path != "/v1/responses" {
			return nil
		}
		sse := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		resp.Body = &idTap{rc: resp.Body, sse: sse, found: func(id string) { p.owners.put(id, i) }}
		return nil
	}
}

// pin counts a request in flight at backend i, chosen because it holds
// the stored response the request is about.
func (p *Proxy) pin(i int) *backend {
	p.mu.Lock()
	defer p.mu.Unlock()
	be := p.backends[i]
	be.inFlight++
	be.served++
	be.stored++
	return be
}

// tracker is a Policy that keeps its own count of the requests it chose
// a pod for (uncoordinated: each front counts only its own). The proxy
// calls Track in place of Pick, and the end it returns (if not nil) once
// the request's answer has ended; both under the proxy's lock, as Pick.
type tracker interface {
	Track(req Request, pods []Pod, now time.Time) (pod int, end func())
}

// pick runs the policy under the lock and counts the request in flight;
// end is a tracker's, for done.
func (p *Proxy) pick(req Request, now time.Time) (be *backend, end func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pods := make([]Pod, len(p.backends))
	for i, b := range p.backends {
		pods[i] = Pod{Name: b.Name, InFlight: b.inFlight, Load: b.load, LoadAt: b.loadAt}
	}
	var i int
	if t, ok := p.policy.(tracker); ok {
		i, end = t.Track(req, pods, now)
	} else {
		i = p.policy.Pick(req, pods, now)
	}
	if i < 0 || i >= len(p.backends) {
		i = 0 // a policy bug must not take the proxy down
	}
	be = p.backends[i]
	be.inFlight++
	be.served++
	return be, end
}

// done ends a request at be: the proxy's count, and the policy's (end,
// when the policy tracks its own).
func (p *Proxy) done(be *backend, end func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	be.inFlight--
	if end != nil {
		end()
	}
}

// PodStats is one backend's counters.
type PodStats struct {
	Name             string
	Served, InFlight int
	Load             Load
	LoadAt           time.Time
	// Stored counts the requests sent to the pod because it holds the
	// stored response they are about.
	Stored int
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
		out[i] = PodStats{Name: b.Name, Served: b.served, InFlight: b.inFlight, Stored: b.stored, Load: b.load, LoadAt: b.loadAt}
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
