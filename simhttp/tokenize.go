package simhttp

import (
	"encoding/json"
	"math"
	"net/http"

	"github.com/gin-gonic/gin"
)

type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             []chatMessage   `json:"messages"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
	Tools                json.RawMessage `json:"tools"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

type detokenizeRequest struct {
	Model  string        `json:"model"`
	Tokens []json.Number `json:"tokens"`
}

// tokenize is vLLM's /tokenize (serve/tokenize/api_router.py): the
// completion variant (prompt) or the chat variant (messages, rendered
// through the chat template exactly as generation renders them, images
// included).
func (s *Server) tokenize(c *gin.Context) {
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
		if ids, _, ok = s.chatTokens(c, msgs, cr.options(), writeError); !ok {
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

func (s *Server) detokenize(c *gin.Context) {
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
