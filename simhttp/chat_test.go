package simhttp

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/vllmsim"
)

func TestParsePrompt(t *testing.T) {
	text := func(s ...string) []completionPrompt {
		var out []completionPrompt
		for _, x := range s {
			out = append(out, completionPrompt{Text: x, IsText: true})
		}
		return out
	}
	ids := func(ls ...[]uint32) []completionPrompt {
		var out []completionPrompt
		for _, l := range ls {
			out = append(out, completionPrompt{Tokens: l})
		}
		return out
	}
	tests := []struct {
		name    string
		raw     string
		want    []completionPrompt
		wantErr bool
	}{
		{"string", `"hello"`, text("hello"), false},
		{"list of one string", `["hello"]`, text("hello"), false},
		{"token ids", `[1, 2, 4294967295]`, ids([]uint32{1, 2, 4294967295}), false},
		{"list of one id list", `[[5, 6]]`, ids([]uint32{5, 6}), false},
		{"two strings", `["a", "b"]`, text("a", "b"), false},
		{"two id lists", `[[1], [2, 3]]`, ids([]uint32{1}, []uint32{2, 3}), false},
		{"empty strings in a batch", `["", "b"]`, text("", "b"), false},
		{"empty list", `[]`, nil, true},
		{"missing", ``, nil, true},
		{"null", `null`, nil, true},
		{"number", `7`, nil, true},
		{"negative id", `[-1]`, nil, true},
		{"too big id", `[4294967296]`, nil, true},
		{"float id", `[1.5]`, nil, true},
		{"mixed", `[1, "a"]`, nil, true},
		{"mixed batch", `["a", [1]]`, nil, true},
		{"batch with an id", `[[1], 2]`, nil, true},
		{"batch with an empty id list", `[[1], []]`, nil, true},
		{"batch with a bad id", `[[1], [-1]]`, nil, true},
		{"nested too deep", `[[[1]]]`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parsePrompt(json.RawMessage(tt.raw))
			if (err != nil) != tt.wantErr {
				t.Fatalf("parsePrompt(%s) error = %v; want error %v", tt.raw, err, tt.wantErr)
			}
			if err != nil {
				if err.Status != 400 || err.Type != "BadRequestError" {
					t.Errorf("parsePrompt(%s) error = %+v; want 400 BadRequestError", tt.raw, err)
				}
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parsePrompt(%s) (-want +got):\n%s", tt.raw, diff)
			}
		})
	}
}

func TestDecodeChat(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantMsgs  []vllmsim.Message
		wantOpts  vllmsim.ChatOptions
		wantMax   int
		wantError bool
	}{
		{"plain", `{"messages":[{"role":"user","content":"hi"}]}`,
			[]vllmsim.Message{{Role: "user", Content: "hi"}}, vllmsim.ChatOptions{AddGenerationPrompt: true}, defaultMaxTokens, false},
		{"parts and tools", `{"messages":[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"tools":[{"type":"function"}],"max_tokens":3,"max_completion_tokens":9}`,
			[]vllmsim.Message{{Role: "system"}, {Role: "user", Content: "a\nb"}},
			vllmsim.ChatOptions{AddGenerationPrompt: true, Tools: []byte(`[{"type":"function"}]`)}, 9, false},
		{"continue final", `{"messages":[{"role":"assistant","content":"x"}],"add_generation_prompt":false,"continue_final_message":true,"max_tokens":2}`,
			[]vllmsim.Message{{Role: "assistant", Content: "x"}}, vllmsim.ChatOptions{ContinueFinalMessage: true}, 2, false},
		{"both flags", `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"no messages", `{"messages":[]}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"no role", `{"messages":[{"content":"x"}]}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"content number", `{"messages":[{"role":"user","content":5}]}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"n=2", `{"messages":[{"role":"user","content":"x"}],"n":2}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"trailing", `{"messages":[{"role":"user","content":"x"}]} {}`, nil, vllmsim.ChatOptions{}, 0, true},
		{"messages object", `{"messages":{}}`, nil, vllmsim.ChatOptions{}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, msgs, err := decodeChat([]byte(tt.body))
			if (err != nil) != tt.wantError {
				t.Fatalf("decodeChat(%s) error = %v; want error %v", tt.body, err, tt.wantError)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tt.wantMsgs, msgs); diff != "" {
				t.Errorf("messages (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOpts, r.options()); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
			if n, _ := r.maxTokens(); n != tt.wantMax {
				t.Errorf("maxTokens = %d; want %d", n, tt.wantMax)
			}
		})
	}
}

// FuzzChatRequest: the chat decoder never panics, and whatever it accepts
// has at least one message with a role.
func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[],"max_completion_tokens":5}`,
		`{"messages":[{"role":"user","content":null}],"add_generation_prompt":false,"continue_final_message":true}`,
		`{"messages":[]}`, `[]`, `null`, `{`, `{"messages":[{"role":1}]}`, `{"max_tokens":1e400}`,
		`{"messages":[{"role":"user","content":"a\u00e9\n\"b"}]}`, "{\"messages\":[{\"role\":\"user\",\"content\":\"bad \xff utf8\"}]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, msgs, err := decodeChat(b)
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("decodeChat error status %d; want 400", err.Status)
			}
			return
		}
		if len(msgs) == 0 || len(msgs) != len(r.Messages) {
			t.Fatalf("accepted %d messages from %d", len(msgs), len(r.Messages))
		}
		for i, m := range msgs {
			if m.Role == "" {
				t.Fatal("accepted a message without role")
			}
			// A string content is what encoding/json makes of it.
			if raw := bytes.TrimSpace(r.Messages[i].Content); len(raw) > 0 && raw[0] == '"' {
				var want string
				if err := json.Unmarshal(raw, &want); err != nil || m.Content != want {
					t.Fatalf("content %q read as %q; encoding/json: %q, %v", raw, m.Content, want, err)
				}
			}
		}
		r.maxTokens()
		r.options()
	})
}

// FuzzCompletionPrompt: the prompt decoder never panics and accepts only
// non-empty token prompts, one or more.
func FuzzCompletionPrompt(f *testing.F) {
	for _, s := range []string{`"x"`, `["x"]`, `[1,2]`, `[[1,2]]`, `[[1],[2]]`, `["a","b"]`, `["a",[1]]`, `[[1],[]]`, `[]`, `[-1]`, `{}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ps, err := parsePrompt(b)
		if err != nil {
			return
		}
		if len(ps) == 0 {
			t.Fatalf("parsePrompt(%q) accepted no prompt", b)
		}
		for i, p := range ps {
			if !p.IsText && len(p.Tokens) == 0 {
				t.Fatalf("parsePrompt(%q) accepted an empty token prompt at %d", b, i)
			}
			if p.IsText != ps[0].IsText {
				t.Fatalf("parsePrompt(%q) accepted a mixed batch", b)
			}
		}
	})
}

// topKeys is the names of the top-level members of the object b, in order.
func topKeys(t *testing.T, b []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	mustJSON(t, b, &m)
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // {
		t.Fatal(err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k.(string))
		if _, ok := m[k.(string)]; !ok {
			t.Fatalf("key %v not in %s", k, b)
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestOpenAIAnswerHead checks the members every chat and completions
// answer object leads with, whole and streamed, in vLLM's order.
func TestOpenAIAnswerHead(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	chat := `{"messages":[{"role":"user","content":"hello there"}],"max_tokens":3`
	cmpl := `{"prompt":"hello there","max_tokens":3`
	tests := []struct {
		name, path, body, object, idPrefix string
		stream                             bool
	}{
		{"chat", "/v1/chat/completions", chat + `}`, "chat.completion", "chatcmpl-", false},
		{"chat stream", "/v1/chat/completions", chat + `,"stream":true,"stream_options":{"include_usage":true}}`, "chat.completion.chunk", "chatcmpl-", true},
		{"completions", "/v1/completions", cmpl + `}`, "text_completion", "cmpl-", false},
		{"completions stream", "/v1/completions", cmpl + `,"stream":true,"stream_options":{"include_usage":true}}`, "text_completion", "cmpl-", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var answers []string
			if tt.stream {
				answers = streamChunks(t, env, tt.path, tt.body)
			} else {
				code, b := env.do(t, "POST", tt.path, tt.body)
				if code != 200 {
					t.Fatalf("status %d: %s", code, b)
				}
				answers = []string{string(b)}
			}
			var id string
			for _, a := range answers {
				if keys := topKeys(t, []byte(a)); len(keys) < 5 || !cmp.Equal(keys[:5], []string{"id", "object", "created", "model", "choices"}) {
					t.Errorf("members %v; want id, object, created, model, choices first: %s", keys, a)
				}
				var h struct {
					ID      string `json:"id"`
					Object  string `json:"object"`
					Created int64  `json:"created"`
					Model   string `json:"model"`
				}
				mustJSON(t, []byte(a), &h)
				if id == "" {
					id = h.ID
				}
				if h.ID != id || !strings.HasPrefix(h.ID, tt.idPrefix) || h.Object != tt.object || h.Model != testModel || h.Created != env.clock.now().Unix() {
					t.Errorf("head %+v; want id %s… (the same in every chunk), object %q, model %q, created %d", h, tt.idPrefix, tt.object, testModel, env.clock.now().Unix())
				}
			}
		})
	}
}
