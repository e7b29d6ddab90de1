package vllmsim

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestTokenizerRoundTrip(t *testing.T) {
	tok := NewTokenizer()
	cases := []string{
		"",
		"Hello, world!",
		"The quick brown fox jumps over the lazy dog.",
		"  leading and trailing spaces  ",
		"tabs\tand\nnew lines\n\n\nand\r\nCRLF",
		"numbers 12345 and 3.14159, symbols #$%^&*()",
		"unicode: héllo wörld — 日本語 🎉",
		"<|im_start|>user\nhi<|im_end|>\n<|not_special|> <| |>",
		"UPPER lower MiXeD camelCase snake_case kebab-case",
		"\x00\x01\xff invalid utf8 \xc3",
	}
	for _, s := range cases {
		ids := tok.Encode(s, false)
		if got := tok.Decode(ids); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
		if again := tok.Encode(tok.Decode(ids), false); !slices.Equal(again, ids) {
			t.Errorf("Encode(Decode(Encode(%q))) = %v; want %v", s, again, ids)
		}
		for _, id := range ids {
			if int(id) >= tok.VocabSize() {
				t.Errorf("Encode(%q) id %d outside vocab %d", s, id, tok.VocabSize())
			}
		}
	}
	if ids := tok.Encode("hi", true); ids[0] != TokenBOS {
		t.Errorf("Encode(addSpecial) = %v; want BOS first", ids)
	}
	if got := tok.Encode("<|im_start|><|im_end|>", false); !slices.Equal(got, []uint32{TokenIMStart, TokenIMEnd}) {
		t.Errorf("Encode(specials) = %v", got)
	}
}

// TestTokenizerDensity: English costs about four characters per token.
func TestTokenizerDensity(t *testing.T) {
	f := loadFixture(t, "kv_event_base.json")
	tok := NewTokenizer()
	text := tok.Decode(tok.Encode(promptOf(t), false))
	ids := tok.Encode(text, false)
	ratio := float64(len(text)) / float64(len(ids))
	t.Logf("%d chars, %d tokens: %.2f chars/token (Qwen3: %d tokens)", len(text), len(ids), ratio, len(f.TokenIDs))
	if ratio < 3.3 || ratio > 5 {
		t.Errorf("chars/token = %.2f; want ~4", ratio)
	}
}

func promptOf(t *testing.T) string {
	t.Helper()
	var f struct{ Prompt string }
	b := mustRead(t, "testdata/kv_event_base.json")
	if err := jsonUnmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	return f.Prompt
}

func TestGeneratedTokensCanonical(t *testing.T) {
	tok := NewTokenizer()
	for seed := range uint64(20) {
		next := tok.generator(seed)
		gen := make([]uint32, 500)
		for i := range gen {
			gen[i] = next()
		}
		if again := tok.Encode(tok.Decode(gen), false); !slices.Equal(again, gen) {
			t.Fatalf("seed %d: Encode(Decode(gen)) differs: %q", seed, tok.Decode(gen)[:80])
		}
		// Every prefix of a generation is canonical too (streams cut anywhere).
		for _, n := range []int{1, 2, 7, 100} {
			if again := tok.Encode(tok.Decode(gen[:n]), false); !slices.Equal(again, gen[:n]) {
				t.Errorf("seed %d: prefix %d not canonical", seed, n)
			}
		}
	}
	a, b := tok.generator(7), tok.generator(7)
	for range 50 {
		if a() != b() {
			t.Fatal("generator not deterministic")
		}
	}
}

// TestChatPrefixProperty: turn N+1 = turn N's prompt + turn N's generated
// tokens + the new tokens, so a multi-turn follow-up hits the cache.
func TestChatPrefixProperty(t *testing.T) {
	tok := NewTokenizer()
	tools := []byte(`[ {"type": "function", "function": {"name": "get_weather"}} ]`)
	for _, o := range []ChatOptions{{AddGenerationPrompt: true}, {AddGenerationPrompt: true, Tools: tools}} {
		msgs := []Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "What is the capital of France?"}}
		prompt, err := tok.Chat(msgs, o)
		if err != nil {
			t.Fatal(err)
		}
		for turn := range 3 {
			next := tok.generator(uint64(turn))
			gen := make([]uint32, 37)
			for i := range gen {
				gen[i] = next()
			}
			msgs = append(msgs, Message{Role: "assistant", Content: tok.Decode(gen)}, Message{Role: "user", Content: "Tell me more about that, please."})
			p2, err := tok.Chat(msgs, o)
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Concat(prompt, gen)
			if !slices.Equal(p2[:len(want)], want) {
				t.Fatalf("turn %d: prompt does not extend previous prompt + generated tokens", turn)
			}
			if p2[len(want)] != TokenIMEnd {
				t.Errorf("turn %d: token after generation = %d; want im_end", turn, p2[len(want)])
			}
			prompt = p2
		}
	}
}

func TestChatTemplate(t *testing.T) {
	tok := NewTokenizer()
	msgs := []Message{{Role: "system", Content: "S"}, {Role: "user", Content: "U"}}
	cases := []struct {
		name string
		o    ChatOptions
		want string
		err  bool
	}{
		{"plain", ChatOptions{}, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n", false},
		{"generation prompt", ChatOptions{AddGenerationPrompt: true},
			"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n", false},
		{"continue final", ChatOptions{ContinueFinalMessage: true}, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU", false},
		{"both flags", ChatOptions{AddGenerationPrompt: true, ContinueFinalMessage: true}, "", true},
		{"null tools", ChatOptions{Tools: []byte("null")}, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n", false},
		{"empty tools", ChatOptions{Tools: []byte(" [ ] ")}, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n", false},
		{"tools", ChatOptions{Tools: []byte(`[{"a": 1}]`)},
			"<|im_start|>system\nS\n\n" + toolsHeader + `[{"a":1}]` + toolsFooter + "<|im_end|>\n<|im_start|>user\nU<|im_end|>\n", false},
		{"bad tools", ChatOptions{Tools: []byte(`[{`)}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ids, err := tok.Chat(msgs, c.o)
			if c.err {
				if !errors.Is(err, ErrBadChat) {
					t.Fatalf("Chat err = %v; want ErrBadChat", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.Decode(ids); got != c.want {
				t.Errorf("Chat = %q; want %q", got, c.want)
			}
		})
	}
	if _, err := tok.Chat(nil, ChatOptions{ContinueFinalMessage: true}); !errors.Is(err, ErrBadChat) {
		t.Errorf("Chat(no messages, continue) err = %v; want ErrBadChat", err)
	}
}

func FuzzEncode(f *testing.F) {
	f.Add("The quick brown fox, 42 times.\n\n  <|im_end|> héllo")
	f.Add("<|<|im_start|")
	f.Add("\xff\xfe  \t")
	tok, mem := NewTokenizer(), NewTokenizerMemo(1<<20)
	f.Fuzz(func(t *testing.T, s string) {
		ids := tok.Encode(s, false)
		if got := tok.Decode(ids); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
		if again := tok.Encode(s, false); !slices.Equal(again, ids) {
			t.Fatalf("Encode not deterministic")
		}
		// Long texts go through the memo: seen first, then remembered.
		long := strings.Repeat(s+" ", memoMinText/(len(s)+1)+1)
		for range 2 {
			if got := mem.Encode(long, false); !slices.Equal(got, tok.Encode(long, false)) {
				t.Fatalf("remembered encoding of %q repeated differs", s)
			}
		}
	})
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 200, 17, 99, 255})
	tok := NewTokenizer()
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids := make([]uint32, 0, len(raw)/3)
		for i := 0; i+3 <= len(raw); i += 3 {
			ids = append(ids, uint32(raw[i])|uint32(raw[i+1])<<8|uint32(raw[i+2])<<16)
		}
		s := tok.Decode(ids) // arbitrary ids, including unknown ones
		if got := tok.Decode(tok.Encode(s, false)); got != s {
			t.Fatalf("Decode(Encode(Decode(ids))) = %q; want %q", got, s)
		}
	})
}

func BenchmarkEncode(b *testing.B) {
	tok := NewTokenizer()
	text := string(mustRead(b, "testdata/kv_event_base.json"))
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, false)
	}
}

// Llama 3.1's template, as the simulator renders it with Template Llama3:
// the system block is there with or without a system message, contents
// are trimmed, and a conversation's prefix renders as a prefix of it.
func TestLlama3Template(t *testing.T) {
	tok := NewTokenizer()
	const sysHead = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
	cases := []struct {
		name string
		msgs []Message
		o    ChatOptions
		want string
	}{
		{"system and user", []Message{{Role: "system", Content: " S "}, {Role: "user", Content: "U\n"}}, ChatOptions{AddGenerationPrompt: true},
			sysHead + "S<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
		{"no system message", []Message{{Role: "user", Content: "U"}}, ChatOptions{},
			sysHead + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"},
		{"continue", []Message{{Role: "user", Content: "U"}, {Role: "assistant", Content: "A"}}, ChatOptions{ContinueFinalMessage: true},
			sysHead + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA"},
	}
	for _, tc := range cases {
		tc.o.Template = Llama3
		ids, err := tok.Chat(tc.msgs, tc.o)
		if err != nil || tok.Decode(ids) != tc.want {
			t.Errorf("%s: %q, %v; want %q", tc.name, tok.Decode(ids), err, tc.want)
		}
	}
	o := ChatOptions{Template: Llama3}
	short, _ := tok.Chat([]Message{{Role: "user", Content: "U"}}, o)
	long, _ := tok.Chat([]Message{{Role: "user", Content: "U"}, {Role: "assistant", Content: "A"}, {Role: "user", Content: "V"}}, o)
	if !slices.Equal(long[:len(short)], short) {
		t.Error("a conversation's first message does not render as a prefix of it")
	}
	if _, err := ParseChatTemplate("jinja"); err == nil {
		t.Error("an unknown template name was accepted")
	}
}
