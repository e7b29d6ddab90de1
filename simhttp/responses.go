package simhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/vllmsim"
)

// OpenAI's Responses API as vLLM serves it without a reasoning or tool
// parser (the simple path; vllm-project/vllm
// vllm/entrypoints/openai/responses/serving.py @0001948b, protocol.py
// @010a69ce, utils.py @01ca842d, simple_streaming_events.py @25af204a,
// api_router.py @f6e93254). The request is converted to chat
// (prompt.ParseAPI: instructions, input items, flat tools) and served by
// the chat path. The store follows vLLM exactly:
//   - it is off unless the process has VLLM_ENABLE_RESPONSES_API_STORE=1
//     (Config.ResponsesStore); off, "store" is silently ignored, a
//     background request with store true is refused (400), and every id
//     is unknown (previous_response_id, GET and cancel answer 404);
//   - on, a response with store (default true) is kept, with the chat
//     messages its request ran; previous_response_id continues it as
//     construct_input_messages does: this request's instructions, the
//     stored messages without their system messages, the stored output as
//     assistant messages, then this input;
//   - background: the response is stored "queued" and answered at once;
//     it runs on, and GET shows it completed; cancel aborts a queued one
//     ("cancelled"); any other status is "Cannot cancel a synchronous
//     response.".
// Unknown ids are vLLM's 404 {"error":{"message":"Response with id '<id>'
// not found.","type":"invalid_request_error","param":"response_id",
// "code":404}}. The simulator's sim member rides on the response object.

// responsesRequest holds the members of vLLM's ResponsesRequest the
// simulator validates or echoes; the conversion reads the input.
type responsesRequest struct {
	Background         *bool           `json:"background"`
	Include            []string        `json:"include"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	PreviousResponse   json.RawMessage `json:"previous_response"`
	Prompt             json.RawMessage `json:"prompt"`
	Reasoning          json.RawMessage `json:"reasoning"`
	ServiceTier        *string         `json:"service_tier"`
	Store              *bool           `json:"store"`
	Stream             bool            `json:"stream"`
	Temperature        *float64        `json:"temperature"`
	Text               json.RawMessage `json:"text"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopLogprobs        *int            `json:"top_logprobs"`
	TopP               *float64        `json:"top_p"`
	Truncation         *string         `json:"truncation"`
	User               *string         `json:"user"`
	RequestID          *string         `json:"request_id"`
	CacheSalt          json.RawMessage `json:"cache_salt"`
}

// given reports whether raw is a value other than null.
func given(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

// modelError is pydantic's error from one of the request model's own
// validators (loc is the body).
func modelError(body []byte, msg string) *apiError {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	ok := dec.Decode(&doc) == nil
	return validationError(pydanticKind{"value_error", "Value error, " + msg}, []any{"body"}, doc, ok)
}

// decodeResponses validates a Responses body as vLLM's ResponsesRequest
// does (its validators' messages).
func decodeResponses(body []byte) (responsesRequest, *apiError) {
	var r responsesRequest
	if aerr := decodeJSON(body, &r); aerr != nil {
		return r, aerr
	}
	in := bytes.TrimSpace(r.Input)
	switch {
	case len(in) == 0:
		return r, missingField(body, "input")
	case in[0] != '"' && in[0] != '[':
		return r, validationError(pydanticKind{"string_type", "Input should be a valid string"}, []any{"body", "input", "str"}, nil, false)
	case r.background() && r.Store != nil && !*r.Store:
		return r, modelError(body, "background can only be used when `store` is true")
	case given(r.Prompt):
		e := modelError(body, "prompt template is not supported")
		e.Param = "prompt"
		return r, e
	case given(r.CacheSalt) && r.salt() == "":
		return r, modelError(body, "Parameter 'cache_salt' must be a non-empty string if provided.")
	case r.PreviousResponseID != nil && *r.PreviousResponseID != "" && given(r.PreviousResponse):
		return r, modelError(body, "Cannot set both 'previous_response_id' and 'previous_response'. Use 'previous_response_id' for store-backed multi-turn, or 'previous_response' (with include=['reasoning.encrypted_content'] and store=false) for stateless multi-turn.")
	}
	return r, nil
}

func (r *responsesRequest) background() bool { return r.Background != nil && *r.Background }

// storeAsked is "store" as sent (vLLM's default true); a stateless
// previous_response turns it off, as vLLM's validator does.
func (r *responsesRequest) storeAsked() bool {
	return (r.Store == nil || *r.Store) && !given(r.PreviousResponse)
}

// salt is cache_salt when it is a non-empty string.
func (r *responsesRequest) salt() string {
	var s string
	if json.Unmarshal(r.CacheSalt, &s) != nil {
		return ""
	}
	return s
}

func (r *responsesRequest) maxTokens() int {
	if r.MaxOutputTokens != nil {
		return *r.MaxOutputTokens
	}
	return defaultMaxTokens
}

// responseID is the request's request_id, vLLM's response id: the
// caller's, or resp_ and a fresh id.
func (s *Server) responseID(r *responsesRequest) string {
	if r.RequestID != nil && *r.RequestID != "" {
		return *r.RequestID
	}
	return fmt.Sprintf("resp_%x%06x", s.boot, s.nextID.Add(1))
}

// responsesPrompt converts and renders a Responses body; prev, when set,
// is the stored response previous_response_id names, whose conversation
// comes first. It returns the chat messages run as well, for the store.
func (s *Server) responsesPrompt(c *gin.Context, body []byte, r *responsesRequest, prev *stored) (responsesRendered, bool) {
	p, ok := parseConverted(c, body, prompt.APIResponses, writeError)
	if !ok {
		return responsesRendered{}, false
	}
	if prev != nil {
		msgs, err := continuation(r.Instructions != nil && *r.Instructions != "", p.Messages, prev)
		if err != nil {
			writeError(c, badRequest("input: %v", err))
			return responsesRendered{}, false
		}
		p.Messages = msgs
	}
	if len(bytes.TrimSpace(p.Messages)) == 0 {
		writeError(c, badRequest("input: nothing to render"))
		return responsesRendered{}, false
	}
	cv, ok := s.convertedTokens(c, p, writeError)
	return responsesRendered{converted: cv, messages: p.Messages}, ok
}

type responsesRendered struct {
	converted
	messages json.RawMessage
}

// continuation is vLLM's construct_input_messages with a previous
// response: the request's instructions (the converted messages' first
// when it has some), the stored messages but their system ones, each
// output text of the stored response as an assistant message, then the
// rest of the converted input.
func continuation(instructions bool, convertedMsgs json.RawMessage, prev *stored) (json.RawMessage, error) {
	var cur, old []json.RawMessage
	if err := json.Unmarshal(convertedMsgs, &cur); err != nil {
		return nil, err
	}
	if len(prev.messages) > 0 {
		if err := json.Unmarshal(prev.messages, &old); err != nil {
			return nil, err
		}
	}
	out := make([]json.RawMessage, 0, len(cur)+len(old)+len(prev.resp.Output))
	if instructions && len(cur) > 0 {
		out, cur = append(out, cur[0]), cur[1:]
	}
	for _, m := range old {
		var role struct {
			Role string `json:"role"`
		}
		if json.Unmarshal(m, &role) == nil && role.Role == "system" {
			continue
		}
		out = append(out, m)
	}
	for _, item := range prev.resp.Output {
		for _, part := range item.Content {
			b, err := json.Marshal(struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			}{"assistant", part.Text})
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
	}
	out = append(out, cur...)
	return json.Marshal(out)
}

// responseObject is vLLM's ResponsesResponse, every member dumped
// (model_dump(), nulls included), plus the simulator's sim.
type responseObject struct {
	ID                 string          `json:"id"`
	CreatedAt          int64           `json:"created_at"`
	IncompleteDetails  *incomplete     `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	Metadata           json.RawMessage `json:"metadata"`
	Model              string          `json:"model"`
	Object             string          `json:"object"`
	Output             []outputMessage `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	Temperature        float64         `json:"temperature"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	Tools              json.RawMessage `json:"tools"`
	TopP               float64         `json:"top_p"`
	Background         bool            `json:"background"`
	MaxOutputTokens    int             `json:"max_output_tokens"`
	MaxToolCalls       *int            `json:"max_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Prompt             json.RawMessage `json:"prompt"`
	Reasoning          json.RawMessage `json:"reasoning"`
	ServiceTier        string          `json:"service_tier"`
	Status             string          `json:"status"`
	Text               json.RawMessage `json:"text"`
	TopLogprobs        *int            `json:"top_logprobs"`
	Truncation         string          `json:"truncation"`
	Usage              *responseUsage  `json:"usage"`
	User               *string         `json:"user"`
	InputMessages      json.RawMessage `json:"input_messages"`
	OutputMessages     json.RawMessage `json:"output_messages"`
	Sim                *simTiming      `json:"sim,omitempty"`
}

type incomplete struct {
	Reason string `json:"reason"`
}

// outputMessage is the openai SDK's ResponseOutputMessage.
type outputMessage struct {
	ID      string       `json:"id"`
	Content []outputText `json:"content"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Type    string       `json:"type"`
}

// outputText is ResponseOutputText; logprobs is null in an answer and []
// in a stream's added part and deltas.
type outputText struct {
	Annotations []any  `json:"annotations"`
	Text        string `json:"text"`
	Type        string `json:"type"`
	Logprobs    []any  `json:"logprobs"`
}

// responseUsage is vLLM's ResponseUsage; the per-turn lists stay empty,
// as vLLM's SimpleContext keeps no turn metrics.
type responseUsage struct {
	InputTokens         int           `json:"input_tokens"`
	InputTokensDetails  inputDetails  `json:"input_tokens_details"`
	OutputTokens        int           `json:"output_tokens"`
	OutputTokensDetails outputDetails `json:"output_tokens_details"`
	TotalTokens         int           `json:"total_tokens"`
}

type inputDetails struct {
	CachedTokens        int   `json:"cached_tokens"`
	InputTokensPerTurn  []int `json:"input_tokens_per_turn"`
	CachedTokensPerTurn []int `json:"cached_tokens_per_turn"`
}

type outputDetails struct {
	ReasoningTokens         int   `json:"reasoning_tokens"`
	ToolOutputTokens        int   `json:"tool_output_tokens"`
	OutputTokensPerTurn     []int `json:"output_tokens_per_turn"`
	ToolOutputTokensPerTurn []int `json:"tool_output_tokens_per_turn"`
}

func responseUsageOf(u vllmsim.Usage) *responseUsage {
	return &responseUsage{
		InputTokens:         u.PromptTokens,
		InputTokensDetails:  inputDetails{CachedTokens: u.CachedTokens, InputTokensPerTurn: []int{}, CachedTokensPerTurn: []int{}},
		OutputTokens:        u.CompletionTokens,
		OutputTokensDetails: outputDetails{OutputTokensPerTurn: []int{}, ToolOutputTokensPerTurn: []int{}},
		TotalTokens:         u.PromptTokens + u.CompletionTokens,
	}
}

// responsesCall is a Responses request ready to run.
type responsesCall struct {
	r       *responsesRequest
	g       genRequest
	id      string
	created int64
	store   bool // keep the answer (the store is on and the request asks)
	msgs    json.RawMessage
}

// object is the response of call (ResponsesResponse.from_request) in
// status, with output and usage when done.
func (call *responsesCall) object(status string, output []outputMessage, o *vllmsim.Output) responseObject {
	r := call.r
	resp := responseObject{ID: call.id, CreatedAt: call.created, Instructions: r.Instructions, Metadata: r.Metadata,
		Model: call.g.model, Object: "response", Output: output, ParallelToolCalls: r.ParallelToolCalls == nil || *r.ParallelToolCalls,
		Temperature: 1, ToolChoice: r.ToolChoice, Tools: r.Tools, TopP: 1, Background: r.background(),
		MaxOutputTokens: call.g.maxTokens, MaxToolCalls: r.MaxToolCalls, PreviousResponseID: r.PreviousResponseID,
		Reasoning: r.Reasoning, ServiceTier: "auto", Status: status, Text: r.Text, Truncation: "disabled", User: r.User}
	if !given(resp.ToolChoice) {
		resp.ToolChoice = json.RawMessage(`"auto"`)
	}
	if !given(resp.Tools) {
		resp.Tools = json.RawMessage(`[]`)
	}
	if r.Temperature != nil {
		resp.Temperature = *r.Temperature
	}
	if r.TopP != nil {
		resp.TopP = *r.TopP
	}
	if r.ServiceTier != nil {
		resp.ServiceTier = *r.ServiceTier
	}
	if r.Truncation != nil {
		resp.Truncation = *r.Truncation
	}
	for _, inc := range r.Include {
		if inc == "message.output_text.logprobs" { // sampling_params.logprobs
			resp.TopLogprobs = ptr(0)
			if r.TopLogprobs != nil {
				resp.TopLogprobs = r.TopLogprobs
			}
		}
	}
	if status == "incomplete" {
		resp.IncompleteDetails = &incomplete{Reason: "max_output_tokens"}
	}
	if o != nil {
		resp.Usage, resp.Sim = responseUsageOf(o.Usage), simOf(*o)
	}
	return resp
}

// final is call's answer after the engine's final output o: one message
// (no content when there is no text), "incomplete" when max_output_tokens
// ended it.
func (call *responsesCall) final(itemID string, text []byte, o vllmsim.Output) responseObject {
	status := "completed"
	if o.FinishReason == "length" {
		status = "incomplete"
	}
	msg := outputMessage{ID: itemID, Content: []outputText{}, Role: "assistant", Status: "completed", Type: "message"}
	if len(text) > 0 {
		msg.Content = append(msg.Content, outputText{Annotations: []any{}, Text: string(text), Type: "output_text"})
	}
	return call.object(status, []outputMessage{msg}, &o)
}

func notFoundResponse(id string) *apiError {
	return &apiError{Status: 404, Type: "invalid_request_error", Param: "response_id", Message: fmt.Sprintf("Response with id '%s' not found.", id)}
}

func (s *Server) responses(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	r, aerr := decodeResponses(a.body)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	call := responsesCall{r: &r, created: s.cfg.Now().Unix()}
	if call.g, aerr = s.newGen(c, r.Model, a); aerr != nil {
		writeError(c, aerr)
		return
	}
	if r.background() && r.storeAsked() && !s.cfg.ResponsesStore {
		writeError(c, &apiError{Status: 400, Type: "invalid_request_error", Param: "background", Message: "This vLLM engine does not support `store=True` and therefore does not support the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."})
		return
	}
	call.store = s.cfg.ResponsesStore && r.storeAsked()
	var prev *stored
	if r.PreviousResponseID != nil {
		e, ok := s.store.get(*r.PreviousResponseID)
		if !ok {
			writeError(c, notFoundResponse(*r.PreviousResponseID))
			return
		}
		prev = &e
	}
	p, ok := s.responsesPrompt(c, a.body, &r, prev)
	if !ok {
		return
	}
	g := &call.g
	g.prompt, g.mm, g.salt, g.stream, g.maxTokens, call.msgs = p.ids, p.mm, r.salt(), r.Stream, r.maxTokens(), p.messages
	if _, aerr = checkMaxTokens(g.maxTokens); aerr != nil {
		writeError(c, aerr)
		return
	}
	if g.maxTokens, aerr = s.responsesMaxTokens(len(g.prompt), g.maxTokens); aerr != nil {
		writeError(c, aerr)
		return
	}
	call.id = s.responseID(&r)
	if r.background() {
		s.startBackground(c, &call)
		return
	}
	ctx := c.Request.Context()
	streams, aerr := s.submit(ctx, g, call.id)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	defer release(streams)
	texts := s.texts(g)
	if g.stream {
		w := s.newSSE(c, g)
		s.responseEvents(ctx, &call, streams[0], &texts[0], func(e sseEvent) bool { return w.send(e.name, e.data) })
		return
	}
	res, aerr := s.collect(ctx, streams, texts)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	resp := call.final(s.itemID(), res[0].text, res[0].final)
	s.keep(&call, resp)
	s.served(c, g)
	c.JSON(http.StatusOK, resp)
}

// responsesMaxTokens checks a Responses prompt's length as vLLM does
// (_validate_generator_input): only a prompt that fills the context is
// refused; max_output_tokens is capped at what is left (get_max_tokens).
func (s *Server) responsesMaxTokens(prompt, maxTokens int) (int, *apiError) {
	m := s.cfg.MaxModelLen
	if m <= 0 {
		return maxTokens, nil
	}
	if prompt >= m {
		return 0, &apiError{Status: 400, Type: "invalid_request_error", Param: "input",
			Message: fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", prompt, m)}
	}
	return min(maxTokens, m-prompt), nil
}

func (s *Server) itemID() string { return fmt.Sprintf("msg_%x%06x", s.boot, s.nextID.Add(1)) }

// keep stores call's final answer when call asks for it, unless a cancel
// got there first (vLLM keeps a cancelled response cancelled).
func (s *Server) keep(call *responsesCall, resp responseObject) {
	if !call.store {
		return
	}
	if _, ok := s.store.update(call.id, func(old responseObject) responseObject {
		if old.Status == "cancelled" {
			return old
		}
		return resp
	}); !ok && !call.r.background() {
		s.store.put(call.id, stored{resp: resp, messages: call.msgs})
	}
}

// responseEvents runs call's stream as vLLM's simple path does, handing
// each event to emit: response.created and response.in_progress (the
// response in_progress, no output), then with the first text
// response.output_item.added and response.content_part.added, one
// response.output_text.delta per engine step with text, then
// response.output_text.done, response.content_part.done,
// response.output_item.done, and response.completed with the answer.
// sequence_number counts from 0. It stops when emit fails, ctx ends or
// the engine aborts the request (a restart: the stream just ends, as a
// restarted vLLM's would).
func (s *Server) responseEvents(ctx context.Context, call *responsesCall, st *vllmsim.Stream, t *textSource, emit func(sseEvent) bool) {
	seq := 0
	send := func(name string, ev map[string]any) bool {
		ev["sequence_number"], ev["type"] = seq, name
		seq++
		b, err := marshalOrdered(ev)
		return err == nil && emit(sseEvent{name: name, data: b})
	}
	initial := call.object("in_progress", []outputMessage{}, nil)
	if !send("response.created", map[string]any{"response": initial}) ||
		!send("response.in_progress", map[string]any{"response": initial}) {
		return
	}
	item := s.itemID()
	var text []byte
	opened := false
	r := newOutputs(ctx, []*vllmsim.Stream{st})
	var final vllmsim.Output
	for {
		x, live := r.next(ctx)
		if !live || !x.ok {
			return
		}
		if _, delta := t.next(x.o.Tokens); delta != "" {
			if !opened {
				added := outputMessage{ID: item, Content: []outputText{}, Role: "assistant", Status: "in_progress", Type: "message"}
				if !send("response.output_item.added", map[string]any{"item": added, "output_index": 0}) ||
					!send("response.content_part.added", map[string]any{"content_index": 0, "item_id": item, "output_index": 0,
						"part": outputText{Annotations: []any{}, Type: "output_text", Logprobs: []any{}}}) {
					return
				}
				opened = true
			}
			text = append(text, delta...)
			if !send("response.output_text.delta", map[string]any{"content_index": 0, "delta": delta, "item_id": item,
				"logprobs": []any{}, "output_index": 0}) {
				return
			}
		}
		if x.o.Done {
			final = x.o
			s.met.finished(final)
			break
		}
	}
	if final.FinishReason == "abort" {
		return
	}
	if opened {
		done := outputText{Annotations: []any{}, Text: string(text), Type: "output_text"}
		if !send("response.output_text.done", map[string]any{"content_index": 0, "item_id": item, "logprobs": []any{}, "output_index": 0, "text": string(text)}) ||
			!send("response.content_part.done", map[string]any{"content_index": 0, "item_id": item, "output_index": 0, "part": done}) ||
			!send("response.output_item.done", map[string]any{"item": doneItem{ID: item, Content: []outputText{done}, Role: "assistant",
				Status: "completed", Type: "message", Annotations: []any{}, Logprobs: []any{}}, "output_index": 0}) {
			return
		}
	}
	resp := call.final(item, text, final)
	s.keep(call, resp)
	send("response.completed", map[string]any{"response": resp})
}

// doneItem is output_item.done's item: vLLM passes annotations and
// logprobs to the message too, and the SDK's model keeps extra members.
type doneItem struct {
	ID          string       `json:"id"`
	Content     []outputText `json:"content"`
	Role        string       `json:"role"`
	Status      string       `json:"status"`
	Type        string       `json:"type"`
	Annotations []any        `json:"annotations"`
	Logprobs    []any        `json:"logprobs"`
}

// eventOrder is the openai SDK's member order of the stream events: they
// are generated models with members sorted by name, "response" and
// "item" first where present.
var eventOrder = []string{"content_index", "delta", "item", "item_id", "logprobs", "output_index", "part", "response", "sequence_number", "text", "type"}

// marshalOrdered writes an event's members in the SDK's order.
func marshalOrdered(ev map[string]any) ([]byte, error) {
	b := []byte{'{'}
	for _, k := range eventOrder {
		v, ok := ev[k]
		if !ok {
			continue
		}
		vb, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, k)
		b = append(append(b, ':'), vb...)
	}
	return append(b, '}'), nil
}

// startBackground stores call "queued" and runs it detached from the
// client, which gets the queued response (or, streaming, the events as
// they are made). The engine request ends with its final output, or when
// cancel or a restart aborts it.
func (s *Server) startBackground(c *gin.Context, call *responsesCall) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(c.Request.Context()))
	g := &call.g
	streams, aerr := s.submit(ctx, g, call.id)
	if aerr != nil {
		cancel()
		writeError(c, aerr)
		return
	}
	queued := call.object("queued", []outputMessage{}, nil)
	e := stored{resp: queued, messages: call.msgs, cancel: cancel}
	if g.stream {
		e.events = newEventLog()
	}
	s.store.put(call.id, e)
	texts := s.texts(g)
	// Runs until the request's final output (or its abort) is read; it
	// drains the stream whatever happens.
	go func() {
		defer cancel()
		defer release(streams)
		if e.events != nil {
			defer e.events.close()
			s.responseEvents(ctx, call, streams[0], &texts[0], func(ev sseEvent) bool { e.events.add(ev); return true })
			return
		}
		res, aerr := s.collect(ctx, streams, texts)
		if aerr != nil {
			s.store.update(call.id, func(old responseObject) responseObject {
				if old.Status == "queued" || old.Status == "in_progress" {
					old.Status = "failed"
				}
				return old
			})
			return
		}
		s.keep(call, call.final(s.itemID(), res[0].text, res[0].final))
	}()
	if e.events != nil {
		s.replay(c, &call.g, e.events, 0)
		return
	}
	c.JSON(http.StatusOK, queued)
}

// replay streams a background response's events from index from, then
// follows them until the log is complete or the client leaves.
func (s *Server) replay(c *gin.Context, g *genRequest, l *eventLog, from int) {
	ctx := c.Request.Context()
	w := s.newSSE(c, g)
	for {
		evs, done, wake := l.from(from)
		for _, e := range evs {
			if !w.send(e.name, e.data) {
				return
			}
		}
		from += len(evs)
		if done {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
	}
}

// retrieveResponse is GET /v1/responses/{id}: the stored response, or
// with ?stream=true a background stream's events after starting_after.
func (s *Server) retrieveResponse(c *gin.Context) {
	id := c.Param("id")
	e, ok := s.store.get(id)
	if !ok {
		writeError(c, notFoundResponse(id))
		return
	}
	if stream, _ := strconv.ParseBool(c.Query("stream")); stream {
		if e.events == nil {
			writeError(c, &apiError{Status: 400, Type: "BadRequestError", Param: "response_id", Message: fmt.Sprintf("Unknown response_id: %s", id)})
			return
		}
		from := 0
		if v := c.Query("starting_after"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < -1 {
				writeError(c, badRequest("starting_after %q: want an event number", v))
				return
			}
			from = n + 1
		}
		s.replay(c, &genRequest{start: s.cfg.Now()}, e.events, from)
		return
	}
	c.JSON(http.StatusOK, e.resp)
}

// cancelResponse is POST /v1/responses/{id}/cancel: a queued or running
// background response becomes "cancelled" and its engine request is
// aborted; any other is vLLM's 400.
func (s *Server) cancelResponse(c *gin.Context) {
	id := c.Param("id")
	var was string
	e, ok := s.store.update(id, func(old responseObject) responseObject {
		was = old.Status
		if was == "queued" || was == "in_progress" {
			old.Status = "cancelled"
		}
		return old
	})
	if !ok {
		writeError(c, notFoundResponse(id))
		return
	}
	if was != "queued" && was != "in_progress" {
		writeError(c, &apiError{Status: 400, Type: "invalid_request_error", Param: "response_id", Message: "Cannot cancel a synchronous response."})
		return
	}
	if e.cancel != nil {
		e.cancel()
	}
	c.JSON(http.StatusOK, e.resp)
}
