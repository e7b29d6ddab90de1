package forward

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/tokenids"
)

// Prompt is what routing needs from an OpenAI request body: which model,
// and either token ids (completions with token prompts) or what /tokenize
// needs to produce them exactly as vLLM will (chat fields passed unchanged).
type Prompt struct {
	Model  string
	Stream bool
	// Chat is true for /v1/chat/completions bodies.
	Chat bool
	// Tokens is set when the completions prompt is already token ids.
	Tokens []uint32
	// Text is the completions prompt when it is a string.
	Text string
	// Chat rendering inputs, raw as the client sent them.
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  *bool
	ContinueFinalMessage *bool
	AddSpecialTokens     *bool
	CacheSalt            string
}

// errBadJSON is a body that is not a JSON object; clients get a 400.
var errBadJSON = errors.New("request body is not a valid JSON object")

// errNoPrompt means the body is valid JSON but routing cannot predict its
// blocks (no prompt or messages, several prompts): it is served without
// prefix prediction, never refused here (DESIGN.md D6).
var errNoPrompt = errors.New("no single prompt to route on")

type wireRequest struct {
	Model                string          `json:"model"`
	Stream               bool            `json:"stream"`
	Messages             json.RawMessage `json:"messages"`
	Prompt               json.RawMessage `json:"prompt"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	CacheSalt            string          `json:"cache_salt"`
}

// ParsePrompt reads the routing-relevant fields of an OpenAI request body.
// It returns errBadJSON (wrapped) for malformed JSON and errNoPrompt when
// the body is fine but carries no single prompt; in that case the returned
// Prompt still has Model and Stream.
func ParsePrompt(body []byte, chat bool) (Prompt, error) {
	var w wireRequest
	// Unmarshal, not a Decoder: it rejects trailing data itself and does
	// not copy the body into a buffer first.
	if err := json.Unmarshal(body, &w); err != nil {
		return Prompt{}, fmt.Errorf("%w: %v", errBadJSON, err)
	}
	p := Prompt{
		Model: w.Model, Stream: w.Stream, Chat: chat,
		Tools: nullToNil(w.Tools), ChatTemplateKwargs: nullToNil(w.ChatTemplateKwargs),
		AddGenerationPrompt: w.AddGenerationPrompt, ContinueFinalMessage: w.ContinueFinalMessage,
		AddSpecialTokens: w.AddSpecialTokens, CacheSalt: w.CacheSalt,
	}
	if chat {
		p.Messages = nullToNil(w.Messages)
		if len(p.Messages) == 0 || p.Messages[0] != '[' {
			return p, errNoPrompt
		}
		return p, nil
	}
	return p, parseCompletionPrompt(nullToNil(w.Prompt), &p)
}

// parseCompletionPrompt accepts the four shapes vLLM does: a string, a list
// with one string, token ids, or a list with one list of token ids.
func parseCompletionPrompt(raw json.RawMessage, p *Prompt) error {
	if len(raw) == 0 {
		return errNoPrompt
	}
	if ids, ok := tokenids.Parse(raw); ok {
		p.Tokens = ids
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return errNoPrompt
		}
		p.Text = s
		return nil
	}
	var ids []uint32
	if json.Unmarshal(raw, &ids) == nil && len(ids) > 0 {
		p.Tokens = ids
		return nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil && len(ss) == 1 && ss[0] != "" {
		p.Text = ss[0]
		return nil
	}
	var ii [][]uint32
	if json.Unmarshal(raw, &ii) == nil && len(ii) == 1 && len(ii[0]) > 0 {
		p.Tokens = ii[0]
		return nil
	}
	return errNoPrompt
}

func nullToNil(r json.RawMessage) json.RawMessage {
	if bytes.Equal(bytes.TrimSpace(r), []byte("null")) {
		return nil
	}
	return r
}
