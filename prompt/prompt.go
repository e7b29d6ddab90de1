// Package prompt reads what routing needs from a request body of each API
// vLLM serves with a prompt: OpenAI completions (batches included) and
// chat, Anthropic Messages and OpenAI Responses. It returns the model and
// the prompt, as token ids or as what vLLM's /tokenize needs to produce
// them: a Messages or Responses body is converted to the chat request
// vLLM itself renders it as (messages.go, responses.go cite the vLLM
// source each rule follows), so the sidecar's front, the simulator and
// the central baselines tokenize the same chat. It is the one place that
// knows each API's shape.
//
// It is pure (bytes in, values out) and fuzzed: every body a client sends
// passes through it. A body is validated in one pass (scan.go); the
// conversions then walk the values that pass handed them and build their
// output from the client's own bytes, so a 160 KB conversation converts
// at a few times the cost of that one pass.
package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Prompt is what routing needs from a request body: which model, and
// either token ids (completions with token prompts) or what /tokenize needs
// to produce them exactly as vLLM will (chat fields passed unchanged, or
// the chat request vLLM converts a Messages or Responses body to).
type Prompt struct {
	Model  string
	Stream bool
	// Chat is true when the prompt is rendered as a chat: chat bodies and
	// converted Messages and Responses bodies.
	Chat bool
	// Tokens is set when the completions prompt is already token ids.
	Tokens []uint32
	// Text is the completions prompt when it is a string.
	Text string
	// Chat rendering inputs, raw as the client sent them (or as converted).
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  *bool
	ContinueFinalMessage *bool
	AddSpecialTokens     *bool
	CacheSalt            string
	// ReturnTokenIDs is vLLM's return_token_ids as the client set it.
	ReturnTokenIDs *bool

	API API
	// Raw is the body as the client sent it (aliases the input): render
	// endpoints get it byte for byte (llm-d-router#2641/#2707: a
	// re-serialised body changes tool key order and so the tokens).
	Raw []byte
	// MaxTokens is max_tokens / max_completion_tokens / max_output_tokens
	// as sent (0: absent).
	MaxTokens int
	// Batch holds a completions request's prompts when it has more than
	// one (Tokens and Text are then unset): each entry is token ids, or nil
	// with the text in Texts at the same index. One engine request per
	// prompt.
	Batch [][]uint32
	Texts []string
	// Images are the images of the (converted) chat messages, in order.
	Images []Image
	// PreviousResponseID is a Responses request's previous_response_id
	// ("" none).
	PreviousResponseID string
	// Store is a Responses request's "store" (nil: absent; vLLM's default
	// is true).
	Store *bool
	// Background is a Responses request's "background".
	Background bool
}

// Image is one image part of a chat prompt.
type Image struct {
	// Message is the index of the converted chat message holding it.
	Message int
	// UUID is the caller's identity for it (vLLM's multi_modal_uuids: the
	// "uuid" member of a chat image_url part), "" when none. vLLM then
	// uses it as the image's identifier in block hashes instead of a
	// content hash.
	UUID string
}

// API is the request shape a body speaks.
type API uint8

const (
	APICompletions API = iota // POST /v1/completions
	APIChat                   // POST /v1/chat/completions
	APIMessages               // POST /v1/messages (Anthropic)
	APIResponses              // POST /v1/responses (OpenAI Responses)
)

func (a API) String() string {
	switch a {
	case APICompletions:
		return "completions"
	case APIChat:
		return "chat"
	case APIMessages:
		return "messages"
	case APIResponses:
		return "responses"
	}
	return fmt.Sprintf("API(%d)", uint8(a))
}

// ErrBadJSON is a body that is not a valid request: malformed JSON, not an
// object, a field of the wrong type, or a shape vLLM refuses with 400.
// Clients get a 400 with its message.
var ErrBadJSON = errors.New("invalid request body")

// ErrNoPrompt means the body is valid JSON but routing cannot predict its
// blocks (no prompt or messages, a stored conversation): it is served
// without prefix prediction, never refused here (docs/design.md D6).
var ErrNoPrompt = errors.New("no single prompt to route on")

// Parse reads the routing-relevant fields of an OpenAI completions or chat
// request body. It returns ErrBadJSON (wrapped) for malformed JSON or a
// known field of the wrong type, and ErrNoPrompt when the body is fine but
// carries no single prompt; in that case the returned Prompt still has
// Model and Stream. Names match exactly, as vLLM's pydantic models do, and
// the last of duplicate names wins, as in Python's json. It is ParseAPI
// for chat or completions without the fields added since (a batch is
// ErrNoPrompt, whatever its entries).
func Parse(body []byte, chat bool) (Prompt, error) {
	var p Prompt
	var err error
	if chat {
		p, err = parseChat(body, false)
	} else {
		p, err = parseCompletions(body, false)
	}
	if errors.Is(err, ErrBadJSON) {
		return Prompt{}, err
	}
	return Prompt{Model: p.Model, Stream: p.Stream, Chat: p.Chat, Tokens: p.Tokens, Text: p.Text,
		Messages: p.Messages, Tools: p.Tools, ChatTemplateKwargs: p.ChatTemplateKwargs,
		AddGenerationPrompt: p.AddGenerationPrompt, ContinueFinalMessage: p.ContinueFinalMessage,
		AddSpecialTokens: p.AddSpecialTokens, CacheSalt: p.CacheSalt, ReturnTokenIDs: p.ReturnTokenIDs}, err
}

// ParseAPI reads a request body of the given API. Chat and completions are
// what Parse returns (plus Batch, Images, MaxTokens). Messages and
// Responses bodies are converted to the chat request vLLM renders them as,
// with vLLM's own conversion: the result has Chat set, Messages the
// converted chat "messages" array and Tools the converted "tools" array
// (nil when none), so that /tokenize (chat variant) on those fields gives
// the token ids vLLM computes. Errors: ErrBadJSON (wrapped, with a message
// a client can act on) for a malformed body, a field of the wrong type or
// a shape vLLM refuses with 400; ErrNoPrompt when the body is fine but
// routing cannot predict its tokens (Model, Stream, API and
// PreviousResponseID are still set).
func ParseAPI(body []byte, api API) (Prompt, error) {
	var p Prompt
	var err error
	switch api {
	case APICompletions:
		p, err = parseCompletions(body, true)
	case APIChat:
		p, err = parseChat(body, true)
	case APIMessages:
		p, err = parseMessages(body)
	case APIResponses:
		p, err = parseResponses(body)
	default:
		return Prompt{}, fmt.Errorf("%w: unknown API %d", ErrBadJSON, api)
	}
	if errors.Is(err, ErrBadJSON) {
		return Prompt{}, err
	}
	p.API, p.Raw = api, body
	return p, err
}

// badf is an ErrBadJSON with what is wrong, for the client.
func badf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadJSON, fmt.Sprintf(format, args...))
}

// wireFields are the raw values of the top-level members any API's
// conversion reads; they alias the body.
type wireFields struct {
	model, stream, messages, prompt, tools, chatTemplateKwargs  []byte
	addGenerationPrompt, continueFinalMessage, addSpecialTokens []byte
	cacheSalt, returnTokenIDs                                   []byte
	maxTokens, maxCompletionTokens, maxOutputTokens             []byte
	system, input, instructions, previousResponseID             []byte
	store, background, toolChoice, outputConfig, reasoning      []byte
	previousResponse, previousInputMessages                     []byte
	// promptIDs are prompt's ids when takeIDs parsed them in the scan;
	// taken holds them from takeIDs until set sees the member.
	promptIDs, taken []uint32
	// msgs, sysBlocks and items are what a conversion's walk made of
	// messages, system (blocks) and input in the scan (takeMessages,
	// takeInput); pending holds a reading until set sees the member, so
	// the last of duplicates wins and one whose name is escaped (not
	// offered to take) drops an earlier one's.
	msgs      reading[takenMsgs]
	sysBlocks reading[[]aBlock]
	items     reading[converted]
	pending   struct {
		msgs      reading[takenMsgs]
		sysBlocks reading[[]aBlock]
		items     reading[converted]
	}
	body []byte
}

// reading is a value a conversion read in the scan; ok is false when it
// did not (the conversion then walks the member after the scan).
type reading[T any] struct {
	v  T
	ok bool
}

// scan validates body and fills f from its top-level members, offering
// each member's value to take first when it is not nil
// (scanObjectTaking).
func (f *wireFields) scan(body []byte, take func(key []byte, v int) int) error {
	f.body = body
	if err := scanObjectTaking(body, f.set, take); err != nil {
		return fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	return nil
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
		f.msgs, f.pending.msgs = f.pending.msgs, reading[takenMsgs]{}
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
	case "max_tokens":
		f.maxTokens = val
	case "max_completion_tokens":
		f.maxCompletionTokens = val
	case "max_output_tokens":
		f.maxOutputTokens = val
	case "system":
		f.system = val
		f.sysBlocks, f.pending.sysBlocks = f.pending.sysBlocks, reading[[]aBlock]{}
	case "input":
		f.input = val
		f.items, f.pending.items = f.pending.items, reading[converted]{}
	case "instructions":
		f.instructions = val
	case "previous_response_id":
		f.previousResponseID = val
	case "store":
		f.store = val
	case "background":
		f.background = val
	case "tool_choice":
		f.toolChoice = val
	case "output_config":
		f.outputConfig = val
	case "reasoning":
		f.reasoning = val
	case "previous_response":
		f.previousResponse = val
	case "previous_input_messages":
		f.previousInputMessages = val
	}
	return nil
}

// common reads the members every API shares into p.
func (f *wireFields) common(p *Prompt) error {
	var err error
	p.Model, err = jsonString(f.model, "model", err)
	p.Stream, err = jsonBool(f.stream, "stream", err)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	return nil
}

// chatOptions reads the chat rendering members (chat and Responses
// bodies carry them).
func (f *wireFields) chatOptions(p *Prompt) error {
	p.ChatTemplateKwargs = nullToNil(f.chatTemplateKwargs)
	var err error
	p.CacheSalt, err = jsonString(f.cacheSalt, "cache_salt", err)
	p.AddGenerationPrompt, err = jsonOptBool(f.addGenerationPrompt, "add_generation_prompt", err)
	p.ContinueFinalMessage, err = jsonOptBool(f.continueFinalMessage, "continue_final_message", err)
	p.AddSpecialTokens, err = jsonOptBool(f.addSpecialTokens, "add_special_tokens", err)
	p.ReturnTokenIDs, err = jsonOptBool(f.returnTokenIDs, "return_token_ids", err)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	return nil
}

// jsonCount reads a token count as sent: an integral number, as
// pydantic's lax int takes it (5, 5.0 or "5"); 0 when absent, null or
// anything vLLM would validate itself.
func jsonCount(raw []byte) int {
	if len(raw) > 2 && raw[0] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return 0
	}
	n, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || n != math.Trunc(n) || n < 0 || n > math.MaxInt32 {
		return 0
	}
	return int(n)
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

func nullToNil(r json.RawMessage) json.RawMessage {
	if bytes.Equal(bytes.TrimSpace(r), []byte("null")) {
		return nil
	}
	return r
}
