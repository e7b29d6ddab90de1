package simhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/vllmsim"
)

// Anthropic's Messages API as vLLM serves it (vllm-project/vllm
// vllm/entrypoints/anthropic/serving.py @0001948b, protocol.py @00589e56,
// api_router.py @01540b75): the request is converted to a chat request
// (prompt.ParseAPI, the sidecar's and the simulator's one rule for vLLM's
// _convert_anthropic_to_openai_request) and served by the chat path; the
// chat answer is converted back. Where vLLM differs from Anthropic's own
// API the simulator follows vLLM:
//   - the id is the chat completion's ("chatcmpl-..."), not "msg_...";
//   - the answer is dumped without nulls (no "stop_sequence": null), and
//     a stream's message_start omits the message's type and role
//     (model_dump_json(exclude_unset=True));
//   - a stream sends no ping, and ends with message_stop (no [DONE]);
//   - errors the route produces are {"type":"error","error":{"type",
//     "message"}} with the OpenAI error's type ("BadRequestError",
//     "NotFoundError") and status; a body that fails validation (max_tokens
//     missing, a wrong type) gets the app-wide validation error, OpenAI's
//     shape, as from any vLLM route;
//   - there is no cache_salt (vLLM's AnthropicMessagesRequest has none).
// One addition: usage carries cache_read_input_tokens, the engine's
// prefix-cache hit (vLLM's AnthropicUsage has the field but leaves it
// unset), as every simulator answer reports its cached tokens; input_tokens
// stays vLLM's, the whole prompt.

// messagesRequest holds the members of vLLM's AnthropicMessagesRequest the
// simulator validates itself; the conversion reads the rest.
type messagesRequest struct {
	Model     *string           `json:"model"`
	Messages  []json.RawMessage `json:"messages"`
	MaxTokens *int              `json:"max_tokens"`
	Stream    *bool             `json:"stream"`
}

// decodeMessages validates a Messages body as vLLM's pydantic model does:
// model, messages and max_tokens are required, model non-empty, max_tokens
// positive (its validators' messages).
func decodeMessages(body []byte) (messagesRequest, *apiError) {
	var r messagesRequest
	if aerr := decodeJSON(body, &r); aerr != nil {
		return r, aerr
	}
	switch {
	case r.Model == nil:
		return r, missingField(body, "model")
	case r.Messages == nil:
		return r, missingField(body, "messages")
	case r.MaxTokens == nil:
		return r, missingField(body, "max_tokens")
	case *r.Model == "":
		return r, valueError("model", "Model is required", "")
	case *r.MaxTokens <= 0:
		return r, valueError("max_tokens", "max_tokens must be positive", json.Number(strconv.Itoa(*r.MaxTokens)))
	}
	return r, nil
}

// converted is a Messages or Responses request rendered through the chat
// path.
type converted struct {
	ids []uint32
	mm  []vllmsim.MMPlacement
}

// convertedTokens renders p, a request prompt.ParseAPI converted to chat,
// as the chat path renders the chat body prompt.ChatBody makes of it, so
// that /tokenize on the converted messages gives the same ids.
func (s *Server) convertedTokens(c *gin.Context, p prompt.Prompt, fail func(*gin.Context, *apiError)) (converted, bool) {
	r, msgs, aerr := decodeChat(prompt.ChatBody(p, 0))
	if aerr != nil {
		fail(c, aerr)
		return converted{}, false
	}
	var out converted
	var ok bool
	out.ids, out.mm, ok = s.chatTokens(c, msgs, r.options(), fail)
	return out, ok
}

// parseConverted converts body with prompt.ParseAPI. A body it refuses is
// a 400 in the validation error's shape. ErrNoPrompt is no error here: it
// says routing cannot predict the tokens (a Responses continuation, whose
// history only this process has), and the messages converted so far are
// what the caller renders.
func parseConverted(c *gin.Context, body []byte, api prompt.API, fail func(*gin.Context, *apiError)) (prompt.Prompt, bool) {
	p, err := prompt.ParseAPI(body, api)
	switch {
	case errors.Is(err, prompt.ErrBadJSON):
		writeError(c, &apiError{Status: 400, Type: "Bad Request", Message: err.Error()})
		return p, false
	case err != nil && !errors.Is(err, prompt.ErrNoPrompt):
		fail(c, internal(err.Error()))
		return p, false
	}
	return p, true
}

// messagesPrompt validates, converts and renders a Messages body. The
// model is resolved before the conversion renders, as vLLM's chat path
// checks it first.
func (s *Server) messagesPrompt(c *gin.Context, body []byte, fail func(*gin.Context, *apiError)) (messagesCall, bool) {
	r, aerr := decodeMessages(body)
	if aerr != nil {
		writeError(c, aerr)
		return messagesCall{}, false
	}
	m := messagesCall{model: *r.Model, maxTokens: *r.MaxTokens, stream: r.Stream != nil && *r.Stream}
	if _, _, aerr = s.resolveModel(m.model); aerr != nil {
		fail(c, aerr)
		return m, false
	}
	p, ok := parseConverted(c, body, prompt.APIMessages, fail)
	if !ok {
		return m, false
	}
	if len(bytes.TrimSpace(p.Messages)) == 0 {
		fail(c, badRequest("messages: nothing to render"))
		return m, false
	}
	p.CacheSalt = "" // vLLM's Messages has no cache_salt
	cv, ok := s.convertedTokens(c, p, fail)
	m.ids, m.mm = cv.ids, cv.mm
	return m, ok
}

// messagesCall is a Messages request ready to run.
type messagesCall struct {
	model     string
	maxTokens int
	stream    bool
	ids       []uint32
	mm        []vllmsim.MMPlacement
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicUsage struct {
	InputTokens          int  `json:"input_tokens"`
	OutputTokens         int  `json:"output_tokens"`
	CacheReadInputTokens *int `json:"cache_read_input_tokens,omitempty"`
}

func anthropicUsageOf(o vllmsim.Output) anthropicUsage {
	return anthropicUsage{InputTokens: o.Usage.PromptTokens, OutputTokens: o.Usage.CompletionTokens, CacheReadInputTokens: ptr(o.Usage.CachedTokens)}
}

// anthropicResponse is vLLM's AnthropicMessagesResponse dumped with
// exclude_none.
type anthropicResponse struct {
	ID         string           `json:"id"`
	Type       string           `json:"type"`
	Role       string           `json:"role"`
	Content    []anthropicBlock `json:"content"`
	Model      string           `json:"model"`
	StopReason *string          `json:"stop_reason,omitempty"`
	Usage      anthropicUsage   `json:"usage"`
	Sim        *simTiming       `json:"sim,omitempty"`
}

// stopReason is vLLM's stop_reason_map; other finish reasons have none.
func stopReason(finish string) *string {
	switch finish {
	case "stop":
		return ptr("end_turn")
	case "length":
		return ptr("max_tokens")
	case "tool_calls":
		return ptr("tool_use")
	}
	return nil
}

// messageStart is the message of message_start: the members vLLM sets
// (model_dump_json(exclude_unset=True) drops type and role).
type messageStart struct {
	ID           string           `json:"id"`
	Content      []anthropicBlock `json:"content"`
	Model        string           `json:"model"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
}

// anthropicEvent is vLLM's AnthropicStreamEvent, members in its order,
// unset ones left out.
type anthropicEvent struct {
	Type         string              `json:"type"`
	Message      *messageStart       `json:"message,omitempty"`
	Delta        *anthropicDelta     `json:"delta,omitempty"`
	ContentBlock *anthropicBlock     `json:"content_block,omitempty"`
	Index        *int                `json:"index,omitempty"`
	Error        *anthropicErrorInfo `json:"error,omitempty"`
	Usage        *anthropicUsage     `json:"usage,omitempty"`
	Sim          *simTiming          `json:"sim,omitempty"`
}

// anthropicDelta is a text delta or, on message_delta, the stop reason
// (set even when null).
type anthropicDelta struct {
	Type       string  `json:"type,omitempty"`
	Text       string  `json:"text,omitempty"`
	StopReason *string `json:"stop_reason"`
}

// MarshalJSON leaves stop_reason out of a text delta.
func (d anthropicDelta) MarshalJSON() ([]byte, error) {
	if d.Type != "" {
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{d.Type, d.Text})
	}
	return json.Marshal(struct {
		StopReason *string `json:"stop_reason"`
	}{d.StopReason})
}

func (s *Server) messages(c *gin.Context) {
	a, ok := s.receive(c, writeAnthropicError)
	if !ok {
		return
	}
	m, ok := s.messagesPrompt(c, a.body, writeAnthropicError)
	if !ok {
		return
	}
	g, aerr := s.newGen(c, m.model, a)
	if aerr != nil {
		writeAnthropicError(c, aerr)
		return
	}
	g.prompt, g.mm, g.maxTokens, g.stream = m.ids, m.mm, m.maxTokens, m.stream
	id := s.newID("chatcmpl")
	ctx := c.Request.Context()
	streams, aerr := s.submit(ctx, &g, id)
	if aerr != nil {
		writeAnthropicError(c, aerr)
		return
	}
	defer release(streams)
	texts := s.texts(&g)
	if g.stream {
		s.streamMessages(c, &g, id, streams[0], &texts[0])
		return
	}
	res, aerr := s.collect(ctx, streams, texts)
	if aerr != nil {
		writeAnthropicError(c, aerr)
		return
	}
	x := res[0]
	resp := anthropicResponse{ID: id, Type: "message", Role: "assistant", Content: []anthropicBlock{}, Model: g.model,
		StopReason: stopReason(x.final.FinishReason), Usage: anthropicUsageOf(x.final), Sim: simOf(x.final)}
	if len(x.text) > 0 {
		resp.Content = append(resp.Content, anthropicBlock{Type: "text", Text: string(x.text)})
	}
	s.served(c, &g)
	c.JSON(http.StatusOK, resp)
}

// streamMessages writes vLLM's Anthropic stream (message_stream_converter):
// message_start; then, from the first text, content_block_start and one
// content_block_delta per engine step with text; content_block_stop;
// message_delta with the stop reason and usage; message_stop. Each is
// `event: <type>` and `data: <json>`.
func (s *Server) streamMessages(c *gin.Context, g *genRequest, id string, st *vllmsim.Stream, t *textSource) {
	ctx := c.Request.Context()
	w := s.newSSE(c, g)
	send := func(e anthropicEvent) bool {
		b, err := json.Marshal(e)
		return err == nil && w.send(e.Type, b)
	}
	zero := 0
	// message_start goes with the engine's first output: vLLM's converter
	// writes it for the chat stream's first chunk, which comes then.
	start := anthropicEvent{Type: "message_start", Message: &messageStart{ID: id, Content: []anthropicBlock{}, Model: g.model,
		Usage: anthropicUsage{InputTokens: len(g.prompt)}}}
	opened := false
	r := newOutputs(ctx, []*vllmsim.Stream{st})
	started := false
	var final vllmsim.Output
	for {
		x, live := r.next(ctx)
		if !live {
			return
		}
		if x.ok && !opened {
			if len(x.o.Tokens) == 0 && !x.o.Done {
				continue
			}
			if !send(start) {
				return
			}
			opened = true
		}
		if !x.ok {
			// vLLM's converter answers a chunk it cannot read so.
			send(anthropicEvent{Type: "error", Error: &anthropicErrorInfo{Type: "internal_error", Message: "engine closed the stream"}})
			return
		}
		if _, text := t.next(x.o.Tokens); text != "" {
			if !started && !send(anthropicEvent{Type: "content_block_start", ContentBlock: &anthropicBlock{Type: "text"}, Index: &zero}) {
				return
			}
			started = true
			if !send(anthropicEvent{Type: "content_block_delta", Delta: &anthropicDelta{Type: "text_delta", Text: text}, Index: &zero}) {
				return
			}
		}
		if x.o.Done {
			final = x.o
			s.met.finished(final)
			break
		}
	}
	if started && !send(anthropicEvent{Type: "content_block_stop", Index: &zero}) {
		return
	}
	u := anthropicUsageOf(final)
	if !send(anthropicEvent{Type: "message_delta", Delta: &anthropicDelta{StopReason: stopReason(final.FinishReason)}, Usage: &u, Sim: simOf(final)}) {
		return
	}
	send(anthropicEvent{Type: "message_stop"})
}
