package forward

import (
	"errors"
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
		{"completion two prompts", `{"model":"m","prompt":["a","b"]}`, false, Prompt{Model: "m"}, errNoPrompt},
		{"completion negative id", `{"prompt":[-1]}`, false, Prompt{}, errNoPrompt},
		{"completion missing prompt", `{"model":"m"}`, false, Prompt{Model: "m"}, errNoPrompt},
		{"completion empty", `{"prompt":""}`, false, Prompt{}, errNoPrompt},
		{"completion null prompt", `{"prompt":null}`, false, Prompt{}, errNoPrompt},
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true,"tools":[{"type":"function"}],"cache_salt":"s"}`, true,
			Prompt{Model: "m", Chat: true, Messages: []byte(`[{"role":"user","content":"hi"}]`),
				Tools: []byte(`[{"type":"function"}]`), AddGenerationPrompt: &tru, CacheSalt: "s"}, nil},
		{"chat no messages", `{"model":"m"}`, true, Prompt{Model: "m", Chat: true}, errNoPrompt},
		{"chat messages not list", `{"messages":{}}`, true, Prompt{Chat: true, Messages: []byte(`{}`)}, errNoPrompt},
		{"malformed", `{"model":`, false, Prompt{}, errBadJSON},
		{"not object", `[1,2]`, false, Prompt{}, errBadJSON},
		{"trailing", `{"prompt":"a"} {}`, false, Prompt{}, errBadJSON},
		{"wrong type", `{"model":5}`, false, Prompt{}, errBadJSON},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePrompt([]byte(tt.body), tt.chat)
			if !errors.Is(err, tt.err) {
				t.Fatalf("ParsePrompt(%s) error = %v; want %v", tt.body, err, tt.err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParsePrompt(%s) mismatch (-want +got):\n%s", tt.body, diff)
			}
		})
	}
}

func FuzzParsePrompt(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":[1,2,3]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":"x"}]}`), true)
	f.Add([]byte(`{"prompt":[[1]]}`), false)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := ParsePrompt(body, chat)
		if err == nil && !chat && p.Text == "" && len(p.Tokens) == 0 {
			t.Fatalf("ParsePrompt(%q) succeeded without a prompt", body)
		}
		if err == nil && chat && len(p.Messages) == 0 {
			t.Fatalf("ParsePrompt(%q) succeeded without messages", body)
		}
	})
}
