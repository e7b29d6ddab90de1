package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute/vllmsim"
)

// defaultMaxTokens applies when a request gives no max_tokens. vLLM's own
// default is "the rest of the context", which would make every simulated
// answer thousands of tokens long; OpenAI's completions default of 16 keeps
// runs short and is what most benchmarks set explicitly anyway.
const defaultMaxTokens = 16

// apiError is an error with its OpenAI/vLLM status and type
// (`{"error":{"message","type","param","code"}}`).
type apiError struct {
	Status  int
	Type    string
	Message string
	Param   string // the field at fault, when known ("body.messages")
}

func (e *apiError) Error() string { return e.Message }

func badRequest(format string, args ...any) *apiError {
	return &apiError{Status: 400, Type: "BadRequestError", Message: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) *apiError {
	return &apiError{Status: 404, Type: "NotFoundError", Message: fmt.Sprintf(format, args...)}
}

type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Error: errorInfo{Message: e.Message, Type: e.Type, Code: e.Status}}
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	return b
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage accepts content as a string, null, or an array of parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type chatRequest struct {
	Model                string          `json:"model"`
	Messages             []chatMessage   `json:"messages"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	N                    *int            `json:"n"`
	CacheSalt            string          `json:"cache_salt"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Tools                json.RawMessage `json:"tools"`
	ReturnTokenIDs       bool            `json:"return_token_ids"`
}

type completionRequest struct {
	Model          string          `json:"model"`
	Prompt         json.RawMessage `json:"prompt"`
	Stream         bool            `json:"stream"`
	StreamOptions  *streamOptions  `json:"stream_options"`
	MaxTokens      *int            `json:"max_tokens"`
	N              *int            `json:"n"`
	CacheSalt      string          `json:"cache_salt"`
	ReturnTokenIDs bool            `json:"return_token_ids"`
}

// decodeJSON is strict about syntax and lenient about unknown fields, as
// vLLM's pydantic models are for the extra fields clients send.
func decodeJSON(body []byte, v any) *apiError {
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '{' {
		return badRequest("invalid JSON body: expected an object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
			return typeError(body, te)
		}
		return badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return badRequest("invalid JSON body: trailing data")
	}
	return nil
}

// decodeChat parses a chat request and renders its messages to the values
// the tokenizer takes.
func decodeChat(body []byte) (chatRequest, []vllmsim.Message, *apiError) {
	var r chatRequest
	if err := decodeJSON(body, &r); err != nil {
		return r, nil, err
	}
	if len(r.Messages) == 0 {
		return r, nil, badRequest("messages: field required and must not be empty")
	}
	if r.N != nil && *r.N != 1 {
		return r, nil, badRequest("n=%d is not supported by the simulator; use n=1", *r.N)
	}
	if r.AddGenerationPrompt != nil && *r.AddGenerationPrompt && r.ContinueFinalMessage {
		return r, nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	msgs, err := flattenMessages(r.Messages)
	if err != nil {
		return r, nil, err
	}
	return r, msgs, nil
}

func (r chatRequest) options() vllmsim.ChatOptions {
	o := vllmsim.ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: r.ContinueFinalMessage}
	if r.AddGenerationPrompt != nil {
		o.AddGenerationPrompt = *r.AddGenerationPrompt
	}
	if len(r.Tools) > 0 && string(r.Tools) != "null" {
		o.Tools = r.Tools
	}
	return o
}

// maxTokens prefers max_completion_tokens (OpenAI's newer name) as vLLM does.
func (r chatRequest) maxTokens() (int, *apiError) {
	if r.MaxCompletionTokens != nil {
		return checkMaxTokens(*r.MaxCompletionTokens)
	}
	if r.MaxTokens != nil {
		return checkMaxTokens(*r.MaxTokens)
	}
	return defaultMaxTokens, nil
}

func (r completionRequest) maxTokens() (int, *apiError) {
	if r.MaxTokens != nil {
		return checkMaxTokens(*r.MaxTokens)
	}
	return defaultMaxTokens, nil
}

func checkMaxTokens(n int) (int, *apiError) {
	if n < 1 {
		return 0, badRequest("max_tokens must be at least 1, got %d.", n)
	}
	return n, nil
}

// flattenMessages turns string or array-of-parts content into text; text
// parts are joined with "\n" as vLLM does for string-content templates.
func flattenMessages(in []chatMessage) ([]vllmsim.Message, *apiError) {
	out := make([]vllmsim.Message, 0, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role: field required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		out = append(out, vllmsim.Message{Role: m.Role, Content: text})
	}
	return out, nil
}

func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if raw[0] == '"' {
		// The request was decoded, so raw is a valid JSON string: without
		// escapes and in valid UTF-8 (which decoding would not replace),
		// its text is what is between the quotes. Decoding it again was
		// two more passes over a 150 KB prompt, ~0.7 ms of the engine's CPU.
		if len(raw) >= 2 {
			if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
				return string(in), nil
			}
		}
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or an array of content parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported", p.Type)
		}
		if p.Text == nil {
			return "", errors.New("text part without text")
		}
		texts = append(texts, *p.Text)
	}
	return strings.Join(texts, "\n"), nil
}

// completionPrompt is a completions prompt: either text or token ids.
type completionPrompt struct {
	Text   string
	Tokens []uint32
	IsText bool
}

// parsePrompt accepts the four forms of `prompt`. A list holding more than
// one prompt is rejected: the simulator serves one choice per request.
func parsePrompt(raw json.RawMessage) (completionPrompt, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return completionPrompt{}, badRequest("prompt: field required")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return completionPrompt{}, badRequest("prompt: %v", err)
		}
		return completionPrompt{Text: s, IsText: true}, nil
	}
	if raw[0] != '[' {
		return completionPrompt{}, badRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return completionPrompt{}, badRequest("prompt: %v", err)
	}
	if len(items) == 0 {
		return completionPrompt{}, badRequest("prompt must not be empty")
	}
	first := bytes.TrimSpace(items[0])
	if len(first) == 0 || (first[0] != '"' && first[0] != '[') {
		ids, err := tokenIDs(items)
		if err != nil {
			return completionPrompt{}, err
		}
		return completionPrompt{Tokens: ids}, nil
	}
	if len(items) > 1 {
		return completionPrompt{}, badRequest("the simulator serves one prompt per request; got %d", len(items))
	}
	if first[0] == '"' {
		return parsePrompt(first)
	}
	var inner []json.RawMessage
	if err := json.Unmarshal(first, &inner); err != nil {
		return completionPrompt{}, badRequest("prompt[0]: %v", err)
	}
	if len(inner) == 0 {
		return completionPrompt{}, badRequest("prompt must not be empty")
	}
	ids, err := tokenIDs(inner)
	if err != nil {
		return completionPrompt{}, err
	}
	return completionPrompt{Tokens: ids}, nil
}

func tokenIDs(items []json.RawMessage) ([]uint32, *apiError) {
	ids := make([]uint32, len(items))
	for i, it := range items {
		var n json.Number
		if err := json.Unmarshal(it, &n); err != nil {
			return nil, badRequest("prompt[%d]: token id must be an integer", i)
		}
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, badRequest("prompt[%d]: token id %s out of range", i, it)
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

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

// Response shapes (OpenAI / vLLM).
//
// With return_token_ids, vLLM adds the prompt's ids (after the chat
// template) and the generated ids (vllm-project/vllm
// vllm/entrypoints/openai/chat_completion/protocol.py and
// completion/protocol.py @002032ee2b18; serving.py beside them): chat puts
// prompt_token_ids at the top level, in a stream only on the role chunk,
// and token_ids on each choice, the chunk's delta when streaming (the role
// chunk has none); completions put both on the choice, the prompt's on the
// first chunk only. The fields are omitzero so that requests without the
// flag answer exactly as before, while an empty delta still shows as [].

type usageInfo struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func usageOf(u vllmsim.Usage) *usageInfo {
	return &usageInfo{
		PromptTokens:        u.PromptTokens,
		CompletionTokens:    u.CompletionTokens,
		TotalTokens:         u.PromptTokens + u.CompletionTokens,
		PromptTokensDetails: &promptDetails{CachedTokens: u.CachedTokens},
	}
}

// simTiming is the simulator's extra top-level field: simulated seconds
// since engine start, so a benchmark can read TTFT without wall-clock noise.
type simTiming struct {
	ArrivalS    float64 `json:"arrival_s"`
	FirstTokenS float64 `json:"first_token_s"`
	FinishS     float64 `json:"finish_s"`
}

func simOf(o vllmsim.Output) *simTiming {
	return &simTiming{ArrivalS: o.ArrivalSim, FirstTokenS: o.FirstTokenSim, FinishS: o.NowSim}
}

type assistantMessage struct {
	Role      string `json:"role"`
	Content   string `json:"content"`
	ToolCalls []any  `json:"tool_calls"`
}

type chatChoice struct {
	Index        int              `json:"index"`
	Message      assistantMessage `json:"message"`
	Logprobs     any              `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
	StopReason   any              `json:"stop_reason"`
	TokenIDs     []uint32         `json:"token_ids,omitzero"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usageInfo   `json:"usage"`
	// PromptTokenIDs follows usage as in vLLM (prompt_logprobs, never set
	// here, sits between them).
	PromptTokenIDs []uint32   `json:"prompt_token_ids,omitzero"`
	Sim            *simTiming `json:"sim,omitempty"`
}

type chatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chatChunkChoice struct {
	Index        int       `json:"index"`
	Delta        chatDelta `json:"delta"`
	Logprobs     any       `json:"logprobs"`
	FinishReason *string   `json:"finish_reason"`
	TokenIDs     []uint32  `json:"token_ids,omitzero"`
}

type chatChunk struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Created        int64             `json:"created"`
	Model          string            `json:"model"`
	Choices        []chatChunkChoice `json:"choices"`
	Usage          *usageInfo        `json:"usage,omitempty"`
	PromptTokenIDs []uint32          `json:"prompt_token_ids,omitzero"`
	Sim            *simTiming        `json:"sim,omitempty"`
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

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usageInfo         `json:"usage,omitempty"`
	Sim     *simTiming         `json:"sim,omitempty"`
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

// cachedBlockJSON is /sim/cache's view of one block; hashes are unsigned
// decimal JSON numbers (exact for Go and Python clients).
type cachedBlockJSON struct {
	Hash   uint64   `json:"hash"`
	Parent *uint64  `json:"parent"`
	Tokens []uint32 `json:"tokens"`
	LoRA   string   `json:"lora"`
	Copies int      `json:"copies"`
}
