package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePrompt(t *testing.T) {
	tru := true
	tests := []struct {
		name string
		body string
		chat bool
		want Prompt
		err  error
	}{
		{"completion text", `{"model":"m","prompt":"hello","stream":true}`, false,
			Prompt{Model: "m", Stream: true, Text: "hello"}, nil},
		{"completion ids", `{"model":"m","prompt":[1,2,3]}`, false,
			Prompt{Model: "m", Tokens: []uint32{1, 2, 3}}, nil},
		{"completion one string list", `{"prompt":["a"]}`, false, Prompt{Text: "a"}, nil},
		{"completion nested ids", `{"prompt":[[4,5]]}`, false, Prompt{Tokens: []uint32{4, 5}}, nil},
		{"completion two prompts", `{"model":"m","prompt":["a","b"]}`, false, Prompt{Model: "m"}, ErrNoPrompt},
		{"completion negative id", `{"prompt":[-1]}`, false, Prompt{}, ErrNoPrompt},
		{"completion missing prompt", `{"model":"m"}`, false, Prompt{Model: "m"}, ErrNoPrompt},
		{"completion empty", `{"prompt":""}`, false, Prompt{}, ErrNoPrompt},
		{"completion null prompt", `{"prompt":null}`, false, Prompt{}, ErrNoPrompt},
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"tools":[{"type":"function"}],"cache_salt":"s"}`, true,
			Prompt{Model: "m", Chat: true, Messages: []byte(`[{"role":"user","content":"hi"}]`),
				Tools: []byte(`[{"type":"function"}]`), AddGenerationPrompt: &tru, CacheSalt: "s"}, nil},
		{"chat no messages", `{"model":"m"}`, true, Prompt{Model: "m", Chat: true}, ErrNoPrompt},
		{"chat messages not list", `{"messages":{}}`, true, Prompt{Chat: true, Messages: []byte(`{}`)}, ErrNoPrompt},
		{"malformed", `{"model":`, false, Prompt{}, ErrBadJSON},
		{"not object", `[1,2]`, false, Prompt{}, ErrBadJSON},
		{"null body", ` null`, false, Prompt{}, ErrBadJSON},
		{"escaped name", `{"mod\u0065l":"m","prompt":[7]}`, false, Prompt{Model: "m", Tokens: []uint32{7}}, nil},
		{"names match exactly", `{"Model":"m","prompt":[7]}`, false, Prompt{Tokens: []uint32{7}}, nil},
		{"trailing", `{"prompt":"a"} {}`, false, Prompt{}, ErrBadJSON},
		{"wrong type", `{"model":5}`, false, Prompt{}, ErrBadJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.body), tt.chat)
			if !errors.Is(err, tt.err) {
				t.Fatalf("Parse(%s) error = %v; want %v", tt.body, err, tt.err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse(%s) mismatch (-want +got):\n%s", tt.body, diff)
			}
		})
	}
}

// A completion prompt of ids is parsed in the scan's one pass; a later
// duplicate of the member still wins, and what follows the ids is still
// validated.
func TestParseTakesIDsInTheScan(t *testing.T) {
	tests := []struct {
		body   string
		tokens []uint32
		text   string
		bad    bool
	}{
		{`{"prompt":[1,2,3]}`, []uint32{1, 2, 3}, "", false},
		{`{"prompt":[1,2],"prompt":"x"}`, nil, "x", false},
		{`{"prompt":"x","prompt":[3]}`, []uint32{3}, "", false},
		{`{"prompt":[1,2],"prompt":[[5]]}`, []uint32{5}, "", false},
		{`{"pr\u006fmpt":[7]}`, []uint32{7}, "", false},
		{`{"prompt":[1,2],}`, nil, "", true},
		{`{"prompt":[1,2]`, nil, "", true},
		{`{"prompt":[1,2]]}`, nil, "", true},
	}
	for _, tt := range tests {
		p, err := Parse([]byte(tt.body), false)
		if tt.bad {
			if !errors.Is(err, ErrBadJSON) {
				t.Errorf("Parse(%s) = %v, %v; want ErrBadJSON", tt.body, p.Tokens, err)
			}
			continue
		}
		if err != nil || !slices.Equal(p.Tokens, tt.tokens) || p.Text != tt.text {
			t.Errorf("Parse(%s) = tokens %v text %q (%v); want %v %q", tt.body, p.Tokens, p.Text, err, tt.tokens, tt.text)
		}
	}
}

func FuzzParsePrompt(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":[1,2,3]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}]}`), true)
	f.Add([]byte(`{"prompt":[[1]]}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := Parse(body, chat)
		if err == nil && !chat && p.Text == "" && len(p.Tokens) == 0 {
			t.Fatalf("Parse(%q) succeeded without a prompt", body)
		}
		if err == nil && chat && len(p.Messages) == 0 {
			t.Fatalf("Parse(%q) succeeded without messages", body)
		}
	})
}

// FuzzScanObject checks the scanner's verdict against encoding/json's: a
// body is accepted exactly when it is valid JSON with an object on top.
func FuzzScanObject(f *testing.F) {
	for _, s := range []string{`{"model":"m","prompt":[1,2,3]}`, `{}`, ` {"a":{"b":[true,false,null,-0.5e+3,"\u00e9\n"]}} `,
		`{"a":01}`, `{"a":1.}`, `{"a":"\x"}`, "{\"a\":\"\x01\"}", `{"a":[1,]}`, `{"a":1}{}`, `[1]`, `{"a" 1}`, "{\"a\":\"\xff\"}", `{"a":-}`, `{"a":tru}`,
		`{"a":[0,1]}`, `{"a":[01]}`, `{"a":[1.5,2]}`, `{"a":[1e3]}`, `{"a":[7E-1]}`, `{"a":[1x]}`, `{"a":[12`, `{"a":[-1,0]}`, `{"a":[0.0]}`, `{"a":[1 ,2 ]}`, `{"a":[1.]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := scanObject(b, func(_, _ []byte) error { return nil })
		trimmed := bytes.TrimLeft(b, " \t\r\n")
		want := json.Valid(b) && len(trimmed) > 0 && trimmed[0] == '{'
		if (err == nil) != want {
			t.Fatalf("scanObject(%q) = %v; encoding/json says valid object: %v", b, err, want)
		}
	})
}

// FuzzParsePromptStd checks Parse against the encoding/json decoding
// it replaced (stdParsePrompt) wherever the two are meant to agree: names
// that match exactly and appear once (encoding/json also matches "Model",
// and reports a wrong type even when a later duplicate is right), and a
// body that is not JSON null (encoding/json decodes null into a struct as
// nothing; it is no request, and now a 400 like any other non-object).
func FuzzParsePromptStd(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":[1,2,3],"stream":true}`), false)
	f.Add([]byte(`{"model":"m\u00e9","messages":[{"role":"user","content":"x"}],"add_generation_prompt":false,"tools":null}`), true)
	f.Add([]byte(`{"prompt":[[1]],"cache_salt":"s","add_special_tokens":null}`), false)
	f.Add([]byte(`{"model":5}`), false)
	f.Add([]byte(` null `), false)
	f.Add([]byte(`{"prompt": [1, 2 ] ,"model":"m"}`), false)
	f.Add([]byte(`{"prompt":[1,2]x}`), false)
	f.Add([]byte(`{"prompt":[1,2],}`), false)
	f.Add([]byte(`{"prompt":[4294967296]}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		seen, comparable := map[string]bool{}, true
		if scanObject(body, func(key, _ []byte) error {
			var k string
			if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
				comparable = false
			}
			for _, name := range fieldNames {
				if strings.EqualFold(k, name) && (k != name || seen[name]) {
					comparable = false
				}
			}
			seen[k] = true
			return nil
		}) != nil {
			comparable = true // both must reject it
		}
		if !comparable || string(bytes.TrimSpace(body)) == "null" {
			return
		}
		got, err := Parse(body, chat)
		want, werr := stdParsePrompt(body, chat)
		if errors.Is(err, ErrBadJSON) != errors.Is(werr, ErrBadJSON) || errors.Is(err, ErrNoPrompt) != errors.Is(werr, ErrNoPrompt) {
			t.Fatalf("Parse(%q) error %v; encoding/json %v", body, err, werr)
		}
		if diff := cmp.Diff(want, got); diff != "" && !errors.Is(err, ErrBadJSON) {
			t.Fatalf("Parse(%q) mismatch (-encoding/json +scan):\n%s", body, diff)
		}
	})
}

var fieldNames = []string{"model", "stream", "messages", "prompt", "tools", "chat_template_kwargs",
	"add_generation_prompt", "continue_final_message", "add_special_tokens", "cache_salt"}

// stdParsePrompt is Parse as encoding/json did it before scanObject.
func stdParsePrompt(body []byte, chat bool) (Prompt, error) {
	var w struct {
		Model                string          `json:"model"`
		Stream               bool            `json:"stream"`
		Messages             json.RawMessage `json:"messages"`
		Prompt               json.RawMessage `json:"prompt"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage *bool           `json:"continue_final_message"`
		AddSpecialTokens     *bool           `json:"add_special_tokens"`
		CacheSalt            string          `json:"cache_salt"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return Prompt{}, fmt.Errorf("%w: %v", ErrBadJSON, err)
	}
	p := Prompt{
		Model: w.Model, Stream: w.Stream, Chat: chat,
		Tools: nullToNil(w.Tools), ChatTemplateKwargs: nullToNil(w.ChatTemplateKwargs),
		AddGenerationPrompt: w.AddGenerationPrompt, ContinueFinalMessage: w.ContinueFinalMessage,
		AddSpecialTokens: w.AddSpecialTokens, CacheSalt: w.CacheSalt,
	}
	if chat {
		p.Messages = nullToNil(w.Messages)
		if len(p.Messages) == 0 || p.Messages[0] != '[' {
			return p, ErrNoPrompt
		}
		return p, nil
	}
	return p, parseCompletionPrompt(nullToNil(w.Prompt), &p)
}

// TestScanObjectDepth: the scanner's nesting limit is encoding/json's.
func TestScanObjectDepth(t *testing.T) {
	for _, n := range []int{9998, 9999, 10000, 10001} {
		b := []byte(`{"a":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}`)
		err := scanObject(b, func(_, _ []byte) error { return nil })
		if (err == nil) != json.Valid(b) {
			t.Errorf("depth %d: scanObject error %v; json.Valid %v", n+1, err, json.Valid(b))
		}
	}
}

// plain8 must flag every word holding a quote, a backslash or a control
// character, wherever it sits (a miss would let a string run past its end).
func TestPlain8(t *testing.T) {
	word := func(b []byte) uint64 {
		var w uint64
		for i, c := range b {
			w |= uint64(c) << (8 * i)
		}
		return w
	}
	base := []byte("abcdefgh")
	if !plain8(word(base)) || !plain8(word([]byte("\x20\x7f\x80\xff\xc3\xa9~!"))) {
		t.Fatal("plain bytes flagged")
	}
	for pos := range 8 {
		for _, c := range []byte{'"', '\\', 0x00, 0x01, 0x1f} {
			b := append([]byte(nil), base...)
			b[pos] = c
			if plain8(word(b)) {
				t.Errorf("%q at %d not flagged", c, pos)
			}
		}
	}
}

// A string's end, escapes and control characters are found wherever they
// fall against the scan's 32- and 8-byte steps, as encoding/json finds
// them.
func TestStringScanSteps(t *testing.T) {
	for n := range 80 {
		for pos := range n {
			for _, c := range []string{`"`, `\n`, `\u00e9`, `\x`, "\x01", "\xc3\xa9"} {
				s := []byte(strings.Repeat("a", n))
				s = append(append(append([]byte(nil), s[:pos]...), c...), s[pos:]...)
				body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + string(s) + `"}]}`)
				_, err := Parse(body, true)
				if valid := json.Valid(body); (err == nil) != valid {
					t.Errorf("%d bytes, %q at %d: Parse error %v; encoding/json valid %v", n, c, pos, err, valid)
				}
			}
		}
	}
}
