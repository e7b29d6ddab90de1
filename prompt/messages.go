package prompt

import (
	"errors"
	"fmt"
)

// The Anthropic Messages conversion is vLLM's: AnthropicServingMessages.
// _convert_anthropic_to_openai_request and its helpers in
// vllm/entrypoints/anthropic/serving.py (vllm-project/vllm@0001948b),
// the request model in vllm/entrypoints/anthropic/protocol.py
// (@00589e56), and the placement of inline system messages in
// vllm/entrypoints/anthropic/inline_system.py (@a8c3bdb2) in its
// converter default, "preserve" (tests/entrypoints/anthropic: kept in
// place under a system prompt, folded into the neighbouring turns
// without one). vLLM's "auto" mode probes the model's chat template and
// may fold where we preserve; the simulator has no template to probe.
//
// Where vLLM would refuse the body with 400 for its JSON types or a
// missing required field, ParseAPI returns ErrBadJSON. An enum value the
// pinned protocol does not know (a block type, a role) is ErrNoPrompt
// instead: a newer vLLM may accept it, and routing must never refuse
// what the engine would serve (docs/design.md D6).

// billingHeader starts Claude Code's per-request attribution text, which
// vLLM strips from system text: it carries a hash per request and would
// defeat prefix caching.
const billingHeader = "x-anthropic-billing-header"

// aMsg is an Anthropic message: content is the string text, or blocks.
type aMsg struct {
	role string
	text []byte // a literal when the content is a string
	list bool   // the content is a list of blocks, maybe empty
	raw  []byte // the list, read into blocks when needed
	// blocks are the list's blocks: read with the messages (readAMsgs),
	// so a session's text is walked once, or for keeps (to rewrite
	// them). They are nil when not read, and the conversion reads raw
	// into scratch space: a list vLLM refuses is read where the
	// conversion meets it, so its error is the one it always was.
	blocks []aBlock
	at     int // the message's index, for errors
}

// load returns m's blocks: m.blocks when read, else raw read into
// scratch (which may be nil, to read them for keeps).
func (m *aMsg) load(scratch []aBlock) ([]aBlock, error) {
	if !m.list || m.blocks != nil {
		return m.blocks, nil
	}
	w := walker{s: scanner{b: m.raw}}
	blocks, _, err := readBlocks(&w, 0, scratch[:0], path{field: "messages", msg: m.at})
	return blocks, err
}

// keep reads m's blocks for keeps.
func (m *aMsg) keep() error {
	var err error
	if m.blocks == nil {
		m.blocks, err = m.load(nil)
	}
	return err
}

// aBlock is an Anthropic content block: its members are checked against
// vLLM's AnthropicContentBlock, and those its type uses are kept, raw
// (nil: absent or null). A session's blocks are all held (readAMsgs), so
// the members of different types share fields.
type aBlock struct {
	typ     string
	text    []byte    // a text block's text, a thinking block's thinking
	id      []byte    // a tool_use's id, a tool_result's tool_use_id
	name    []byte    // a tool_use's name
	obj     []byte    // an image's source, a tool_use's input (objects)
	content trContent // a tool_result's
}

// trContent is a tool_result block's content: absent or null, a string,
// or a list of objects.
type trContent struct {
	str   []byte // a literal
	items []trItem
	list  bool
}

// trItem is one object of a tool_result's content list, read as vLLM's
// _convert_user_tool_result reads it (dict lookups, not a model).
type trItem struct {
	typ            string
	text           []byte // a literal; nil when absent
	textBad        bool   // present but not a string: vLLM's join fails
	source         []byte
	toolName, name []byte // literals
}

func parseMessages(body []byte) (Prompt, error) {
	var f wireFields
	if err := f.scan(body, f.takeMessages); err != nil {
		return Prompt{}, err
	}
	p := Prompt{Chat: true}
	if err := f.common(&p); err != nil {
		return Prompt{}, err
	}
	if p.Model == "" {
		return Prompt{}, badf("model: a model is required")
	}
	if k := kind(f.maxTokens); k != '0' && k != '"' {
		return Prompt{}, badf("max_tokens: an integer is required")
	}
	if p.MaxTokens = jsonCount(f.maxTokens); p.MaxTokens <= 0 {
		return Prompt{}, badf("max_tokens: must be a positive integer")
	}
	if kind(f.messages) != '[' {
		return Prompt{}, badf("messages: a list of messages is required")
	}
	if err := checkToolChoice(f.toolChoice); err != nil {
		return Prompt{}, err
	}
	var err error
	if p.ChatTemplateKwargs, err = optObject(f.chatTemplateKwargs, "chat_template_kwargs"); err != nil {
		return Prompt{}, err
	}
	// vLLM's Messages takes cache_salt since vLLM issue 46688 (a
	// non-empty string) and passes it to the chat request
	// (tests/entrypoints/anthropic TestCacheSalt), where older versions
	// ignored it.
	if p.CacheSalt, err = jsonString(f.cacheSalt, "cache_salt", nil); err != nil {
		return Prompt{}, badf("%v", err)
	}
	if f.cacheSalt != nil && kind(f.cacheSalt) != 'n' && p.CacheSalt == "" {
		return Prompt{}, badf("cache_salt: must be a non-empty string")
	}
	effort, err := reasoningEffort(f.outputConfig, "output_config")
	if err != nil {
		return Prompt{}, err
	}
	p.ChatTemplateKwargs = withEffort(p.ChatTemplateKwargs, effort)

	t := f.msgs.v // what the scan made of the messages
	if !f.msgs.ok {
		w := walker{s: scanner{b: f.messages}}
		if t.msgs, _, err = readAMsgs(&w, 0); err != nil {
			return Prompt{}, err
		}
	}
	var system []byte // the top-level system text, billing header stripped
	switch kind(f.system) {
	case 0, 'n':
	case '"':
		system = f.system
	case '[':
		blocks := f.sysBlocks.v
		if !f.sysBlocks.ok {
			w := walker{s: scanner{b: f.system}}
			if blocks, _, err = readBlocks(&w, 0, nil, path{field: "system", msg: -1}); err != nil {
				return Prompt{}, err
			}
		}
		system = blocksText(blocks)
	default:
		return Prompt{}, badf("system: want a string or a list of content blocks")
	}
	if !t.streamed {
		if p.Tools, err = anthropicTools(f.tools, nil); err != nil {
			return Prompt{}, err
		}
	}

	c, unknown := t.c, t.unknown
	if t.streamed { // there is no inline system message to place
		if sys := joinLit(`\n\n`, true, system); truthy(sys) {
			c.insertFirst("system", sys)
		}
	} else {
		if c == nil {
			conv := newConvo(len(f.messages)+len(f.system), false)
			c = &conv
		}
		for _, m := range t.msgs {
			unknown = unknown || m.role == ""
		}
		leading, rest, err := placeInlineSystem(system, t.msgs)
		if err != nil {
			return Prompt{}, err
		}
		if sys := joinLit(`\n\n`, true, system, leading); truthy(sys) {
			c.add(msg{role: "system", content: sys})
		}
		for _, m := range rest {
			if err := c.anthropicMsg(m); err != nil {
				return Prompt{}, err
			}
		}
	}
	p.Messages, p.Images = c.json(), c.images
	// Converted in the scan, the messages have nothing after them to
	// refuse, and the tools go in the space left after them.
	if t.streamed {
		if p.Tools, err = anthropicTools(f.tools, c.spare()); err != nil {
			return Prompt{}, err
		}
	}
	if c.unsure || unknown {
		return p, ErrNoPrompt
	}
	return p, nil
}

// takenMsgs is what the body's scan made of the messages: the
// conversion itself, or the messages read for it.
type takenMsgs struct {
	// c is the conversion of the messages so far (nil: none). When
	// streamed it holds all of them, made as the scan met them, less the
	// system prompt; otherwise it is empty, made to be used.
	c        *convo
	streamed bool
	unknown  bool // a message's role is one vLLM does not know
	msgs     []aMsg
}

// errInline stops a conversion of messages in the scan at an inline
// system message: where it goes depends on what follows it.
var errInline = errors.New("inline system message")

// takeMessages converts the messages in the body's scan
// (scanObjectTaking's take), validating them as it goes, and reads the
// system blocks. The system prompt, which vLLM puts first, may come later
// in the body: the output has room for it. A body with an inline system
// message has its messages read instead, and converted after the scan. A
// list it cannot read whole, because it is not JSON or vLLM refuses it,
// is left to the scan and read after it, so errors are what they would be
// without it.
func (f *wireFields) takeMessages(key []byte, v int) int {
	if v >= len(f.body) || f.body[v] != '[' {
		return 0
	}
	w := walker{s: scanner{b: f.body}, check: true, depth: 1}
	switch string(key) {
	case "messages":
		c := newConvo(len(f.body)-v+len(f.system), false)
		t := takenMsgs{c: &c, streamed: true}
		end, err := c.anthropicMsgs(&w, v, &t.unknown)
		if err == errInline {
			c.reset()
			t.streamed, t.unknown = false, false
			t.msgs, end, err = readAMsgs(&w, v)
		}
		if err != nil {
			return 0
		}
		f.pending.msgs = reading[takenMsgs]{t, true}
		return end - v
	case "system":
		blocks, end, err := readBlocks(&w, v, nil, path{field: "system", msg: -1})
		if err != nil {
			return 0
		}
		f.pending.sysBlocks = reading[[]aBlock]{blocks, true}
		return end - v
	}
	return 0
}

// anthropicMsgs converts the messages list at w's i as it walks it,
// each message's blocks read into scratch space, until a message is an
// inline system message (errInline). It sets unknown when a role is one
// vLLM does not know.
func (c *convo) anthropicMsgs(w *walker, i int, unknown *bool) (int, error) {
	at := 0
	return w.array(i, func(v int) (int, error) {
		m, end, err := readAMsg(w, v, at, c.scratch[:0])
		if err != nil {
			return end, err
		}
		at++
		if m.blocks != nil {
			c.scratch = m.blocks
		}
		switch m.role {
		case "system":
			return end, errInline
		case "":
			*unknown = true
		}
		return end, c.anthropicMsg(m)
	})
}

// readAMsgs reads the messages list at w's i, and each message's blocks
// that vLLM takes (all of them into one array). A role vLLM does not know
// is kept with role "" (the conversion skips it, and ParseAPI says
// ErrNoPrompt).
func readAMsgs(w *walker, i int) ([]aMsg, int, error) {
	msgs := make([]aMsg, 0, 16)
	// chunk holds the blocks read so far in its length and has room for
	// more: each message's are read into its free end (a message's blocks
	// are contiguous), and one that outgrows it starts the next chunk, so
	// a block is copied at most once, into a chunk of its message's
	// size, and memory is what the blocks take.
	var chunk []aBlock
	end, err := w.array(i, func(v int) (int, error) {
		if cap(chunk)-len(chunk) < 8 {
			chunk = make([]aBlock, 0, min(2*cap(chunk)+16, 128))
		}
		free := chunk[len(chunk):len(chunk)]
		m, end, err := readAMsg(w, v, len(msgs), free)
		if err != nil {
			return end, err
		}
		if n := len(m.blocks); n > 0 {
			if cap(m.blocks) == cap(free) {
				chunk = chunk[:len(chunk)+n]
			} else {
				chunk = m.blocks
			}
			m.blocks = m.blocks[:n:n]
		}
		msgs = append(msgs, m)
		return end, nil
	})
	return msgs, end, err
}

// readAMsg reads the message at w's v, the at-th, its blocks appended to
// free (nil when there are none or vLLM refuses them: the conversion
// reads the list again, where it meets it, for its error).
func readAMsg(w *walker, v, at int, free []aBlock) (aMsg, int, error) {
	raw := w.s.b
	if raw[v] != '{' {
		return aMsg{}, v, badf("messages[%d]: want an object", at)
	}
	var role []byte
	m := aMsg{at: at}
	content := byte(0) // the content's kind
	end, err := w.object(v, func(k []byte, x int) (int, error) {
		switch string(key(k)) {
		case "role":
			end, err := w.skip(x)
			if err == nil {
				role = raw[x:end]
			}
			return end, err
		case "content":
			content = raw[x]
			switch content {
			case '"':
				end, err := w.str(x)
				m.text, m.blocks, m.list, m.raw = raw[x:end], nil, false, nil
				return end, err
			case '[':
				blocks, end, err := readBlocks(w, x, free, path{field: "messages", msg: at})
				if err != nil || len(blocks) == 0 { // walk it as a value
					blocks = nil
					end, err = w.skip(x)
				}
				m.text, m.list, m.raw, m.blocks = nil, true, raw[x:end], blocks
				return end, err
			}
		}
		return w.skip(x)
	})
	if err != nil {
		return aMsg{}, end, err
	}
	if !isStr(role) {
		return aMsg{}, end, badf("messages[%d].role: a string is required", at)
	}
	switch {
	case strIs(role, "user"), strIs(role, "ctx"), strIs(role, "msg"):
		m.role = "user" // Claude Code >= 2.1.154 sends ctx and msg; vLLM maps them to user
	case strIs(role, "assistant"):
		m.role = "assistant"
	case strIs(role, "system"):
		m.role = "system"
	}
	if content != '"' && content != '[' {
		return aMsg{}, end, badf("messages[%d].content: a string or a list of content blocks is required", at)
	}
	return m, end, nil
}

// path names a block for an error message, built only when one is.
type path struct {
	field      string // "system" or "messages"
	msg, block int    // msg < 0: a top-level list
}

func (p path) String() string {
	if p.msg < 0 {
		return fmt.Sprintf("%s[%d]", p.field, p.block)
	}
	return fmt.Sprintf("%s[%d].content[%d]", p.field, p.msg, p.block)
}

// readBlocks appends the list of content blocks at w's i to blocks and
// returns them and the list's end.
func readBlocks(w *walker, i int, blocks []aBlock, at path) ([]aBlock, int, error) {
	end, err := w.array(i, func(v int) (int, error) {
		at.block = len(blocks)
		blocks = append(blocks, aBlock{})
		return readBlock(w, v, &blocks[len(blocks)-1], at)
	})
	return blocks, end, err
}

// readBlock reads the content block at w's i and returns its end, checking
// its members' types as pydantic checks AnthropicContentBlock's. A block
// of a type vLLM does not know gets typ "?".
func readBlock(w *walker, i int, blk *aBlock, where path) (int, error) {
	b := w.s.b
	if b[i] != '{' {
		return i, badf("%s: want a content block object", where)
	}
	var typ, text, thinking, id, toolUseID, name, source, input []byte
	content := byte(0)
	end, err := w.object(i, func(k []byte, x int) (int, error) {
		if string(key(k)) == "content" {
			blk.content = trContent{}
			switch content = b[x]; content {
			case '"':
				end, err := w.str(x)
				blk.content.str = b[x:end]
				return end, err
			case '[':
				blk.content.list = true
				return w.array(x, func(v int) (int, error) {
					if b[v] != '{' {
						return v, badf("%s.content: want a string or a list of objects", where)
					}
					it, end, err := readTRItem(w, v)
					blk.content.items = append(blk.content.items, it)
					return end, err
				})
			}
			return w.skip(x)
		}
		val, end, err := w.raw(x)
		if err != nil {
			return end, err
		}
		switch string(key(k)) {
		case "type":
			typ = val
		case "text":
			text, err = blockMember(val, '"', "text", where)
		case "thinking":
			thinking, err = blockMember(val, '"', "thinking", where)
		case "id":
			id, err = blockMember(val, '"', "id", where)
		case "tool_use_id":
			toolUseID, err = blockMember(val, '"', "tool_use_id", where)
		case "name":
			name, err = blockMember(val, '"', "name", where)
		case "tool_name", "signature", "data":
			_, err = blockMember(val, '"', "tool_name, signature and data", where)
		case "source":
			source, err = blockMember(val, '{', "source", where)
		case "input":
			input, err = blockMember(val, '{', "input", where)
		}
		return end, err
	})
	if err != nil {
		return end, err
	}
	if !isStr(typ) {
		return end, badf("%s.type: a string is required", where)
	}
	blk.typ = "?"
	for _, t := range blockTypes {
		if strIs(typ, t) {
			blk.typ = t
			break
		}
	}
	switch blk.typ {
	case "text":
		blk.text = text
	case "thinking":
		blk.text = thinking
	case "image":
		blk.obj = source
	case "tool_use":
		blk.id, blk.name, blk.obj = id, name, input
	case "tool_result":
		blk.id = toolUseID
	}
	switch content {
	case 0, 'n', '"', '[':
		return end, nil
	}
	return end, badf("%s.content: want a string or a list of objects", where)
}

// blockTypes are the block types vLLM's AnthropicContentBlock takes.
var blockTypes = [...]string{"text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"}

// blockMember is optional for a block's member named field, of kind want
// ('"' or '{').
func blockMember(v []byte, want byte, field string, at path) ([]byte, error) {
	v, ok := optional(v, want)
	if ok {
		return v, nil
	}
	if want == '{' {
		return nil, badf("%s.%s: want an object", at, field)
	}
	return nil, badf("%s.%s: want a string", at, field)
}

func readTRItem(w *walker, i int) (trItem, int, error) {
	var it trItem
	end, err := w.object(i, func(k []byte, x int) (int, error) {
		val, end, err := w.raw(x)
		if err != nil {
			return end, err
		}
		switch string(key(k)) {
		case "type":
			it.typ = ""
			for _, t := range [...]string{"text", "image", "tool_reference"} {
				if strIs(val, t) {
					it.typ = t
				}
			}
		case "text":
			it.text, it.textBad = val, !isStr(val)
		case "source":
			it.source = val
		case "tool_name":
			it.toolName = val
		case "name":
			it.name = val
		}
		return end, nil
	})
	return it, end, err
}

// blocksText is the text of system blocks: their text blocks joined,
// without Claude Code's billing header (inline_system.py _blocks_text).
func blocksText(blocks []aBlock) []byte {
	var texts [][]byte
	for _, b := range blocks {
		if b.typ == "text" && truthy(b.text) && !hasPrefix(b.text, billingHeader) {
			texts = append(texts, b.text)
		}
	}
	return joinLit("", false, texts...)
}

// systemText is an inline system message's text (inline_system.py
// system_text).
func systemText(m *aMsg) ([]byte, error) {
	if !m.list {
		if hasPrefix(m.text, billingHeader) {
			return []byte(`""`), nil
		}
		return m.text, nil
	}
	err := m.keep()
	return blocksText(m.blocks), err
}

// placeInlineSystem is inline_system.py's normalize_inline_system in
// "preserve" mode: system messages leading the list join the system
// prompt (returned as leading); later ones stay where they are, moved
// past the results of a tool call they interrupt, when there is a system
// prompt, and are folded into the neighbouring user turns when there is
// none.
func placeInlineSystem(system []byte, msgs []aMsg) (leading []byte, rest []aMsg, err error) {
	inline := false
	for _, m := range msgs {
		inline = inline || m.role == "system"
	}
	if !inline {
		return nil, msgs, nil
	}
	n := 0
	var lead [][]byte
	for ; n < len(msgs) && msgs[n].role == "system"; n++ {
		t, err := systemText(&msgs[n])
		if err != nil {
			return nil, nil, err
		}
		lead = append(lead, t)
	}
	leading = joinLit(`\n\n`, true, lead...)
	if rest, err = outOfToolRuns(msgs[n:]); err != nil {
		return nil, nil, err
	}
	if truthy(system) || truthy(leading) {
		return leading, rest, nil
	}
	var out []aMsg
	var pending [][]byte // system text after an assistant turn
	for _, m := range rest {
		if err := m.keep(); err != nil {
			return nil, nil, err
		}
		if m.role == "system" {
			t, _ := systemText(&m)
			if !truthy(t) {
				continue
			}
			if len(out) > 0 && out[len(out)-1].role == "user" && len(pending) == 0 {
				out[len(out)-1] = appendToUser(out[len(out)-1], t)
			} else {
				pending = append(pending, t)
			}
			continue
		}
		if pending != nil {
			t := joinLit(`\n\n`, true, pending...)
			pending = nil
			if m.role == "user" {
				m = addText(m, t, false)
			} else {
				out = append(out, aMsg{role: "user", text: t})
			}
		}
		out = append(out, m)
	}
	if pending != nil {
		out = append(out, aMsg{role: "user", text: joinLit(`\n\n`, true, pending...)})
	}
	return leading, out, nil
}

// outOfToolRuns moves system messages that sit between an assistant's
// tool_use and the user message answering it to after that message
// (inline_system.py _move_out_of_tool_runs).
func outOfToolRuns(msgs []aMsg) ([]aMsg, error) {
	out := make([]aMsg, 0, len(msgs))
	var held []aMsg
	var scratch []aBlock
	awaiting := false
	for i := range msgs {
		m := msgs[i]
		if m.role == "system" {
			if awaiting {
				held = append(held, m)
			} else {
				out = append(out, m)
			}
			continue
		}
		if m.role == "assistant" {
			out, held = append(out, held...), held[:0]
		}
		out = append(out, m)
		if m.role == "user" {
			out, held = append(out, held...), held[:0]
		}
		awaiting = false
		if m.role == "assistant" && m.list {
			blocks, err := m.load(scratch)
			if err != nil {
				return nil, err
			}
			if m.blocks == nil {
				scratch = blocks
			}
			for _, b := range blocks {
				awaiting = awaiting || b.typ == "tool_use"
			}
		}
	}
	return append(out, held...), nil
}

// appendToUser joins text onto a user message's own text or, when it holds
// only tool results, onto the last result (inline_system.py
// _append_to_user).
func appendToUser(m aMsg, text []byte) aMsg {
	allResults := m.list && len(m.blocks) > 0
	for _, b := range m.blocks {
		allResults = allResults && b.typ == "tool_result"
	}
	if allResults {
		blocks := append([]aBlock(nil), m.blocks...)
		last := &blocks[len(blocks)-1]
		last.content = addTRText(last.content, text)
		m.blocks = blocks
		return m
	}
	if !m.list {
		return addText(m, text, true)
	}
	var results, own []aBlock
	for _, b := range m.blocks {
		if b.typ == "tool_result" {
			results = append(results, b)
		} else {
			own = append(own, b)
		}
	}
	m.blocks = own
	m = addText(m, text, true)
	m.blocks = append(results, m.blocks...)
	return m
}

// addText joins text onto the text at one end of m's content, merging into
// an adjacent text block rather than adding one, since some templates glue
// text blocks together (inline_system.py _add_text).
func addText(m aMsg, text []byte, atEnd bool) aMsg {
	if !m.list {
		if atEnd {
			m.text = joinLit(`\n\n`, true, m.text, text)
		} else {
			m.text = joinLit(`\n\n`, true, text, m.text)
		}
		return m
	}
	blocks := append([]aBlock(nil), m.blocks...)
	end := 0
	if atEnd {
		end = len(blocks) - 1
	}
	switch {
	case len(blocks) > 0 && blocks[end].typ == "text" && atEnd:
		blocks[end].text = joinLit(`\n\n`, true, blocks[end].text, text)
	case len(blocks) > 0 && blocks[end].typ == "text":
		blocks[end].text = joinLit(`\n\n`, true, text, blocks[end].text)
	case atEnd:
		blocks = append(blocks, aBlock{typ: "text", text: text})
	default:
		blocks = append([]aBlock{{typ: "text", text: text}}, blocks...)
	}
	m.blocks = blocks
	return m
}

// addTRText is addText at the end of a tool result's content.
func addTRText(c trContent, text []byte) trContent {
	if !c.list {
		c.str = joinLit(`\n\n`, true, c.str, text)
		return c
	}
	items := append([]trItem(nil), c.items...)
	if n := len(items); n > 0 && items[n-1].typ == "text" {
		old := items[n-1].text
		if items[n-1].textBad || !isStr(old) {
			old = nil // Python's `or ""`: a falsy non-string text
		}
		items[n-1].text, items[n-1].textBad = joinLit(`\n\n`, true, old, text), false
	} else {
		items = append(items, trItem{typ: "text", text: text})
	}
	c.items = items
	return c
}

// anthropicMsg converts one message (serving.py _convert_messages).
func (c *convo) anthropicMsg(m aMsg) error {
	switch {
	case m.role == "":
		return nil
	case m.role == "system": // inline, kept in place
		t, err := systemText(&m)
		if truthy(t) {
			c.add(msg{role: "system", content: t})
		}
		return err
	case !m.list:
		c.add(msg{role: m.role, content: m.text})
		return nil
	}
	blocks, err := m.load(c.scratch)
	if err != nil {
		return err
	}
	if m.blocks == nil {
		c.scratch = blocks
	}
	// vLLM appends a user's tool results as it meets them, before the
	// message itself; the message is then written straight into the
	// output, its parts counted first for the one-text-part rule.
	nparts, nimgs, ncalls := 0, 0, 0
	var single, resultText []byte // the one part's text; an assistant's tool result's
	var thinking [][]byte
	for _, b := range blocks {
		switch b.typ {
		case "text":
			if truthy(b.text) {
				nparts, single = nparts+1, b.text
			}
		case "image":
			if nonEmptyObject(b.obj) {
				nparts, nimgs, single = nparts+1, nimgs+1, nil
			}
		case "thinking":
			if b.text != nil {
				thinking = append(thinking, b.text)
			}
		case "tool_use":
			ncalls++
		case "tool_result":
			if m.role == "user" {
				c.userToolResult(b)
				continue
			}
			resultText = c.assistantToolResult(b)
			nparts, single = nparts+1, resultText
		case "?":
			c.unsure = true
		}
	}
	if m.role == "user" && nparts == 0 {
		return nil
	}
	c.flush()
	for range nimgs {
		c.images = append(c.images, Image{Message: c.n})
	}
	c.n++
	b := c.out
	if len(b) > 1 {
		b = append(b, ',')
	}
	b = append(append(append(b, `{"role":"`...), m.role...), '"')
	switch {
	case nparts == 1 && single != nil:
		b = append(append(b, `,"content":`...), single...)
	case nparts > 0:
		b = append(b, `,"content":[`...)
		first := true
		sep := func() {
			if !first {
				b = append(b, ',')
			}
			first = false
		}
		for _, blk := range blocks {
			switch blk.typ {
			case "text":
				if truthy(blk.text) {
					sep()
					b = textPart(b, blk.text)
				}
			case "image":
				if nonEmptyObject(blk.obj) {
					sep()
					b = imagePart(b, c.imageURL(blk.obj), nil)
				}
			case "tool_result": // a user's became tool messages
				if m.role != "user" {
					sep()
					b = textPart(b, c.assistantToolResult(blk))
				}
			}
		}
		b = append(b, ']')
	}
	if thinking != nil {
		b = append(append(b, `,"reasoning":`...), joinLit("", false, thinking...)...)
	}
	if ncalls > 0 {
		b = append(b, `,"tool_calls":[`...)
		first := true
		for _, blk := range blocks {
			if blk.typ == "tool_use" {
				if !first {
					b = append(b, ',')
				}
				first = false
				b = c.toolUse(b, blk)
			}
		}
		b = append(b, ']')
	}
	c.out = append(b, '}')
	return nil
}

// assistantToolResult is the text vLLM makes of an assistant's tool_result
// block: "Tool result: " and str(block.content).
func (c *convo) assistantToolResult(b aBlock) []byte {
	text := []byte(`""`)
	switch {
	case truthy(b.content.str):
		text = b.content.str
	case len(b.content.items) > 0:
		c.unsure = true // Python's repr of a list of dicts
	}
	return joinLit("", false, lit("Tool result: "), text)
}

// toolUse is a tool_use block as a chat tool call
// (serving.py _convert_tool_use_block). vLLM writes the arguments with
// json.dumps(block.input or {}); the chat renderer parses them back into
// a dict (chat_utils.py _postprocess_messages), so the input's own JSON
// text renders the same and is spliced as it came.
func (c *convo) toolUse(out []byte, b aBlock) []byte {
	id := b.id
	if !truthy(id) {
		id = lit("call_0") // vLLM: f"call_{int(time.time())}"
		c.unsure = true
	}
	fn := b.name
	if fn == nil {
		fn = []byte(`""`)
	}
	out = append(append(out, `{"id":`...), id...)
	out = append(append(out, `,"type":"function","function":{"name":`...), fn...)
	out = append(out, `,"arguments":`...)
	if nonEmptyObject(b.obj) {
		out = appendRawString(out, b.obj)
	} else {
		out = append(out, `"{}"`...)
	}
	return append(out, "}}"...)
}

// userToolResult converts a user's tool_result block: a tool message with
// its text, then a user message with its images, then a tool message with
// its tool references (serving.py _convert_user_tool_result).
func (c *convo) userToolResult(b aBlock) {
	text := []byte(`""`)
	var urls, refs [][]byte
	switch {
	case b.content.str != nil:
		text = b.content.str
	case b.content.list:
		var texts [][]byte
		for _, it := range b.content.items {
			switch it.typ {
			case "text":
				switch {
				case it.text == nil:
					texts = append(texts, []byte(`""`))
				case it.textBad:
					c.unsure = true // vLLM's join fails on it
				default:
					texts = append(texts, it.text)
				}
			case "image":
				src := it.source
				if src == nil {
					src = []byte("{}")
				}
				if kind(src) != '{' {
					c.unsure = true
					continue
				}
				if u := c.imageURL(src); truthy(u) {
					urls = append(urls, u)
				}
			case "tool_reference":
				switch {
				case isStr(it.toolName) && truthy(it.toolName):
					refs = append(refs, it.toolName)
				case isStr(it.name) && truthy(it.name):
					refs = append(refs, it.name)
				}
			}
		}
		text = joinLit(`\n`, false, texts...)
	}
	id := b.id
	if id == nil {
		id = []byte(`""`)
	}
	c.add(msg{role: "tool", callID: id, content: text})
	if urls != nil {
		parts := []byte{'['}
		imgs := make([]Image, len(urls))
		for i, u := range urls {
			if i > 0 {
				parts = append(parts, ',')
			}
			parts = imagePart(parts, u, nil)
		}
		c.add(msg{role: "user", content: append(parts, ']')}, imgs...)
	}
	if refs != nil {
		parts := []byte{'['}
		for i, r := range refs {
			if i > 0 {
				parts = append(parts, ',')
			}
			parts = append(append(append(parts, `{"type":"tool_reference","name":`...), r...), '}')
		}
		c.add(msg{role: "tool", callID: id, content: append(parts, ']')})
	}
}

// imageURL is an image source as a URL (serving.py
// _convert_image_source_to_url): a "url" source's url, else a data URL of
// media_type (default image/jpeg) and data. Python formats a null there
// as "None"; a value of another type is not reproduced.
func (c *convo) imageURL(source []byte) []byte {
	var typ, url, media, data []byte
	members(source, func(k, v []byte) error {
		switch string(key(k)) {
		case "type":
			typ = v
		case "url":
			url = v
		case "media_type":
			media = v
		case "data":
			data = v
		}
		return nil
	})
	str := func(v []byte, absent string) []byte {
		switch kind(v) {
		case 0:
			return lit(absent)
		case 'n':
			return lit("None")
		case '"':
			return v
		}
		c.unsure = true
		return lit(absent)
	}
	if strIs(typ, "url") {
		if kind(url) == 'n' {
			c.unsure = true
		}
		return str(url, "")
	}
	return joinLit("", false, lit("data:"), str(media, "image/jpeg"), lit(";base64,"), str(data, ""))
}

// anthropicTools converts tools to chat tools (serving.py _convert_tools):
// {"type":"function","function":{"name","description","parameters"}},
// the input schema spliced as sent. vLLM's AnthropicTool validator adds
// "type":"object" to a schema without a type (at the end, where a Python
// dict puts a new key), and defer_loading goes along when set. The result
// is written in room when it fits (see toolsSpace).
func anthropicTools(raw, room []byte) ([]byte, error) {
	return convertTools(raw, room, func(b []byte, v, at int) ([]byte, int, error) {
		var nm, desc, schema, deferLoading []byte
		typed := false // schema has a type
		end, _ := walkObject(raw, v, func(k []byte, x int) (int, error) {
			if string(key(k)) == "input_schema" && raw[x] == '{' {
				typed = false
				end, _ := walkObject(raw, x, func(k []byte, y int) (int, error) {
					typed = typed || string(key(k)) == "type"
					return skipValue(raw, y), nil
				})
				schema = raw[x:end]
				return end, nil
			}
			end := skipValue(raw, x)
			switch string(key(k)) {
			case "name":
				nm = raw[x:end]
			case "description":
				desc = raw[x:end]
			case "input_schema":
				schema = raw[x:end]
			case "defer_loading":
				deferLoading = raw[x:end]
			}
			return end, nil
		})
		if !isStr(nm) {
			return nil, end, badf("tools[%d].name: a string is required", at)
		}
		if k := kind(desc); k != 0 && k != 'n' && k != '"' {
			return nil, end, badf("tools[%d].description: want a string", at)
		}
		if kind(schema) != '{' {
			return nil, end, badf("tools[%d].input_schema: an object is required", at)
		}
		b = append(append(b, `{"type":"function","function":{"name":`...), nm...)
		if kind(desc) == '"' {
			b = append(append(b, `,"description":`...), desc...)
		}
		b = append(b, `,"parameters":`...)
		b = appendSchema(b, schema, typed)
		if k := kind(deferLoading); k == 't' || k == 'f' {
			b = append(append(b, `,"defer_loading":`...), deferLoading...)
		}
		return append(b, "}}"...), end, nil
	})
}

// appendSchema appends an input schema, with "type":"object" added last
// when it has no type.
func appendSchema(b, schema []byte, typed bool) []byte {
	if typed {
		return append(b, schema...)
	}
	end := len(schema) - 1 // the closing brace
	b = append(b, schema[:end]...)
	if nonEmptyObject(schema) {
		b = append(b, ',')
	}
	return append(b, `"type":"object"}`...)
}

// checkToolChoice checks tool_choice as AnthropicToolChoice does.
func checkToolChoice(raw []byte) error {
	switch kind(raw) {
	case 0, 'n':
		return nil
	case '{':
	default:
		return badf("tool_choice: want an object")
	}
	var typ, nm []byte
	members(raw, func(k, v []byte) error {
		switch string(key(k)) {
		case "type":
			typ = v
		case "name":
			nm = v
		}
		return nil
	})
	if !isStr(typ) {
		return badf("tool_choice.type: a string is required")
	}
	if _, err := optStr(nm, "tool_choice.name"); err != nil {
		return err
	}
	if t, _ := jsonString(typ, "", nil); t == "tool" && !truthy(nm) {
		return badf("tool_choice.name: required when tool_choice.type is 'tool'")
	}
	return nil
}

// reasoningEffort is the "effort" of raw, the object in the body's member
// field (Messages' output_config, Responses' reasoning), an optional
// string: vLLM passes it to the chat template as reasoning_effort
// (serving.py _handle_output_config, ResponsesRequest.build_chat_params).
func reasoningEffort(raw []byte, field string) ([]byte, error) {
	switch kind(raw) {
	case 0, 'n':
		return nil, nil
	case '{':
	default:
		return nil, badf("%s: want an object", field)
	}
	var e []byte
	members(raw, func(k, v []byte) error {
		if string(key(k)) == "effort" {
			e = v
		}
		return nil
	})
	return optStr(e, field+".effort")
}

// withEffort adds reasoning_effort to chat template kwargs: vLLM's chat
// renderer passes a request's reasoning_effort to the template as a
// kwarg over the client's own (ChatParams' merge_kwargs). A duplicate
// name's last value wins in Python's json, so appending it is the merge.
func withEffort(kwargs, effort []byte) []byte {
	if effort == nil {
		return kwargs
	}
	if kwargs == nil {
		return append(append([]byte(`{"reasoning_effort":`), effort...), '}')
	}
	b := append([]byte(nil), kwargs[:len(kwargs)-1]...)
	if nonEmptyObject(kwargs) {
		b = append(b, ',')
	}
	return append(append(append(b, `"reasoning_effort":`...), effort...), '}')
}

// optObject is optional for an object member named field.
func optObject(v []byte, field string) ([]byte, error) {
	v, ok := optional(v, '{')
	if !ok {
		return nil, badf("%s: want an object", field)
	}
	return v, nil
}
