package vllmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
)

// ErrBadChat: the chat request cannot be rendered (vLLM answers 400).
var ErrBadChat = errors.New("invalid chat request")

// Special token ids. They are small, as in real vocabularies, and their
// literal text is recognised wherever it appears in input (as Hugging Face
// tokenizers do by default).
const (
	TokenEndOfText uint32 = 0 // <|endoftext|>
	TokenBOS       uint32 = 1 // <|begin_of_text|>, added by addSpecial
	TokenIMStart   uint32 = 2 // <|im_start|>
	TokenIMEnd     uint32 = 3 // <|im_end|>
	TokenPad       uint32 = 4 // <|pad|>
	// Llama 3's header and turn-end tokens.
	TokenStartHeader uint32 = 5 // <|start_header_id|>
	TokenEndHeader   uint32 = 6 // <|end_header_id|>
	TokenEOT         uint32 = 7 // <|eot_id|>
	// Qwen2-VL's image tokens, written only by the chat template around an
	// image (ChatMM). Their literal text in input stays plain text, so text
	// tokenizes as it did before images existed.
	TokenVisionStart uint32 = 8  // <|vision_start|>
	TokenVisionEnd   uint32 = 9  // <|vision_end|>
	TokenImagePad    uint32 = 10 // <|image_pad|>
)

// DefaultImageTokens is how many placeholder tokens an image takes unless
// set otherwise (Qwen2-VL gives a 224×224 image 64).
const DefaultImageTokens = 64

var specials = []string{"<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>",
	"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}

// imageSpecials are the texts of the ids from TokenVisionStart on, for
// Decode only.
var imageSpecials = []string{"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"}

// Vocabulary layout. Ids below numSpecial are specials (some reserved),
// then one token per byte (fallback for anything else), then every
// lowercase chunk of 1–4 letters with and without a leading space (ids
// computed, not stored), then the stored pieces: common words in four
// casings, ASCII punctuation and digits, whitespace runs.
const (
	numSpecial   = 16
	byteBase     = numSpecial
	chunkBase    = byteBase + 256
	maxChunk     = 4
	chunkPerLead = 26 + 26*26 + 26*26*26 + 26*26*26*26
	pieceBase    = chunkBase + 2*chunkPerLead
)

// chunkOffset is the index of the first chunk of length l among the
// chunks of one lead (shorter chunks come first).
func chunkOffset(l int) int {
	off, p := 0, 1
	for range l - 1 {
		p *= 26
		off += p
	}
	return off
}

// Tokenizer is the simulator's deterministic tokenizer and chat template.
// It is lossless (Decode(Encode(s)) == s for any string), so Encode's
// output is canonical: Encode(Decode(ids)) == ids for every ids Encode or
// the engine produced. Text is split into pieces (a letter run with its
// leading space, one digit or punctuation mark with its leading space,
// a whitespace run); a piece that is a known word is one token, others are
// cut greedily into the longest known pieces and lowercase chunks. English
// comes out at roughly four characters per token. It is safe for
// concurrent use (immutable after NewTokenizer).
type Tokenizer struct {
	ids    map[string]uint32
	pieces []string // stored pieces by id - pieceBase
	maxLen int      // longest stored piece in bytes
	// Generator vocabulary: each entry is one canonical token.
	lower, capital, capSpace []uint32 // " word", "Word", " Word"
	period, comma            uint32
	memo                     *memo // nil: encode everything
	imageTokens              int   // placeholder tokens per image
}

// NewTokenizer builds the vocabulary (a few milliseconds; build once).
func NewTokenizer() *Tokenizer { return NewTokenizerMemo(0) }

// NewTokenizerMemo is NewTokenizer remembering the encodings of long texts
// in up to memoBytes of texts and ids (0: none). The output is the same;
// only the simulator's own CPU changes (see memo).
func NewTokenizerMemo(memoBytes int) *Tokenizer {
	t := &Tokenizer{ids: make(map[string]uint32), imageTokens: DefaultImageTokens}
	if memoBytes > 0 {
		t.memo = newMemo(memoBytes)
	}
	add := func(p string) uint32 {
		if id, ok := t.ids[p]; ok {
			return id
		}
		id := uint32(pieceBase + len(t.pieces))
		t.ids[p] = id
		t.pieces = append(t.pieces, p)
		t.maxLen = max(t.maxLen, len(p))
		return id
	}
	for c := byte('!'); c <= '~'; c++ {
		if c >= 'a' && c <= 'z' {
			continue // lowercase letters are chunks
		}
		add(string(c))
		add(" " + string(c))
	}
	for _, ws := range []string{" ", "\n", "\t", "\r", "\v", "\f", "  ", "   ", "    ", "        ",
		"\n\n", "\n\n\n", "\r\n", "\t\t", " \n", "\n    ", "\n        "} {
		add(ws)
	}
	for _, w := range strings.Fields(words) {
		c := strings.ToUpper(w[:1]) + w[1:]
		t.lower = append(t.lower, add(" "+w))
		add(w)
		t.capital = append(t.capital, add(c))
		t.capSpace = append(t.capSpace, add(" "+c))
	}
	t.period, t.comma = t.ids["."], t.ids[","]
	return t
}

// WithImageTokens returns a tokenizer that renders each image as n
// placeholder tokens (n < 1: DefaultImageTokens), sharing t's vocabulary
// and memo; t is unchanged.
func (t *Tokenizer) WithImageTokens(n int) *Tokenizer {
	if n < 1 {
		n = DefaultImageTokens
	}
	c := *t
	c.imageTokens = n
	return &c
}

// ImageTokens is how many placeholder tokens one image takes.
func (t *Tokenizer) ImageTokens() int { return t.imageTokens }

// VocabSize is the number of token ids (specials, bytes, chunks, pieces).
func (t *Tokenizer) VocabSize() int { return pieceBase + len(t.pieces) }

// Encode tokenizes text (~4 characters per token on English). addSpecial
// prepends the BOS token, as add_special_tokens does for completions.
func (t *Tokenizer) Encode(text string, addSpecial bool) []uint32 {
	ids := make([]uint32, 0, len(text)/3+2)
	if addSpecial {
		ids = append(ids, TokenBOS)
	}
	return t.encode(ids, text)
}

func (t *Tokenizer) encode(ids []uint32, text string) []uint32 {
	if t.memo == nil || len(text) < memoMinText {
		return t.encodeText(ids, text)
	}
	if got, ok := t.memo.get(text); ok {
		return append(ids, got...)
	}
	got := t.encodeText(make([]uint32, 0, len(text)/3), text)
	// The key is cloned: text may be part of a larger string (a trimmed
	// message), which the memo would otherwise keep alive whole.
	t.memo.put(strings.Clone(text), got)
	return append(ids, got...)
}

func (t *Tokenizer) encodeText(ids []uint32, text string) []uint32 {
	for len(text) > 0 {
		i := strings.Index(text, "<|")
		if i < 0 {
			return t.encodePlain(ids, text)
		}
		ids = t.encodePlain(ids, text[:i])
		text = text[i:]
		matched := false
		for id, s := range specials {
			if strings.HasPrefix(text, s) {
				ids = append(ids, uint32(id))
				text = text[len(s):]
				matched = true
				break
			}
		}
		if !matched {
			ids = t.encodePlain(ids, text[:2])
			text = text[2:]
		}
	}
	return ids
}

// encodePlain tokenizes text that holds no special-token literal.
func (t *Tokenizer) encodePlain(ids []uint32, text string) []uint32 {
	for len(text) > 0 {
		n := pieceLen(text)
		ids = t.encodePiece(ids, text[:n])
		text = text[n:]
	}
	return ids
}

func isLetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }
func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}
func isPunct(c byte) bool { return c > ' ' && c < 0x7f && !isLetter(c) && !isDigit(c) }

// pieceLen is the length of the piece that starts text (pre-tokenization).
func pieceLen(s string) int {
	c := s[0]
	switch {
	case c == ' ' && len(s) > 1 && isLetter(s[1]):
		return 1 + letterRun(s[1:])
	case c == ' ' && len(s) > 1 && (isDigit(s[1]) || isPunct(s[1])):
		return 2
	case isLetter(c):
		return letterRun(s)
	case isSpace(c):
		n := 1
		for n < len(s) && isSpace(s[n]) {
			n++
		}
		// Leave a final space to the word, digit or mark that follows.
		if n > 1 && s[n-1] == ' ' && n < len(s) && (isLetter(s[n]) || isDigit(s[n]) || isPunct(s[n])) {
			n--
		}
		return n
	}
	return 1 // a digit, a mark, or a byte outside ASCII/printable
}

func letterRun(s string) int {
	n := 0
	for n < len(s) && isLetter(s[n]) {
		n++
	}
	return n
}

func (t *Tokenizer) encodePiece(ids []uint32, p string) []uint32 {
	if id, ok := t.ids[p]; ok {
		return append(ids, id)
	}
	for i := 0; i < len(p); {
		best, n := uint32(0), 0
		for l := min(t.maxLen, len(p)-i); l > 0; l-- {
			if id, ok := t.ids[p[i:i+l]]; ok {
				best, n = id, l
				break
			}
		}
		if id, l := chunkAt(p[i:]); l > n {
			best, n = id, l
		}
		if n == 0 {
			best, n = byteBase+uint32(p[i]), 1
		}
		ids = append(ids, best)
		i += n
	}
	return ids
}

// chunkAt returns the id and length of the longest lowercase chunk (with
// an optional leading space) at the start of s, or length 0.
func chunkAt(s string) (uint32, int) {
	lead, i := 0, 0
	if len(s) > 0 && s[0] == ' ' {
		lead, i = 1, 1
	}
	v, l := 0, 0
	for l < maxChunk && i+l < len(s) && s[i+l] >= 'a' && s[i+l] <= 'z' {
		v = v*26 + int(s[i+l]-'a')
		l++
	}
	if l == 0 {
		return 0, 0
	}
	return uint32(chunkBase + lead*chunkPerLead + chunkOffset(l) + v), i + l
}

// Decode turns ids back into text; Encode(Decode(ids)) == ids for ids the
// engine generates. Ids outside the vocabulary decode to nothing.
func (t *Tokenizer) Decode(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id < uint32(len(specials)):
			b.WriteString(specials[id])
		case id < TokenVisionStart+uint32(len(imageSpecials)):
			b.WriteString(imageSpecials[id-TokenVisionStart])
		case id < byteBase:
		case id < chunkBase:
			b.WriteByte(byte(id - byteBase))
		case id < pieceBase:
			writeChunk(&b, int(id-chunkBase))
		case int(id-pieceBase) < len(t.pieces):
			b.WriteString(t.pieces[id-pieceBase])
		}
	}
	return b.String()
}

func writeChunk(b *strings.Builder, x int) {
	if x >= chunkPerLead {
		b.WriteByte(' ')
		x -= chunkPerLead
	}
	l := maxChunk
	for l > 1 && x < chunkOffset(l) {
		l--
	}
	x -= chunkOffset(l)
	var buf [maxChunk]byte
	for i := l - 1; i >= 0; i-- {
		buf[i] = 'a' + byte(x%26)
		x /= 26
	}
	b.Write(buf[:l])
}

// generator returns the engine's "model": a deterministic stream of
// canonical tokens spelling pseudo-English sentences, seeded per request.
func (t *Tokenizer) generator(seed uint64) func() uint32 {
	const (
		start = iota
		inSentence
		afterPeriod
		afterComma
	)
	state, x := start, seed
	return func() uint32 {
		// splitmix64
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		z ^= z >> 31
		w := int(z % uint64(len(t.lower)))
		switch state {
		case start:
			state = inSentence
			return t.capital[w]
		case afterPeriod:
			state = inSentence
			return t.capSpace[w]
		case afterComma:
			state = inSentence
			return t.lower[w]
		}
		switch (z >> 40) % 16 {
		case 0:
			state = afterPeriod
			return t.period
		case 1:
			state = afterComma
			return t.comma
		}
		return t.lower[w]
	}
}

// Chat renders messages through the chat template and tokenizes them. The
// template is ChatML: "<|im_start|>role\ncontent<|im_end|>\n" per message;
// tools go into a system turn first (merged with a leading system message);
// AddGenerationPrompt appends "<|im_start|>assistant\n";
// ContinueFinalMessage leaves the last message open (no <|im_end|>).
// Each segment is tokenized on its own, so turn N+1 of a conversation
// starts with turn N's prompt followed by turn N's generated tokens.
// Images render as in ChatMM.
func (t *Tokenizer) Chat(msgs []Message, o ChatOptions) ([]uint32, error) {
	ids, _, err := t.ChatMM(msgs, o)
	return ids, err
}

// ChatMM is Chat that also returns each image's placement, in prompt
// order. An image renders as TokenVisionStart, ImageTokens() copies of
// TokenImagePad, TokenVisionEnd (Qwen2-VL's
// <|vision_start|><|image_pad|>*N<|vision_end|>); its placement covers the
// N pad tokens, as vLLM's mm_placeholders do. Text parts of one message are
// joined with "\n" (as vLLM does for string-content templates); an image
// sits between them where it was, with no separator (as Qwen2-VL's
// template writes it inline). Without images the tokens are Chat's and the
// placements nil. An image without an ID is ErrBadChat.
func (t *Tokenizer) ChatMM(msgs []Message, o ChatOptions) ([]uint32, []MMPlacement, error) {
	if o.AddGenerationPrompt && o.ContinueFinalMessage {
		return nil, nil, fmt.Errorf("%w: add_generation_prompt and continue_final_message are both set", ErrBadChat)
	}
	if o.ContinueFinalMessage && len(msgs) == 0 {
		return nil, nil, fmt.Errorf("%w: continue_final_message needs a message", ErrBadChat)
	}
	for i, m := range msgs {
		for j, p := range m.Parts {
			if p.Image != nil && p.Image.ID == "" {
				return nil, nil, fmt.Errorf("%w: messages[%d].content[%d]: image without an id", ErrBadChat, i, j)
			}
		}
	}
	tools, err := compactTools(o.Tools)
	if err != nil {
		return nil, nil, err
	}
	r := render{t: t}
	if o.Template == Llama3 {
		r.llama3(msgs, o, tools)
		return r.ids, r.mm, nil
	}
	if tools != "" {
		var sys []seg
		if len(msgs) > 0 && msgs[0].Role == "system" {
			sys = withText(content(msgs[0]), "\n\n")
			msgs = msgs[1:]
		}
		sys = withText(sys, toolsHeader+tools+toolsFooter)
		r.turn("system", sys, !(o.ContinueFinalMessage && len(msgs) == 0))
	}
	for i, m := range msgs {
		r.turn(m.Role, content(m), !(o.ContinueFinalMessage && i == len(msgs)-1))
	}
	if o.AddGenerationPrompt {
		r.ids = append(r.ids, TokenIMStart)
		r.ids = t.encode(r.ids, "assistant\n")
	}
	return r.ids, r.mm, nil
}

// seg is a run of a message's content: text, or one image when img is set.
// Adjacent text is always one seg, tokenized whole, so that splitting a
// message into parts cannot change how its text tokenizes.
type seg struct {
	text string
	img  *Image
}

// content is m's content as segs: Content, or Parts with consecutive text
// parts joined by "\n".
func content(m Message) []seg {
	if m.Parts == nil {
		return []seg{{text: m.Content}}
	}
	var out []seg
	var b strings.Builder
	text := false
	for _, p := range m.Parts {
		if p.Image != nil {
			if text {
				out = append(out, seg{text: b.String()})
				b.Reset()
				text = false
			}
			out = append(out, seg{img: p.Image})
			continue
		}
		if text {
			b.WriteByte('\n')
		}
		b.WriteString(p.Text)
		text = true
	}
	if text {
		out = append(out, seg{text: b.String()})
	}
	return out
}

// withText appends s to segs, into the last seg when that is text.
func withText(segs []seg, s string) []seg {
	if n := len(segs); n > 0 && segs[n-1].img == nil {
		segs[n-1].text += s
		return segs
	}
	return append(segs, seg{text: s})
}

// trimSegs is strings.TrimSpace of the content segs make up.
func trimSegs(segs []seg) []seg {
	if len(segs) == 0 {
		return segs
	}
	segs = slices.Clone(segs)
	if segs[0].img == nil {
		segs[0].text = strings.TrimLeftFunc(segs[0].text, unicode.IsSpace)
	}
	if n := len(segs) - 1; segs[n].img == nil {
		segs[n].text = strings.TrimRightFunc(segs[n].text, unicode.IsSpace)
	}
	return segs
}

// render accumulates a prompt's tokens and image placements.
type render struct {
	t   *Tokenizer
	ids []uint32
	mm  []MMPlacement
}

func (r *render) content(segs []seg) {
	for _, s := range segs {
		if s.img == nil {
			r.ids = r.t.encode(r.ids, s.text)
			continue
		}
		r.ids = append(r.ids, TokenVisionStart)
		r.mm = append(r.mm, MMPlacement{ID: s.img.ID, Offset: len(r.ids), Length: r.t.imageTokens})
		for range r.t.imageTokens {
			r.ids = append(r.ids, TokenImagePad)
		}
		r.ids = append(r.ids, TokenVisionEnd)
	}
}

func (r *render) turn(role string, segs []seg, closed bool) {
	r.ids = append(r.ids, TokenIMStart)
	r.ids = r.t.encode(r.ids, role+"\n")
	r.content(segs)
	if closed {
		r.ids = append(r.ids, TokenIMEnd)
		r.ids = r.t.encode(r.ids, "\n")
	}
}

const (
	toolsHeader = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n" +
		"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
	toolsFooter = "\n</tools>\n\nFor each function call, return a json object with function name and " +
		"arguments within <tool_call></tool_call> XML tags."
)

// compactTools validates the tools JSON and removes insignificant space so
// that formatting does not change the tokens. null and [] mean no tools
// (the template tests the list for truth).
func compactTools(raw []byte) (string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "", nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return "", fmt.Errorf("%w: tools: %v", ErrBadChat, err)
	}
	if s := b.String(); s != "null" && s != "[]" {
		return s, nil
	}
	return "", nil
}

// llama3 renders as Llama 3.1's template does (without its tool-call
// forms): <|begin_of_text|>, then a system block that is always there,
// holding the knowledge-date lines, the tools if any and the system
// message if the first message is one, then per message a header and its
// content trimmed, each closed by <|eot_id|>. Unlike ChatML, a
// conversation without a system message still starts with that block.
func (r *render) llama3(msgs []Message, o ChatOptions, tools string) {
	r.ids = append(r.ids, TokenBOS)
	var sys []seg
	if len(msgs) > 0 && msgs[0].Role == "system" {
		sys, msgs = trimSegs(content(msgs[0])), msgs[1:]
	}
	head := "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
	if tools != "" {
		head = "Environment: ipython\n" + head + toolsHeader + tools + toolsFooter + "\n\n"
	}
	// The head and a leading text of the system message are one text.
	if len(sys) > 0 && sys[0].img == nil {
		sys[0].text = head + sys[0].text
	} else {
		sys = append([]seg{{text: head}}, sys...)
	}
	r.header("system")
	r.content(sys)
	r.ids = append(r.ids, TokenEOT)
	for i, m := range msgs {
		r.header(m.Role)
		r.content(trimSegs(content(m)))
		if !(o.ContinueFinalMessage && i == len(msgs)-1) {
			r.ids = append(r.ids, TokenEOT)
		}
	}
	if o.AddGenerationPrompt {
		r.header("assistant")
	}
}

func (r *render) header(role string) {
	r.ids = append(r.ids, TokenStartHeader)
	r.ids = r.t.encode(r.ids, role)
	r.ids = append(r.ids, TokenEndHeader)
	r.ids = r.t.encode(r.ids, "\n\n")
}

// words is the generator's vocabulary and the stored whole-word pieces:
// common English words, so English text mostly costs one token per word.
const words = `
the of and to in is was for that on as with by he at from his it an were are which
this be or has had first one their its new after who they two her she been other when
there all during into school time may years more most only over city some world would
where later up such used many can state about national out known university united
then made also between since under through first both these three being before while
however until team part well including season him series called area population new
film music year general following war government high day group people work house
company first second members three american best good back long own right come little
state old number small great life place man world way take name still system make
just like any even home city each end found very show play family much game last
began use could world did those few because set same must form several based led
four within around local made day another line early public among power against field
will age without point took major end water due top held along today next given
order near different including name country main history book five large back real
south north east west children law often per days given business land side though
small around house less health important few air body head yet light held story
power point move office music question policy start report mind love open model
study case research market data human learn build view create support service level
simple change problem design process value result fact class idea speak order rate
money price cost report thing information energy plan hold turn word sure help ask
need feel seem leave put mean keep let begin seem talk turn start show hear play run
move live believe bring happen write provide sit stand lose pay meet include continue
set learn change lead understand watch follow stop create speak read allow add spend
grow open walk win offer remember love consider appear buy wait serve die send expect
build stay fall cut reach kill remain suggest raise pass sell require report decide
pull true clear whole free full short strong possible special easy hard late early
young black white red blue green able available likely certain recent private social
economic political natural federal final central single common current similar
environmental financial legal medical military physical cultural personal nice
always never sometimes often again already almost also away ever far here now once
perhaps quite rather really soon together too why how what who whose whom whether
model token cache block prefix request server cluster router memory network node
`
