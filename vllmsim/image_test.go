package vllmsim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/kvevent"
)

func img(id string) Part { return Part{Image: &Image{ID: id}} }

func txt(s string) Part { return Part{Text: s} }

// imageIDs is what ChatMM writes for one image of n placeholder tokens.
func imageIDs(n int) []uint32 {
	out := []uint32{TokenVisionStart}
	for range n {
		out = append(out, TokenImagePad)
	}
	return append(out, TokenVisionEnd)
}

// checkPlacements: every placement covers exactly pad tokens, framed by
// the vision start and end tokens, and no pad token is outside them.
func checkPlacements(t *testing.T, ids []uint32, mm []MMPlacement, n int) {
	t.Helper()
	covered := 0
	for i, m := range mm {
		if m.Length != n || m.Offset < 1 || m.Offset+m.Length >= len(ids) {
			t.Fatalf("placement %d = %+v in %d ids; want length %d inside", i, m, len(ids), n)
		}
		if ids[m.Offset-1] != TokenVisionStart || ids[m.Offset+m.Length] != TokenVisionEnd {
			t.Errorf("placement %d = %+v is not framed by vision start/end", i, m)
		}
		for _, id := range ids[m.Offset : m.Offset+m.Length] {
			if id != TokenImagePad {
				t.Errorf("placement %d = %+v covers a non-pad token %d", i, m, id)
			}
		}
		if i > 0 && m.Offset <= mm[i-1].Offset {
			t.Errorf("placements out of order: %+v after %+v", m, mm[i-1])
		}
		covered += m.Length
	}
	pads := 0
	for _, id := range ids {
		if id == TokenImagePad {
			pads++
		}
	}
	if pads != covered {
		t.Errorf("%d pad tokens, %d covered by placements", pads, covered)
	}
}

// TestChatMMPlacements builds each expected prompt piece by piece: the
// template's tokens, each text run encoded whole, each image as vision
// start, N pads, vision end, and its placement at the first pad.
func TestChatMMPlacements(t *testing.T) {
	tok := NewTokenizer().WithImageTokens(8)
	enc := func(s string) []uint32 { return tok.Encode(s, false) }
	sysHead := "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
	type piece struct {
		ids []uint32
		img string // an image piece's ID
	}
	cases := []struct {
		name string
		msgs []Message
		o    ChatOptions
		want []piece
	}{
		{"chatml one image between texts",
			[]Message{{Role: "user", Parts: []Part{txt("Look at"), txt("this:"), img("A"), txt(" What is it?")}}},
			ChatOptions{AddGenerationPrompt: true},
			[]piece{{ids: slices.Concat([]uint32{TokenIMStart}, enc("user\n"), enc("Look at\nthis:"))}, {img: "A"},
				{ids: slices.Concat(enc(" What is it?"), []uint32{TokenIMEnd}, enc("\n"), []uint32{TokenIMStart}, enc("assistant\n"))}}},
		{"chatml images in several messages",
			[]Message{
				{Role: "system", Content: "Be brief."},
				{Role: "user", Parts: []Part{img("A"), img("B"), txt("Compare.")}},
				{Role: "assistant", Content: "They differ."},
				{Role: "user", Parts: []Part{txt("And"), img("C")}},
			},
			ChatOptions{},
			[]piece{
				{ids: slices.Concat([]uint32{TokenIMStart}, enc("system\n"), enc("Be brief."), []uint32{TokenIMEnd}, enc("\n"),
					[]uint32{TokenIMStart}, enc("user\n"))},
				{img: "A"}, {img: "B"},
				{ids: slices.Concat(enc("Compare."), []uint32{TokenIMEnd}, enc("\n"),
					[]uint32{TokenIMStart}, enc("assistant\n"), enc("They differ."), []uint32{TokenIMEnd}, enc("\n"),
					[]uint32{TokenIMStart}, enc("user\n"), enc("And"))},
				{img: "C"},
				{ids: slices.Concat([]uint32{TokenIMEnd}, enc("\n"))},
			}},
		{"chatml image in a system message with tools",
			[]Message{{Role: "system", Parts: []Part{txt("See"), img("S")}}, {Role: "user", Content: "Hi"}},
			ChatOptions{Tools: []byte(`[{"type":"function"}]`)},
			[]piece{
				{ids: slices.Concat([]uint32{TokenIMStart}, enc("system\n"), enc("See"))},
				{img: "S"},
				{ids: slices.Concat(enc("\n\n"+toolsHeader+`[{"type":"function"}]`+toolsFooter), []uint32{TokenIMEnd}, enc("\n"),
					[]uint32{TokenIMStart}, enc("user\n"), enc("Hi"), []uint32{TokenIMEnd}, enc("\n"))},
			}},
		{"llama3 images trimmed around",
			[]Message{{Role: "user", Parts: []Part{txt("  Describe:"), img("A"), txt("and"), img("B")}}},
			ChatOptions{Template: Llama3, AddGenerationPrompt: true},
			[]piece{
				{ids: slices.Concat([]uint32{TokenBOS, TokenStartHeader}, enc("system"), []uint32{TokenEndHeader}, enc("\n\n"),
					enc(sysHead), []uint32{TokenEOT, TokenStartHeader}, enc("user"), []uint32{TokenEndHeader}, enc("\n\n"), enc("Describe:"))},
				{img: "A"},
				{ids: enc("and")},
				{img: "B"},
				{ids: slices.Concat([]uint32{TokenEOT, TokenStartHeader}, enc("assistant"), []uint32{TokenEndHeader}, enc("\n\n"))},
			}},
		{"llama3 system message starting with an image",
			[]Message{{Role: "system", Parts: []Part{img("S"), txt(" rules ")}}, {Role: "user", Content: "U"}},
			ChatOptions{Template: Llama3},
			[]piece{
				{ids: slices.Concat([]uint32{TokenBOS, TokenStartHeader}, enc("system"), []uint32{TokenEndHeader}, enc("\n\n"), enc(sysHead))},
				{img: "S"},
				{ids: slices.Concat(enc(" rules"), []uint32{TokenEOT, TokenStartHeader}, enc("user"), []uint32{TokenEndHeader}, enc("\n\n"),
					enc("U"), []uint32{TokenEOT})},
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var want []uint32
			var wantMM []MMPlacement
			for _, p := range tc.want {
				if p.img == "" {
					want = append(want, p.ids...)
					continue
				}
				wantMM = append(wantMM, MMPlacement{ID: p.img, Offset: len(want) + 1, Length: 8})
				want = append(want, imageIDs(8)...)
			}
			ids, mm, err := tok.ChatMM(tc.msgs, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids, want) {
				t.Errorf("ids:\n got %q\nwant %q", tok.Decode(ids), tok.Decode(want))
			}
			if !slices.Equal(mm, wantMM) {
				t.Errorf("placements = %+v; want %+v", mm, wantMM)
			}
			checkPlacements(t, ids, mm, 8)
			if chat, err := tok.Chat(tc.msgs, tc.o); err != nil || !slices.Equal(chat, ids) {
				t.Errorf("Chat differs from ChatMM's ids (err %v)", err)
			}
		})
	}
}

// TestChatMMTextPartsAreContent: text-only parts render exactly as the
// same text joined with "\n" in Content, and no placements come back.
func TestChatMMTextPartsAreContent(t *testing.T) {
	tok := NewTokenizer()
	parts := []Message{{Role: "system", Parts: []Part{txt(" You help. "), txt("Be kind.")}},
		{Role: "user", Parts: []Part{txt("Hello"), txt(""), txt("  world \n")}}, {Role: "assistant", Parts: []Part{}}}
	flat := []Message{{Role: "system", Content: " You help. \nBe kind."},
		{Role: "user", Content: "Hello\n\n  world \n"}, {Role: "assistant", Content: ""}}
	for _, o := range []ChatOptions{
		{}, {AddGenerationPrompt: true}, {ContinueFinalMessage: true}, {Tools: []byte(`[{"a": 1}]`)},
		{Template: Llama3}, {Template: Llama3, AddGenerationPrompt: true, Tools: []byte(`[{"a": 1}]`)},
	} {
		a, mm, err := tok.ChatMM(parts, o)
		b, err2 := tok.Chat(flat, o)
		if err != nil || err2 != nil || !slices.Equal(a, b) || mm != nil {
			t.Errorf("%+v: parts %q (%v, %v)\n content %q (%v)", o, tok.Decode(a), mm, err, tok.Decode(b), err2)
		}
	}
}

func TestChatMMErrorsAndSettings(t *testing.T) {
	tok := NewTokenizer()
	if _, _, err := tok.ChatMM([]Message{{Role: "user", Parts: []Part{{Image: &Image{}}}}}, ChatOptions{}); !errors.Is(err, ErrBadChat) {
		t.Errorf("image without an id: %v; want ErrBadChat", err)
	}
	if _, _, err := tok.ChatMM(nil, ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: true}); !errors.Is(err, ErrBadChat) {
		t.Errorf("both flags: %v; want ErrBadChat", err)
	}
	if tok.ImageTokens() != DefaultImageTokens || tok.WithImageTokens(0).ImageTokens() != DefaultImageTokens {
		t.Errorf("default image tokens = %d", tok.ImageTokens())
	}
	five := tok.WithImageTokens(5)
	ids, mm, _ := five.ChatMM([]Message{{Role: "user", Parts: []Part{img("A")}}}, ChatOptions{})
	checkPlacements(t, ids, mm, 5)
	if tok.ImageTokens() != DefaultImageTokens {
		t.Error("WithImageTokens changed the original")
	}
	// The image tokens decode to their names, but typed in text they stay
	// text: a user cannot forge an image.
	lit := "<|vision_start|><|image_pad|><|vision_end|>"
	if got := tok.Decode(imageIDs(1)); got != lit {
		t.Errorf("Decode(image) = %q", got)
	}
	if slices.Contains(tok.Encode(lit, false), TokenImagePad) {
		t.Error("the image pad's text encodes to the pad token")
	}
	if got, want := ContentID("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("ContentID(abc) = %q; want sha256 %q", got, want)
	}
}

func TestConfigImageTokens(t *testing.T) {
	cfg := smallConfig()
	cfg.ImageTokens = 3
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.Tokenizer().ImageTokens(); n != 3 {
		t.Errorf("engine tokenizer renders %d tokens per image; want 3", n)
	}
	cfg.ImageTokens = -1
	if _, err := New(cfg); err == nil {
		t.Error("negative ImageTokens accepted")
	}
}

// imageRequest renders a prompt with one long text, then the given images,
// then a question, as the simulator's edge does.
func imageRequest(t *testing.T, tok *Tokenizer, ids ...string) Request {
	t.Helper()
	parts := []Part{txt(strings.Repeat("Here is a long shared preamble about rivers and towns. ", 6))}
	for _, id := range ids {
		parts = append(parts, img(id))
	}
	parts = append(parts, txt("What do the images show?"))
	p, mm, err := tok.ChatMM([]Message{{Role: "user", Parts: parts}}, ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	return Request{PromptTokens: p, MaxTokens: 4, MM: mm}
}

// TestImageIDsShareOnlyBlocksBefore: the same text with another image hits
// exactly the blocks before the first block the image overlaps; the same
// image again hits everything vLLM can (the (n-1)//bs cap).
func TestImageIDsShareOnlyBlocksBefore(t *testing.T) {
	cfg := timingConfig()
	e, _ := startEngine(t, cfg)
	bs := cfg.BlockSize
	a := imageRequest(t, e.Tokenizer(), "img-A")
	b := imageRequest(t, e.Tokenizer(), "img-B")
	if !slices.Equal(a.PromptTokens, b.PromptTokens) {
		t.Fatal("the two prompts' tokens differ; the test needs them equal")
	}
	off := a.MM[0].Offset
	if off < 2*bs || off%bs == 0 {
		t.Fatalf("image at %d: want it inside a later block of %d", off, bs)
	}
	n := len(a.PromptTokens)
	if got := usage(t, e, a).CachedTokens; got != 0 {
		t.Fatalf("first request hit %d tokens", got)
	}
	before := e.Cached()
	if got, want := usage(t, e, b).CachedTokens, off/bs*bs; got != want {
		t.Errorf("other image: cached %d tokens; want %d (the blocks before the image's)", got, want)
	}
	if got, want := usage(t, e, a).CachedTokens, (n-1)/bs*bs; got != want {
		t.Errorf("same image again: cached %d tokens; want %d", got, want)
	}
	// Ground truth: B added exactly the blocks from the image's on, each
	// with B's ID in its extras where it overlaps the image.
	old := map[uint64]bool{}
	for _, c := range before {
		old[c.Hash] = true
	}
	added := 0
	for _, c := range e.Cached() {
		if old[c.Hash] {
			continue
		}
		added++
		if slices.Contains(c.Extra, "img-A") {
			t.Errorf("a block new with image B carries A: %+v", c.Extra)
		}
	}
	if want := len(before) - off/bs; added != want {
		t.Errorf("image B added %d blocks; want %d", added, want)
	}
}

func usage(t *testing.T, e *Engine, r Request) Usage {
	t.Helper()
	outs := run(t, e, r)
	return outs[len(outs)-1].Usage
}

// TestEventExtraKeys: BlockStored carries per block vLLM's extra keys:
// LoRA on every block, image IDs where they overlap, the salt on block 0,
// in that order; a request without any sends [None, ...] as vLLM does.
func TestEventExtraKeys(t *testing.T) {
	cfg := smallConfig() // blocks of 4
	e, rec := startEngine(t, cfg)
	prompt := toks(5000, 18) // 4 full blocks (the 18th token is never cached first)
	mm := []MMPlacement{{ID: "i1", Offset: 2, Length: 3}, {ID: "i2", Offset: 5, Length: 2}, {ID: "i3", Offset: 12, Length: 4}}
	cases := []struct {
		name string
		r    Request
		want [][]any
	}{
		{"plain", Request{}, [][]any{nil, nil, nil, nil}},
		{"lora", Request{LoRA: "ad"}, [][]any{{"ad"}, {"ad"}, {"ad"}, {"ad"}}},
		{"salt", Request{CacheSalt: "s"}, [][]any{{"s"}, nil, nil, nil}},
		{"images", Request{MM: mm}, [][]any{{"i1"}, {"i1", "i2"}, nil, {"i3"}}},
		{"all", Request{LoRA: "ad", CacheSalt: "s", MM: mm}, [][]any{{"ad", "i1", "s"}, {"ad", "i1", "i2"}, {"ad"}, {"ad", "i3"}}},
	}
	for i, tc := range cases {
		r := tc.r
		// A fresh prefix per case, so no case hits another's blocks.
		r.PromptTokens, r.MaxTokens = slices.Concat([]uint32{uint32(i)}, prompt[1:]), 1
		run(t, e, r)
		var got [][]any
		var hashes int
		rec.mu.Lock()
		for _, ev := range rec.r.log {
			if ev.Kind == kvevent.BlockStored && ev.TokenIDs[0] == uint32(i) {
				got = append(got, ev.ExtraKeys...)
				hashes += len(ev.BlockHashes)
			}
		}
		rec.mu.Unlock()
		if hashes != len(tc.want) || !equalKeys(got, tc.want) {
			t.Errorf("%s: extra_keys %v for %d blocks; want %v", tc.name, got, hashes, tc.want)
		}
		// What the publisher writes decodes back the same, nil entries
		// as msgpack nil (vLLM's None).
		for _, enc := range []kvevent.Encoding{kvevent.ArrayEncoding, kvevent.MapEncoding} {
			ev := kvevent.Event{Kind: kvevent.BlockStored, BlockHashes: make([]uint64, len(got)), TokenIDs: []uint32{}, ExtraKeys: got}
			raw, err := kvevent.Encode(kvevent.Batch{TS: 1, Events: []kvevent.Event{ev}}, enc)
			if err != nil {
				t.Fatal(err)
			}
			b, err := kvevent.Decode(raw)
			if err != nil || !equalKeys(b.Events[0].ExtraKeys, tc.want) {
				t.Errorf("%s: encoding %d decodes to %v, %v", tc.name, enc, b.Events[0].ExtraKeys, err)
			}
		}
	}
}

func equalKeys(a, b [][]any) bool {
	return slices.EqualFunc(a, b, func(x, y []any) bool {
		return (x == nil) == (y == nil) && slices.Equal(x, y)
	})
}

// TestExtraKeysWithGeneratedBlocks: blocks past the prompt (generated
// tokens) carry LoRA but no image or salt, and hashes stay chained.
func TestExtraKeysWithGeneratedBlocks(t *testing.T) {
	cfg := smallConfig()
	e, rec := startEngine(t, cfg)
	r := Request{PromptTokens: toks(7000, 8), MaxTokens: 9, LoRA: "L", CacheSalt: "s",
		MM: []MMPlacement{{ID: "x", Offset: 4, Length: 4}}}
	run(t, e, r)
	var got [][]any
	rec.mu.Lock()
	for _, ev := range rec.r.log {
		if ev.Kind == kvevent.BlockStored {
			got = append(got, ev.ExtraKeys...)
		}
	}
	rec.mu.Unlock()
	want := [][]any{{"L", "s"}, {"L", "x"}, {"L"}, {"L"}}
	if !equalKeys(got, want) {
		t.Errorf("extra_keys = %v; want %v", got, want)
	}
}

func TestSubmitRejectsBadPlacements(t *testing.T) {
	e, _ := startEngine(t, smallConfig())
	p := toks(1, 20)
	for _, mm := range [][]MMPlacement{
		{{ID: "", Offset: 1, Length: 2}},
		{{ID: "a", Offset: 1, Length: 0}},
		{{ID: "a", Offset: -1, Length: 2}},
		{{ID: "a", Offset: 19, Length: 2}},
		{{ID: "a", Offset: 5, Length: 2}, {ID: "b", Offset: 1, Length: 2}},
		{{ID: "a", Offset: 1, Length: 4}, {ID: "b", Offset: 4, Length: 2}},
	} {
		if _, err := e.Submit(context.Background(), Request{PromptTokens: p, MaxTokens: 1, MM: mm}); !errors.Is(err, ErrInvalid) {
			t.Errorf("Submit with %+v: %v; want ErrInvalid", mm, err)
		}
	}
	ok := []MMPlacement{{ID: "a", Offset: 0, Length: 2}, {ID: "b", Offset: 2, Length: 18}}
	run(t, e, Request{PromptTokens: p, MaxTokens: 1, MM: ok})
}

// TestImageChangesAnswer: the answer depends on the image, as a model's
// would, and is the same for the same image.
func TestImageChangesAnswer(t *testing.T) {
	e, _ := startEngine(t, timingConfig())
	tokens := func(r Request) []uint32 {
		var out []uint32
		for _, o := range run(t, e, r) {
			out = append(out, o.Tokens...)
		}
		return out
	}
	a := imageRequest(t, e.Tokenizer(), "A")
	a.MaxTokens = 12
	b := a
	b.MM = []MMPlacement{{ID: "B", Offset: a.MM[0].Offset, Length: a.MM[0].Length}}
	if slices.Equal(tokens(a), tokens(b)) {
		t.Error("two images gave the same answer")
	}
	if !slices.Equal(tokens(a), tokens(a)) {
		t.Error("the same image gave another answer")
	}
}

// FuzzChatMM: for any texts and images, placements frame exactly the pad
// tokens, in order, with the images' IDs; dropping the images gives the
// text-only rendering of the same parts.
func FuzzChatMM(f *testing.F) {
	f.Add("Look:", "A", "what?", uint8(3), false)
	f.Add("", "", "  ", uint8(0), true)
	f.Add("<|image_pad|>", "x", "<|im_end|>\n", uint8(255), true)
	tok := NewTokenizer().WithImageTokens(4)
	f.Fuzz(func(t *testing.T, a, id, b string, layout uint8, llama bool) {
		if id == "" {
			id = "id"
		}
		var parts []Part
		var ids []string
		for i, s := range []string{a, b, a} {
			if layout&(1<<i) != 0 {
				parts = append(parts, img(id+string(rune('0'+i))))
				ids = append(ids, id+string(rune('0'+i)))
			}
			parts = append(parts, txt(s))
		}
		o := ChatOptions{AddGenerationPrompt: layout&8 != 0}
		if llama {
			o.Template = Llama3
		}
		msgs := []Message{{Role: "user", Parts: parts}}
		got, mm, err := tok.ChatMM(msgs, o)
		if err != nil {
			t.Fatal(err)
		}
		checkPlacements(t, got, mm, 4)
		var gotIDs []string
		for _, m := range mm {
			gotIDs = append(gotIDs, m.ID)
		}
		if !slices.Equal(gotIDs, ids) {
			t.Fatalf("placement ids %q; want %q", gotIDs, ids)
		}
	})
}
