package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// engine is what the HTTP edge needs from the simulated engine core;
// *vllmsim.Engine satisfies it.
type engine interface {
	Submit(ctx context.Context, r vllmsim.Request) (*vllmsim.Stream, error)
	Stats() vllmsim.Stats
	Cached() []vllmsim.CachedBlock
	ResetPrefixCache() bool
	Restart()
}

// tokenizer is what the edge needs from the engine's tokenizer;
// *vllmsim.Tokenizer satisfies it.
type tokenizer interface {
	Encode(text string, addSpecial bool) []uint32
	Decode(ids []uint32) string
	Chat(msgs []vllmsim.Message, o vllmsim.ChatOptions) ([]uint32, error)
}

// eventControl is the publisher as the admin endpoints see it.
type eventControl interface {
	Restart(ctx context.Context) error
	SetDropRate(r float64) error
	DropRate() float64
}

// noEvents stands in for the publisher when KV events are disabled.
type noEvents struct{}

func (noEvents) Restart(context.Context) error { return nil }
func (noEvents) SetDropRate(float64) error     { return errors.New("kv events are disabled") }
func (noEvents) DropRate() float64             { return 0 }

// serverConfig is the HTTP edge's configuration.
type serverConfig struct {
	// Models are the served model names; the first is the base model's id.
	Models []string
	// Root is --model, reported as the ModelCard root.
	Root  string
	LoRAs []lora // --lora-modules
	// RuntimeLoRA serves /v1/load_lora_adapter and /v1/unload_lora_adapter,
	// as vLLM does with VLLM_ALLOW_RUNTIME_LORA_UPDATING set.
	RuntimeLoRA bool
	MaxModelLen int
	// Echo makes the output text repeat the prompt instead of the engine's
	// synthetic tokens (token counts and timing are unchanged).
	Echo bool
	// RestartDowntime is how long /health and generation answer 503 after
	// /sim/restart, as a restarting vLLM would be unavailable.
	RestartDowntime time.Duration
	// BodyLimitBytes caps request bodies (413 above it).
	BodyLimitBytes int64
	// Now is the wall clock (for "created" and the restart window).
	Now func() time.Time
	// ChatTemplate is the model's chat template.
	ChatTemplate vllmsim.ChatTemplate
	// TokenizeCost charges tokenization time (nil: free).
	TokenizeCost *vllmsim.TokenizeCost
}

type server struct {
	cfg     serverConfig
	eng     engine
	tok     tokenizer
	events  eventControl
	met     *metrics
	loras   *adapters
	boot    int64
	nextID  atomic.Uint64
	drain   atomic.Bool
	restart atomic.Int64 // unix nanos until which the engine counts as restarting
}

func newServer(cfg serverConfig, eng engine, tok tokenizer, events eventControl, met *metrics) *server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BodyLimitBytes <= 0 {
		cfg.BodyLimitBytes = 32 << 20
	}
	if events == nil {
		events = noEvents{}
	}
	return &server{cfg: cfg, eng: eng, tok: tok, events: events, met: met, loras: newAdapters(cfg.LoRAs), boot: cfg.Now().UnixNano()}
}

// SetDraining makes /health answer 503 so Kubernetes stops sending traffic.
func (s *server) SetDraining() { s.drain.Store(true) }

func (s *server) unavailable() bool {
	return s.drain.Load() || s.cfg.Now().UnixNano() < s.restart.Load()
}

// handler builds the gin engine with vLLM's routes and the /sim/ admin
// routes. A panic in a handler becomes a 500 error body, never a crash.
func (s *server) handler() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		writeError(c, &apiError{Status: 500, Type: "InternalServerError", Message: "internal error"})
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
	r.GET("/v1/models", s.models)
	r.GET("/health", s.health)
	r.POST("/tokenize", s.tokenize)
	r.POST("/detokenize", s.detokenize)
	s.registerRender(r)
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

func writeError(c *gin.Context, e *apiError) {
	c.AbortWithStatusJSON(e.Status, e.body())
}

func readBody(c *gin.Context) ([]byte, *apiError) {
	b, err := io.ReadAll(c.Request.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: 413, Type: "Request Entity Too Large", Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		}
		return nil, badRequest("read body: %v", err)
	}
	return b, nil
}

// resolveModel maps a request's model to the id to report and the
// adapter it names (zero for the base model). An empty model means the
// base model, as vLLM allows.
func (s *server) resolveModel(name string) (string, lora, *apiError) {
	if name == "" {
		return s.cfg.Models[0], lora{}, nil
	}
	if slices.Contains(s.cfg.Models, name) {
		return name, lora{}, nil
	}
	if l, ok := s.loras.find(name); ok {
		return name, l, nil
	}
	return "", lora{}, notFound("The model `%s` does not exist.", name)
}

// rankedEngine is an engine with data-parallel ranks; *ranks satisfies it.
type rankedEngine interface {
	// SubmitRank submits to one rank, as vLLM does for a request that
	// names its data_parallel_rank.
	SubmitRank(ctx context.Context, rank int, r vllmsim.Request) (*vllmsim.Stream, error)
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
	chat         bool
	model        string
	lora         lora
	prompt       []uint32
	maxTokens    int
	salt         string
	stream       bool
	includeUsage bool
	tokenIDs     bool          // return_token_ids
	start        time.Time     // the request's body was read
	read         time.Duration // from the handler's start to then
	rank         int           // X-data-parallel-rank, -1 when absent
}

func (s *server) chat(c *gin.Context) {
	arrived := s.cfg.Now()
	body, aerr := readBody(c)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	start := s.cfg.Now()
	r, msgs, aerr := decodeChat(body)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	g := genRequest{start: start, read: start.Sub(arrived), chat: true, salt: r.CacheSalt, stream: r.Stream, includeUsage: r.StreamOptions != nil && r.StreamOptions.IncludeUsage, tokenIDs: r.ReturnTokenIDs}
	if g.rank, aerr = dpRank(c); aerr != nil {
		writeError(c, aerr)
		return
	}
	if g.model, g.lora, aerr = s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	if g.maxTokens, aerr = r.maxTokens(); aerr != nil {
		writeError(c, aerr)
		return
	}
	ids, ok := s.chatTokens(c, msgs, r.options())
	if !ok {
		return
	}
	g.prompt = ids
	s.generate(c, g)
}

func (s *server) completions(c *gin.Context) {
	arrived := s.cfg.Now()
	body, aerr := readBody(c)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	start := s.cfg.Now()
	var r completionRequest
	if aerr = decodeJSON(body, &r); aerr != nil {
		writeError(c, aerr)
		return
	}
	if r.N != nil && *r.N != 1 {
		writeError(c, badRequest("n=%d is not supported by the simulator; use n=1", *r.N))
		return
	}
	g := genRequest{start: start, read: start.Sub(arrived), salt: r.CacheSalt, stream: r.Stream, includeUsage: r.StreamOptions != nil && r.StreamOptions.IncludeUsage, tokenIDs: r.ReturnTokenIDs}
	if g.rank, aerr = dpRank(c); aerr != nil {
		writeError(c, aerr)
		return
	}
	if g.model, g.lora, aerr = s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	if g.maxTokens, aerr = r.maxTokens(); aerr != nil {
		writeError(c, aerr)
		return
	}
	p, aerr := parsePrompt(r.Prompt)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	g.prompt = p.Tokens
	if p.IsText && !s.charged(c, func() int { g.prompt = s.tok.Encode(p.Text, true); return len(g.prompt) }) {
		return
	}
	s.generate(c, g)
}

// tooLong is vLLM's message (serving_engine._validate_input).
func (s *server) tooLong(prompt, maxTokens int) *apiError {
	return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		s.cfg.MaxModelLen, prompt+maxTokens, prompt, maxTokens)
}

func (s *server) generate(c *gin.Context, g genRequest) {
	if len(g.prompt) == 0 {
		writeError(c, badRequest("The prompt cannot be empty."))
		return
	}
	if s.cfg.MaxModelLen > 0 && len(g.prompt)+g.maxTokens > s.cfg.MaxModelLen {
		writeError(c, s.tooLong(len(g.prompt), g.maxTokens))
		return
	}
	if s.unavailable() {
		writeError(c, &apiError{Status: 503, Type: "ServiceUnavailableError", Message: "engine is restarting or draining"})
		return
	}
	prefix := "cmpl"
	if g.chat {
		prefix = "chatcmpl"
	}
	id := fmt.Sprintf("%s-%x%06x", prefix, s.boot, s.nextID.Add(1))
	ctx := c.Request.Context()
	q := vllmsim.Request{ID: id, PromptTokens: g.prompt, MaxTokens: g.maxTokens, LoRA: g.lora.Name, LoRAID: g.lora.ID, CacheSalt: g.salt}
	var st *vllmsim.Stream
	var err error
	if rs, ok := s.eng.(rankedEngine); ok && g.rank >= 0 {
		st, err = rs.SubmitRank(ctx, g.rank, q)
	} else {
		st, err = s.eng.Submit(ctx, q)
	}
	switch {
	case errors.Is(err, vllmsim.ErrTooLong):
		writeError(c, s.tooLong(len(g.prompt), g.maxTokens))
		return
	case errors.Is(err, vllmsim.ErrInvalid):
		writeError(c, badRequest("%v", err))
		return
	case errors.Is(err, context.Canceled):
		return // the client left before the request was queued
	case errors.Is(err, vllmsim.ErrStopped):
		writeError(c, &apiError{Status: 503, Type: "ServiceUnavailableError", Message: "engine is not running"})
		return
	case err != nil:
		writeError(c, &apiError{Status: 500, Type: "InternalServerError", Message: err.Error()})
		return
	}
	// However this handler ends, the engine must never block on C.
	defer func() {
		go func() {
			for range st.C {
			}
		}()
	}()
	t := textSource{tok: s.tok, prompt: g.prompt, echo: s.cfg.Echo}
	resp := respShape{id: id, model: g.model, created: s.cfg.Now().Unix(), chat: g.chat, tokenIDs: g.tokenIDs, prompt: g.prompt, start: g.start, read: g.read, now: s.cfg.Now}
	if g.stream {
		s.stream(c, st, t, resp, g.includeUsage)
		return
	}
	var text []byte
	var gen []uint32
	for {
		select {
		case <-ctx.Done():
			return
		case o, ok := <-st.C:
			if !ok {
				writeError(c, &apiError{Status: 500, Type: "InternalServerError", Message: "engine closed the stream without a final output"})
				return
			}
			ids, delta := t.next(o.Tokens)
			text = append(text, delta...)
			gen = append(gen, ids...)
			if !o.Done {
				continue
			}
			if s.met != nil {
				s.met.finished(o)
			}
			if o.FinishReason == "abort" {
				writeError(c, &apiError{Status: 503, Type: "ServiceUnavailableError", Message: "request aborted: engine restarted"})
				return
			}
			resp.served(c)
			b, err := json.Marshal(resp.full(string(text), gen, o))
			if err != nil {
				writeError(c, &apiError{Status: 500, Type: "InternalServerError", Message: err.Error()})
				return
			}
			c.Data(http.StatusOK, "application/json; charset=utf-8", b)
			return
		}
	}
}

// stream writes vLLM's SSE framing: one `data: {json}\n\n` per engine step
// that produced tokens, flushed at once, then `data: [DONE]\n\n`.
func (s *server) stream(c *gin.Context, st *vllmsim.Stream, t textSource, resp respShape, includeUsage bool) {
	ctx := c.Request.Context()
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	c.Status(http.StatusOK)
	unsent := true
	send := func(v any) bool {
		if unsent { // gin writes the header with the first byte
			resp.served(c)
			unsent = false
		}
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(c.Writer, "data: %s\n\n", b); err != nil {
			return false
		}
		c.Writer.Flush()
		return true
	}
	if resp.chat {
		// The role chunk carries the prompt's ids and no token_ids.
		role := resp.chatChunk(&chatDelta{Role: "assistant", Content: ptr("")}, nil, nil)
		role.PromptTokenIDs = resp.promptIDs()
		if !send(role) {
			return
		}
	}
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case o, ok := <-st.C:
			if !ok {
				send(gin.H{"error": errorInfo{Message: "engine closed the stream", Type: "InternalServerError", Code: 500}})
				fmt.Fprint(c.Writer, "data: [DONE]\n\n")
				return
			}
			if len(o.Tokens) == 0 && !o.Done {
				continue
			}
			var fr *string
			if o.Done {
				fr = ptr(o.FinishReason)
			}
			ids, text := t.next(o.Tokens)
			var chunk any
			if resp.chat {
				d := &chatDelta{}
				if len(o.Tokens) > 0 {
					d.Content = ptr(text)
				}
				chunk = resp.chatChunk(d, resp.ids(ids), fr)
			} else {
				chunk = resp.completionChunk(text, ids, fr, first)
			}
			first = false
			if !send(chunk) {
				return
			}
			if !o.Done {
				continue
			}
			if s.met != nil {
				s.met.finished(o)
			}
			if includeUsage && !send(resp.usageChunk(o)) {
				return
			}
			fmt.Fprint(c.Writer, "data: [DONE]\n\n")
			c.Writer.Flush()
			return
		}
	}
}

func ptr[T any](v T) *T { return &v }

// textSource turns generated token ids into text. In echo mode it replays
// the prompt, one prompt token per generated token, wrapping around.
type textSource struct {
	tok    tokenizer
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
// first output is ready.
func (r respShape) served(c *gin.Context) {
	c.Header(ServiceHeader, strconv.FormatInt(r.now().Sub(r.start).Microseconds(), 10))
	c.Header(ReadHeader, strconv.FormatInt(r.read.Microseconds(), 10))
	c.Header(StartHeader, strconv.FormatInt(r.start.Add(-r.read).UnixMicro(), 10))
}

// respShape builds the OpenAI response objects of one request.
type respShape struct {
	id, model string
	created   int64
	chat      bool
	tokenIDs  bool     // return_token_ids
	prompt    []uint32 // the ids the engine ran
	start     time.Time
	read      time.Duration
	now       func() time.Time
}

// ids is what a token_ids field carries: nothing without return_token_ids,
// else the ids, an empty list rather than none.
func (r respShape) ids(ids []uint32) []uint32 {
	if !r.tokenIDs {
		return nil
	}
	if ids == nil {
		return []uint32{}
	}
	return ids
}

// promptIDs is what a prompt_token_ids field carries.
func (r respShape) promptIDs() []uint32 {
	if !r.tokenIDs {
		return nil
	}
	return r.prompt
}

func (r respShape) full(text string, gen []uint32, o vllmsim.Output) any {
	fr := ptr(o.FinishReason)
	if r.chat {
		return chatResponse{ID: r.id, Object: "chat.completion", Created: r.created, Model: r.model,
			Choices: []chatChoice{{Message: assistantMessage{Role: "assistant", Content: text, ToolCalls: []any{}}, FinishReason: fr, TokenIDs: r.ids(gen)}},
			Usage:   usageOf(o.Usage), PromptTokenIDs: r.promptIDs(), Sim: simOf(o)}
	}
	return completionResponse{ID: r.id, Object: "text_completion", Created: r.created, Model: r.model,
		Choices: []completionChoice{{Text: text, FinishReason: fr, TokenIDs: r.ids(gen), PromptTokenIDs: r.promptIDs()}},
		Usage:   usageOf(o.Usage), Sim: simOf(o)}
}

func (r respShape) chatChunk(d *chatDelta, ids []uint32, fr *string) chatChunk {
	return chatChunk{ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.model,
		Choices: []chatChunkChoice{{Delta: *d, FinishReason: fr, TokenIDs: ids}}}
}

// completionChunk carries the prompt's ids on the first chunk only, as
// vLLM does.
func (r respShape) completionChunk(text string, ids []uint32, fr *string, first bool) completionResponse {
	c := completionChoice{Text: text, FinishReason: fr, TokenIDs: r.ids(ids)}
	if first {
		c.PromptTokenIDs = r.promptIDs()
	}
	return completionResponse{ID: r.id, Object: "text_completion", Created: r.created, Model: r.model,
		Choices: []completionChoice{c}}
}

func (r respShape) usageChunk(o vllmsim.Output) any {
	if r.chat {
		return chatChunk{ID: r.id, Object: "chat.completion.chunk", Created: r.created, Model: r.model,
			Choices: []chatChunkChoice{}, Usage: usageOf(o.Usage), Sim: simOf(o)}
	}
	return completionResponse{ID: r.id, Object: "text_completion", Created: r.created, Model: r.model,
		Choices: []completionChoice{}, Usage: usageOf(o.Usage), Sim: simOf(o)}
}

func (s *server) models(c *gin.Context) {
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
func (s *server) health(c *gin.Context) {
	if s.unavailable() {
		c.Status(http.StatusServiceUnavailable)
		return
	}
	c.Status(http.StatusOK)
}

func (s *server) tokenize(c *gin.Context) {
	var r tokenizeRequest
	if !bindJSON(c, &r) {
		return
	}
	if _, _, aerr := s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	var ids []uint32
	switch {
	case r.Messages != nil:
		cr := chatRequest{Messages: r.Messages, AddGenerationPrompt: r.AddGenerationPrompt,
			ContinueFinalMessage: r.ContinueFinalMessage, Tools: r.Tools}
		if cr.AddGenerationPrompt != nil && *cr.AddGenerationPrompt && cr.ContinueFinalMessage {
			writeError(c, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True."))
			return
		}
		msgs, aerr := flattenMessages(r.Messages)
		if aerr != nil {
			writeError(c, aerr)
			return
		}
		var ok bool
		if ids, ok = s.chatTokens(c, msgs, cr.options()); !ok {
			return
		}
	case len(r.Prompt) > 0:
		var text string
		if err := json.Unmarshal(r.Prompt, &text); err != nil {
			writeError(c, badRequest("prompt must be a string"))
			return
		}
		add := r.AddSpecialTokens == nil || *r.AddSpecialTokens
		if !s.charged(c, func() int { ids = s.tok.Encode(text, add); return len(ids) }) {
			return
		}
	default:
		writeError(c, badRequest("either prompt or messages is required"))
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.MaxModelLen, Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []uint32{}
	}
	if r.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i] = s.tok.Decode([]uint32{id})
		}
	}
	c.JSON(http.StatusOK, resp)
}

func (s *server) detokenize(c *gin.Context) {
	var r detokenizeRequest
	if !bindJSON(c, &r) {
		return
	}
	if _, _, aerr := s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	if r.Tokens == nil {
		writeError(c, badRequest("tokens: field required"))
		return
	}
	ids := make([]uint32, len(r.Tokens))
	for i, n := range r.Tokens {
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			writeError(c, badRequest("tokens[%d]: %s is not a valid token id", i, n))
			return
		}
		ids[i] = uint32(v)
	}
	c.JSON(http.StatusOK, gin.H{"prompt": s.tok.Decode(ids)})
}

// resetPrefixCache answers as vLLM's dev route does (api_router.py): 200
// with an empty body, 409 "Prefix cache reset failed." while requests hold
// blocks (the HTTPException handler's body, type = the status phrase).
func (s *server) resetPrefixCache(c *gin.Context) {
	if !s.eng.ResetPrefixCache() {
		writeError(c, &apiError{Status: 409, Type: "Conflict", Message: "Prefix cache reset failed."})
		return
	}
	c.Status(http.StatusOK)
}

func (s *server) simCache(c *gin.Context) {
	blocks := s.eng.Cached()
	out := make([]cachedBlockJSON, len(blocks))
	for i, b := range blocks {
		out[i] = cachedBlockJSON{Hash: b.Hash, Parent: b.Parent, Tokens: b.Tokens, LoRA: b.LoRA, Copies: b.Copies}
		if out[i].Tokens == nil {
			out[i].Tokens = []uint32{}
		}
	}
	c.JSON(http.StatusOK, gin.H{"block_size": s.eng.Stats().BlockSize, "blocks": out})
}

// simRestart simulates a vLLM process restart: requests are aborted, the
// cache is emptied without AllBlocksCleared, adapters loaded at run time
// are gone (ids start again at 1), the event seq restarts at 0,
// and /health answers 503 for RestartDowntime.
func (s *server) simRestart(c *gin.Context) {
	s.restart.Store(s.cfg.Now().Add(s.cfg.RestartDowntime).UnixNano())
	s.eng.Restart()
	s.loras.reset(s.cfg.LoRAs) // a new process has only its --lora-modules
	if err := s.events.Restart(c.Request.Context()); err != nil {
		writeError(c, &apiError{Status: 500, Type: "InternalServerError", Message: err.Error()})
		return
	}
	c.JSON(http.StatusOK, gin.H{"restarted": true})
}

func (s *server) simDropRate(c *gin.Context) {
	if c.Request.Method == http.MethodPost {
		body, aerr := readBody(c)
		if aerr != nil {
			writeError(c, aerr)
			return
		}
		var r struct {
			DropRate *float64 `json:"drop_rate"`
		}
		if aerr = decodeJSON(body, &r); aerr != nil {
			writeError(c, aerr)
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
