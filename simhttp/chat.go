package simhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/vllmsim"
)

// defaultMaxTokens applies when a request gives no max_tokens. vLLM's own
// default is "the rest of the context", which would make every simulated
// answer thousands of tokens long; OpenAI's completions default of 16 keeps
// runs short and is what most benchmarks set explicitly anyway.
const defaultMaxTokens = 16

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// ContinuousUsageStats is set only where vLLM sets it itself (the chat
	// request a streamed Messages request converts to).
	ContinuousUsageStats bool `json:"continuous_usage_stats,omitempty"`
}

// chatMessage accepts content as a string, null, or an array of parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// openAIRequest holds the members chat and completions requests share
// (vLLM's ChatCompletionRequest and CompletionRequest), each of which
// embeds it.
type openAIRequest struct {
	Model          string         `json:"model"`
	Stream         bool           `json:"stream"`
	StreamOptions  *streamOptions `json:"stream_options"`
	MaxTokens      *int           `json:"max_tokens"`
	N              *int           `json:"n"`
	CacheSalt      string         `json:"cache_salt"`
	ReturnTokenIDs bool           `json:"return_token_ids"`
}

// checkN refuses n > 1: the simulator generates one choice per prompt.
func (r *openAIRequest) checkN() *apiError {
	if r.N != nil && *r.N != 1 {
		return badRequest("n=%d is not supported by the simulator; use n=1", *r.N)
	}
	return nil
}

// maxTokens is max_tokens, checked, or the simulator's default.
func (r *openAIRequest) maxTokens() (int, *apiError) {
	if r.MaxTokens != nil {
		return checkMaxTokens(*r.MaxTokens)
	}
	return defaultMaxTokens, nil
}

// generation sets the answer's options on g: salt, stream, usage, ids.
func (r *openAIRequest) generation(g *genRequest) {
	g.salt, g.stream, g.tokenIDs = r.CacheSalt, r.Stream, r.ReturnTokenIDs
	g.includeUsage = r.StreamOptions != nil && r.StreamOptions.IncludeUsage
}

// rendered is r's GenerateRequest options, its prompt yet to render.
func (r *openAIRequest) rendered() rendered {
	return rendered{model: r.Model, stream: r.Stream, so: r.StreamOptions, salt: r.CacheSalt}
}

type chatRequest struct {
	openAIRequest
	Messages             []chatMessage   `json:"messages"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Tools                json.RawMessage `json:"tools"`
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
	if aerr := r.checkN(); aerr != nil {
		return r, nil, aerr
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
func (r *chatRequest) maxTokens() (int, *apiError) {
	if r.MaxCompletionTokens != nil {
		return checkMaxTokens(*r.MaxCompletionTokens)
	}
	return r.openAIRequest.maxTokens()
}

func checkMaxTokens(n int) (int, *apiError) {
	if n < 1 {
		return 0, badRequest("max_tokens must be at least 1, got %d.", n)
	}
	return n, nil
}

// flattenMessages turns string or array-of-parts content into what the
// tokenizer takes: text parts are joined with "\n" as vLLM does for
// string-content templates; a message holding an image keeps its parts in
// order, each image named by its uuid or else by the simulator's content
// hash of its URL (vllmsim.ContentID).
func flattenMessages(in []chatMessage) ([]vllmsim.Message, *apiError) {
	out := make([]vllmsim.Message, 0, len(in))
	for i, m := range in {
		if m.Role == "" {
			return nil, badRequest("messages[%d].role: field required", i)
		}
		text, parts, err := messageContent(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		msg := vllmsim.Message{Role: m.Role, Content: text}
		if parts != nil {
			msg.Parts = make([]vllmsim.Part, len(parts))
			for j, p := range parts {
				msg.Parts[j] = vllmsim.Part{Text: p.text}
				if p.image {
					id := p.uuid
					if id == "" {
						id = vllmsim.ContentID(p.url)
					}
					msg.Parts[j] = vllmsim.Part{Image: &vllmsim.Image{ID: id}}
				}
			}
		}
		out = append(out, msg)
	}
	return out, nil
}

// contentPart is one part of a message's array content, in the forms
// vLLM's chat_utils MM_PARSER_MAP reads: text, input_text and output_text
// carry text; image_url ({"url": ...} or, as vLLM also accepts, a bare
// string) and Responses' input_image (image_url a string) carry an image,
// named by the part's uuid when it has one (vLLM's multi_modal_uuids).
type contentPart struct {
	Type     string          `json:"type"`
	Text     *string         `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
	UUID     string          `json:"uuid"`
}

// part is a content part read: text, or an image's URL and uuid.
type part struct {
	text      string
	image     bool
	url, uuid string
}

// messageContent reads a message's content: its text, or its parts when
// one of them is an image (text is then unset).
func messageContent(raw json.RawMessage) (string, []part, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	if raw[0] == '"' {
		// The request was decoded, so raw is a valid JSON string: without
		// escapes and in valid UTF-8 (which decoding would not replace),
		// its text is what is between the quotes. Decoding it again was
		// two more passes over a 150 KB prompt, ~0.7 ms of the engine's CPU.
		if len(raw) >= 2 {
			if in := raw[1 : len(raw)-1]; bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
				return string(in), nil, nil
			}
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, err
		}
		return s, nil, nil
	}
	var cps []contentPart
	if err := json.Unmarshal(raw, &cps); err != nil {
		return "", nil, errors.New("must be a string or an array of content parts")
	}
	parts := make([]part, 0, len(cps))
	images := false
	for _, p := range cps {
		switch p.Type {
		case "text", "input_text", "output_text":
			if p.Text == nil {
				return "", nil, errors.New("text part without text")
			}
			parts = append(parts, part{text: *p.Text})
		case "image_url", "input_image":
			url, err := imageURL(p)
			if err != nil {
				return "", nil, err
			}
			parts = append(parts, part{image: true, url: url, uuid: p.UUID})
			images = true
		default:
			return "", nil, fmt.Errorf("content part type %q is not supported", p.Type)
		}
	}
	if images {
		return "", parts, nil
	}
	texts := make([]string, len(parts))
	for i, p := range parts {
		texts[i] = p.text
	}
	return strings.Join(texts, "\n"), nil, nil
}

// imageURL reads an image part's URL: image_url's "url", or image_url
// itself when it is a string.
func imageURL(p contentPart) (string, error) {
	raw := bytes.TrimSpace(p.ImageURL)
	if len(raw) == 0 || string(raw) == "null" {
		return "", fmt.Errorf("%s part without image_url", p.Type)
	}
	var url string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &url); err != nil {
			return "", err
		}
	} else {
		var obj struct {
			URL *string `json:"url"`
		}
		if err := json.Unmarshal(raw, &obj); err != nil || obj.URL == nil {
			return "", fmt.Errorf("%s part: image_url must be a string or {\"url\": ...}", p.Type)
		}
		url = *obj.URL
	}
	if url == "" {
		return "", fmt.Errorf("%s part with an empty url", p.Type)
	}
	return url, nil
}

// chatTokens renders and tokenizes a chat on the tokenize pool, with its
// images' placements (nil without images); on a template error it answers
// with fail. ok is false when an answer was written or the client left.
func (s *Server) chatTokens(c *gin.Context, msgs []vllmsim.Message, o vllmsim.ChatOptions, fail func(*gin.Context, *apiError)) ([]uint32, []vllmsim.MMPlacement, bool) {
	o.Template = s.cfg.ChatTemplate
	var ids []uint32
	var mm []vllmsim.MMPlacement
	var err error
	if !s.charged(c, func() int { ids, mm, err = s.tok.ChatMM(msgs, o); return len(ids) }) {
		return nil, nil, false
	}
	if err != nil {
		fail(c, badRequest("%v", err))
		return nil, nil, false
	}
	return ids, mm, true
}

func (s *Server) chat(c *gin.Context) {
	a, ok := s.receive(c, writeError)
	if !ok {
		return
	}
	r, msgs, aerr := decodeChat(a.body)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	g, aerr := s.newGen(c, r.Model, a)
	if aerr == nil {
		g.maxTokens, aerr = r.maxTokens()
	}
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	r.generation(&g)
	if g.prompt, g.mm, ok = s.chatTokens(c, msgs, r.options(), writeError); !ok {
		return
	}
	s.generateOpenAI(c, &g, true)
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

// usageOf sums the usage of a request's engine requests (one, or a
// batch's). The cached figure is summed too: vLLM reports one prompt's
// num_cached_tokens for a batch (completion/serving.py @030ea52e, and
// only with --enable-prompt-tokens-details), which says nothing about the
// others; the simulator always reports it, and a benchmark reads the hits
// of the whole request from it.
func usageOf(outs ...vllmsim.Output) *usageInfo {
	var u usageInfo
	var cached int
	for _, o := range outs {
		u.PromptTokens += o.Usage.PromptTokens
		u.CompletionTokens += o.Usage.CompletionTokens
		cached += o.Usage.CachedTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails = &promptDetails{CachedTokens: cached}
	return &u
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

// answer is an OpenAI answer object, chat's or completions', whole or a
// chunk: they differ in their choices (C) alone. A whole answer always has
// usage, a chunk only when it is the usage chunk. Chat's prompt_token_ids
// follows usage as in vLLM (prompt_logprobs, never set here, sits between
// them); completions carry the prompt's ids on the choices instead.
type answer[C any] struct {
	ID             string     `json:"id"`
	Object         string     `json:"object"`
	Created        int64      `json:"created"`
	Model          string     `json:"model"`
	Choices        []C        `json:"choices"`
	Usage          *usageInfo `json:"usage,omitempty"`
	PromptTokenIDs []uint32   `json:"prompt_token_ids,omitzero"`
	Sim            *simTiming `json:"sim,omitempty"`
}

type (
	chatResponse       = answer[chatChoice]
	chatChunk          = answer[chatChunkChoice]
	completionResponse = answer[completionChoice]
)

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

// respShape builds the OpenAI response objects of one chat or
// completions request.
type respShape struct {
	id, model string
	created   int64
	chat      bool
	tokenIDs  bool       // return_token_ids
	prompts   [][]uint32 // the ids the engine ran, per choice
}

// newAnswer is an answer object of r's, of type object, with choices.
func newAnswer[C any](r respShape, object string, choices []C) answer[C] {
	return answer[C]{ID: r.id, Object: object, Created: r.created, Model: r.model, Choices: choices}
}

// ids is what a token_ids field carries: nothing without return_token_ids,
// else the ids, an empty list rather than none.
func (r respShape) ids(ids []uint32) []uint32 {
	if !r.tokenIDs {
		return nil
	}
	if ids == nil {
		return []uint32{}
	}
	return ids
}

// promptIDs is what choice i's prompt_token_ids field carries.
func (r respShape) promptIDs(i int) []uint32 {
	if !r.tokenIDs {
		return nil
	}
	return r.prompts[i]
}

func (r respShape) full(res []result) any {
	finals := make([]vllmsim.Output, len(res))
	for i, x := range res {
		finals[i] = x.final
	}
	if r.chat {
		x := res[0]
		a := newAnswer(r, "chat.completion", []chatChoice{{Message: assistantMessage{Role: "assistant", Content: string(x.text), ToolCalls: []any{}},
			FinishReason: ptr(x.final.FinishReason), TokenIDs: r.ids(x.ids)}})
		a.Usage, a.PromptTokenIDs, a.Sim = usageOf(finals...), r.promptIDs(0), simOf(x.final)
		return a
	}
	choices := make([]completionChoice, len(res))
	for i, x := range res {
		// vLLM numbers a batch's choices in prompt order (index=len(choices)).
		choices[i] = completionChoice{Index: i, Text: string(x.text), FinishReason: ptr(x.final.FinishReason),
			TokenIDs: r.ids(x.ids), PromptTokenIDs: r.promptIDs(i)}
	}
	a := newAnswer(r, "text_completion", choices)
	a.Usage, a.Sim = usageOf(finals...), simOfAll(finals)
	return a
}

func (r respShape) chatChunk(d *chatDelta, ids []uint32, fr *string) chatChunk {
	return newAnswer(r, "chat.completion.chunk", []chatChunkChoice{{Delta: *d, FinishReason: fr, TokenIDs: ids}})
}

// completionChunk is one chunk of choice i; it carries that prompt's ids
// on its first chunk only, as vLLM does.
func (r respShape) completionChunk(i int, text string, ids []uint32, fr *string, first bool) completionResponse {
	c := completionChoice{Index: i, Text: text, FinishReason: fr, TokenIDs: r.ids(ids)}
	if first {
		c.PromptTokenIDs = r.promptIDs(i)
	}
	return newAnswer(r, "text_completion", []completionChoice{c})
}

// usageChunk is the last chunk, with no choices, when the client asked
// for usage.
func (r respShape) usageChunk(finals []vllmsim.Output) any {
	if r.chat {
		a := newAnswer(r, "chat.completion.chunk", []chatChunkChoice{})
		a.Usage, a.Sim = usageOf(finals...), simOf(finals[0])
		return a
	}
	a := newAnswer(r, "text_completion", []completionChoice{})
	a.Usage, a.Sim = usageOf(finals...), simOfAll(finals)
	return a
}

// generateOpenAI runs a chat or completions request and answers in
// OpenAI's shape, streaming or not.
func (s *Server) generateOpenAI(c *gin.Context, g *genRequest, chat bool) {
	prefix := "cmpl"
	if chat {
		prefix = "chatcmpl"
	}
	id := s.newID(prefix)
	ctx := c.Request.Context()
	streams, aerr := s.submit(ctx, g, id)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	defer release(streams)
	resp := respShape{id: id, model: g.model, created: s.cfg.Now().Unix(), chat: chat, tokenIDs: g.tokenIDs, prompts: g.prompts()}
	texts := s.texts(g)
	if g.stream {
		s.streamOpenAI(c, g, streams, texts, resp)
		return
	}
	res, aerr := s.collect(ctx, streams, texts)
	if aerr != nil {
		writeError(c, aerr)
		return
	}
	s.served(c, g)
	b, err := json.Marshal(resp.full(res))
	if err != nil {
		writeError(c, internal(err.Error()))
		return
	}
	c.Data(http.StatusOK, "application/json; charset=utf-8", b)
}

// streamOpenAI writes vLLM's SSE framing: one `data: {json}\n\n` per engine
// step that produced tokens, per choice (its index set), flushed at once,
// then `data: [DONE]\n\n`.
func (s *Server) streamOpenAI(c *gin.Context, g *genRequest, streams []*vllmsim.Stream, texts []textSource, resp respShape) {
	ctx := c.Request.Context()
	w := s.newSSE(c, g)
	send := func(v any) bool {
		b, err := json.Marshal(v)
		return err == nil && w.send("", b)
	}
	// A chat stream opens with the role chunk, which carries the prompt's
	// ids and no token_ids. vLLM writes it on the first output of the
	// engine, not when it takes the request: a client (or a sidecar) that
	// times the first chunk times the first token, queueing included.
	roleSent := !resp.chat
	finals := make([]vllmsim.Output, len(streams))
	sent := make([]bool, len(streams))
	r := newOutputs(ctx, streams)
	for left := len(streams); left > 0; {
		x, live := r.next(ctx)
		if !live {
			return
		}
		if !x.ok {
			send(gin.H{"error": errorInfo{Message: "engine closed the stream", Type: "InternalServerError", Code: 500}})
			fmt.Fprint(c.Writer, "data: [DONE]\n\n")
			return
		}
		o := x.o
		if len(o.Tokens) == 0 && !o.Done {
			continue
		}
		if !roleSent {
			role := resp.chatChunk(&chatDelta{Role: "assistant", Content: ptr("")}, nil, nil)
			role.PromptTokenIDs = resp.promptIDs(0)
			if !send(role) {
				return
			}
			roleSent = true
		}
		var fr *string
		if o.Done {
			fr = ptr(o.FinishReason)
		}
		ids, text := texts[x.i].next(o.Tokens)
		var chunk any
		if resp.chat {
			d := &chatDelta{}
			if len(o.Tokens) > 0 {
				d.Content = ptr(text)
			}
			chunk = resp.chatChunk(d, resp.ids(ids), fr)
		} else {
			chunk = resp.completionChunk(x.i, text, ids, fr, !sent[x.i])
		}
		sent[x.i] = true
		if !send(chunk) {
			return
		}
		if !o.Done {
			continue
		}
		left--
		finals[x.i] = o
		s.met.finished(o)
	}
	if g.includeUsage && !send(resp.usageChunk(finals)) {
		return
	}
	fmt.Fprint(c.Writer, "data: [DONE]\n\n")
	c.Writer.Flush()
}
