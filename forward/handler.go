package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// Response headers that say who served a request and why.
const (
	ServedByHeader = "X-Kvroute-Served-By"
	DecisionHeader = "X-Kvroute-Decision"
	// RefusedHeader marks a 503 by which a sidecar refuses a forwarded
	// request it cannot serve (its engine is down, or it is draining),
	// before any byte of an answer: the sender tries its next candidate.
	RefusedHeader = "X-Kvroute-Refused"
)

// errModelNotServed is a forwarded request's 404 from the local vLLM.
var errModelNotServed = errors.New("the local vLLM does not serve the model")

// Peers is the peer table as the front needs it; *gossip.Mesh satisfies it.
type Peers interface {
	// AppendSnapshot returns every live peer, the local pod included
	// (Local set), written over buf (nil: a new slice), in its array when
	// that is large enough.
	AppendSnapshot(buf []route.PeerView, now time.Time) []route.PeerView
	// EachPeer calls f with each of AppendSnapshot's peers until f returns
	// false, building their views as it goes: admission before the choice
	// reads them only up to the first pod with room. f keeps nothing.
	EachPeer(now time.Time, f func(*route.PeerView) bool)
	// MarkFailed records that a forward to peer failed at the given time.
	MarkFailed(peer string, at time.Time)
	// SetServing reports how many requests the front has at the local vLLM,
	// how many of them still wait for their first token and their prompt
	// tokens still to prefill, and the engine's route.Load.PrefillShare
	// (peers learn them at once, which keeps independent fronts from
	// herding).
	SetServing(requests, prefilling, prefillTokens int, share float64)
	// Claim shares that a request whose prefix cs claim was just sent to
	// peer (this node's own name included).
	Claim(peer string, cs []route.Claim)
}

// Tokenizer returns the token ids vLLM will use for a prompt (the local
// vLLM's /tokenize renders chat templates exactly).
type Tokenizer interface {
	Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error)
}

// Config of the front. DefaultConfig documents the defaults.
type Config struct {
	// Self is this node's name in the mesh (the local PeerView's ID).
	Self string
	// VLLM is the local vLLM's base URL.
	VLLM *url.URL
	// Model is the base model name block keys are seeded with. A request
	// naming another model is treated as a LoRA adapter of it, unless
	// IsAdapter says otherwise.
	Model string
	// IsAdapter reports whether a model name other than Model is a LoRA
	// adapter, whose blocks vLLM hashes with its name; another name the
	// base model is served under (--served-model-name) is not, and its
	// requests are keyed as Model's. nil treats every other name as an
	// adapter.
	IsAdapter func(model string) bool
	// Scheme is the routing key scheme (block size and stride).
	Scheme blockkey.Scheme
	// MaxBodyBytes bounds request bodies (413 above). Default 32 MiB.
	MaxBodyBytes int64
	// Retry bounds attempts before the first response byte. Default 3.
	Retry RetryConfig
	// HopKey authenticates hop headers between sidecars. HopMaxAge is how
	// old (or how far in the future) a header may be. Default 30 s.
	HopKey    []byte
	HopMaxAge time.Duration
	// TokenizeTimeout bounds the /tokenize call; past it the request is
	// routed by load alone. Default 2 s.
	TokenizeTimeout time.Duration
	// Route and Recent configure the choice (route.DefaultConfig).
	Route  route.Config
	Recent route.RecentConfig
	// NoShortlist makes every choice read every peer's view. By default a
	// choice among route.ShortlistMin peers or more reads the few that
	// can win it and sums the rest (route.Shortlist), and decides the
	// same: at a thousand peers under half the time (docs/scale).
	NoShortlist bool
	// DialTimeout bounds connecting to a peer or the local vLLM. Default 1 s,
	// so a dead peer costs little before the next candidate is tried.
	DialTimeout time.Duration
	// LocalFailed, if set, is told of every request to the local vLLM that
	// failed before an answer (the engine watcher: a refused connection
	// means the engine is gone).
	LocalFailed func(error)
	// ModelsChanged, if set, is told when the local vLLM answered a
	// forwarded request that it does not serve its model (the advertised
	// list is behind: an adapter was unloaded).
	ModelsChanged func()
	// MaxQueue is the requests waiting at a pod's engine (not yet
	// scheduled) at which the pod is full; MaxQueueWait is the queued
	// prefill, at Route.PrefillTokensPerSecond, at which it is. When every
	// pod that could serve a client's request is full, it is refused at
	// once with 429 and Retry-After (admit.go). Defaults 64 and 8 s: 8 s
	// of queue drains within the 10 s a burst's TTFT must recover in, and
	// it is the bound a backlog of prompts meets (16 waiting 32k-token
	// chats are half a minute of prefill). A count cannot tell a burst
	// from a backlog: at 16, agent fan-out (8 calls of a task at once,
	// 41.6 req/s on 4 pods) had two tasks' calls waiting at a holder for
	// a moment and was steered off it and refused, 87% served at a TTFT
	// p90 of 2.3-2.5 s; at 64 or off, all served at 0.62-0.63 s
	// (docs/bench/2026-12-06/waiting.md). The count is for requests that
	// wait with little prefill: for KV space, or behind long decodes.
	// 0 turns either off.
	MaxQueue     int
	MaxQueueWait time.Duration
	// MaxPrefillShare is the prefill share (route.Load.PrefillShare) at
	// which a pod takes no new request of over SmallPrefill uncached
	// tokens (admit.go): an engine whose every step carries a prefill
	// chunk decodes the requests it runs at a token per step of prefill
	// (2 tokens a second at 8192-token chunks), so under a sustained
	// backlog a long answer started early never ends. Above the share the
	// pod's queue drains and its engine runs decode-only steps until the
	// share falls below it again: a tenth of its time at the default 0.9.
	// 0 or 1: off.
	MaxPrefillShare float64
	// StepTokens is the engine's token budget for one step (vLLM's
	// --max-num-batched-tokens): the prefill share refuses a request only
	// if, with it, more than this is queued for prefill at the pod, the
	// backlog whose every step is a full chunk. Default 8192 (vLLM V1's
	// for online serving on an H100, the simulator's). 0: any queue.
	StepTokens int
	// ServeRetry is the attempt (RetryCountHeader) from which a client's
	// request passes MaxPrefillShare: its last, refused, would be lost
	// (admit.go). Default 2, the SDKs' default max_retries. 0: off.
	ServeRetry int
	// BodyTimeout bounds reading a client's request body, from its
	// headers: a body trickled in slower is cut off with 408 (counted as
	// request_errors_total{kind="body_timeout"}), so a slow client holds
	// sidecar memory no longer. Default 10 s (32 MiB at 3.2 MB/s, a
	// 32k-token chat at 15 KB/s). 0: no bound.
	BodyTimeout time.Duration
	// Ranks is how many data-parallel ranks the local vLLM runs (the
	// sidecar's --kv-events-dp-ranks). Above 1, with PlaceRanks, the front
	// names the rank of every request it sends its vLLM that the client
	// did not pin (RankHeader): the rank holding the prefix, unless the
	// work queued there costs more than the prefix saves, else the rank
	// with the least work (route.Config.PickRank). It counts each rank's
	// work exactly because it names every rank; vLLM's own balancer sees
	// only request counts. Default 1; PlaceRanks default true (false: the
	// mesh's pin goes as chosen, and vLLM balances the rest).
	Ranks      int
	PlaceRanks bool
	// WriteTimeout bounds every write of an answer to the client: a
	// client that reads a stream so slowly that a write blocks that long
	// is cut off (request_errors_total{kind="write_timeout"}) and the
	// engine's request canceled, so it holds no engine slot. Default 10 s.
	// 0: no bound.
	WriteTimeout time.Duration
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{
		Scheme:          blockkey.DefaultScheme(),
		MaxBodyBytes:    32 << 20,
		Retry:           RetryConfig{MaxAttempts: 3},
		HopMaxAge:       30 * time.Second,
		TokenizeTimeout: 2 * time.Second,
		Route:           route.DefaultConfig(),
		Recent:          route.DefaultRecentConfig(),
		DialTimeout:     time.Second,
		MaxQueue:        64,
		MaxQueueWait:    8 * time.Second,
		MaxPrefillShare: 0.9,
		StepTokens:      8192,
		ServeRetry:      2,
		BodyTimeout:     10 * time.Second,
		WriteTimeout:    10 * time.Second,
		Ranks:           1,
		PlaceRanks:      true,
	}
}

// Handler is the sidecar's OpenAI front: it routes completions and passes
// everything else to the local vLLM.
type Handler struct {
	cfg     Config
	peers   Peers
	tok     Tokenizer
	text    TextPrefixes // nil: chat prompts are tokenized on the request path
	textIDs bool         // chats ask their engine for their prompt's token ids
	log     zerolog.Logger
	metrics *Metrics
	proxy   *httputil.ReverseProxy
	client  *http.Client // the front's own calls to pods (probes), over the proxy's transport
	hop     Hop
	now     func() time.Time

	render *renderer // nil: no render endpoints are used
	stored Stored    // nil: stored responses are the local vLLM's only
	// engines are where peers' vLLMs listen (direct.go).
	engines *engines

	mu      sync.Mutex // guards recent, flights, sent and policy use
	recent  *route.Recent
	policy  route.Policy
	flights flights
	sent    map[sentKey]uint64
	repush  *time.Timer // reports the local queue when a prefill's time is up
	// repushDue is when repush is armed for; zero: disarmed or fired.
	repushDue time.Time
	share     prefillShare
	snaps     snapshots // the request path's copies of the peer table
	also      []string  // choose's scratch: the peers with requests in flight

	draining   atomic.Bool
	localReady atomic.Bool
	ranks      atomic.Int32 // Config.Ranks, as SetRanks last set it
	waiting    *waiters     // local attempts waiting for headers
	active     sync.WaitGroup
	seq        atomic.Uint64
}

// New builds a Handler. metrics may be nil (then nothing is exported).
func New(cfg Config, peers Peers, tok Tokenizer, m *Metrics, log zerolog.Logger) *Handler {
	if m == nil {
		m = NewMetrics(nil)
	}
	h := &Handler{
		cfg: cfg, peers: peers, tok: tok, log: log, metrics: m,
		hop: NewHop(cfg.HopKey, cfg.HopMaxAge), now: time.Now,
		recent: route.NewRecent(cfg.Recent), flights: flights{}, sent: map[sentKey]uint64{},
	}
	h.localReady.Store(true)
	h.SetRanks(cfg.Ranks)
	h.waiting = &waiters{}
	h.policy = route.DefaultChain(cfg.Route, h.recent)
	bufs := &copyBuffers{}
	dialer := &httpDialer{timeout: cfg.DialTimeout, bufs: bufs}
	h.engines = newEngines(dialer.DialContext)
	base := &http.Transport{
		DialContext:         dialer.DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		// Headers and a body of up to ~5k token ids go out in one write
		// (the default 4 KiB split a 1032-token prompt in three), so the
		// upstream wakes once per request.
		WriteBufferSize: 32 << 10,
	}
	tr := &attempts{base: base, hop: h.hop, self: cfg.Self, retry: cfg.Retry, now: h.now,
		failed: func(peer string, at time.Time) {
			m.retries.Inc()
			if peers != nil {
				peers.MarkFailed(peer, at)
			}
		},
		localFailed: cfg.LocalFailed, local: h.waiting}
	h.client = &http.Client{Transport: base}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(cfg.VLLM)
			r.Out.Host = cfg.VLLM.Host
		},
		Transport: tr,
		// 0, not -1: ReverseProxy already flushes every write of a
		// text/event-stream or unknown-length response (SSE is never
		// buffered; TestStreamingFlushesPerEvent checks it), and a JSON
		// body with a Content-Length then goes out in one write instead of
		// a flush per copy plus chunked framing (~10% of the sidecar's CPU).
		FlushInterval:  0,
		BufferPool:     bufs,
		ModifyResponse: h.modifyResponse,
		ErrorHandler:   h.proxyError,
	}
	return h
}

// readBody reads a request body of at most limit bytes. With a
// Content-Length up to presizeMax it reads into one buffer of that size
// instead of growing one (io.ReadAll copied a 6 KB prompt four times);
// above, memory follows the bytes that actually arrive, so a header alone
// cannot make the sidecar allocate limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	const presizeMax = 1 << 20
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= min(limit, presizeMax) {
		buf := make([]byte, n)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return buf, nil // net/http reads no further than Content-Length
	}
	return io.ReadAll(rd)
}

// copyBuffers lends ReverseProxy its response copy buffers; without a pool
// it allocates 32 KiB per request (40% of the front's allocation). The
// pool holds array pointers, which a returned slice converts to in place:
// a *[]byte would cost an allocation per Put.
type copyBuffers struct{ p sync.Pool }

const copyBufferSize = 32 << 10

func (b *copyBuffers) Get() []byte {
	if v, ok := b.p.Get().(*[copyBufferSize]byte); ok {
		return v[:]
	}
	return make([]byte, copyBufferSize)
}

func (b *copyBuffers) Put(buf []byte) {
	if cap(buf) >= copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(buf[:copyBufferSize]))
	}
}

// Register mounts the front on r: every API's generation path, and the
// paths of stored responses (stored.go).
func (h *Handler) Register(r gin.IRoutes) {
	for _, rt := range routes {
		r.POST(rt.path, h.serveRouted(rt.api))
	}
	r.GET(storedPath, h.serveStored)
	r.POST(storedPath+"/cancel", h.serveStored)
}

// Passthrough serves any other path from the local vLLM (mount it as gin's
// NoRoute handler).
func (h *Handler) Passthrough(c *gin.Context) {
	h.proxy.ServeHTTP(c.Writer, c.Request)
}

// SetDraining makes the front refuse forwarded requests with 503, so peers
// retry elsewhere, while client requests are still served.
func (h *Handler) SetDraining(d bool) { h.draining.Store(d) }

// SetRanks sets how many data-parallel ranks the local vLLM runs
// (Config.Ranks): the sidecar lowers it to the engines vLLM's metrics
// name when the flag says more.
func (h *Handler) SetRanks(n int) { h.ranks.Store(int32(max(n, 1))) }

// SetLocalReady tells the front whether the local vLLM can take work. When
// it cannot, routing chooses among peers only, and a forwarded request is
// refused (503 with RefusedHeader) so that its sender tries another pod
// (docs/design.md D6).
//
// When it cannot, the requests waiting at the local vLLM for an answer are
// abandoned and none is sent there (abandon.go): a hung engine would hold
// them.
func (h *Handler) SetLocalReady(ok bool) {
	switch was := h.localReady.Swap(ok); {
	case !ok:
		h.waiting.abandon()
	case !was:
		h.waiting.serving()
	}
}

// Wait blocks until every request in flight has finished or ctx is done.
func (h *Handler) Wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() { h.active.Wait(); close(done) }() // exits when all requests end
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sent returns how many requests this front has sent each peer ("" is the
// local vLLM), by API, since it started (/debug/peers).
func (h *Handler) Sent() map[string]map[string]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]map[string]uint64, len(h.sent))
	for k, n := range h.sent {
		if out[k.peer] == nil {
			out[k.peer] = map[string]uint64{}
		}
		out[k.peer][k.api.String()] = n
	}
	return out
}

// InFlight returns the number of requests this front has sent to each peer
// ("" is the local vLLM) and not yet finished.
func (h *Handler) InFlight() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[string]int, len(h.flights))
	for k, v := range h.flights {
		out[k] = len(v)
	}
	return out
}

type reqState struct {
	id  reqID
	api prompt.API
	// creates: the request makes a new stored response (a Responses
	// generation, not a read or cancel of one).
	creates   bool
	decision  route.Decision
	reason    string // what DecisionHeader says
	predicted int    // cached tokens the choice expects at the target
	plan      *plan
	arrived   time.Time // the handler began (the headers were read)
	started   time.Time // the body was read
	routed    time.Time // the target was chosen (zero for a hop)
	// flight marks the request's prefill done in the front's flights;
	// answer calls it at the answer's first byte (held here, not
	// allocated apart).
	flight func()
	answer firstByte
	usage  usageTap // the answer's cached tokens, for the cache metric
	writer deadlineWriter
	// tapIDs: take the prompt's token ids from the answer (promptIDs);
	// stripIDs: the front asked for them, so the client gets null.
	tapIDs, stripIDs bool
	promptIDs        []byte
}

// stateKey holds a request's *reqState in its context: the handler's
// hooks read it, and the transport its plan.
type stateKey struct{}

func (h *Handler) serveRouted(api prompt.API) gin.HandlerFunc {
	return func(c *gin.Context) {
		h.active.Add(1)
		defer h.active.Done()
		r := c.Request
		arrived := h.now()
		st := &reqState{id: h.requestID(r), api: api, creates: api == prompt.APIResponses, arrived: arrived, started: arrived}
		if from, ok := h.trustedHop(r, &st.id); ok {
			h.serveHop(c, st, from)
			return
		}
		body, ok := h.readClientBody(c)
		if !ok || !h.admittedAny(c) {
			return
		}
		st.started = h.now()
		p, perr := prompt.ParseAPI(body, api)
		if errors.Is(perr, prompt.ErrBadJSON) {
			h.metrics.badRequests.WithLabelValues("bad_json", api.String()).Inc()
			writeError(c, http.StatusBadRequest, perr.Error())
			return
		}
		if p.PreviousResponseID != "" && h.stored != nil {
			h.serveContinued(c, body, st, p.PreviousResponseID)
			return
		}
		kctx, keyed := r.Context(), func() {}
		if !idsOnly(p, perr) {
			kctx, keyed = h.waiting.watch(r.Context())
		}
		k := h.routeKeys(kctx, p, perr)
		keyed()
		keys := k.keys
		if k.after != nil {
			if api == prompt.APIChat { // the other APIs' answers carry no prompt ids
				body = h.askIDs(body, p, st)
			}
			defer func() { k.after(parseIDs(st.promptIDs)) }()
		}
		var targets []target
		var steered, admitted bool
		st.decision, targets, steered, admitted = h.routed(c, p.Model, k)
		if !admitted {
			return
		}
		withPrefill(targets, st.decision, k.tokens, p.Stream, h.cfg.Route)
		st.routed = h.now()
		st.reason = st.decision.Reason
		if len(keys) == 0 && st.reason != route.ReasonNone {
			st.reason += "-nokeys"
		}
		if steered {
			st.reason += "-full" // the choice's pod was full: the next with room serves
		}
		st.predicted = st.decision.Expected()
		h.remember(targets[0].Peer, k, st.decision)
		outcome := "local"
		if targets[0].Peer != "" {
			outcome = "forwarded"
		} else if st.decision.Reason == route.ReasonNone {
			outcome = "fallback"
		}
		h.metrics.decisions.WithLabelValues(outcome, st.decision.Reason, api.String()).Inc()
		h.metrics.tiers.observe(st.decision, targets[0])
		h.serve(c, body, st, targets)
	}
}

// trustedHop reports whether r came from a peer sidecar with a valid hop
// header, and which. An untrusted header is counted, logged and removed,
// and so is a client's pin (only a sidecar pins a hop): the request is then
// the client's own and is routed.
func (h *Handler) trustedHop(r *http.Request, id *reqID) (from string, ok bool) {
	if v := r.Header.Get(HopHeader); v != "" {
		from, err := h.hop.Verify(v, h.cfg.Self, h.now())
		if err == nil {
			return from, true
		}
		h.metrics.hopRejected.WithLabelValues(hopReason(err)).Inc()
		h.log.Warn().Stringer("req", id).Err(err).Msg("ignoring untrusted hop header")
		r.Header.Del(HopHeader)
	}
	r.Header.Del(PinnedHeader)
	return "", false
}

// serveHop serves a request another sidecar forwarded here (a trusted hop
// header): locally, or refused so that the sender tries its next
// candidate. The body streams through to the local vLLM as it arrives:
// the sender already parsed and routed it, and holds it for a retry, so
// reading it whole first would only add its transfer time and a copy.
func (h *Handler) serveHop(c *gin.Context, st *reqState, from string) {
	// A stored response's request only this pod can serve: while its vLLM
	// lives (draining too) it serves it, and its local attempt tells a
	// vLLM gone (proxyError's 404) from one hung (a refusal).
	pinned := c.Request.Header.Get(PinnedHeader) != ""
	if h.draining.Load() && !pinned {
		h.refuse(c, "draining", "node is draining")
		return
	}
	if !h.localReady.Load() && !pinned {
		h.refuse(c, "engine-down", "the engine of this pod cannot serve")
		return
	}
	r := c.Request
	if r.ContentLength > h.cfg.MaxBodyBytes {
		h.tooLarge(c)
		return
	}
	st.reason = "hop"
	h.metrics.decisions.WithLabelValues("local", "hop", st.api.String()).Inc()
	h.log.Debug().Stringer("req", &st.id).Str("from", from).Msg("serving forwarded request")
	local := []target{{URL: h.cfg.VLLM}}
	local[0].Prefill, local[0].PrefillFor = hopPrefill(r)
	hopRankChoice(r, &local[0])
	// Full duplex, or the server drains and closes the body when the
	// answer's headers go out, under the transport still reading it, and
	// the failed write cuts the answer on its way (docs/design.md §5). The
	// limit keeps the transport's last read, a check for bytes past the
	// Content-Length, off the server's body altogether.
	if r.ContentLength >= 0 && http.NewResponseController(c.Writer).EnableFullDuplex() == nil {
		// Closed before the server reads the connection's next request: an
		// attempt that failed before reading the body (the engine refused
		// the connection) otherwise leaves net/http's server reading the
		// next request under a read it thinks still pending, and it panics
		// and drops the connection (golang/go#68560).
		defer r.Body.Close()
		body := io.LimitReader(r.Body, r.ContentLength)
		h.serveFrom(c, &plan{targets: local, stream: body, length: r.ContentLength, served: -1}, st)
		return
	}
	body, ok := h.readRequest(c) // chunked, or a server that cannot
	if !ok {
		return
	}
	st.started = h.now()
	h.serve(c, body, st, local)
}

// readRequest reads the request body whole, or answers the client why not.
func (h *Handler) readRequest(c *gin.Context) ([]byte, bool) {
	body, err := readBody(c.Writer, c.Request, h.cfg.MaxBodyBytes)
	if err == nil {
		return body, true
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		h.tooLarge(c)
		return nil, false
	}
	h.metrics.badRequests.WithLabelValues("read", apiOf(c).String()).Inc()
	writeError(c, http.StatusBadRequest, "could not read request body: "+err.Error())
	return nil, false
}

func (h *Handler) tooLarge(c *gin.Context) {
	h.metrics.badRequests.WithLabelValues("too_large", apiOf(c).String()).Inc()
	writeError(c, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", h.cfg.MaxBodyBytes))
}

// keys computes the request's routing keys; any failure returns nil keys and
// the request is routed by load alone (docs/design.md D6).
func (h *Handler) keys(ctx context.Context, p prompt.Prompt, perr error) ([]blockkey.Key, int) {
	if perr != nil {
		return nil, 0
	}
	tokens := p.Tokens
	if tokens == nil && h.tok != nil {
		tctx, cancel := context.WithTimeout(ctx, h.cfg.TokenizeTimeout)
		t0 := h.now()
		ids, err := h.tok.Tokenize(tctx, p)
		cancel()
		h.metrics.tokenizeSeconds.Observe(h.now().Sub(t0).Seconds())
		if err != nil {
			h.metrics.tokenizeErrors.Inc()
			h.log.Debug().Err(err).Msg("tokenize failed; routing by load")
			return nil, 0
		}
		tokens = ids
	}
	if len(tokens) == 0 {
		return nil, 0
	}
	return h.keysOf(p, tokens), len(tokens)
}

// keysOf is the request-to-keys rule: p's model root and cache salt,
// tokens cut by the scheme.
func (h *Handler) keysOf(p prompt.Prompt, tokens []uint32) []blockkey.Key {
	return h.cfg.Scheme.Request(h.root(p), tokens)
}

// root is the chain root of p's tokens: its model's, salted with its
// cache_salt as vLLM salts block 0 (blockkey.Salted). Every path that keys
// a prompt's tokens (tokenized, learned text prefixes, rendered) starts
// from it.
func (h *Handler) root(p prompt.Prompt) blockkey.Key {
	return blockkey.Salted(h.modelRoot(p), p.CacheSalt)
}

// modelRoot is the chain root of p's model, unsalted.
func (h *Handler) modelRoot(p prompt.Prompt) blockkey.Key {
	model := p.Model
	if model != "" && model != h.cfg.Model && h.cfg.IsAdapter != nil && !h.cfg.IsAdapter(model) {
		model = h.cfg.Model // another served name of the base model
	}
	return blockkey.ModelRoot(h.cfg.Model, model)
}

// routed is a client request's routing: the choice on a snapshot of the
// peer table, admission (false: refused, and answered), steering past full
// pods, and the targets in failover order. The snapshot is read no more
// after it (snapshots).
func (h *Handler) routed(c *gin.Context, model string, k keyed) (d route.Decision, ts []target, steered, admitted bool) {
	snap := h.snaps.take()
	defer h.snaps.give(snap)
	var peers []route.PeerView
	d, peers = h.choose(model, k, false, *snap)
	*snap = peers
	b, ok := h.admitted(c, d, peers, k.tokens)
	if !ok {
		return d, nil, false, false
	}
	d, steered = h.steered(d, peers, k.tokens, b)
	return d, h.targets(d, peers), steered, true
}

// choose runs the policy on a snapshot of the peer table, written over
// buf, with this front's own in-flight requests as the freshest load
// signal: the local pod's are exact (every request it serves passes here),
// and for a peer those sent after its last load report. Among many peers
// the snapshot is a shortlist (shortlisted).
func (h *Handler) choose(model string, k keyed, explain bool, buf []route.PeerView) (route.Decision, []route.PeerView) {
	now := h.now()
	if model == "" {
		model = h.cfg.Model
	}
	if model == h.cfg.Model {
		model = "" // the base model: every peer of this deployment serves it
	}
	req := route.Request{Model: model, Keys: k.keys, Batch: k.batch, TokensPerKey: h.cfg.Scheme.TokensPerKey(),
		PromptTokens: k.tokens, Explain: explain}
	short, peers := h.shortlisted(&req, buf, now) // mu held when short is set
	if short != nil {
		defer route.PutShortlist(short) // req reads it until the choice is made
	} else {
		if h.peers != nil {
			peers = h.peers.AppendSnapshot(buf, now)
		}
		h.mu.Lock()
		h.freshenLocked(peers, now)
	}
	defer h.mu.Unlock()
	d := h.policy.Choose(req, peers, now)
	d.Attempts = route.Attempts(d, h.cfg.Retry.MaxAttempts)
	return d, peers
}

// shortlister is a peer table that can hand a choice among many peers
// the views it reads (gossip.Mesh.Shortlist, route.Shortlist).
type shortlister interface {
	Shortlist(sl *route.Shortlist, cfg *route.Config, req *route.Request, also []string, r *route.Recent,
		now time.Time, fresh func(*route.PeerView), buf []route.PeerView) ([]route.PeerView, bool)
}

// shortlisted returns a shortlist for req, which req reads (PutShortlist
// it after the choice), and its views written over buf, freshened, with mu
// held; nil, and mu not held, when the table cannot shortlist or it is not
// worth it (few peers, a batch, an explanation of every peer, turned off).
func (h *Handler) shortlisted(req *route.Request, buf []route.PeerView, now time.Time) (*route.Shortlist, []route.PeerView) {
	sl, ok := h.peers.(shortlister)
	if !ok || req.Explain || h.cfg.NoShortlist {
		return nil, nil
	}
	h.mu.Lock()
	h.also = h.also[:0]
	for id := range h.flights {
		if id != "" {
			h.also = append(h.also, id)
		}
	}
	short := route.GetShortlist()
	peers, ok := sl.Shortlist(short, &h.cfg.Route, req, h.also, h.recent, now,
		func(p *route.PeerView) { h.freshenOneLocked(p, now) }, buf)
	if !ok {
		h.mu.Unlock()
		route.PutShortlist(short)
		return nil, nil
	}
	return short, peers
}

// freshenLocked puts the front's own counts into a snapshot: the local
// pod's load is exact, and a peer's gets what was sent it since its last
// report. Called with mu held.
func (h *Handler) freshenLocked(peers []route.PeerView, now time.Time) {
	for i := range peers {
		h.freshenOneLocked(&peers[i], now)
	}
}

// freshenOneLocked is freshenLocked for one peer.
func (h *Handler) freshenOneLocked(p *route.PeerView, now time.Time) {
	if p.Local {
		p.Load.Serving, p.Load.Prefilling, p.Load.QueuedPrefillTokens = h.flights.since("", time.Time{}, now)
		p.Load.PrefillShare = h.share.at(now)
		p.Load.InFlight, p.Load.InFlightPrefilling, p.Load.InFlightPrefillTokens, p.Load.Fronted = 0, 0, 0, true
		p.LoadAt = now // Serving and the queue are exact
		if !h.localReady.Load() {
			p.Engine = route.EngineDown
		}
		return
	}
	p.Load.InFlight, p.Load.InFlightPrefilling, p.Load.InFlightPrefillTokens = h.flights.since(p.ID, p.LoadAt, now)
}

// targets turns the decision's attempts (route.Attempts: the failover
// order) into where to send them.
func (h *Handler) targets(d route.Decision, peers []route.PeerView) []target {
	var out []target
	for _, id := range d.Attempts {
		pv := peerOf(d, peers, id)
		switch {
		case pv == nil:
		case pv.Local:
			// Pinned only within the count the pod advertises
			// (route.PeerView.Ranks): a digest's rank marker can be a
			// Bloom false positive, and vLLM answers 400 to a rank it
			// does not run (ci-smoke caught it).
			out = append(out, target{URL: h.cfg.VLLM, Rank: rankFor(d, id)})
		case pv.Addr != "":
			out = append(out, target{Peer: id, URL: &url.URL{Scheme: "http", Host: pv.Addr}, Rank: rankFor(d, id)})
		}
	}
	if len(out) == 0 { // no candidates at all (an empty peer table)
		out = append(out, target{URL: h.cfg.VLLM})
	}
	return out
}

// peerOf returns the peer of id among the peers d was made on, by its
// candidate's index (a thousand peers are not searched for each attempt),
// or nil.
func peerOf(d route.Decision, peers []route.PeerView, id string) *route.PeerView {
	for i := range d.Candidates {
		if c := &d.Candidates[i]; c.ID == id {
			return peerAt(peers, c)
		}
	}
	return peerByID(peers, id)
}

// peerAt is candidate c's peer among peers: at its index, or where its ID
// is for a Decision not made on peers (tests).
func peerAt(peers []route.PeerView, c *route.Candidate) *route.PeerView {
	if c.Index >= 0 && c.Index < len(peers) && peers[c.Index].ID == c.ID {
		return &peers[c.Index]
	}
	return peerByID(peers, c.ID)
}

func peerByID(peers []route.PeerView, id string) *route.PeerView {
	for i := range peers {
		if peers[i].ID == id {
			return &peers[i]
		}
	}
	return nil
}

// refuse answers a forwarded request this node cannot serve, so that its
// sender tries the next candidate before any byte reaches the client.
func (h *Handler) refuse(c *gin.Context, reason, msg string) {
	h.metrics.decisions.WithLabelValues("refused", reason, apiOf(c).String()).Inc()
	c.Header(RefusedHeader, reason)
	writeError(c, http.StatusServiceUnavailable, msg)
}

func (h *Handler) serve(c *gin.Context, body []byte, st *reqState, targets []target) {
	h.serveFrom(c, &plan{targets: targets, body: body, length: int64(len(body)), served: -1}, st)
}

// sentKey counts requests by where they were first sent and their API.
type sentKey struct {
	peer string
	api  prompt.API
}

// serveFrom proxies the request along p, counting it in flight.
func (h *Handler) serveFrom(c *gin.Context, p *plan, st *reqState) {
	st.plan = p
	first, start := p.targets[0].Peer, h.now()
	st.flight = func() { h.track(func() { h.flights.answered(first, start) }, first) }
	h.track(func() {
		rank := -1
		if first == "" {
			rank = h.placeRank(&p.targets[0], c.Request.Header.Get(RankHeader), start)
		}
		h.flights.add(first, start, p.targets[0].Prefill, p.targets[0].PrefillFor, rank)
		h.sent[sentKey{first, st.api}]++
	}, first)
	h.metrics.inflight.Inc()
	defer func() {
		h.track(func() { h.flights.done(first, start) }, first)
		h.metrics.inflight.Dec()
	}()
	r := c.Request
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
	r.Body = http.NoBody // each attempt gets the plan's
	r.ContentLength = p.length
	h.proxy.ServeHTTP(h.slowReaderBound(c, &st.writer), r)
}

// placedRanks is how many ranks the front places requests on: the local
// vLLM's, when it runs several and PlaceRanks is on; else 0.
func (h *Handler) placedRanks() int {
	if n := int(h.ranks.Load()); n > 1 && h.cfg.PlaceRanks {
		return n
	}
	return 0
}

// RankLoads is each rank's requests and queued prefill at the local vLLM
// as the front counts them, for /debug/peers; nil unless the front places
// requests on several ranks.
func (h *Handler) RankLoads(now time.Time) []route.RankLoad {
	n := h.placedRanks()
	if n == 0 {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.flights.ranks(n, now)
}

// placeRank names the local vLLM's rank that serves t (placeRank), when
// it runs several and the front places requests on them; -1 otherwise.
// Called with mu held, so that a burst sees each pick in the next one's
// counts.
func (h *Handler) placeRank(t *target, client string, now time.Time) int {
	n := h.placedRanks()
	if n == 0 {
		return -1
	}
	r, why := placeRank(h.cfg.Route, t, client, h.flights.ranks(n, now))
	if h.metrics != nil {
		h.metrics.tiers.placed.WithLabelValues(strconv.Itoa(r), why).Inc()
	}
	return r
}

// track applies change to the flights and, for the local vLLM, tells the
// peer table the new count. Both happen under mu so counts reach the table
// in order.
func (h *Handler) track(change func(), peer string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	change()
	if peer == "" {
		now := h.now()
		n, prefilling, queued := h.flights.since("", time.Time{}, now)
		h.share.set(now, queued > 0)
		h.metrics.queuedPrefill.Set(float64(queued))
		h.metrics.prefillShare.Set(h.share.v)
		if h.peers != nil {
			h.peers.SetServing(n, prefilling, queued, h.share.v)
		}
		h.repushAt(h.repushTime(now), now)
	}
}

// repushTime is when the local queue must be reported again though no
// request starts or answers: a non-streamed request's prefill should be
// done (flights.next), or an idle engine's prefill share falls below
// MaxPrefillShare, so that peers, which may have taken a later report of
// the scraped load as carrying the share then (gossip's SetLoad), admit
// again. Zero: never. Called with mu held.
func (h *Handler) repushTime(now time.Time) time.Time {
	t := h.flights.next("", now)
	if b := h.bounds(); b.shareOn() && !h.share.busy && h.share.v >= b.MaxShare {
		if c := now.Add(route.ShareCrossing(h.share.v, b.MaxShare)); t.IsZero() || c.Before(t) {
			t = c
		}
	}
	return t
}

// repushAt arms the timer that reports the local queue again at t
// (repushTime). Called with mu held; a zero t disarms it.
func (h *Handler) repushAt(t, now time.Time) {
	if t.Equal(h.repushDue) {
		return // armed for t already (or disarmed): most of a request's reports
	}
	h.repushDue = t
	switch {
	case t.IsZero():
		if h.repush != nil {
			h.repush.Stop()
		}
	case h.repush == nil:
		h.repush = time.AfterFunc(t.Sub(now), func() {
			h.track(func() {
				if !h.repushDue.After(h.now()) { // not armed again since
					h.repushDue = time.Time{}
				}
			}, "")
		})
	default:
		h.repush.Reset(t.Sub(now)) // one timer, not one per request
	}
}

// modifyResponse labels the response and taps its usage for the
// predicted-vs-actual cache metric.
func (h *Handler) modifyResponse(resp *http.Response) error {
	st, _ := resp.Request.Context().Value(stateKey{}).(*reqState)
	if st == nil {
		return nil
	}
	p := st.plan
	if st.flight != nil {
		// The first byte of the answer is the first token of a stream (of a
		// whole answer otherwise): the request's prefill is done. A
		// Responses stream says so only after its preamble (firstOutput).
		if st.api == prompt.APIResponses && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			resp.Body = newFirstOutput(resp.Body, st.flight)
		} else {
			st.answer = firstByte{rc: resp.Body, fn: st.flight}
			resp.Body = &st.answer
		}
	}
	served := h.cfg.Self
	if p.served >= 0 && p.targets[p.served].Peer != "" {
		served = p.targets[p.served].Peer
	}
	if resp.Header.Get(ServedByHeader) == "" {
		resp.Header.Set(ServedByHeader, served)
	}
	reason := st.reason
	if p.served > 0 {
		reason += "-retried"
	}
	resp.Header.Set(DecisionHeader, reason)
	retryableRefusal(resp, st)
	where := "local"
	if served != h.cfg.Self {
		where = "peer"
	}
	if st.reason == "hop" && resp.StatusCode == http.StatusNotFound && resp.Request.Header.Get(PinnedHeader) == "" {
		// vLLM's 404 on a completions path is a model it does not serve (an
		// adapter unloaded since the sender's view): refuse, so the sender
		// tries a pod that serves it.
		resp.Body.Close()
		return errModelNotServed
	}
	now := h.now()
	h.metrics.forwardSeconds.WithLabelValues(where).Observe(now.Sub(st.started).Seconds())
	resp.Header.Add("Server-Timing", serverTiming(st, now))
	if resp.StatusCode == http.StatusOK && st.tapIDs {
		if err := tapTokenIDs(resp, st.stripIDs, func(ids []byte) { st.promptIDs = ids }); err != nil {
			return err
		}
	}
	if resp.StatusCode == http.StatusOK && st.reason != "hop" && (st.reason != ReasonStored || st.creates) {
		api, field := st.api.String(), cachedField
		if st.api == prompt.APIMessages {
			field = anthropicCachedField
		}
		st.usage = usageTap{rc: resp.Body, field: field, found: func(cached int) {
			if st.reason == ReasonStored {
				// A continued conversation is routed to its store, not on a
				// prediction: its hit is real but was not predicted.
				h.metrics.cachedTokens.WithLabelValues("unpredicted", api).Add(float64(cached))
				return
			}
			h.metrics.cachedTokens.WithLabelValues("actual", api).Add(float64(cached))
			h.metrics.cachedTokens.WithLabelValues("predicted", api).Add(float64(st.predicted))
		}}
		resp.Body = &st.usage
	}
	// This pod's vLLM made the response, or a peer's reached past its
	// sidecar (away or draining), which cannot say so: the mesh learns
	// where it is as soon as its id passes, before the client has the
	// answer.
	if resp.StatusCode == http.StatusOK && st.creates && h.stored != nil &&
		(served == h.cfg.Self || p.targets[p.served].Direct) {
		resp.Body = &idTap{rc: resp.Body, found: func(id string) { h.stored.AnnounceResponsesOf(served, id) }}
	}
	if e := h.log.Debug(); e.Enabled() {
		e = e.Stringer("req", &st.id).Str("served_by", served).Str("decision", reason).
			Strs("tried", p.tried).Int("predicted_cached", st.predicted)
		// Where the chosen peer's match came from ("recent", "claim", a
		// stale load...): what a chaos failure's reader needs first.
		for i := range st.decision.Candidates {
			if c := &st.decision.Candidates[i]; c.Chosen {
				e = e.Int("matched_keys", c.MatchedKeys).Str("match_note", c.Note)
				break
			}
		}
		// Every candidate's terms, as /debug/route shows them: why a
		// session left its holder is in the loads and matches of both.
		e = e.Str("note", st.decision.Note).Interface("candidates", st.decision.Candidates)
		e.Msg("routed")
	}
	return nil
}

// serverTiming is the front's part of a W3C Server-Timing header, in ms:
// kvroute-read reading the request body; then from the last request byte
// read, kvroute-route until the target was chosen (parsing, keys,
// tokenizing if any, choosing), and kvroute until the answer's headers are
// about to go out (the rest is upstream's). A hop's sidecar says its own
// part as kvroute-hop: from the request's headers (its body streams
// through) to the answer's, and kvroute-hop-send until the body was all
// written to its vLLM (left out when the answer's headers came first: the
// transport reports the write's end on another goroutine, ~2% of a fast
// fake engine's answers);
// kvroute-send is from choosing until the request was written upstream.
func serverTiming(st *reqState, now time.Time) string {
	// Built in one buffer: the header's one allocation is its string.
	var buf [160]byte
	b := buf[:0]
	dur := func(b []byte, name string, d time.Duration) []byte {
		if len(b) > 0 {
			b = append(b, ", "...)
		}
		b = append(append(b, name...), ";dur="...)
		return strconv.AppendFloat(b, float64(d)/1e6, 'f', 3, 64)
	}
	if st.routed.IsZero() {
		b = dur(b, "kvroute-hop", now.Sub(st.started))
		if w := st.plan.wrote.Load(); w != 0 {
			b = dur(b, "kvroute-hop-send", time.Unix(0, w).Sub(st.started))
		}
		return string(b)
	}
	b = dur(b, "kvroute-read", st.started.Sub(st.arrived))
	b = dur(b, "kvroute-route", st.routed.Sub(st.started))
	if w := st.plan.wrote.Load(); w != 0 {
		b = dur(b, "kvroute-send", time.Unix(0, w).Sub(st.routed))
	}
	return string(dur(b, "kvroute", now.Sub(st.started)))
}

func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		h.metrics.canceled.Inc()
		return // the client went away; nobody to answer
	}
	if st, _ := r.Context().Value(stateKey{}).(*reqState); st != nil && st.reason == "hop" {
		if r.Header.Get(PinnedHeader) != "" && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, errEngineDown)) && h.localRefuses(r.Context()) {
			// A stored response's request, and no vLLM listens here: the
			// store in its memory is gone with it. Only this pod held it.
			h.metrics.badRequests.WithLabelValues("stored_gone", st.api.String()).Inc()
			writeAPIError(w, st.api, http.StatusNotFound, "Response not found: it was stored in the engine of pod "+h.cfg.Self+", which is gone (it is not running)")
			return
		}
		// Nothing reached the sender's client yet: let it try elsewhere.
		reason, msg := "engine-unreachable", "the engine of this pod is unreachable: "+err.Error()
		if errors.Is(err, errModelNotServed) {
			reason, msg = "model", "this pod does not serve the requested model"
			if h.cfg.ModelsChanged != nil {
				h.cfg.ModelsChanged()
			}
		} else {
			h.metrics.badRequests.WithLabelValues("upstream", st.api.String()).Inc()
		}
		h.metrics.decisions.WithLabelValues("refused", reason, st.api.String()).Inc()
		h.log.Warn().Err(err).Stringer("req", &st.id).Msg("local vLLM failed a forwarded request; refusing it")
		w.Header().Set(RefusedHeader, reason)
		writeAPIError(w, st.api, http.StatusServiceUnavailable, msg)
		return
	}
	api := prompt.APIChat
	if st, _ := r.Context().Value(stateKey{}).(*reqState); st != nil {
		api = st.api
		if st.reason == ReasonStored {
			if node, addr, ok := h.storeVanished(st.plan, err); ok {
				// Its vLLM, reached there before, no longer listens: the
				// store in its memory went with it (a pod deleted while its
				// sidecar drains, whose peers send its stored requests to
				// its vLLM directly).
				h.metrics.badRequests.WithLabelValues("stored_gone", api.String()).Inc()
				writeAPIError(w, api, http.StatusNotFound, fmt.Sprintf(
					"Response not found: it was stored on pod %s, which is gone (its engine no longer listens at %s)", node, addr))
				return
			}
			// Only that pod holds the response: say so, retryably, until the
			// mesh knows whether it is gone (then a 404 says that).
			h.metrics.badRequests.WithLabelValues("stored_unreachable", api.String()).Inc()
			w.Header().Set("Retry-After", "1")
			writeAPIError(w, api, http.StatusServiceUnavailable, "the pod that stores this response cannot be reached: "+err.Error())
			return
		}
	}
	h.metrics.badRequests.WithLabelValues("upstream", api.String()).Inc()
	h.log.Warn().Err(err).Str("path", r.URL.Path).Msg("upstream failed")
	// Every attempt failed before an answer (a refused or reset
	// connection, a dial timeout): nothing was served, so it is retryable.
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
	writeAPIError(w, api, http.StatusServiceUnavailable, "no engine could take this request: "+err.Error())
}

func (h *Handler) requestID(r *http.Request) reqID {
	if id := r.Header.Get("X-Request-Id"); id != "" && len(id) <= 128 {
		return reqID{client: id}
	}
	return reqID{self: h.cfg.Self, seq: h.seq.Add(1)}
}

// reqID names a request in the logs: its client's X-Request-Id, or this
// front's name and a sequence number, made a string only when a line
// names it (most requests log none). Logged by pointer (Stringer), which
// boxes without allocating.
type reqID struct {
	client, self string
	seq          uint64
}

func (id *reqID) String() string {
	if id.client != "" {
		return id.client
	}
	return id.self + "-" + strconv.FormatUint(id.seq, 10)
}

func hopReason(err error) string {
	switch {
	case errors.Is(err, ErrHopBadMAC):
		return "bad_mac"
	case errors.Is(err, ErrHopStale):
		return "stale"
	case errors.Is(err, ErrHopOtherNode):
		return "other_node"
	}
	return "malformed"
}

// Excluded returns why the front would choose p for no request now, or ""
// (route.Excluded with the front's routing config).
func (h *Handler) Excluded(p route.PeerView, now time.Time) string {
	return route.Excluded(h.cfg.Route, p, now)
}

// Explain returns the decision the front would make for a request body of
// api, without serving it (the admin /debug/route endpoint), and how many
// routing keys the request had (over every prompt of a batch).
func (h *Handler) Explain(ctx context.Context, body []byte, api prompt.API) (route.Decision, int, error) {
	p, perr := prompt.ParseAPI(body, api)
	if errors.Is(perr, prompt.ErrBadJSON) {
		h.metrics.badRequests.WithLabelValues("bad_json", api.String()).Inc()
		return route.Decision{}, 0, perr
	}
	if p.PreviousResponseID != "" && h.stored != nil {
		return h.explainStored(ctx, p.PreviousResponseID), 0, nil
	}
	k := h.routeKeys(ctx, p, perr)
	d, _ := h.choose(p.Model, k, true, nil) // every peer's row, however many
	n := len(k.keys)
	for _, b := range k.batch {
		n += len(b)
	}
	return d, n, nil
}
