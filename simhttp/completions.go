package simhttp

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"

	"github.com/gin-gonic/gin"
)

type completionRequest struct {
	openAIRequest
	Prompt json.RawMessage `json:"prompt"`
}

// decodeCompletion parses a completions request.
func decodeCompletion(body []byte) (completionRequest, *apiError) {
	var r completionRequest
	aerr := decodeJSON(body, &r)
	return r, aerr
}

// prompts is r's max_tokens and prompts, checked, in vLLM's order.
func (r *completionRequest) prompts() (int, []completionPrompt, *apiError) {
	maxTokens, aerr := r.maxTokens()
	if aerr != nil {
		return 0, nil, aerr
	}
	ps, aerr := parsePrompt(r.Prompt)
	return maxTokens, ps, aerr
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
	// vLLM's non-streaming choice orders these two as here; its stream
	// choice puts prompt_token_ids first. One type serves both.
	TokenIDs       []uint32 `json:"token_ids,omitzero"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitzero"`
}

// completionPrompt is one completions prompt: either text or token ids.
type completionPrompt struct {
	Text   string
	Tokens []uint32
	IsText bool
}

// promptForms is vLLM's refusal of any other prompt form.
const promptForms = "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids"

// parsePrompt accepts the four forms of `prompt` (vLLM's CompletionRequest:
// str | list[str] | list[int] | list[list[int]]); a list of strings or of
// token-id lists is one prompt per entry, each served as its own engine
// request. Mixed lists, empty lists and empty token lists are refused.
func parsePrompt(raw json.RawMessage) ([]completionPrompt, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badRequest("prompt: field required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("prompt: %v", err)
		}
		return []completionPrompt{{Text: s, IsText: true}}, nil
	}
	if raw[0] != '[' {
		return nil, badRequest(promptForms)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("prompt: %v", err)
	}
	if len(items) == 0 {
		return nil, badRequest("prompt must not be empty")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) == 0 || (first[0] != '"' && first[0] != '[') {
		ids, err := tokenIDs(items, "prompt")
		if err != nil {
			return nil, err
		}
		return []completionPrompt{{Tokens: ids}}, nil
	}
	out := make([]completionPrompt, len(items))
	for i, it := range items {
		it = bytes.TrimSpace(it)
		if len(it) == 0 || it[0] != first[0] {
			return nil, badRequest("prompt[%d]: %s", i, promptForms)
		}
		if it[0] == '"' {
			if err := json.Unmarshal(it, &out[i].Text); err != nil {
				return nil, badRequest("prompt[%d]: %v", i, err)
			}
			out[i].IsText = true
			continue
		}
		var inner []json.RawMessage
		if err := json.Unmarshal(it, &inner); err != nil {
			return nil, badRequest("prompt[%d]: %v", i, err)
		}
		if len(inner) == 0 {
			return nil, badRequest("prompt must not be empty")
		}
		ids, err := tokenIDs(inner, "prompt["+strconv.Itoa(i)+"]")
		if err != nil {
			return nil, err
		}
		out[i].Tokens = ids
	}
	return out, nil
}

func tokenIDs(items []json.RawMessage, field string) ([]uint32, *apiError) {
	ids := make([]uint32, len(items))
	for i, it := range items {
		var n json.Number
		if err := json.Unmarshal(it, &n); err != nil {
			return nil, badRequest("%s[%d]: token id must be an integer", field, i)
		}
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, badRequest("%s[%d]: token id %s out of range", field, i, it)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

// promptTokens tokenizes the text prompts (each charged as vLLM's API
// server tokenizes each); false when the client left.
func (s *Server) promptTokens(c *gin.Context, ps []completionPrompt) ([][]uint32, bool) {
	out := make([][]uint32, len(ps))
	for i, p := range ps {
		out[i] = p.Tokens
		if p.IsText && !s.charged(c, func() int { out[i] = s.tok.Encode(p.Text, true); return len(out[i]) }) {
			return nil, false
		}
	}
	return out, true
}

func (s *Server) completions(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	r, aerr := decodeCompletion(a.body)
	if aerr == nil {
		aerr = r.checkN()
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	g, aerr := s.newGen(c, r.Model, a)
	var ps []completionPrompt
	if aerr == nil {
		g.maxTokens, ps, aerr = r.prompts()
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	r.generation(&g)
	prompts, ok := s.promptTokens(c, ps)
	if !ok {
		return
	}
	if len(prompts) == 1 {
		g.prompt = prompts[0]
	} else {
		g.batch = prompts
	}
	s.generateOpenAI(c, &g, false)
}
