// Package prompt reads what routing needs from an OpenAI completions or
// chat request body: the model and the prompt, as token ids or as what
// vLLM's /tokenize needs to produce them. It is pure (bytes in, values
// out) and fuzzed: every body a client sends passes through it.
package prompt

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
	// ReturnTokenIDs is vLLM's return_token_ids as the client set it.
	ReturnTokenIDs *bool
}

// ErrBadJSON is a body that is not a JSON object; clients get a 400.
var ErrBadJSON = errors.New("request body is not a valid JSON object")

// ErrNoPrompt means the body is valid JSON but routing cannot predict its
// blocks (no prompt or messages, several prompts): it is served without
// prefix prediction, never refused here (docs/design.md D6).
var ErrNoPrompt = errors.New("no single prompt to route on")

// Parse reads the routing-relevant fields of an OpenAI request body.
// It returns ErrBadJSON (wrapped) for malformed JSON or a known field of
// the wrong type, and ErrNoPrompt when the body is fine but carries no
// single prompt; in that case the returned Prompt still has Model and
// Stream. Names match exactly, as vLLM's pydantic models do, and the last
// of duplicate names wins, as in Python's json.
func Parse(body []byte, chat bool) (Prompt, error) {
	var f wireFields
	var take func(key, rest []byte) int
	if !chat {
		take = f.takeIDs
	}
	if err := scanObjectTaking(body, f.set, take); err != nil {
		return Prompt{}, fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	p := Prompt{Chat: chat, Tools: nullToNil(f.tools), ChatTemplateKwargs: nullToNil(f.chatTemplateKwargs)}
	var err error
	p.Model, err = jsonString(f.model, "model", err)
	p.Stream, err = jsonBool(f.stream, "stream", err)
	p.CacheSalt, err = jsonString(f.cacheSalt, "cache_salt", err)
	p.AddGenerationPrompt, err = jsonOptBool(f.addGenerationPrompt, "add_generation_prompt", err)
	p.ContinueFinalMessage, err = jsonOptBool(f.continueFinalMessage, "continue_final_message", err)
	p.AddSpecialTokens, err = jsonOptBool(f.addSpecialTokens, "add_special_tokens", err)
	p.ReturnTokenIDs, err = jsonOptBool(f.returnTokenIDs, "return_token_ids", err)
	if err != nil {
		return Prompt{}, fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	if chat {
		p.Messages = nullToNil(f.messages)
		if len(p.Messages) == 0 || p.Messages[0] != '[' {
			return p, ErrNoPrompt
		}
		return p, nil
	}
	if f.promptIDs != nil {
		p.Tokens = f.promptIDs
		return p, nil
	}
	return p, parseCompletionPrompt(nullToNil(f.prompt), &p)
}

// wireFields are the raw values of the members routing reads; they alias
// the body.
type wireFields struct {
	model, stream, messages, prompt, tools, chatTemplateKwargs  []byte
	addGenerationPrompt, continueFinalMessage, addSpecialTokens []byte
	cacheSalt, returnTokenIDs                                   []byte
	// promptIDs are prompt's ids when takeIDs parsed them in the scan;
	// taken holds them from takeIDs until set sees the member.
	promptIDs, taken []uint32
}

// takeIDs parses a completion prompt of token ids in the scan's one pass
// (tokenids.ParsePrefix accepts only valid JSON).
func (f *wireFields) takeIDs(key, rest []byte) int {
	if string(key) != "prompt" {
		return 0
	}
	ids, n, ok := tokenids.ParsePrefix(rest)
	if !ok {
		return 0
	}
	f.taken = ids
	return n
}

func (f *wireFields) set(key, val []byte) error {
	if bytes.IndexByte(key, '\\') >= 0 { // an escaped name: rare, decode it
		k, err := jsonString(append(append([]byte{'"'}, key...), '"'), "member name", nil)
		if err != nil {
			return err
		}
		key = []byte(k)
	}
	switch string(key) {
	case "model":
		f.model = val
	case "stream":
		f.stream = val
	case "messages":
		f.messages = val
	case "prompt":
		f.prompt, f.promptIDs, f.taken = val, f.taken, nil
	case "tools":
		f.tools = val
	case "chat_template_kwargs":
		f.chatTemplateKwargs = val
	case "add_generation_prompt":
		f.addGenerationPrompt = val
	case "continue_final_message":
		f.continueFinalMessage = val
	case "add_special_tokens":
		f.addSpecialTokens = val
	case "cache_salt":
		f.cacheSalt = val
	case "return_token_ids":
		f.returnTokenIDs = val
	}
	return nil
}

// jsonString decodes a string member (absent or null: ""). err passes an
// earlier error through, so a run of fields reports the first.
func jsonString(raw []byte, name string, err error) (string, error) {
	if err != nil || raw == nil || string(raw) == "null" {
		return "", err
	}
	if raw[0] != '"' {
		return "", fmt.Errorf("%s: want a string", name)
	}
	plain := true
	for _, c := range raw[1 : len(raw)-1] {
		if c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string // escapes or non-ASCII: encoding/json's decoding
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	return s, nil
}

func jsonBool(raw []byte, name string, err error) (bool, error) {
	b, err := jsonOptBool(raw, name, err)
	return b != nil && *b, err
}

func jsonOptBool(raw []byte, name string, err error) (*bool, error) {
	if err != nil || raw == nil {
		return nil, err
	}
	switch string(raw) {
	case "null":
		return nil, nil
	case "true", "false":
		v := raw[0] == 't'
		return &v, nil
	}
	return nil, fmt.Errorf("%s: want true or false", name)
}

// parseCompletionPrompt accepts the four shapes vLLM does: a string, a list
// with one string, token ids, or a list with one list of token ids.
func parseCompletionPrompt(raw json.RawMessage, p *Prompt) error {
	if len(raw) == 0 {
		return ErrNoPrompt
	}
	if ids, ok := tokenids.Parse(raw); ok {
		p.Tokens = ids
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return ErrNoPrompt
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
	return ErrNoPrompt
}

func nullToNil(r json.RawMessage) json.RawMessage {
	if bytes.Equal(bytes.TrimSpace(r), []byte("null")) {
		return nil
	}
	return r
}
