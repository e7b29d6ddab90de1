package loadgen

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// The agent APIs: how a Call becomes an Anthropic Messages or an OpenAI
// Responses request, and how their answers and SSE events are read. The
// shapes are those vLLM serves (vllm/entrypoints/anthropic/protocol.py and
// serving.py; vllm/entrypoints/openai/responses/protocol.py, serving.py,
// simple_streaming_events.py and utils.py, read at the revisions the
// search corpus holds, 2026).

// Tool is a function an agent offers the model.
type Tool struct {
	Name        string
	Description string
	// Parameters is the JSON Schema of the arguments, sent as it is
	// (Messages' input_schema, Responses' parameters): its key order is
	// part of the rendered prompt.
	Parameters json.RawMessage
}

// Image is one image of a user message.
type Image struct {
	// URL is a data URL ("data:image/png;base64,...") or a URL.
	URL string
	// UUID is the caller's identity for the image, vLLM's
	// multi_modal_uuids: its blocks are then hashed by it instead of the
	// content. vLLM reads it from any content part (chat_utils
	// _parse_chat_message_content_mm_part), so it goes on a Responses
	// input_image part; Anthropic's image block has no such member, so a
	// Messages call sends the image alone. "" for none.
	UUID string
}

// ToolCall is one call of an assistant message.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the JSON object of the arguments.
	Arguments json.RawMessage
}

func (c ToolCall) arguments() json.RawMessage {
	if len(c.Arguments) == 0 {
		return json.RawMessage(`{}`)
	}
	return c.Arguments
}

// mediaType is a data URL's media type ("image/png"), "" for a URL.
func mediaType(url string) (media, data string, ok bool) {
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		return "", "", false
	}
	head, data, ok := strings.Cut(rest, ",")
	if !ok {
		return "", "", false
	}
	media, _, _ = strings.Cut(head, ";")
	return media, data, true
}

type anthropicRequest struct {
	Model     string             `json:"model"`
	MaxTokens int                `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	System    []anthropicBlock   `json:"system,omitempty"`
	Tools     []anthropicTool    `json:"tools,omitempty"`
	Messages  []anthropicMessage `json:"messages"`
}

type anthropicMessage struct {
	Role    string           `json:"role"`
	Content []anthropicBlock `json:"content"`
}

type anthropicBlock struct {
	Type         string           `json:"type"`
	Text         string           `json:"text,omitempty"`
	Source       *anthropicSource `json:"source,omitempty"`
	ID           string           `json:"id,omitempty"`
	Name         string           `json:"name,omitempty"`
	Input        json.RawMessage  `json:"input,omitempty"`
	ToolUseID    string           `json:"tool_use_id,omitempty"`
	Content      *string          `json:"content,omitempty"`
	CacheControl *cacheControl    `json:"cache_control,omitempty"`
}

type anthropicSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// cacheControl is Anthropic's prompt-caching marker, which Claude Code puts
// on its system prompt; vLLM ignores it (caching is automatic there).
type cacheControl struct {
	Type string `json:"type"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

func anthropicImage(im Image) anthropicBlock {
	if media, data, ok := mediaType(im.URL); ok {
		return anthropicBlock{Type: "image", Source: &anthropicSource{Type: "base64", MediaType: media, Data: data}}
	}
	return anthropicBlock{Type: "image", Source: &anthropicSource{Type: "url", URL: im.URL}}
}

// messagesBody is call as an Anthropic Messages request. Tool results and
// the user text after them share one user message, as Claude Code sends
// them (Anthropic's roles alternate).
func messagesBody(call Call, model string, stream bool) ([]byte, error) {
	req := anthropicRequest{Model: model, MaxTokens: call.MaxTokens, Stream: stream}
	if call.Billing != "" {
		req.System = append(req.System, anthropicBlock{Type: "text", Text: call.Billing})
	}
	if call.System != "" {
		req.System = append(req.System, anthropicBlock{Type: "text", Text: call.System, CacheControl: &cacheControl{Type: "ephemeral"}})
	}
	for _, t := range call.Tools {
		req.Tools = append(req.Tools, anthropicTool{Name: t.Name, Description: t.Description, InputSchema: t.Parameters})
	}
	for _, m := range call.Messages {
		var blocks []anthropicBlock
		role := m.Role
		switch m.Role {
		case "system":
			continue
		case "assistant":
			if m.Content != "" {
				blocks = append(blocks, anthropicBlock{Type: "text", Text: m.Content})
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, anthropicBlock{Type: "tool_use", ID: tc.ID, Name: tc.Name, Input: tc.arguments()})
			}
		case "tool":
			role = "user"
			blocks = append(blocks, anthropicBlock{Type: "tool_result", ToolUseID: m.ToolCallID, Content: &m.Content})
		default:
			if m.ImagesFirst {
				for _, im := range m.Images {
					blocks = append(blocks, anthropicImage(im))
				}
			}
			if m.Content != "" {
				blocks = append(blocks, anthropicBlock{Type: "text", Text: m.Content})
			}
			if !m.ImagesFirst {
				for _, im := range m.Images {
					blocks = append(blocks, anthropicImage(im))
				}
			}
		}
		if len(blocks) == 0 {
			continue
		}
		if n := len(req.Messages); n > 0 && role == "user" && req.Messages[n-1].Role == "user" {
			req.Messages[n-1].Content = append(req.Messages[n-1].Content, blocks...)
			continue
		}
		req.Messages = append(req.Messages, anthropicMessage{Role: role, Content: blocks})
	}
	return json.Marshal(req)
}

type responsesRequest struct {
	Model              string          `json:"model"`
	Instructions       string          `json:"instructions,omitempty"`
	Input              []responsesItem `json:"input"`
	Tools              []responsesTool `json:"tools,omitempty"`
	MaxOutputTokens    int             `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store,omitempty"`
	PreviousResponseID string          `json:"previous_response_id,omitempty"`
}

// responsesItem is one input item: a message (content a string or parts),
// a function_call or a function_call_output.
type responsesItem struct {
	Type      string  `json:"type"`
	Role      string  `json:"role,omitempty"`
	Content   any     `json:"content,omitempty"`
	CallID    string  `json:"call_id,omitempty"`
	Name      string  `json:"name,omitempty"`
	Arguments string  `json:"arguments,omitempty"`
	Output    *string `json:"output,omitempty"`
}

type responsesPart struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL string `json:"image_url,omitempty"`
	// Detail is required by the OpenAI SDK's ResponseInputImageParam.
	Detail string `json:"detail,omitempty"`
	UUID   string `json:"uuid,omitempty"`
}

type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

func responsesImage(im Image) responsesPart {
	return responsesPart{Type: "input_image", ImageURL: im.URL, Detail: "auto", UUID: im.UUID}
}

// responsesBody is call as an OpenAI Responses request. An assistant
// message is its text as an output message item and each tool call as a
// function_call item (vLLM merges them back into one chat message,
// construct_chat_messages_with_tool_call); a tool result is a
// function_call_output item.
func responsesBody(call Call, model string, stream bool) ([]byte, error) {
	req := responsesRequest{Model: model, Instructions: call.System, MaxOutputTokens: call.MaxTokens, Stream: stream,
		Store: call.Store, PreviousResponseID: call.PreviousResponseID, Input: []responsesItem{}}
	for _, t := range call.Tools {
		req.Tools = append(req.Tools, responsesTool{Type: "function", Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	for _, m := range call.Messages {
		switch m.Role {
		case "system":
			continue
		case "assistant":
			if m.Content != "" {
				req.Input = append(req.Input, responsesItem{Type: "message", Role: "assistant", Content: m.Content})
			}
			for _, tc := range m.ToolCalls {
				req.Input = append(req.Input, responsesItem{Type: "function_call", CallID: tc.ID, Name: tc.Name, Arguments: string(tc.arguments())})
			}
		case "tool":
			req.Input = append(req.Input, responsesItem{Type: "function_call_output", CallID: m.ToolCallID, Output: &m.Content})
		default:
			var parts []responsesPart
			if m.ImagesFirst {
				for _, im := range m.Images {
					parts = append(parts, responsesImage(im))
				}
			}
			if m.Content != "" {
				parts = append(parts, responsesPart{Type: "input_text", Text: m.Content})
			}
			if !m.ImagesFirst {
				for _, im := range m.Images {
					parts = append(parts, responsesImage(im))
				}
			}
			if len(parts) > 0 {
				req.Input = append(req.Input, responsesItem{Type: "message", Role: m.Role, Content: parts})
			}
		}
	}
	return json.Marshal(req)
}

// agentUsage is the union of the two APIs' usage objects. Messages:
// vLLM reports input_tokens as the whole prompt (the chat answer's
// prompt_tokens, serving.py messages_full_converter); the cached part is
// cache_read_input_tokens where the server reports it. Responses:
// input_tokens and input_tokens_details.cached_tokens (ResponseUsage).
type agentUsage struct {
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	CacheReadTokens    *int `json:"cache_read_input_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

func (r *Reply) takeUsage(u *agentUsage) {
	if u == nil {
		return
	}
	if u.InputTokens != nil {
		r.PromptTokens = *u.InputTokens
	}
	if u.OutputTokens != nil {
		r.OutputTokens = *u.OutputTokens
	}
	if u.CacheReadTokens != nil {
		r.CachedTokens = *u.CacheReadTokens
	}
	if d := u.InputTokensDetails; d != nil && d.CachedTokens != nil {
		r.CachedTokens = *d.CachedTokens
	}
}

// agentError is an error object of either API: Anthropic's
// {"type":"error","error":{"type","message"}}, a Responses error event's
// top-level message, or a failed response's error.
type agentError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// agentObject is a Messages message or a Responses response object.
type agentObject struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Status  string `json:"status"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *agentUsage `json:"usage"`
	Sim   *SimTiming  `json:"sim"`
	Error *agentError `json:"error"`
}

// text is the answer's text: Messages text blocks, or the output_text
// parts of Responses output messages.
func (o agentObject) text() string {
	var b strings.Builder
	for _, c := range o.Content {
		if c.Type == "text" {
			b.WriteString(c.Text)
		}
	}
	for _, item := range o.Output {
		if item.Type != "message" {
			continue
		}
		for _, c := range item.Content {
			if c.Type == "output_text" {
				b.WriteString(c.Text)
			}
		}
	}
	return b.String()
}

func (r *Reply) takeObject(o *agentObject) {
	if o == nil {
		return
	}
	if o.ID != "" {
		r.ResponseID = o.ID
	}
	r.takeUsage(o.Usage)
	if o.Sim != nil {
		r.Sim = o.Sim
	}
}

// failed is a Responses status that is no answer: "incomplete" (the
// output hit max_output_tokens) and "completed" are answers.
func failedStatus(s string) bool { return s == "failed" || s == "cancelled" }

// readAgentBody reads a non-streamed Messages or Responses answer.
func readAgentBody(r io.Reader, kind Kind, rep *Reply) error {
	var o agentObject
	if err := json.NewDecoder(io.LimitReader(r, maxBody)).Decode(&o); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	if o.Type == "error" || (o.Error != nil && o.Error.Message != "") {
		msg := ""
		if o.Error != nil {
			msg = o.Error.Message
		}
		return fmt.Errorf("server error: %s", msg)
	}
	if kind == Responses && failedStatus(o.Status) {
		return fmt.Errorf("response %s", o.Status)
	}
	rep.Text = o.text()
	rep.takeObject(&o)
	return nil
}

// agentEvent is the union of the SSE events read: Anthropic's
// message_start (message), content_block_delta (delta), message_delta
// (usage), message_stop and error; the Responses API's
// response.created / in_progress / completed / incomplete / failed
// (response), response.output_text.delta (delta as a string) and error.
type agentEvent struct {
	Type string `json:"type"`
	// Message is Anthropic's message object, or a Responses error event's
	// message string.
	Message  json.RawMessage `json:"message"`
	Response *agentObject    `json:"response"`
	Delta    json.RawMessage `json:"delta"`
	Usage    *agentUsage     `json:"usage"`
	Sim      *SimTiming      `json:"sim"`
	Error    *agentError     `json:"error"`
}

// message returns the event's message object (nil for none), or its
// message string.
func (e agentEvent) message() (*agentObject, string) {
	m := bytes.TrimSpace(e.Message)
	switch {
	case len(m) == 0:
		return nil, ""
	case m[0] == '{':
		var o agentObject
		if json.Unmarshal(m, &o) == nil {
			return &o, ""
		}
	case m[0] == '"':
		var s string
		if json.Unmarshal(m, &s) == nil {
			return nil, s
		}
	}
	return nil, ""
}

// deltaText is a content_block_delta's text_delta text, or a Responses
// output_text delta.
func (e agentEvent) deltaText() string {
	d := bytes.TrimSpace(e.Delta)
	if len(d) == 0 {
		return ""
	}
	if d[0] == '"' {
		var s string
		if json.Unmarshal(d, &s) == nil {
			return s
		}
		return ""
	}
	var td struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(d, &td) == nil && td.Type == "text_delta" {
		return td.Text
	}
	return ""
}

// readEvents reads a Messages or Responses SSE stream until its last event
// (message_stop; response.completed or response.incomplete). TTFT is the
// first text delta. A stream that ends before its last event is
// ErrTruncated.
func readEvents(r io.Reader, kind Kind, rep *Reply, start time.Time) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 16<<10), maxSSELine)
	var text strings.Builder
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue // event names (the data repeats them), comments, separators
		}
		data = bytes.TrimSpace(data)
		var e agentEvent
		if err := json.Unmarshal(data, &e); err != nil {
			return fmt.Errorf("decode stream event: %w", err)
		}
		if e.Sim != nil {
			rep.Sim = e.Sim
		}
		msgObj, msgText := e.message()
		rep.takeUsage(e.Usage)
		rep.takeObject(msgObj)
		rep.takeObject(e.Response)
		if t := e.deltaText(); t != "" && (e.Type == "content_block_delta" || e.Type == "response.output_text.delta") {
			if text.Len() == 0 {
				rep.WallTTFT = time.Since(start)
			}
			text.WriteString(t)
			rep.Chunks++
		}
		switch e.Type {
		case "error":
			msg := msgText
			if e.Error != nil {
				msg = e.Error.Message
			}
			return fmt.Errorf("server error in stream: %s", msg)
		case "response.failed":
			msg := "response failed"
			if e.Response != nil && e.Response.Error != nil {
				msg += ": " + e.Response.Error.Message
			}
			return fmt.Errorf("server error in stream: %s", msg)
		case "message_stop":
			if kind == Messages {
				rep.Text = text.String()
				return nil
			}
		case "response.completed", "response.incomplete":
			if kind == Responses {
				rep.Text = text.String()
				return nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return ErrTruncated
}
