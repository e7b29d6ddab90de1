package main

import (
	"fmt"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// vLLM's render endpoints turn an OpenAI request into the token ids the
// engine would run, without running it (vllm-project/vllm
// vllm/entrypoints/serve/render/api_router.py @1c608d646e4c and serving.py
// @0001948bc769). llm-d's token producer and other routers tokenize through
// them, so they must work against the simulator unchanged. The answer is a
// GenerateRequest (vllm/entrypoints/serve/disagg/protocol.py @06408932946d);
// /v1/completions/render answers a list of them, one per prompt.
func (s *server) registerRender(r gin.IRoutes) {
	r.POST("/v1/chat/completions/render", s.renderChat)
	r.POST("/v1/completions/render", s.renderCompletion)
}

// generateRequest is vLLM's GenerateRequest. features is null for text
// prompts; sampling_params carries the fields the simulator honours (vLLM
// dumps its whole SamplingParams; readers take what they need).
type generateRequest struct {
	RequestID        string         `json:"request_id"`
	TokenIDs         []uint32       `json:"token_ids"`
	Features         any            `json:"features"`
	SamplingParams   samplingParams `json:"sampling_params"`
	Model            *string        `json:"model"`
	Stream           bool           `json:"stream"`
	StreamOptions    *streamOptions `json:"stream_options"`
	CacheSalt        *string        `json:"cache_salt"`
	Priority         int            `json:"priority"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

type samplingParams struct {
	N         int `json:"n"`
	MaxTokens int `json:"max_tokens"`
}

func (s *server) renderChat(c *gin.Context) {
	body, aerr := readBody(c)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	r, msgs, aerr := decodeChat(body)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	if _, _, aerr = s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	maxTokens, aerr := r.maxTokens()
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	ids, ok := s.chatTokens(c, msgs, r.options())
	if !ok {
		return
	}
	g, aerr := s.rendered("chatcmpl", ids, maxTokens, r.Model, r.Stream, r.StreamOptions, r.CacheSalt)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	c.JSON(http.StatusOK, g)
}

func (s *server) renderCompletion(c *gin.Context) {
	body, aerr := readBody(c)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	var r completionRequest
	if aerr = decodeJSON(body, &r); aerr != nil {
		writeError(c, aerr)
		return
	}
	if _, _, aerr = s.resolveModel(r.Model); aerr != nil {
		writeError(c, aerr)
		return
	}
	maxTokens, aerr := r.maxTokens()
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	p, aerr := parsePrompt(r.Prompt)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	ids := p.Tokens
	if p.IsText && !s.charged(c, func() int { ids = s.tok.Encode(p.Text, true); return len(ids) }) {
		return
	}
	g, aerr := s.rendered("cmpl", ids, maxTokens, r.Model, r.Stream, r.StreamOptions, r.CacheSalt)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	c.JSON(http.StatusOK, []generateRequest{g})
}

// rendered validates a prompt as vLLM's render does (no empty prompt, the
// context length) and builds its GenerateRequest.
func (s *server) rendered(prefix string, ids []uint32, maxTokens int, model string, stream bool, so *streamOptions, salt string) (generateRequest, *apiError) {
	if len(ids) == 0 {
		return generateRequest{}, badRequest("No token_ids rendered")
	}
	if s.cfg.MaxModelLen > 0 && len(ids)+maxTokens > s.cfg.MaxModelLen {
		return generateRequest{}, s.tooLong(len(ids), maxTokens)
	}
	g := generateRequest{
		RequestID:      fmt.Sprintf("%s-%x%06x", prefix, s.boot, s.nextID.Add(1)),
		TokenIDs:       ids,
		SamplingParams: samplingParams{N: 1, MaxTokens: maxTokens},
		Stream:         stream,
	}
	if model != "" {
		g.Model = &model
	}
	if stream {
		g.StreamOptions = so
	}
	if salt != "" {
		g.CacheSalt = &salt
	}
	return g, nil
}

// chatTokens renders and tokenizes a chat on the tokenize pool; on a
// template error it answers 400. ok is false when an answer was written or
// the client left.
func (s *server) chatTokens(c *gin.Context, msgs []vllmsim.Message, o vllmsim.ChatOptions) ([]uint32, bool) {
	o.Template = s.cfg.ChatTemplate
	var ids []uint32
	var err error
	if !s.charged(c, func() int { ids, err = s.tok.Chat(msgs, o); return len(ids) }) {
		return nil, false
	}
	if err != nil {
		writeError(c, badRequest("%v", err))
		return nil, false
	}
	return ids, true
}

// charged runs a tokenization under the configured cost. It returns false
// when the client left while it waited (nothing is written then).
func (s *server) charged(c *gin.Context, tokenize func() int) bool {
	return s.cfg.TokenizeCost.Run(c.Request.Context(), tokenize) == nil
}
