package prompt

// The Responses conversion is vLLM's non-harmony path:
// OpenAIServingResponses._make_request in
// vllm/entrypoints/openai/responses/serving.py (vllm-project/vllm@0001948b)
// builds the chat messages with construct_input_messages and
// construct_chat_messages_with_tool_call, and the tools with
// construct_tool_dicts, in vllm/entrypoints/openai/responses/utils.py
// (@01ca842d); the request model and its chat template kwargs are
// ResponsesRequest in vllm/entrypoints/openai/responses/protocol.py
// (@010a69ce). Items vLLM passes to its chat parser as they are (user,
// system and developer messages) have their Responses content parts
// written as the chat parts that parser makes of them
// (vllm/entrypoints/chat_utils.py MM_PARSER_MAP: input_text and
// output_text are text, input_image is an image).

func parseResponses(body []byte) (Prompt, error) {
	var f wireFields
	if err := f.scan(body, f.takeInput); err != nil {
		return Prompt{}, err
	}
	p := Prompt{Chat: true}
	if err := f.common(&p); err != nil {
		return Prompt{}, err
	}
	var err error
	p.PreviousResponseID, err = jsonString(f.previousResponseID, "previous_response_id", err)
	p.Store, err = jsonOptBool(f.store, "store", err)
	p.Background, err = jsonBool(f.background, "background", err)
	p.CacheSalt, err = jsonString(f.cacheSalt, "cache_salt", err)
	if err != nil {
		return Prompt{}, badf("%v", err)
	}
	if k := kind(f.maxOutputTokens); k != 0 && k != 'n' {
		if p.MaxTokens = jsonCount(f.maxOutputTokens); k != '0' && (k != '"' || p.MaxTokens == 0) {
			return Prompt{}, badf("max_output_tokens: want an integer")
		}
	}
	switch {
	case kind(f.input) != '"' && kind(f.input) != '[':
		return Prompt{}, badf("input: a string or a list of input items is required")
	case p.Background && p.Store != nil && !*p.Store:
		return Prompt{}, badf("background: can only be used when store is true")
	case kind(f.prompt) != 0 && kind(f.prompt) != 'n':
		return Prompt{}, badf("prompt: prompt templates are not supported")
	case f.cacheSalt != nil && kind(f.cacheSalt) != 'n' && p.CacheSalt == "":
		return Prompt{}, badf("cache_salt: must be a non-empty string")
	case p.PreviousResponseID != "" && kind(f.previousResponse) != 0 && kind(f.previousResponse) != 'n':
		return Prompt{}, badf("previous_response_id: cannot be set together with previous_response")
	case p.PreviousResponseID != "" && kind(f.previousInputMessages) == '[' && nonEmptyArray(f.previousInputMessages):
		return Prompt{}, badf("previous_response_id: cannot be set together with previous_input_messages")
	}
	instructions, err := optStr(f.instructions, "instructions")
	if err != nil {
		return Prompt{}, err
	}
	effort, err := reasoningEffort(f.reasoning, "reasoning")
	if err != nil {
		return Prompt{}, err
	}
	p.ChatTemplateKwargs = withEffort(nil, effort)
	if !f.items.ok {
		if p.Tools, err = responsesTools(f.tools, nil); err != nil {
			return Prompt{}, err
		}
	}

	var c *convo
	cont := false
	switch {
	case f.items.ok: // converted in the scan, before the instructions maybe
		c, cont = f.items.v.c, f.items.v.cont
		if truthy(instructions) {
			c.insertFirst("system", instructions)
		}
	default:
		conv := newConvo(len(f.input)+len(f.instructions), true)
		c = &conv
		if truthy(instructions) {
			c.add(msg{role: "system", content: instructions})
		}
		if kind(f.input) == '"' {
			c.add(msg{role: "user", content: f.input})
			break
		}
		w := walker{s: scanner{b: f.input}}
		if cont, _, err = c.responsesItems(&w, 0); err != nil {
			return Prompt{}, err
		}
	}
	// ResponsesRequest.build_chat_params: a partial assistant message
	// last is continued, not answered.
	gen := !cont
	p.AddGenerationPrompt, p.ContinueFinalMessage = &gen, &cont
	p.Messages, p.Images = c.json(), c.images
	// Converted in the scan, the items have nothing after them to
	// refuse, and the tools go in the space left after them.
	if f.items.ok {
		if p.Tools, err = responsesTools(f.tools, c.spare()); err != nil {
			return Prompt{}, err
		}
	}
	// A stored conversation is the owning pod's alone to render; a
	// previous_response or previous_input_messages is harmony's.
	if c.unsure || p.PreviousResponseID != "" || kind(f.previousResponse) == '{' ||
		kind(f.previousInputMessages) == '[' && nonEmptyArray(f.previousInputMessages) {
		return p, ErrNoPrompt
	}
	return p, nil
}

// rItem is a Responses input item's members that the conversion reads.
type rItem struct {
	typ, role, status                                      []byte // literals
	content, callID, name, arguments, output, summary, nsp []byte
}

// converted is input converted in the body's scan.
type converted struct {
	c    *convo
	cont bool
}

// takeInput converts the input items in the body's scan, validating them
// as it goes (see takeMessages). The instructions, which vLLM puts first,
// may come later in the body: the output has room for them.
func (f *wireFields) takeInput(key []byte, v int) int {
	if string(key) != "input" || v >= len(f.body) || f.body[v] != '[' {
		return 0
	}
	c := newConvo(len(f.body)-v+len(f.instructions), true)
	w := walker{s: scanner{b: f.body}, check: true, depth: 1}
	cont, end, err := c.responsesItems(&w, v)
	if err != nil {
		return 0
	}
	f.pending.items = reading[converted]{converted{&c, cont}, true}
	return end - v
}

// responsesItems converts the input items at w's i (utils.py
// construct_chat_messages_with_tool_call) as it walks them: function
// calls, reasoning and assistant text merge into the assistant message
// before them where it has no such part yet. It reports whether the last
// item is a partial message to continue (utils.py
// should_continue_final_message), and the list's end.
func (c *convo) responsesItems(w *walker, i int) (cont bool, end int, err error) {
	raw := w.s.b
	n := 0
	end, err = w.array(i, func(v int) (int, error) {
		at := n
		n++
		if raw[v] != '{' {
			return v, badf("input[%d]: want an object", at)
		}
		var it rItem
		end, err := w.object(v, func(k []byte, x int) (int, error) {
			val, end, err := w.raw(x)
			if err != nil {
				return end, err
			}
			switch string(key(k)) {
			case "type":
				it.typ = val
			case "role":
				it.role = val
			case "status":
				it.status = val
			case "content":
				it.content = val
			case "call_id":
				it.callID = val
			case "name":
				it.name = val
			case "arguments":
				it.arguments = val
			case "output":
				it.output = val
			case "summary":
				it.summary = val
			case "namespace":
				it.nsp = val
			}
			return end, nil
		})
		if err != nil {
			return end, err
		}
		cont = (it.typ == nil || strIs(it.typ, "message") || strIs(it.typ, "reasoning")) &&
			(strIs(it.status, "in_progress") || strIs(it.status, "incomplete"))
		return end, c.responsesItem(it, at)
	})
	return cont, end, err
}

func (c *convo) responsesItem(it rItem, at int) error {
	prev := c.prev() // the assistant message before, to merge into
	switch {
	case strIs(it.typ, "function_call"):
		// vLLM makes a ResponseFunctionToolCall of it, which needs these.
		if !isStr(it.callID) || !isStr(it.name) || !isStr(it.arguments) {
			return badf("input[%d]: a function_call needs string call_id, name and arguments", at)
		}
		if truthy(it.nsp) {
			c.unsure = true // a namespaced tool's flat name is not reproduced
		}
		tc := toolCall(it.callID, it.name, it.arguments)
		if prev != nil {
			prev.calls = append(prev.calls, tc)
			return nil
		}
		c.add(msg{role: "assistant", calls: [][]byte{tc}})
	case strIs(it.typ, "function_call_output"):
		if !isStr(it.callID) {
			return badf("input[%d]: a function_call_output needs a string call_id", at)
		}
		out := it.output
		var imgs []Image
		switch kind(out) {
		case '"':
		case '[':
			out, imgs = c.parts(out)
		default:
			return badf("input[%d].output: want a string or a list of content parts", at)
		}
		c.add(msg{role: "tool", callID: it.callID, content: out}, imgs...)
	case strIs(it.typ, "reasoning"):
		text := c.firstText(it.content)
		if text == nil {
			text = c.firstText(it.summary)
		}
		if text == nil {
			text = []byte(`""`)
		}
		if prev != nil && prev.reasoning == nil {
			prev.reasoning = text
			return nil
		}
		c.add(msg{role: "assistant", reasoning: text})
	case strIs(it.role, "assistant"):
		var text []byte
		switch kind(it.content) {
		case '"':
			text = it.content
		case '[':
			text = c.firstText(it.content)
		}
		if text == nil {
			text = []byte(`""`)
		}
		if prev != nil && prev.content == nil {
			prev.content = text
			return nil
		}
		c.add(msg{role: "assistant", content: text})
	case strIs(it.role, "user") || strIs(it.role, "system") || strIs(it.role, "developer"):
		m := msg{role: string(body(it.role))}
		var imgs []Image
		switch kind(it.content) {
		case '"':
			m.content = it.content
		case '[':
			m.content, imgs = c.parts(it.content)
		case 0, 'n':
		default:
			return badf("input[%d].content: want a string or a list of content parts", at)
		}
		if isStr(it.name) {
			m.name = it.name
		}
		c.add(m, imgs...)
	default:
		// Other items (item_reference, built-in tool calls) reach vLLM's
		// chat parser as they are, which has no message to make of them.
		c.unsure = true
	}
	return nil
}

// firstText is the text of the first entry of a reasoning item's content
// or summary, or of an assistant message's content: an object's "text",
// or the entry itself (utils.py _construct_message_from_response_item).
// It is nil when raw is not a non-empty list.
func (c *convo) firstText(raw []byte) []byte {
	if kind(raw) != '[' || !nonEmptyArray(raw) {
		return nil
	}
	var first []byte
	elems(raw, func(v []byte) error {
		if first == nil {
			first = v
		}
		return nil
	})
	if kind(first) != '{' {
		if !isStr(first) {
			c.unsure = true
			return []byte(`""`)
		}
		return first
	}
	var text []byte
	members(first, func(k, v []byte) error {
		if string(key(k)) == "text" {
			text = v
		}
		return nil
	})
	switch kind(text) {
	case 0:
		return []byte(`""`)
	case '"':
		return text
	}
	c.unsure = true
	return []byte(`""`)
}

// parts writes Responses content parts as chat content parts: input_text
// and output_text as text, input_image as image_url (with its uuid); chat
// parts pass as they are. It returns the images among them.
func (c *convo) parts(raw []byte) ([]byte, []Image) {
	b := make([]byte, 0, len(raw)+16)
	b = append(b, '[')
	var imgs []Image
	n := 0
	walkArray(raw, 0, func(v int) (int, error) {
		if n > 0 {
			b = append(b, ',')
		}
		n++
		if raw[v] != '{' {
			end := skipValue(raw, v)
			b = append(b, raw[v:end]...) // a bare string is a text part to vLLM
			if raw[v] != '"' {
				c.unsure = true
			}
			return end, nil
		}
		var typ, text, url, uuid []byte
		end, _ := walkObject(raw, v, func(k []byte, x int) (int, error) {
			end := skipValue(raw, x)
			switch string(key(k)) {
			case "type":
				typ = raw[x:end]
			case "text":
				text = raw[x:end]
			case "image_url":
				url = raw[x:end]
			case "uuid":
				uuid = raw[x:end]
			}
			return end, nil
		})
		if kind(uuid) == 'n' {
			uuid = nil
		}
		switch {
		case strIs(typ, "input_text") || strIs(typ, "output_text"):
			if !isStr(text) {
				c.unsure = true
				text = []byte(`""`)
			}
			b = textPart(b, text)
		case strIs(typ, "input_image"):
			if !isStr(url) {
				c.unsure = true // a file_id, which vLLM cannot fetch
				url = []byte(`""`)
			}
			b = imagePart(b, url, uuid)
			imgs = append(imgs, Image{UUID: uuidOf(uuid)})
		default:
			b = append(b, raw[v:end]...)
			if im, ok := chatImage(raw[v:end]); ok {
				imgs = append(imgs, im)
			} else if !strIs(typ, "text") && !strIs(typ, "refusal") {
				c.unsure = true
			}
		}
		return end, nil
	})
	return append(b, ']'), imgs
}

// responsesTools converts the function tools to chat tools
// (utils.py construct_tool_dicts): a flat {"type":"function","name",...}
// becomes {"type":"function","function":{...}} with every other member
// spliced in order, as FunctionDefinition.model_validate gets them. Tools
// of other types are not rendered. The result is written in room when it
// fits (see toolsSpace).
func responsesTools(raw, room []byte) ([]byte, error) {
	if kind(raw) == '[' && !nonEmptyArray(raw) {
		return nil, nil
	}
	return convertTools(raw, room, func(b []byte, v, at int) ([]byte, int, error) {
		// The tool is written as it is walked, and left out when it is
		// not a function's.
		b = append(b, `{"type":"function","function":{`...)
		var typ, nm []byte
		first := true
		end, _ := walkObject(raw, v, func(k []byte, x int) (int, error) {
			end := skipValue(raw, x)
			val := raw[x:end]
			switch string(key(k)) {
			case "type":
				typ = val
				return end, nil
			case "name":
				nm = val
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(append(append(append(b, '"'), k...), `":`...), val...)
			return end, nil
		})
		if !strIs(typ, "function") {
			return nil, end, nil
		}
		if !isStr(nm) {
			return nil, end, badf("tools[%d].name: a string is required", at)
		}
		return append(b, "}}"...), end, nil
	})
}

// nonEmptyArray reports whether the array v has an element.
func nonEmptyArray(v []byte) bool {
	s := scanner{b: v}
	return kind(v) == '[' && s.space(1) < len(v) && v[s.space(1)] != ']'
}
