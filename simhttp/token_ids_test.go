package simhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const tokenIDsMessages = `[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]`

// tokenized is what /tokenize answers for body.
func tokenized(t *testing.T, env *testEnv, body string) []uint32 {
	t.Helper()
	code, b := env.do(t, "POST", "/tokenize", body)
	if code != 200 {
		t.Fatalf("tokenize: status %d: %s", code, b)
	}
	var r tokenizeResponse
	mustJSON(t, b, &r)
	return r.Tokens
}

// streamChunks posts a streaming request and returns its JSON chunks,
// without [DONE].
func streamChunks(t *testing.T, env *testEnv, path, body string) []string {
	t.Helper()
	resp, err := http.Post(env.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := sseEvents(t, resp.Body)
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events = %q; want chunks then [DONE]", events)
	}
	return events[:len(events)-1]
}

func TestReturnTokenIDsChat(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	wantPrompt := tokenized(t, env, `{"messages":`+tokenIDsMessages+`}`)
	code, b := env.do(t, "POST", "/v1/chat/completions", `{"messages":`+tokenIDsMessages+`,"max_tokens":5,"return_token_ids":true}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var r chatResponse
	mustJSON(t, b, &r)
	if diff := cmp.Diff(wantPrompt, r.PromptTokenIDs); diff != "" {
		t.Errorf("prompt_token_ids differ from /tokenize (-want +got):\n%s", diff)
	}
	if got := r.Choices[0].TokenIDs; len(got) != r.Usage.CompletionTokens || len(got) != 5 {
		t.Errorf("token_ids = %v; want usage.completion_tokens (%d) = 5 ids", got, r.Usage.CompletionTokens)
	}
	// vLLM's order: ... usage, prompt_token_ids; the simulator's sim after.
	u, p, s := bytes.Index(b, []byte(`"usage":`)), bytes.Index(b, []byte(`"prompt_token_ids":`)), bytes.Index(b, []byte(`"sim":`))
	if u < 0 || p < u || s < p {
		t.Errorf("field order usage@%d prompt_token_ids@%d sim@%d; want increasing: %s", u, p, s, b)
	}
}

func TestReturnTokenIDsChatStream(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	wantPrompt := tokenized(t, env, `{"messages":`+tokenIDsMessages+`}`)
	chunks := streamChunks(t, env, "/v1/chat/completions",
		`{"messages":`+tokenIDsMessages+`,"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`)
	type chunk struct {
		PromptTokenIDs *[]uint32  `json:"prompt_token_ids"`
		Usage          *usageInfo `json:"usage"`
		Choices        []struct {
			Delta    chatDelta `json:"delta"`
			TokenIDs *[]uint32 `json:"token_ids"`
		} `json:"choices"`
	}
	var role chunk
	mustJSON(t, []byte(chunks[0]), &role)
	if role.PromptTokenIDs == nil || !cmp.Equal(*role.PromptTokenIDs, wantPrompt) {
		t.Errorf("role chunk prompt_token_ids = %v; want /tokenize's %v", role.PromptTokenIDs, wantPrompt)
	}
	if len(role.Choices) != 1 || role.Choices[0].Delta.Role != "assistant" || role.Choices[0].TokenIDs != nil {
		t.Errorf("role chunk = %s; want role assistant and no token_ids", chunks[0])
	}
	var final chunk
	mustJSON(t, []byte(chunks[len(chunks)-1]), &final)
	if final.Usage == nil || final.Usage.CompletionTokens != 7 {
		t.Fatalf("usage chunk = %s; want 7 completion tokens", chunks[len(chunks)-1])
	}
	var gen []uint32
	tok := env.eng.Tokenizer()
	for i, c := range chunks[1 : len(chunks)-1] {
		var ch chunk
		mustJSON(t, []byte(c), &ch)
		if ch.PromptTokenIDs != nil || len(ch.Choices) != 1 || ch.Choices[0].TokenIDs == nil {
			t.Fatalf("chunk %d = %s; want token_ids and no prompt_token_ids", i+1, c)
		}
		ids := *ch.Choices[0].TokenIDs
		if content := ch.Choices[0].Delta.Content; content != nil && *content != tok.Decode(ids) {
			t.Errorf("chunk %d content %q is not its token_ids %v (%q)", i+1, *content, ids, tok.Decode(ids))
		}
		gen = append(gen, ids...)
	}
	if len(gen) != final.Usage.CompletionTokens {
		t.Errorf("token_ids across chunks = %v (%d); want %d", gen, len(gen), final.Usage.CompletionTokens)
	}
}

func TestReturnTokenIDsCompletions(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	wantPrompt := env.eng.Tokenizer().Encode("hello world", true)
	code, b := env.do(t, "POST", "/v1/completions", `{"prompt":"hello world","max_tokens":4,"return_token_ids":true}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var r completionResponse
	mustJSON(t, b, &r)
	c := r.Choices[0]
	if !cmp.Equal(c.PromptTokenIDs, wantPrompt) || len(c.TokenIDs) != r.Usage.CompletionTokens || len(c.TokenIDs) != 4 {
		t.Errorf("choice prompt_token_ids %v token_ids %v; want %v and 4 ids", c.PromptTokenIDs, c.TokenIDs, wantPrompt)
	}

	chunks := streamChunks(t, env, "/v1/completions",
		`{"prompt":"hello world","max_tokens":6,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`)
	var final completionResponse
	mustJSON(t, []byte(chunks[len(chunks)-1]), &final)
	if final.Usage == nil || final.Usage.CompletionTokens != 6 {
		t.Fatalf("usage chunk = %s; want 6 completion tokens", chunks[len(chunks)-1])
	}
	var gen []uint32
	for i, s := range chunks[:len(chunks)-1] {
		var ch completionResponse
		mustJSON(t, []byte(s), &ch)
		c := ch.Choices[0]
		if i == 0 && !cmp.Equal(c.PromptTokenIDs, wantPrompt) || i > 0 && c.PromptTokenIDs != nil {
			t.Errorf("chunk %d prompt_token_ids = %v; want %v on the first chunk only", i, c.PromptTokenIDs, wantPrompt)
		}
		gen = append(gen, c.TokenIDs...)
	}
	if len(gen) != final.Usage.CompletionTokens {
		t.Errorf("token_ids across chunks = %v; want %d", gen, final.Usage.CompletionTokens)
	}
}

// In echo mode the text replays the prompt, and token_ids name the ids
// that text came from.
func TestReturnTokenIDsEcho(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.Echo = true })
	ids := env.eng.Tokenizer().Encode("alpha beta gamma delta", false)
	idsJSON, _ := json.Marshal(ids)
	code, b := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"return_token_ids":true}`, idsJSON, len(ids)))
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var r completionResponse
	mustJSON(t, b, &r)
	if c := r.Choices[0]; !cmp.Equal(c.TokenIDs, ids) || !cmp.Equal(c.PromptTokenIDs, ids) {
		t.Errorf("echo token_ids %v prompt_token_ids %v; want both %v", c.TokenIDs, c.PromptTokenIDs, ids)
	}
}

// Without return_token_ids (absent, false or null) neither key appears.
func TestNoReturnTokenIDs(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	for _, flag := range []string{"", `,"return_token_ids":false`, `,"return_token_ids":null`} {
		for _, tt := range []struct{ path, body string }{
			{"/v1/chat/completions", `{"messages":` + tokenIDsMessages + `,"max_tokens":3` + flag},
			{"/v1/completions", `{"prompt":"hello world","max_tokens":3` + flag},
		} {
			for _, stream := range []string{"", `,"stream":true,"stream_options":{"include_usage":true}`} {
				body := tt.body + stream + "}"
				code, b := env.do(t, "POST", tt.path, body)
				if code != 200 {
					t.Fatalf("%s %s: status %d: %s", tt.path, body, code, b)
				}
				if bytes.Contains(b, []byte(`token_ids`)) {
					t.Errorf("%s %s answered token ids: %s", tt.path, body, b)
				}
			}
		}
	}
}
