package prompt

import "strconv"

// parseChat reads a /v1/chat/completions body, and its images when
// images is set.
func parseChat(body []byte, images bool) (Prompt, error) {
	var f wireFields
	if err := f.scan(body, nil); err != nil {
		return Prompt{}, err
	}
	p := Prompt{Chat: true, Tools: nullToNil(f.tools)}
	if err := f.common(&p); err != nil {
		return Prompt{}, err
	}
	if err := f.chatOptions(&p); err != nil {
		return Prompt{}, err
	}
	// vLLM's ChatCompletionRequest: max_completion_tokens or max_tokens.
	if p.MaxTokens = jsonCount(f.maxCompletionTokens); p.MaxTokens == 0 {
		p.MaxTokens = jsonCount(f.maxTokens)
	}
	p.Messages = nullToNil(f.messages)
	if len(p.Messages) == 0 || p.Messages[0] != '[' {
		return p, ErrNoPrompt
	}
	if images {
		p.Images = chatImages(p.Messages)
	}
	return p, nil
}

// ChatBody returns a complete /v1/chat/completions request body equivalent
// to p for rendering: model, messages, tools, the chat rendering fields set
// on p, and max_tokens when maxTokens > 0. It is what the simulator feeds
// its chat path for a Messages or Responses request. p.Messages, p.Tools
// and p.ChatTemplateKwargs are spliced byte for byte.
func ChatBody(p Prompt, maxTokens int) []byte {
	b := make([]byte, 0, len(p.Messages)+len(p.Tools)+len(p.ChatTemplateKwargs)+128)
	b = append(b, `{"model":`...)
	b = appendString(b, p.Model)
	b = append(b, `,"messages":`...)
	if len(p.Messages) == 0 {
		b = append(b, "[]"...)
	} else {
		b = append(b, p.Messages...)
	}
	if len(p.Tools) > 0 {
		b = append(append(b, `,"tools":`...), p.Tools...)
	}
	if len(p.ChatTemplateKwargs) > 0 {
		b = append(append(b, `,"chat_template_kwargs":`...), p.ChatTemplateKwargs...)
	}
	b = appendOptBool(b, "add_generation_prompt", p.AddGenerationPrompt)
	b = appendOptBool(b, "continue_final_message", p.ContinueFinalMessage)
	b = appendOptBool(b, "add_special_tokens", p.AddSpecialTokens)
	if p.CacheSalt != "" {
		b = appendString(append(b, `,"cache_salt":`...), p.CacheSalt)
	}
	if maxTokens > 0 {
		b = strconv.AppendInt(append(b, `,"max_tokens":`...), int64(maxTokens), 10)
	}
	return append(b, '}')
}

func appendOptBool(b []byte, name string, v *bool) []byte {
	if v == nil {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return strconv.AppendBool(b, *v)
}

// msg is one message of a converted chat request. Every field is raw
// JSON (a literal, an object or an array) or nil for absent, so a
// conversion splices the client's bytes.
type msg struct {
	role      string // a plain ASCII name
	content   []byte // a string, or an array of parts
	reasoning []byte // a string
	calls     [][]byte
	callID    []byte // a string
	name      []byte // a string
}

// convo is a conversion's output: the chat messages, written as they
// come into one array, and their images.
type convo struct {
	out []byte // the messages array so far, without its closing bracket
	n   int    // messages written or held
	// held is the last message, not yet written, when merge is set and
	// it is an assistant's: Responses items add tool calls, reasoning and
	// content to the assistant message before them. Other messages are
	// written at once (and may refer to scratch space the next one
	// reuses).
	held    msg
	holding bool
	merge   bool
	images  []Image
	// scratch holds the blocks of the message being converted.
	scratch []aBlock
	// unsure is set when vLLM's rendering of the body is not reproduced
	// (an id vLLM makes from the clock, a shape vLLM answers with an
	// error of its own): the conversion still completes, and ParseAPI
	// returns ErrNoPrompt.
	unsure bool
}

// newConvo is a conversion of a body of size bytes.
func newConvo(size int, merge bool) convo {
	out := make([]byte, 1, size+size/16+256)
	out[0] = '['
	return convo{out: out, merge: merge}
}

// reset empties c to convert afresh in the same space.
func (c *convo) reset() {
	*c = convo{out: c.out[:1], merge: c.merge, scratch: c.scratch[:0]}
}

// add appends m, and imgs as m's images.
func (c *convo) add(m msg, imgs ...Image) {
	c.flush()
	for _, im := range imgs {
		im.Message = c.n
		c.images = append(c.images, im)
	}
	c.n++
	if c.merge && m.role == "assistant" {
		c.held, c.holding = m, true
		return
	}
	c.write(m)
}

// insertFirst puts a message with role and content alone before the
// messages written so far: a conversion made in the body's scan meets a
// member vLLM renders first (the instructions) only after the messages.
// The output has room for it, so the messages move once, within it.
func (c *convo) insertFirst(role string, content []byte) {
	n := len(c.out) - 1 // the messages' bytes after '['
	size := len(`{"role":"`) + len(role) + len(`","content":`) + len(content) + len(`}`)
	if n > 0 {
		size++ // the comma after it
	}
	c.out = append(c.out, make([]byte, size)...)
	copy(c.out[1+size:], c.out[1:1+n])
	at := 1 + copy(c.out[1:], `{"role":"`)
	at += copy(c.out[at:], role)
	at += copy(c.out[at:], `","content":`)
	at += copy(c.out[at:], content)
	copy(c.out[at:1+size], "},") // the comma only when messages follow
	for i := range c.images {
		c.images[i].Message++
	}
	c.n++
}

// prev is the held assistant message, nil when the last message is
// another's.
func (c *convo) prev() *msg {
	if c.holding {
		return &c.held
	}
	return nil
}

func (c *convo) flush() {
	if c.holding {
		c.write(c.held)
		c.holding = false
	}
}

func (c *convo) write(m msg) {
	b := c.out
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = append(append(append(b, `{"role":"`...), m.role...), '"')
	if m.content != nil {
		b = append(append(b, `,"content":`...), m.content...)
	}
	if m.reasoning != nil {
		b = append(append(b, `,"reasoning":`...), m.reasoning...)
	}
	if m.calls != nil {
		b = append(b, `,"tool_calls":[`...)
		for j, tc := range m.calls {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, tc...)
		}
		b = append(b, ']')
	}
	if m.callID != nil {
		b = append(append(b, `,"tool_call_id":`...), m.callID...)
	}
	if m.name != nil {
		b = append(append(b, `,"name":`...), m.name...)
	}
	c.out = append(b, '}')
}

// json is the messages as a chat "messages" array; it cannot be
// appended to in place (spare is past its end).
func (c *convo) json() []byte {
	c.flush()
	c.out = append(c.out, ']')
	return c.out[:len(c.out):len(c.out)]
}

// spare is the space after the messages, which json has closed: a
// conversion sized for the body it came from has a whole body's room.
func (c *convo) spare() []byte { return c.out[len(c.out):] }

// toolsSpace is where converted tools of n raw bytes are written: room
// when they should fit (they are about their own size), else new space.
func toolsSpace(room []byte, n int) []byte {
	if cap(room) >= n+n/16+256 {
		return room[:0]
	}
	return make([]byte, 0, n+n/4+256)
}

// convertTools converts a request's tools list raw (absent or null: nil)
// to chat tools, written in room when they fit (see toolsSpace): tool
// appends the chat tool for the at-th tool, the object at raw's v, to b
// (which has its separator), and returns the tool's end, or nil for b to
// leave the tool out.
func convertTools(raw, room []byte, tool func(b []byte, v, at int) ([]byte, int, error)) ([]byte, error) {
	switch kind(raw) {
	case 0, 'n':
		return nil, nil
	case '[':
	default:
		return nil, badf("tools: want a list of tools")
	}
	b := toolsSpace(room, len(raw))
	b = append(b, '[')
	at := 0
	_, err := walkArray(raw, 0, func(v int) (int, error) {
		if raw[v] != '{' {
			return v, badf("tools[%d]: want an object", at)
		}
		start := len(b)
		if start > 1 {
			b = append(b, ',')
		}
		out, end, err := tool(b, v, at)
		if out == nil {
			out = b[:start]
		}
		b = out
		at++
		return end, err
	})
	if err != nil {
		return nil, err
	}
	return append(b, ']'), nil
}

// toolCall is a chat tool_calls entry; arguments is a string literal.
func toolCall(id, fn, arguments []byte) []byte {
	b := make([]byte, 0, len(id)+len(fn)+len(arguments)+64)
	b = append(append(b, `{"id":`...), id...)
	b = append(append(b, `,"type":"function","function":{"name":`...), fn...)
	b = append(append(b, `,"arguments":`...), arguments...)
	return append(b, "}}"...)
}

// textPart is a chat text content part.
func textPart(b, text []byte) []byte {
	return append(append(append(b, `{"type":"text","text":`...), text...), '}')
}

// imagePart is a chat image_url content part for url (a literal), with
// the caller's uuid (a literal) when not nil.
func imagePart(b, url, uuid []byte) []byte {
	b = append(append(append(b, `{"type":"image_url","image_url":{"url":`...), url...), '}')
	if uuid != nil {
		b = append(append(b, `,"uuid":`...), uuid...)
	}
	return append(b, '}')
}
