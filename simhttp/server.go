package simhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// Engine is what the HTTP layer needs from the simulated engine core;
// *vllmsim.Engine satisfies it, and so does cmd/vllm-sim's set of
// data-parallel ranks.
type Engine interface {
	Submit(ctx context.Context, r vllmsim.Request) (*vllmsim.Stream, error)
	Stats() vllmsim.Stats
	Cached() []vllmsim.CachedBlock
	ResetPrefixCache() bool
	Restart()
}

// RankedEngine is an Engine with data-parallel ranks.
type RankedEngine interface {
	// SubmitRank submits to one rank, as vLLM does for a request that
	// names its data_parallel_rank; a rank out of range is
	// vllmsim.ErrInvalid.
	SubmitRank(ctx context.Context, rank int, r vllmsim.Request) (*vllmsim.Stream, error)
}

// Tokenizer is what the HTTP layer needs from the engine's tokenizer;
// *vllmsim.Tokenizer satisfies it.
type Tokenizer interface {
	Encode(text string, addSpecial bool) []uint32
	Decode(ids []uint32) string
	// ChatMM renders a chat through the model's template and tokenizes
	// it, returning its images' placements (nil without images).
	ChatMM(msgs []vllmsim.Message, o vllmsim.ChatOptions) ([]uint32, []vllmsim.MMPlacement, error)
}

// Events is the KV-event publisher as the /sim/ admin endpoints see it.
type Events interface {
	// Restart starts the event sequence again at 0 with an empty replay
	// buffer, as a restarted vLLM's publisher does.
	Restart(ctx context.Context) error
	SetDropRate(r float64) error
	DropRate() float64
}

// noEvents stands in for the publisher when KV events are disabled.
type noEvents struct{}

func (noEvents) Restart(context.Context) error { return nil }
func (noEvents) SetDropRate(float64) error     { return errors.New("kv events are disabled") }
func (noEvents) DropRate() float64             { return 0 }

// Config is the HTTP layer's configuration. DefaultConfig gives the
// defaults; New also applies them to zero fields.
type Config struct {
	// Models are the served model names (--served-model-name); the first is
	// the base model's id. Required.
	Models []string
	// Root is --model, reported as the ModelCard root ("": Models[0]).
	Root string
	// LoRAs are the --lora-modules adapters, served as extra models.
	LoRAs []LoRA
	// RuntimeLoRA serves /v1/load_lora_adapter and /v1/unload_lora_adapter,
	// as vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING set.
	RuntimeLoRA bool
	// MaxModelLen is the context length checked before a request is queued
	// (0: not checked here; the engine still refuses).
	MaxModelLen int
	// Echo makes the output text repeat the prompt instead of the engine's
	// synthetic tokens (token counts and timing are unchanged).
	Echo bool
	// RestartDowntime is how long /health and generation answer 503 after
	// /sim/restart, as a restarting vLLM would be unavailable. Default 2 s.
	RestartDowntime time.Duration
	// BodyLimitBytes caps request bodies (413 above it). Default 32 MiB.
	BodyLimitBytes int64
	// Now is the wall clock (for "created" and the restart window).
	// Default time.Now.
	Now func() time.Time
	// ChatTemplate is the model's chat template.
	ChatTemplate vllmsim.ChatTemplate
	// TokenizeCost charges tokenization time (nil: free).
	TokenizeCost *vllmsim.TokenizeCost
	// ScaleOut registers the render endpoints (/v1/chat/completions/render,
	// /v1/completions/render, /v1/messages/render, /v1/responses/render),
	// as vLLM v0.30 does only with --enable-scale-out or
	// VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1. Without it they are 404 (or 405
	// where another method owns the path) like any unknown path.
	ScaleOut bool
	// ResponsesStore keeps Responses in this process's memory, as vLLM does
	// only with VLLM_ENABLE_RESPONSES_API_STORE=1; without it "store" is
	// ignored, background mode is refused and every id is unknown.
	ResponsesStore bool
	// StoreLimit bounds the store by count: the oldest response (and its
	// messages) goes when a new one would exceed it. vLLM never evicts
	// ("may cause a memory leak"); a simulator under a long benchmark
	// must. Default 10000.
	StoreLimit int
}

// DefaultConfig is Config with its defaults; Models must still be set.
func DefaultConfig() Config {
	return Config{RestartDowntime: 2 * time.Second, BodyLimitBytes: 32 << 20, Now: time.Now, StoreLimit: 10000}
}

// Server is the simulator's HTTP layer: vLLM's OpenAI, Anthropic and
// tokenizer endpoints in front of an Engine, plus the /sim/ admin routes.
type Server struct {
	cfg     Config
	eng     Engine
	tok     Tokenizer
	events  Events
	met     *Metrics
	loras   *adapters
	store   *store
	boot    int64
	nextID  atomic.Uint64
	drain   atomic.Bool
	restart atomic.Int64 // unix nanos until which the engine counts as restarting
}

// New builds a Server. events may be nil (KV events disabled), and so may
// met (no /metrics).
func New(cfg Config, eng Engine, tok Tokenizer, events Events, met *Metrics) *Server {
	d := DefaultConfig()
	if cfg.Now == nil {
		cfg.Now = d.Now
	}
	if cfg.BodyLimitBytes <= 0 {
		cfg.BodyLimitBytes = d.BodyLimitBytes
	}
	if cfg.StoreLimit <= 0 {
		cfg.StoreLimit = d.StoreLimit
	}
	if events == nil {
		events = noEvents{}
	}
	return &Server{cfg: cfg, eng: eng, tok: tok, events: events, met: met, loras: newAdapters(cfg.LoRAs),
		store: newStore(cfg.StoreLimit), boot: cfg.Now().UnixNano()}
}

// SetDraining makes /health answer 503 so Kubernetes stops sending traffic.
func (s *Server) SetDraining() { s.drain.Store(true) }

func (s *Server) unavailable() bool {
	return s.drain.Load() || s.cfg.Now().UnixNano() < s.restart.Load()
}

// Handler builds the routes: vLLM's, and /sim/'s admin routes. A panic in
// a handler becomes a 500 error body, never a crash.
func (s *Server) Handler() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		writeError(c, internal("internal error"))
	}))
	r.Use(func(c *gin.Context) {
		if c.Request.Body != nil {
			c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, s.cfg.BodyLimitBytes)
		}
	})
	r.NoRoute(func(c *gin.Context) { c.JSON(404, gin.H{"detail": "Not Found"}) })
	r.NoMethod(func(c *gin.Context) { c.JSON(405, gin.H{"detail": "Method Not Allowed"}) })

	r.POST("/v1/chat/completions", s.chat)
	r.POST("/v1/completions", s.completions)
	r.POST("/v1/messages", s.messages)
	r.POST("/v1/responses", s.responses)
	r.GET("/v1/responses/:id", s.retrieveResponse)
	r.POST("/v1/responses/:id/cancel", s.cancelResponse)
	r.GET("/v1/models", s.models)
	r.GET("/health", s.health)
	r.POST("/tokenize", s.tokenize)
	r.POST("/detokenize", s.detokenize)
	if s.cfg.ScaleOut {
		s.registerRender(r)
	}
	r.POST("/reset_prefix_cache", s.resetPrefixCache)
	if s.cfg.RuntimeLoRA {
		r.POST("/v1/load_lora_adapter", s.loadLoRA)
		r.POST("/v1/unload_lora_adapter", s.unloadLoRA)
	}
	if s.met != nil {
		mh := s.met.handler()
		r.GET("/metrics", func(c *gin.Context) { mh.ServeHTTP(c.Writer, c.Request) })
	}
	r.GET("/sim/cache", s.simCache)
	r.POST("/sim/restart", s.simRestart)
	r.GET("/sim/drop-rate", s.simDropRate)
	r.POST("/sim/drop-rate", s.simDropRate)
	return r
}

func readBody(c *gin.Context) ([]byte, *apiError) {
	b, err := io.ReadAll(c.Request.Body)
	if err != nil {
		if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return nil, &apiError{Status: 413, Type: "Request Entity Too Large", Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		}
		return nil, badRequest("read body: %v", err)
	}
	return b, nil
}

// bindJSON reads and decodes a JSON request body into v; on failure it has
// already answered with vLLM's error and returns false.
func bindJSON(c *gin.Context, v any) bool {
	body, aerr := readBody(c)
	if aerr == nil {
		aerr = decodeJSON(body, v)
	}
	if aerr != nil {
		writeError(c, aerr)
		return false
	}
	return true
}

// resolveModel maps a request's model to the id to report and the
// adapter it names (zero for the base model). An empty model means the
// base model, as vLLM allows.
func (s *Server) resolveModel(name string) (string, LoRA, *apiError) {
	if name == "" {
		return s.cfg.Models[0], LoRA{}, nil
	}
	if slices.Contains(s.cfg.Models, name) {
		return name, LoRA{}, nil
	}
	if l, ok := s.loras.find(name); ok {
		return name, l, nil
	}
	return "", LoRA{}, notFound("The model `%s` does not exist.", name)
}

// dpRank reads vLLM's X-data-parallel-rank header (serving_engine
// _get_data_parallel_rank; header names are case-insensitive): the rank a
// request is pinned to, or -1 when it names none.
func dpRank(c *gin.Context) (int, *apiError) {
	v := c.GetHeader("X-data-parallel-rank")
	if v == "" {
		return -1, nil
	}
	r, err := strconv.Atoi(v)
	if err != nil || r < 0 {
		return 0, badRequest("X-data-parallel-rank %q: want a rank, 0 or more", v)
	}
	return r, nil
}

// genRequest is a parsed generation request in engine terms.
type genRequest struct {
	model     string
	lora      LoRA
	prompt    []uint32
	mm        []vllmsim.MMPlacement // the prompt's image placements
	batch     [][]uint32            // a completions batch: one engine request per prompt (prompt unset)
	maxTokens int
	salt      string
	stream    bool
	// includeUsage is stream_options.include_usage (chat, completions).
	includeUsage bool
	tokenIDs     bool          // return_token_ids
	start        time.Time     // the request's body was read
	read         time.Duration // from the handler's start to then
	rank         int           // X-data-parallel-rank, -1 when absent
}

// prompts are the engine requests' prompts, in choice order.
func (g *genRequest) prompts() [][]uint32 {
	if g.batch != nil {
		return g.batch
	}
	return [][]uint32{g.prompt}
}

// arrival is a request's body and when it was read: a generation counts
// the read as part of its time (newGen, ReadHeader).
type arrival struct {
	body           []byte
	arrived, start time.Time // before and after the read
}

// receive reads the request's body for a handler whose errors fail
// writes in its API's shape; on failure it has answered, and returns
// false.
func (s *Server) receive(c *gin.Context, fail func(*gin.Context, *apiError)) (arrival, bool) {
	a := arrival{arrived: s.cfg.Now()}
	var aerr *apiError
	if a.body, aerr = readBody(c); aerr != nil {
		fail(c, aerr)
		return arrival{}, false
	}
	a.start = s.cfg.Now()
	return a, true
}

// newGen starts a genRequest for the request c, received as a: the
// model, adapter and rank resolved.
func (s *Server) newGen(c *gin.Context, model string, a arrival) (genRequest, *apiError) {
	g := genRequest{start: a.start, read: a.start.Sub(a.arrived)}
	var aerr *apiError
	if g.rank, aerr = dpRank(c); aerr != nil {
		return g, aerr
	}
	g.model, g.lora, aerr = s.resolveModel(model)
	return g, aerr
}

// tooLong is vLLM's message (serving_engine._validate_input).
func (s *Server) tooLong(prompt, maxTokens int) *apiError {
	return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		s.cfg.MaxModelLen, prompt+maxTokens, prompt, maxTokens)
}

// errGone stands for "the client left": nothing is to be written.
var errGone = &apiError{}

// newID is a response id: the API's prefix, the process's boot time and a
// counter, so ids are unique across restarts of the process.
func (s *Server) newID(prefix string) string {
	return fmt.Sprintf("%s-%x%06x", prefix, s.boot, s.nextID.Add(1))
}

// submit validates g's prompts as vLLM does before it queues them and
// queues them all, before any output is read (vLLM's merged generators),
// as engine requests id, or id-i for a batch (vLLM's f"{request_id}-{i}").
// When one fails, those already queued are released. errGone means the
// client left.
func (s *Server) submit(ctx context.Context, g *genRequest, id string) ([]*vllmsim.Stream, *apiError) {
	prompts := g.prompts()
	for _, p := range prompts {
		if len(p) == 0 {
			return nil, badRequest("The prompt cannot be empty.")
		}
		if s.cfg.MaxModelLen > 0 && len(p)+g.maxTokens > s.cfg.MaxModelLen {
			return nil, s.tooLong(len(p), g.maxTokens)
		}
	}
	if s.unavailable() {
		return nil, unavailable("engine is restarting or draining")
	}
	streams := make([]*vllmsim.Stream, 0, len(prompts))
	for i, p := range prompts {
		q := vllmsim.Request{ID: id, PromptTokens: p, MaxTokens: g.maxTokens, LoRA: g.lora.Name, LoRAID: g.lora.ID, CacheSalt: g.salt, MM: g.mm}
		if g.batch != nil {
			q.ID = fmt.Sprintf("%s-%d", id, i)
		}
		var st *vllmsim.Stream
		var err error
		if rs, ok := s.eng.(RankedEngine); ok && g.rank >= 0 {
			st, err = rs.SubmitRank(ctx, g.rank, q)
		} else {
			st, err = s.eng.Submit(ctx, q)
		}
		if err != nil {
			release(streams)
			return nil, s.submitError(err, len(p), g.maxTokens)
		}
		streams = append(streams, st)
	}
	return streams, nil
}

func (s *Server) submitError(err error, prompt, maxTokens int) *apiError {
	switch {
	case errors.Is(err, vllmsim.ErrTooLong):
		return s.tooLong(prompt, maxTokens)
	case errors.Is(err, vllmsim.ErrInvalid):
		return badRequest("%v", err)
	case errors.Is(err, context.Canceled):
		return errGone // the client left before the request was queued
	case errors.Is(err, vllmsim.ErrStopped):
		return unavailable("engine is not running")
	}
	return internal(err.Error())
}

// release lets the engine deliver the rest of each stream, which it must
// never block on: each goroutine exits when the engine closes its channel,
// which it does after the final output (the request's context ending
// aborts it, so that comes soon).
func release(streams []*vllmsim.Stream) {
	for _, st := range streams {
		go func() {
			for range st.C {
			}
		}()
	}
}

// indexed is one engine output and the index of the prompt it belongs to;
// ok false means that prompt's stream closed without a final output.
type indexed struct {
	i  int
	o  vllmsim.Output
	ok bool
}

// outputs reads the outputs of one request's streams in arrival order.
type outputs struct {
	one  <-chan vllmsim.Output // the stream when there is one
	many chan indexed
}

// newOutputs reads streams. With several, one goroutine per stream passes
// its outputs on until the stream closes; once ctx ends it drops them, so
// it never outlives the engine's final output by more than that.
func newOutputs(ctx context.Context, streams []*vllmsim.Stream) *outputs {
	if len(streams) == 1 {
		return &outputs{one: streams[0].C}
	}
	r := &outputs{many: make(chan indexed)}
	for i, st := range streams {
		go func() {
			done := false
			for o := range st.C {
				done = o.Done
				select {
				case r.many <- indexed{i: i, o: o, ok: true}:
				case <-ctx.Done():
				}
			}
			if done {
				return
			}
			select {
			case r.many <- indexed{i: i}:
			case <-ctx.Done():
			}
		}()
	}
	return r
}

// next waits for the next output; false when ctx ended first. A stream's
// outputs after its final one are never delivered (there are none).
func (r *outputs) next(ctx context.Context) (indexed, bool) {
	if r.one != nil {
		select {
		case <-ctx.Done():
			return indexed{}, false
		case o, ok := <-r.one:
			return indexed{o: o, ok: ok}, true
		}
	}
	select {
	case <-ctx.Done():
		return indexed{}, false
	case x := <-r.many:
		return x, true
	}
}

// textSource turns generated token ids into text. In echo mode it replays
// the prompt, one prompt token per generated token, wrapping around.
type textSource struct {
	tok    Tokenizer
	prompt []uint32
	echo   bool
	pos    int
}

// next returns the ids the text is decoded from, which in echo mode are
// the replayed prompt ids, so that return_token_ids matches the text.
func (t *textSource) next(ids []uint32) ([]uint32, string) {
	if len(ids) == 0 {
		return nil, ""
	}
	if !t.echo {
		return ids, t.tok.Decode(ids)
	}
	out := make([]uint32, len(ids))
	for i := range out {
		out[i] = t.prompt[t.pos%len(t.prompt)]
		t.pos++
	}
	return out, t.tok.Decode(out)
}

// result is one prompt's generation, collected.
type result struct {
	text  []byte
	ids   []uint32
	final vllmsim.Output
}

// collect reads every stream to its final output. It fails with the
// simulator's 503 when the engine aborted a request (a restart), 500 when
// a stream ended without its final output, errGone when ctx ended.
func (s *Server) collect(ctx context.Context, streams []*vllmsim.Stream, texts []textSource) ([]result, *apiError) {
	res := make([]result, len(streams))
	r := newOutputs(ctx, streams)
	for left := len(streams); left > 0; {
		x, live := r.next(ctx)
		if !live {
			return nil, errGone
		}
		if !x.ok {
			return nil, internal("engine closed the stream without a final output")
		}
		ids, delta := texts[x.i].next(x.o.Tokens)
		res[x.i].text = append(res[x.i].text, delta...)
		res[x.i].ids = append(res[x.i].ids, ids...)
		if !x.o.Done {
			continue
		}
		left--
		s.met.finished(x.o)
		if x.o.FinishReason == "abort" {
			return nil, unavailable("request aborted: engine restarted")
		}
		res[x.i].final = x.o
	}
	return res, nil
}

// texts are the text sources of g's prompts.
func (s *Server) texts(g *genRequest) []textSource {
	ps := g.prompts()
	ts := make([]textSource, len(ps))
	for i, p := range ps {
		ts[i] = textSource{tok: s.tok, prompt: p, echo: s.cfg.Echo}
	}
	return ts
}

// ServiceHeader is the simulator's own header on a generation answer: the
// microseconds from the request's body being read to its first output
// being ready (tokenization, queueing, prefill), before it is encoded. A
// benchmark takes it from the client's time to the first byte to get what
// lies outside the engine, request by request; encoding stays outside,
// since what a request asks to be returned (token ids) costs there.
const ServiceHeader = "X-Sim-Service-Us"

// ReadHeader is the microseconds the handler took to read the request's
// body (the headers were read before it started): with ServiceHeader it
// tells a body that was slow to arrive from an engine slow to serve.
const ReadHeader = "X-Sim-Read-Us"

// StartHeader is the wall clock, Unix µs, when the handler started (its
// request's headers were read): a benchmark on the same machine puts it
// against its own clock to tell the way to the engine from the way back.
const StartHeader = "X-Sim-Start-Unix-Us"

// served sets ServiceHeader, ReadHeader and StartHeader; call it when the
// first output is ready, before the first byte.
func (s *Server) served(c *gin.Context, g *genRequest) {
	c.Header(ServiceHeader, strconv.FormatInt(s.cfg.Now().Sub(g.start).Microseconds(), 10))
	c.Header(ReadHeader, strconv.FormatInt(g.read.Microseconds(), 10))
	c.Header(StartHeader, strconv.FormatInt(g.start.Add(-g.read).UnixMicro(), 10))
}

// sse writes one API's server-sent events, each flushed at once; the
// headers go with the first (and the simulator's timing headers then).
type sse struct {
	c      *gin.Context
	s      *Server
	g      *genRequest
	unsent bool
}

func (s *Server) newSSE(c *gin.Context, g *genRequest) *sse {
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c.Status(http.StatusOK)
	return &sse{c: c, s: s, g: g, unsent: true}
}

// send writes `event: name\n` (when name is set) and `data: b\n\n`.
func (w *sse) send(name string, b []byte) bool {
	if w.unsent { // gin writes the header with the first byte
		w.s.served(w.c, w.g)
		w.unsent = false
	}
	var err error
	if name != "" {
		_, err = fmt.Fprintf(w.c.Writer, "event: %s\ndata: %s\n\n", name, b)
	} else {
		_, err = fmt.Fprintf(w.c.Writer, "data: %s\n\n", b)
	}
	if err != nil {
		return false
	}
	w.c.Writer.Flush()
	return true
}

func ptr[T any](v T) *T { return &v }

// simTiming is the simulator's extra member: simulated seconds since
// engine start, so a benchmark can read TTFT without wall-clock noise.
type simTiming struct {
	ArrivalS    float64 `json:"arrival_s"`
	FirstTokenS float64 `json:"first_token_s"`
	FinishS     float64 `json:"finish_s"`
}

func simOf(o vllmsim.Output) *simTiming {
	return &simTiming{ArrivalS: o.ArrivalSim, FirstTokenS: o.FirstTokenSim, FinishS: o.NowSim}
}

// simOfAll is a batch's timing: its first arrival and first token, its
// last finish.
func simOfAll(outs []vllmsim.Output) *simTiming {
	t := simOf(outs[0])
	for _, o := range outs[1:] {
		t.ArrivalS = min(t.ArrivalS, o.ArrivalSim)
		if o.FirstTokenSim > 0 && (t.FirstTokenS == 0 || o.FirstTokenSim < t.FirstTokenS) {
			t.FirstTokenS = o.FirstTokenSim
		}
		t.FinishS = max(t.FinishS, o.NowSim)
	}
	return t
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen *int    `json:"max_model_len"`
	Permission  []any   `json:"permission"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

func (s *Server) models(c *gin.Context) {
	now := s.cfg.Now().Unix()
	perm := func(id string) []any {
		return []any{gin.H{"id": "modelperm-" + id, "object": "model_permission", "created": now,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
			"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}}
	}
	root := s.cfg.Root
	if root == "" {
		root = s.cfg.Models[0]
	}
	list := modelList{Object: "list"}
	for _, m := range s.cfg.Models {
		list.Data = append(list.Data, modelCard{ID: m, Object: "model", Created: now, OwnedBy: "vllm", Root: root,
			MaxModelLen: ptr(s.cfg.MaxModelLen), Permission: perm(m)})
	}
	for _, l := range s.loras.all() {
		parent := l.Base
		if parent == "" {
			parent = s.cfg.Models[0]
		}
		list.Data = append(list.Data, modelCard{ID: l.Name, Object: "model", Created: now, OwnedBy: "vllm", Root: l.Path,
			Parent: ptr(parent), Permission: perm(l.Name)})
	}
	c.JSON(http.StatusOK, list)
}

// health has an empty body, as vLLM's.
func (s *Server) health(c *gin.Context) {
	if s.unavailable() {
		c.Status(http.StatusServiceUnavailable)
		return
	}
	c.Status(http.StatusOK)
}

// resetPrefixCache answers as vLLM's dev route does (api_router.py): 200
// with an empty body, 409 "Prefix cache reset failed." while requests hold
// blocks (the HTTPException handler's body, type = the status phrase).
func (s *Server) resetPrefixCache(c *gin.Context) {
	if !s.eng.ResetPrefixCache() {
		writeError(c, &apiError{Status: 409, Type: "Conflict", Message: "Prefix cache reset failed."})
		return
	}
	c.Status(http.StatusOK)
}

// cachedBlockJSON is /sim/cache's view of one block; hashes are unsigned
// decimal JSON numbers (exact for Go and Python clients).
type cachedBlockJSON struct {
	Hash   uint64   `json:"hash"`
	Parent *uint64  `json:"parent"`
	Tokens []uint32 `json:"tokens"`
	LoRA   string   `json:"lora"`
	// Extra are the block's extra hash keys (LoRA, image ids, salt),
	// absent when none.
	Extra  []string `json:"extra,omitempty"`
	Copies int      `json:"copies"`
}

func (s *Server) simCache(c *gin.Context) {
	blocks := s.eng.Cached()
	out := make([]cachedBlockJSON, len(blocks))
	for i, b := range blocks {
		out[i] = cachedBlockJSON{Hash: b.Hash, Parent: b.Parent, Tokens: b.Tokens, LoRA: b.LoRA, Extra: b.Extra, Copies: b.Copies}
		if out[i].Tokens == nil {
			out[i].Tokens = []uint32{}
		}
	}
	c.JSON(http.StatusOK, gin.H{"block_size": s.eng.Stats().BlockSize, "blocks": out})
}

// simRestart simulates a vLLM process restart: requests are aborted, the
// cache is emptied without AllBlocksCleared, adapters loaded at run time
// and stored Responses are gone (a new process has neither; adapter ids
// start again at 1), the event seq restarts at 0, and /health answers 503
// for RestartDowntime.
func (s *Server) simRestart(c *gin.Context) {
	s.restart.Store(s.cfg.Now().Add(s.cfg.RestartDowntime).UnixNano())
	s.eng.Restart()
	s.loras.reset(s.cfg.LoRAs)
	s.store.reset()
	if err := s.events.Restart(c.Request.Context()); err != nil {
		writeError(c, internal(err.Error()))
		return
	}
	c.JSON(http.StatusOK, gin.H{"restarted": true})
}

func (s *Server) simDropRate(c *gin.Context) {
	if c.Request.Method == http.MethodPost {
		var r struct {
			DropRate *float64 `json:"drop_rate"`
		}
		if !bindJSON(c, &r) {
			return
		}
		if r.DropRate == nil {
			writeError(c, badRequest("drop_rate: field required"))
			return
		}
		if err := s.events.SetDropRate(*r.DropRate); err != nil {
			writeError(c, badRequest("%v", err))
			return
		}
	}
	c.JSON(http.StatusOK, gin.H{"drop_rate": s.events.DropRate()})
}

// charged runs a tokenization under the configured cost. It returns false
// when the client left while it waited (nothing is written then).
func (s *Server) charged(c *gin.Context, tokenize func() int) bool {
	return s.cfg.TokenizeCost.Run(c.Request.Context(), tokenize) == nil
}
