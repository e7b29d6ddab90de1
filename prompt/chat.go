package prompt

import (
	"strconv"
)

// parseChat reads a /v1/chat/completions body.
func parseChat(body []byte) (Prompt, error) {
	var f wireFields
	if err := f.scan(body, false); err != nil {
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
	p.Images = chatImages(p.Messages)
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

// convo is a conversion's output: the chat messages and their images.
type convo struct {
	msgs   []msg
	images []Image
	// unsure is set when vLLM's rendering of the body is not reproduced
	// (an id vLLM makes from the clock, a shape vLLM answers with an
	// error of its own): the conversion still completes, and ParseAPI
	// returns ErrNoPrompt.
	unsure bool
}

// add appends m, and imgs as m's images.
func (c *convo) add(m msg, imgs ...Image) {
	for _, im := range imgs {
		im.Message = len(c.msgs)
		c.images = append(c.images, im)
	}
	c.msgs = append(c.msgs, m)
}

// json is the messages as a chat "messages" array.
func (c *convo) json() []byte {
	size := 2
	for _, m := range c.msgs {
		size += 64 + len(m.content) + len(m.reasoning) + len(m.callID) + len(m.name)
		for _, tc := range m.calls {
			size += len(tc) + 1
		}
	}
	b := make([]byte, 0, size)
	b = append(b, '[')
	for i, m := range c.msgs {
		if i > 0 {
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
		b = append(b, '}')
	}
	return append(b, ']')
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
