package simhttp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// namedEvent is one `event:` + `data:` SSE event.
type namedEvent struct {
	name string
	data json.RawMessage
}

// namedEvents reads an SSE body of named events and checks its framing:
// each event is an `event: ` line, a `data: ` line and a blank line, and
// its name is its data's "type".
func namedEvents(t *testing.T, body io.Reader) []namedEvent {
	t.Helper()
	var out []namedEvent
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, ok := strings.CutPrefix(sc.Text(), "event: ")
		if !ok {
			t.Fatalf("line %q: want \"event: \"", sc.Text())
		}
		if !sc.Scan() {
			t.Fatalf("event %s without data", name)
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			t.Fatalf("event %s: line %q, want \"data: \"", name, sc.Text())
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %s not followed by a blank line", name)
		}
		var typ struct{ Type string }
		mustJSON(t, []byte(data), &typ)
		if typ.Type != name {
			t.Errorf("event %s carries type %q", name, typ.Type)
		}
		out = append(out, namedEvent{name, json.RawMessage(data)})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func postStream(t *testing.T, env *testEnv, path, body string) []namedEvent {
	t.Helper()
	resp, err := http.Post(env.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("POST %s: %d %q %s", path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return namedEvents(t, resp.Body)
}

// messagesBody is a Messages request whose vLLM conversion is
// messagesChat.
const (
	messagesBody = `{"model":"sim-model","max_tokens":5,"system":"be brief","messages":[{"role":"user","content":"hello there"}]}`
	messagesChat = `[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]`
)

type anthropicAnswer struct {
	ID         string           `json:"id"`
	Type       string           `json:"type"`
	Role       string           `json:"role"`
	Content    []anthropicBlock `json:"content"`
	Model      string           `json:"model"`
	StopReason string           `json:"stop_reason"`
	Usage      struct {
		InputTokens  int  `json:"input_tokens"`
		OutputTokens int  `json:"output_tokens"`
		CacheRead    *int `json:"cache_read_input_tokens"`
	} `json:"usage"`
	Sim *simTiming `json:"sim"`
}

// A Messages request is served as the chat it converts to, answered in
// vLLM's Anthropic shape: the chat's id, type message, one text block,
// stop_reason, usage with the engine's cached figure, sim; no nulls.
func TestMessagesShape(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	want := tokenized(t, env, `{"messages":`+messagesChat+`}`)
	var last anthropicAnswer
	for i := range 2 {
		code, b := env.do(t, "POST", "/v1/messages", messagesBody)
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		var raw map[string]json.RawMessage
		mustJSON(t, b, &raw)
		for _, k := range []string{"stop_sequence", "kv_transfer_params"} {
			if _, ok := raw[k]; ok {
				t.Errorf("answer has %q; vLLM dumps without nulls: %s", k, b)
			}
		}
		var a anthropicAnswer
		mustJSON(t, b, &a)
		if !strings.HasPrefix(a.ID, "chatcmpl-") || a.Type != "message" || a.Role != "assistant" || a.Model != testModel ||
			len(a.Content) != 1 || a.Content[0].Type != "text" || a.Content[0].Text == "" || a.StopReason != "max_tokens" || a.Sim == nil {
			t.Errorf("answer %d = %s", i, b)
		}
		if a.Usage.InputTokens != len(want) || a.Usage.OutputTokens != 5 || a.Usage.CacheRead == nil {
			t.Errorf("usage = %+v; want input %d (the converted chat's /tokenize), output 5, cache_read_input_tokens", a.Usage, len(want))
		}
		if i == 0 && *a.Usage.CacheRead != 0 {
			t.Errorf("first request cache_read_input_tokens = %d; want 0", *a.Usage.CacheRead)
		}
		last = a
	}
	if got, wantHit := *last.Usage.CacheRead, (len(want)-1)/16*16; got != wantHit {
		t.Errorf("repeat cache_read_input_tokens = %d; want %d", got, wantHit)
	}
}

// vLLM strips Claude Code's per-request billing header from the system
// prompt, so it must not change the tokens.
func TestMessagesBillingHeader(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	want := tokenized(t, env, `{"messages":`+messagesChat+`}`)
	code, b := env.do(t, "POST", "/v1/messages", `{"model":"sim-model","max_tokens":2,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1; cch=abc"},{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":"hello there"}]}`)
	var a anthropicAnswer
	mustJSON(t, b, &a)
	if code != 200 || a.Usage.InputTokens != len(want) {
		t.Errorf("with the billing header: %d input tokens %d; want %d: %s", code, a.Usage.InputTokens, len(want), b)
	}
}

// A Messages stream is vLLM's: message_start (the message without type
// and role), content_block_start, deltas, content_block_stop,
// message_delta with the stop reason and usage (and sim), message_stop.
func TestMessagesStream(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	want := tokenized(t, env, `{"messages":`+messagesChat+`}`)
	evs := postStream(t, env, "/v1/messages", strings.Replace(messagesBody, `"max_tokens":5`, `"max_tokens":6,"stream":true`, 1))
	var names []string
	for _, e := range evs {
		if len(names) == 0 || names[len(names)-1] != e.name || e.name != "content_block_delta" {
			names = append(names, e.name)
		}
	}
	if diff := cmp.Diff([]string{"message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, names); diff != "" {
		t.Fatalf("event order (-want +got):\n%s", diff)
	}
	var start struct {
		Message map[string]json.RawMessage `json:"message"`
	}
	mustJSON(t, evs[0].data, &start)
	if _, ok := start.Message["type"]; ok || string(start.Message["stop_reason"]) != "null" || !strings.HasPrefix(string(start.Message["id"]), `"chatcmpl-`) {
		t.Errorf("message_start = %s; want vLLM's (no type or role, stop_reason null)", evs[0].data)
	}
	if got := string(start.Message["usage"]); got != fmt.Sprintf(`{"input_tokens":%d,"output_tokens":0}`, len(want)) {
		t.Errorf("message_start usage = %s; want %d input tokens", got, len(want))
	}
	if string(evs[1].data) != `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}` {
		t.Errorf("content_block_start = %s", evs[1].data)
	}
	var text strings.Builder
	for _, e := range evs[2 : len(evs)-3] {
		var d struct {
			Delta struct{ Type, Text string }
			Index *int
		}
		mustJSON(t, e.data, &d)
		if d.Delta.Type != "text_delta" || d.Index == nil || *d.Index != 0 {
			t.Errorf("delta = %s", e.data)
		}
		text.WriteString(d.Delta.Text)
	}
	if text.Len() == 0 {
		t.Error("no text streamed")
	}
	if got := string(evs[len(evs)-3].data); got != `{"type":"content_block_stop","index":0}` {
		t.Errorf("content_block_stop = %s", got)
	}
	var delta struct {
		Delta map[string]json.RawMessage
		Usage struct {
			InputTokens  int  `json:"input_tokens"`
			OutputTokens int  `json:"output_tokens"`
			CacheRead    *int `json:"cache_read_input_tokens"`
		}
		Sim *simTiming
	}
	mustJSON(t, evs[len(evs)-2].data, &delta)
	if string(delta.Delta["stop_reason"]) != `"max_tokens"` || len(delta.Delta) != 1 || delta.Usage.OutputTokens != 6 ||
		delta.Usage.InputTokens != len(want) || delta.Usage.CacheRead == nil || delta.Sim == nil {
		t.Errorf("message_delta = %s", evs[len(evs)-2].data)
	}
	if got := string(evs[len(evs)-1].data); got != `{"type":"message_stop"}` {
		t.Errorf("message_stop = %s", got)
	}
}

// Errors the route makes are Anthropic's envelope with vLLM's status and
// the OpenAI error type; a body that fails validation gets vLLM's app-wide
// validation error (OpenAI's shape).
func TestMessagesErrors(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	long := strings.Repeat("word ", 2100)
	for _, tt := range []struct {
		name, body string
		status     int
		want       string // the whole body, or a prefix of the error message
		anthropic  bool
	}{
		{"unknown model", `{"model":"gpt-9","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, 404,
			`{"type":"error","error":{"type":"NotFoundError","message":"The model ` + "`gpt-9`" + ` does not exist."}}`, true},
		{"too long", fmt.Sprintf(`{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":%q}]}`, long), 400,
			"This model's maximum context length is 2048 tokens.", true},
		{"max_tokens missing", `{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`, 400,
			"1 validation error:\n  {'type': 'missing', 'loc': ('body', 'max_tokens'), 'msg': 'Field required'", false},
		{"max_tokens zero", `{"model":"sim-model","max_tokens":0,"messages":[]}`, 400,
			"1 validation error:\n  {'type': 'value_error', 'loc': ('body', 'max_tokens'), 'msg': 'Value error, max_tokens must be positive', 'input': 0}", false},
		{"model missing", `{"max_tokens":1,"messages":[]}`, 400, "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'model')", false},
		{"messages a string", `{"model":"sim-model","max_tokens":1,"messages":"hi"}`, 400, "1 validation error:\n  {'type': 'list_type', 'loc': ('body', 'messages')", false},
		{"not json", `{`, 400, "invalid JSON body", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, b := env.do(t, "POST", "/v1/messages", tt.body)
			if code != tt.status {
				t.Fatalf("status %d %s; want %d", code, b, tt.status)
			}
			if tt.anthropic {
				var e anthropicError
				mustJSON(t, b, &e)
				if strings.HasPrefix(tt.want, "{") {
					if string(b) != tt.want {
						t.Errorf("body %s; want %s", b, tt.want)
					}
				} else if e.Type != "error" || e.Error.Type != "BadRequestError" || !strings.HasPrefix(e.Error.Message, tt.want) {
					t.Errorf("body %s; want Anthropic's envelope, BadRequestError, %q", b, tt.want)
				}
				return
			}
			var e errorBody
			mustJSON(t, b, &e)
			if e.Error.Code != 400 || !strings.HasPrefix(e.Error.Message, tt.want) {
				t.Errorf("error %s; want OpenAI's shape, message prefix %q", b, tt.want)
			}
		})
	}
}

// /v1/messages/render renders what /v1/messages runs.
func TestMessagesRender(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut = true })
	want := tokenized(t, env, `{"messages":`+messagesChat+`}`)
	code, b := env.do(t, "POST", "/v1/messages/render", messagesBody)
	var g generateRequest
	mustJSON(t, b, &g)
	if code != 200 || !cmp.Equal(g.TokenIDs, want) || g.SamplingParams.MaxTokens != 5 || g.Model == nil || *g.Model != testModel ||
		g.CacheSalt != nil || g.Features != nil || !strings.HasPrefix(g.RequestID, "chatcmpl-") {
		t.Errorf("render = %d %s; want /tokenize's %v", code, b, want)
	}
	if code, b := env.do(t, "POST", "/v1/messages/render", `{"model":"nope","max_tokens":1,"messages":[]}`); code != 404 || errorOf(t, b).Type != "NotFoundError" {
		t.Errorf("unknown model render = %d %s; want OpenAI's 404", code, b)
	}
}

// FuzzMessagesRequest: the Messages validation never panics, and what it
// accepts has a model, messages and a positive max_tokens.
func FuzzMessagesRequest(f *testing.F) {
	for _, s := range []string{messagesBody, `{}`, `{"model":"m","max_tokens":0,"messages":[]}`, `{"model":"","max_tokens":1,"messages":[]}`,
		`{"model":"m","max_tokens":1.5,"messages":[]}`, `{"model":"m","max_tokens":1,"messages":{}}`, `[]`, `{`, `{"stream":"x"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, aerr := decodeMessages(b)
		if aerr != nil {
			if aerr.Status != 400 {
				t.Fatalf("status %d; want 400", aerr.Status)
			}
			return
		}
		if r.Model == nil || *r.Model == "" || r.Messages == nil || r.MaxTokens == nil || *r.MaxTokens <= 0 {
			t.Fatalf("decodeMessages(%q) accepted %+v", b, r)
		}
	})
}
