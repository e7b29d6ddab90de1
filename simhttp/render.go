package simhttp

import (
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// vLLM's render endpoints turn a request into the token ids the engine
// would run, without running it (vllm-project/vllm
// vllm/entrypoints/scale_out/render/serving.py @04e47dbe, api_router.py
// beside it; /v1/messages/render since v0.29, vllm#45803;
// /v1/responses/render since v0.30, vllm#50195). llm-d's token producer and
// kvroute's sidecar tokenize through them, so they must answer as vLLM's
// do. Since v0.30 plain `vllm serve` registers them only with
// --enable-scale-out (first VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1, vllm#54579,
// scale_out/factories.py @0487d5c2; then the flag, vllm#55176): Config.ScaleOut.
// The answer is a GenerateRequest (scale_out/token_in_token_out/protocol.py);
// /v1/completions/render answers a list of them, one per prompt.
func (s *Server) registerRender(r gin.IRoutes) {
	r.POST("/v1/chat/completions/render", s.renderChat)
	r.POST("/v1/completions/render", s.renderCompletion)
	r.POST("/v1/messages/render", s.renderMessages)
	r.POST("/v1/responses/render", s.renderResponses)
}

// generateRequest is vLLM's GenerateRequest. features is null for text
// prompts; sampling_params carries the fields the simulator honours (vLLM
// dumps its whole SamplingParams; readers take what they need).
type generateRequest struct {
	RequestID        string         `json:"request_id"`
	TokenIDs         []uint32       `json:"token_ids"`
	Features         *mmFeatures    `json:"features"`
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

// mmFeatures is vLLM's MultiModalFeatures (token_in_token_out/protocol.py):
// per modality, each item's identifier (mm_hashes, what enters the block
// hashes) and where its placeholder tokens sit; kwargs_data, the
// serialized tensors, is null: the simulator has none, as vLLM's answer
// has none for a cached item.
type mmFeatures struct {
	MMHashes       map[string][]string        `json:"mm_hashes"`
	MMPlaceholders map[string][]mmPlaceholder `json:"mm_placeholders"`
	KwargsData     map[string][]*string       `json:"kwargs_data"`
}

// mmPlaceholder is vLLM's PlaceholderRangeInfo.
type mmPlaceholder struct {
	Offset int `json:"offset"`
	Length int `json:"length"`
}

// featuresOf is the features of a prompt with these image placements; nil
// without images, as vLLM's _extract_mm_features returns for text.
func featuresOf(mm []vllmsim.MMPlacement) *mmFeatures {
	if len(mm) == 0 {
		return nil
	}
	f := &mmFeatures{MMHashes: map[string][]string{}, MMPlaceholders: map[string][]mmPlaceholder{}}
	for _, p := range mm {
		f.MMHashes["image"] = append(f.MMHashes["image"], p.ID)
		f.MMPlaceholders["image"] = append(f.MMPlaceholders["image"], mmPlaceholder{Offset: p.Offset, Length: p.Length})
	}
	return f
}

// rendered is one prompt's GenerateRequest.
type rendered struct {
	ids       []uint32
	mm        []vllmsim.MMPlacement
	maxTokens int
	model     string // as the request named it ("" none)
	stream    bool
	so        *streamOptions
	salt      string
}

// generate validates r as vLLM's render does (no empty prompt, the
// context length) and builds its GenerateRequest with id.
func (s *Server) generate(id string, r rendered) (generateRequest, *apiError) {
	if len(r.ids) == 0 {
		return generateRequest{}, badRequest("No token_ids rendered")
	}
	if s.cfg.MaxModelLen > 0 && len(r.ids)+r.maxTokens > s.cfg.MaxModelLen {
		return generateRequest{}, s.tooLong(len(r.ids), r.maxTokens)
	}
	g := generateRequest{
		RequestID:      id,
		TokenIDs:       r.ids,
		Features:       featuresOf(r.mm),
		SamplingParams: samplingParams{N: 1, MaxTokens: r.maxTokens},
		Stream:         r.stream,
	}
	if r.model != "" {
		g.Model = &r.model
	}
	if r.stream {
		g.StreamOptions = r.so
	}
	if r.salt != "" {
		g.CacheSalt = &r.salt
	}
	return g, nil
}

func (s *Server) renderChat(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	r, msgs, aerr := decodeChat(a.body)
	if aerr == nil {
		_, _, aerr = s.resolveModel(r.Model)
	}
	q := r.rendered()
	if aerr == nil {
		q.maxTokens, aerr = r.maxTokens()
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	if q.ids, q.mm, ok = s.chatTokens(c, msgs, r.options(), writeError); !ok {
		return
	}
	s.answerRender(c, "chatcmpl", q)
}

// answerRender answers one GenerateRequest, named prefix-... (vLLM's
// chatcmpl-/cmpl- render ids), or prefix itself when it is a whole id.
func (s *Server) answerRender(c *gin.Context, prefix string, q rendered) {
	id := prefix
	if prefix == "chatcmpl" || prefix == "cmpl" {
		id = s.newID(prefix)
	}
	g, aerr := s.generate(id, q)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	c.JSON(http.StatusOK, g)
}

func (s *Server) renderCompletion(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	r, aerr := decodeCompletion(a.body)
	if aerr == nil {
		_, _, aerr = s.resolveModel(r.Model)
	}
	q := r.rendered()
	var ps []completionPrompt
	if aerr == nil {
		q.maxTokens, ps, aerr = r.prompts()
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	prompts, ok := s.promptTokens(c, ps)
	if !ok {
		return
	}
	out := make([]generateRequest, len(prompts))
	for i, ids := range prompts {
		q.ids = ids
		if out[i], aerr = s.generate(s.newID("cmpl"), q); aerr != nil {
			writeError(c, aerr)
			return
		}
	}
	c.JSON(http.StatusOK, out)
}

// renderMessages is /v1/messages/render: the Messages request converted
// as /v1/messages converts it ("the same converter, so the rendered tokens
// match", vllm#45803), one GenerateRequest like chat render's. Errors are
// OpenAI's shape, as the render router's are.
func (s *Server) renderMessages(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	m, ok := s.messagesPrompt(c, a.body, writeError)
	if !ok {
		return
	}
	s.answerRender(c, "chatcmpl", rendered{ids: m.ids, mm: m.mm, maxTokens: m.maxTokens, model: m.model, stream: m.stream,
		so: &streamOptions{IncludeUsage: true, ContinuousUsageStats: true}})
}

// renderResponses is /v1/responses/render: stateless, so
// previous_response_id is refused as vLLM refuses it
// (render_responses_request); the GenerateRequest carries the request's
// resp_ id, and no stream_options.
func (s *Server) renderResponses(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	rr, aerr := decodeResponses(a.body)
	if aerr == nil {
		_, _, aerr = s.resolveModel(rr.Model)
	}
	if aerr == nil && rr.PreviousResponseID != nil {
		aerr = &apiError{Status: 400, Type: "invalid_request_error", Param: "previous_response_id",
			Message: "previous_response_id is not supported by the stateless render endpoint."}
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	p, ok := s.responsesPrompt(c, a.body, &rr, nil)
	if !ok {
		return
	}
	maxTokens, aerr := checkMaxTokens(rr.maxTokens())
	if aerr == nil && len(p.ids) > 0 {
		maxTokens, aerr = s.responsesMaxTokens(len(p.ids), maxTokens)
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	s.answerRender(c, s.responseID(&rr), rendered{ids: p.ids, mm: p.mm, maxTokens: maxTokens, model: rr.Model, stream: rr.Stream, salt: rr.salt()})
}
