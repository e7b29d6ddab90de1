package simhttp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/vllmsim"
)

const testModel = "sim-model"

// fakeClock is the server's wall clock under test control.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// fakeEvents records what the admin endpoints ask of the publisher.
type fakeEvents struct {
	mu       sync.Mutex
	restarts int
	rate     float64
}

func (f *fakeEvents) Restart(context.Context) error {
	f.mu.Lock()
	f.restarts++
	f.mu.Unlock()
	return nil
}
func (f *fakeEvents) SetDropRate(r float64) error {
	if r < 0 || r > 1 {
		return fmt.Errorf("drop rate %v outside [0, 1]", r)
	}
	f.mu.Lock()
	f.rate = r
	f.mu.Unlock()
	return nil
}
func (f *fakeEvents) DropRate() float64 { f.mu.Lock(); defer f.mu.Unlock(); return f.rate }

type testEnv struct {
	url    string
	eng    *vllmsim.Engine
	srv    *Server
	clock  *fakeClock
	events *fakeEvents
}

func testEngineConfig() vllmsim.Config {
	cfg := vllmsim.DefaultConfig()
	cfg.Model = testModel
	cfg.NumGPUBlocks = 512
	cfg.MaxModelLen = 2048
	cfg.TimeScale = 1000
	cfg.HashSeed, cfg.HashSeedSet = "0", true
	return cfg
}

// newTestEnv runs a real engine behind the HTTP edge on httptest.
func newTestEnv(t testing.TB, cfg vllmsim.Config, mut func(*Config)) *testEnv {
	t.Helper()
	eng, err := vllmsim.New(cfg)
	if err != nil {
		t.Fatalf("vllmsim.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { eng.Run(ctx); close(done) }()
	env := &testEnv{eng: eng, clock: &fakeClock{}, events: &fakeEvents{}}
	env.clock.ns.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	sc := Config{
		Models: []string{testModel, "alias"}, Root: "/models/sim", LoRAs: []LoRA{{Name: "adapter", Path: "/loras/a"}},
		MaxModelLen: cfg.MaxModelLen, RestartDowntime: time.Minute, BodyLimitBytes: 1 << 20, Now: env.clock.now,
	}
	if mut != nil {
		mut(&sc)
	}
	met := NewMetrics(testModel, []func() vllmsim.Stats{eng.Stats}, CacheInfo{BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks, HashAlgo: cfg.HashAlgo})
	env.srv = New(sc, eng, eng.Tokenizer(), env.events, met)
	hs := httptest.NewServer(env.srv.Handler())
	env.url = hs.URL
	t.Cleanup(func() {
		hs.Close()
		cancel()
		<-done
	})
	return env
}

func (e *testEnv) do(t testing.TB, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read: %v", method, path, err)
	}
	return resp.StatusCode, b
}

func mustJSON(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
}

// longPrompt is long enough to fill several 16-token blocks.
var longPrompt = strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20)

func TestCompletionsShapeAndCacheHit(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":5}`, testModel, longPrompt)
	var first, second completionResponse
	code, b := env.do(t, "POST", "/v1/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	mustJSON(t, b, &first)
	code, b = env.do(t, "POST", "/v1/completions", body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	mustJSON(t, b, &second)
	var raw map[string]any
	mustJSON(t, b, &raw)
	for _, k := range []string{"id", "object", "created", "model", "choices", "usage", "sim"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("response lacks %q: %s", k, b)
		}
	}
	r := second
	if !strings.HasPrefix(r.ID, "cmpl-") || r.Object != "text_completion" || r.Model != testModel || r.Created != env.clock.now().Unix() {
		t.Errorf("header fields = %q %q %q %d", r.ID, r.Object, r.Model, r.Created)
	}
	if len(r.Choices) != 1 || r.Choices[0].Text == "" || r.Choices[0].FinishReason == nil || *r.Choices[0].FinishReason != "length" {
		t.Fatalf("choices = %+v", r.Choices)
	}
	prompt := len(env.eng.Tokenizer().Encode(longPrompt, true))
	u := r.Usage
	if u.PromptTokens != prompt || u.CompletionTokens != 5 || u.TotalTokens != prompt+5 {
		t.Errorf("usage = %+v; want prompt %d completion 5", u, prompt)
	}
	if first.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first request cached_tokens = %d; want 0", first.Usage.PromptTokensDetails.CachedTokens)
	}
	// The repeat hits every full block the last-token rule allows.
	if want := (prompt - 1) / 16 * 16; u.PromptTokensDetails.CachedTokens != want {
		t.Errorf("repeat cached_tokens = %d; want %d", u.PromptTokensDetails.CachedTokens, want)
	}
	s := r.Sim
	if s == nil || s.FirstTokenS < s.ArrivalS || s.FinishS < s.FirstTokenS || s.FinishS == s.ArrivalS {
		t.Errorf("sim = %+v; want arrival <= first token <= finish", s)
	}
	if first.ID == second.ID {
		t.Errorf("two requests share id %q", first.ID)
	}
}

func TestCompletionsTokenPromptMatchesText(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	ids := env.eng.Tokenizer().Encode(longPrompt, true)
	idsJSON, _ := json.Marshal(ids)
	for _, prompt := range []string{string(idsJSON), "[" + string(idsJSON) + "]"} {
		code, b := env.do(t, "POST", "/v1/completions", `{"prompt":`+prompt+`,"max_tokens":2}`)
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		var r completionResponse
		mustJSON(t, b, &r)
		if r.Usage.PromptTokens != len(ids) || r.Model != testModel {
			t.Errorf("prompt_tokens %d model %q; want %d %q", r.Usage.PromptTokens, r.Model, len(ids), testModel)
		}
	}
}

func TestChatShape(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	code, b := env.do(t, "POST", "/v1/chat/completions", `{"model":"alias","messages":[{"role":"user","content":"hello there"}],"max_completion_tokens":3}`)
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var r chatResponse
	mustJSON(t, b, &r)
	want, err := env.eng.Tokenizer().Chat([]vllmsim.Message{{Role: "user", Content: "hello there"}}, vllmsim.ChatOptions{AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "chatcmpl-") || r.Object != "chat.completion" || r.Model != "alias" {
		t.Errorf("id %q object %q model %q", r.ID, r.Object, r.Model)
	}
	if len(r.Choices) != 1 || r.Choices[0].Message.Role != "assistant" || r.Choices[0].Message.Content == "" {
		t.Errorf("choices = %+v", r.Choices)
	}
	if r.Usage.PromptTokens != len(want) || r.Usage.CompletionTokens != 3 {
		t.Errorf("usage = %+v; want prompt %d completion 3", r.Usage, len(want))
	}
}

func TestEchoRepeatsPrompt(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.Echo = true })
	tok := env.eng.Tokenizer()
	ids := tok.Encode("alpha beta gamma delta", false)
	idsJSON, _ := json.Marshal(ids)
	code, b := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":%d}`, idsJSON, len(ids)))
	if code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	var r completionResponse
	mustJSON(t, b, &r)
	var want strings.Builder
	for _, id := range ids {
		want.WriteString(tok.Decode([]uint32{id}))
	}
	if r.Choices[0].Text != want.String() {
		t.Errorf("echo text = %q; want %q", r.Choices[0].Text, want.String())
	}
}

// sseEvents reads an SSE body and checks its framing: every event is one
// `data: ` line followed by a blank line.
func sseEvents(t *testing.T, body io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("line %q does not start with \"data: \"", line)
		}
		if !sc.Scan() || sc.Text() != "" {
			t.Fatalf("event %q not followed by a blank line", line)
		}
		events = append(events, strings.TrimPrefix(line, "data: "))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

func TestStreamingSSE(t *testing.T) {
	tests := []struct {
		name, path, body string
		usage            bool
	}{
		{"chat usage", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":6,"stream":true}`, false},
		{"completion usage", "/v1/completions", `{"prompt":"hello","max_tokens":6,"stream":true,"stream_options":{"include_usage":true}}`, true},
		{"completion", "/v1/completions", `{"prompt":"hello","max_tokens":6,"stream":true}`, false},
	}
	env := newTestEnv(t, testEngineConfig(), nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := http.Post(env.url+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d content-type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			events := sseEvents(t, resp.Body)
			if len(events) < 3 || events[len(events)-1] != "[DONE]" {
				t.Fatalf("events = %q; want chunks then [DONE]", events)
			}
			chunks := events[:len(events)-1]
			var final map[string]json.RawMessage
			if tt.usage {
				mustJSON(t, []byte(chunks[len(chunks)-1]), &final)
				if string(final["choices"]) != "[]" || final["usage"] == nil || final["sim"] == nil {
					t.Errorf("usage chunk = %s; want choices [] with usage and sim", chunks[len(chunks)-1])
				}
				chunks = chunks[:len(chunks)-1]
			}
			var text strings.Builder
			finishes := 0
			for i, c := range chunks {
				var ch struct {
					Object  string `json:"object"`
					Usage   any    `json:"usage"`
					Choices []struct {
						Text  string `json:"text"`
						Delta struct {
							Role    string `json:"role"`
							Content string `json:"content"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				mustJSON(t, []byte(c), &ch)
				wantObj := "text_completion"
				if strings.Contains(tt.path, "chat") {
					wantObj = "chat.completion.chunk"
				}
				if ch.Object != wantObj || len(ch.Choices) != 1 || ch.Usage != nil {
					t.Fatalf("chunk %d = %s; want object %s, one choice, no usage", i, c, wantObj)
				}
				if i == 0 && wantObj == "chat.completion.chunk" && ch.Choices[0].Delta.Role != "assistant" {
					t.Errorf("first chat chunk = %s; want role assistant", c)
				}
				text.WriteString(ch.Choices[0].Text + ch.Choices[0].Delta.Content)
				if ch.Choices[0].FinishReason != nil {
					finishes++
					if i != len(chunks)-1 || *ch.Choices[0].FinishReason != "length" {
						t.Errorf("finish_reason %q on chunk %d of %d", *ch.Choices[0].FinishReason, i, len(chunks))
					}
				}
			}
			if finishes != 1 || text.Len() == 0 {
				t.Errorf("finish_reason chunks = %d, text %q; want 1 and non-empty", finishes, text.String())
			}
			if tt.usage {
				var u usageInfo
				mustJSON(t, final["usage"], &u)
				if u.CompletionTokens != 6 || u.PromptTokens == 0 {
					t.Errorf("usage = %+v; want 6 completion tokens", u)
				}
			}
		})
	}
}

func errorOf(t *testing.T, b []byte) errorInfo {
	t.Helper()
	var e errorBody
	mustJSON(t, b, &e)
	var raw struct {
		Error map[string]json.RawMessage `json:"error"`
	}
	mustJSON(t, b, &raw)
	if string(raw.Error["param"]) != "null" {
		t.Errorf("error param = %s; want null", raw.Error["param"])
	}
	return e.Error
}

func TestErrors(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	long := strings.Repeat("word ", 4000)
	tests := []struct {
		name, method, path, body string
		status                   int
		typ, msgPrefix           string
	}{
		{"malformed chat", "POST", "/v1/chat/completions", `{"messages":`, 400, "BadRequestError", "invalid JSON body"},
		{"malformed completion", "POST", "/v1/completions", `nope`, 400, "BadRequestError", "invalid JSON body"},
		{"unknown model", "POST", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"unknown model completions", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"unknown model tokenize", "POST", "/tokenize", `{"model":"gpt-9","prompt":"x"}`, 404, "NotFoundError", "The model"},
		{"too long", "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":10}`, long), 400, "BadRequestError", "This model's maximum context length is 2048 tokens. However, you requested "},
		{"too long max_tokens", "POST", "/v1/completions", `{"prompt":"hi","max_tokens":5000}`, 400, "BadRequestError", "This model's maximum context length is 2048 tokens. However, you requested 5"},
		{"both chat flags", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, 400, "BadRequestError", "Cannot set both"},
		{"both tokenize flags", "POST", "/tokenize", `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, 400, "BadRequestError", "Cannot set both"},
		{"mixed batch", "POST", "/v1/completions", `{"prompt":["a",[1]]}`, 400, "BadRequestError", ""},
		{"empty batch entry", "POST", "/v1/completions", `{"prompt":[[1],[]]}`, 400, "BadRequestError", ""},
		{"n=2", "POST", "/v1/completions", `{"prompt":"a","n":2}`, 400, "BadRequestError", ""},
		{"max_tokens 0", "POST", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "BadRequestError", ""},
		{"bad token", "POST", "/v1/completions", `{"prompt":[1,-2]}`, 400, "BadRequestError", ""},
		{"empty token list", "POST", "/v1/completions", `{"prompt":[[]]}`, 400, "BadRequestError", ""},
		{"tokenize nothing", "POST", "/tokenize", `{}`, 400, "BadRequestError", ""},
		{"detokenize bad id", "POST", "/detokenize", `{"tokens":[1,99999999999]}`, 400, "BadRequestError", ""},
		{"drop rate range", "POST", "/sim/drop-rate", `{"drop_rate":1.5}`, 400, "BadRequestError", ""},
		{"drop rate missing", "POST", "/sim/drop-rate", `{}`, 400, "BadRequestError", ""},
		{"body too large", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 2<<20) + `"}`, 413, "Request Entity Too Large", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := env.do(t, tt.method, tt.path, tt.body)
			if code != tt.status {
				t.Fatalf("status = %d (%s); want %d", code, b, tt.status)
			}
			e := errorOf(t, b)
			if e.Type != tt.typ || e.Code != tt.status || !strings.HasPrefix(e.Message, tt.msgPrefix) {
				t.Errorf("error = %+v; want type %q code %d message prefix %q", e, tt.typ, tt.status, tt.msgPrefix)
			}
		})
	}
	for _, tt := range []struct {
		method, path string
		status       int
	}{{"GET", "/nope", 404}, {"GET", "/v1/completions", 405}, {"POST", "/health", 405}} {
		if code, b := env.do(t, tt.method, tt.path, ""); code != tt.status {
			t.Errorf("%s %s = %d %s; want %d", tt.method, tt.path, code, b, tt.status)
		}
	}
}

// TestGarbageNeverCrashes throws malformed bodies at every POST route: none
// gets a 5xx, none is a valid generation request, and the server keeps
// serving. (Some are valid for /tokenize: unknown fields are ignored.)
func TestGarbageNeverCrashes(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	bodies := []string{
		"", "{", "}", "null", "[]", "0", `"x"`, "\x00\xff\xfe", `{"messages":null}`, `{"messages":[null]}`,
		`{"messages":[{"role":"user","content":{"a":1}}]}`, `{"prompt":{"a":1}}`, `{"prompt":[[1],"a"]}`,
		`{"prompt":[1e999]}`, `{"max_tokens":"many","prompt":"x"}`, `{"max_tokens":1e20,"prompt":"x"}`,
		`{"stream":"yes","prompt":"x"}`, `{"model":5}`, `{"tokens":"abc"}`, `{"tokens":[1.5]}`,
		`{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, `{"drop_rate":"x"}`,
		`{"prompt":"x","stream_options":[]}`, strings.Repeat("[", 10000),
	}
	paths := []string{"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/sim/drop-rate"}
	for _, p := range paths {
		for _, b := range bodies {
			code, resp := env.do(t, "POST", p, b)
			if code >= 500 || (strings.HasPrefix(p, "/v1/") && code < 400) {
				t.Errorf("POST %s %q = %d %s; want 4xx", p, b, code, resp)
			}
		}
	}
	if code, _ := env.do(t, "GET", "/health", ""); code != 200 {
		t.Errorf("health after garbage = %d; want 200", code)
	}
}

func TestModels(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	code, b := env.do(t, "GET", "/v1/models", "")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	var l modelList
	mustJSON(t, b, &l)
	type card struct {
		ID, Root string
		Parent   *string
		MaxLen   *int
	}
	var got []card
	for _, c := range l.Data {
		if c.Object != "model" || c.OwnedBy != "vllm" || len(c.Permission) != 1 {
			t.Errorf("card %+v lacks object/owned_by/permission", c)
		}
		got = append(got, card{c.ID, c.Root, c.Parent, c.MaxModelLen})
	}
	want := []card{
		{testModel, "/models/sim", nil, ptr(2048)},
		{"alias", "/models/sim", nil, ptr(2048)},
		{"adapter", "/loras/a", ptr(testModel), nil},
	}
	if l.Object != "list" {
		t.Errorf("object = %q; want list", l.Object)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("cards (-want +got):\n%s", diff)
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	tok := env.eng.Tokenizer()
	tests := []struct {
		name, body string
		want       []uint32
	}{
		{"prompt", `{"prompt":"hello world"}`, tok.Encode("hello world", true)},
		{"prompt no special", `{"model":"alias","prompt":"hello world","add_special_tokens":false}`, tok.Encode("hello world", false)},
		{"messages", `{"messages":[{"role":"user","content":"hi"}]}`, must(tok.Chat([]vllmsim.Message{{Role: "user", Content: "hi"}}, vllmsim.ChatOptions{AddGenerationPrompt: true}))},
		{"messages no gen prompt", `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`, must(tok.Chat([]vllmsim.Message{{Role: "user", Content: "hi"}}, vllmsim.ChatOptions{}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := env.do(t, "POST", "/tokenize", tt.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			var raw map[string]json.RawMessage
			mustJSON(t, b, &raw)
			if string(raw["token_strs"]) != "null" {
				t.Errorf("token_strs = %s; want null", raw["token_strs"])
			}
			var r tokenizeResponse
			mustJSON(t, b, &r)
			if r.Count != len(tt.want) || r.MaxModelLen != 2048 || !cmp.Equal(r.Tokens, tt.want) {
				t.Errorf("tokenize = %+v; want tokens %v", r, tt.want)
			}
		})
	}
	code, b := env.do(t, "POST", "/tokenize", `{"prompt":"hello world","return_token_strs":true,"add_special_tokens":false}`)
	var r tokenizeResponse
	mustJSON(t, b, &r)
	if code != 200 || len(r.TokenStrs) != r.Count || strings.Join(r.TokenStrs, "") != tok.Decode(r.Tokens) {
		t.Errorf("token_strs = %q for %v", r.TokenStrs, r.Tokens)
	}
	ids, _ := json.Marshal(r.Tokens)
	code, b = env.do(t, "POST", "/detokenize", `{"tokens":`+string(ids)+`}`)
	var d struct{ Prompt string }
	mustJSON(t, b, &d)
	if code != 200 || d.Prompt != "hello world" {
		t.Errorf("detokenize = %d %q; want 200 \"hello world\"", code, d.Prompt)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestSimCacheGroundTruthAndLoRA(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	if code, b := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"adapter","prompt":%q,"max_tokens":1}`, longPrompt)); code != 200 {
		t.Fatalf("status %d: %s", code, b)
	}
	code, b := env.do(t, "GET", "/sim/cache", "")
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	var got struct {
		BlockSize int               `json:"block_size"`
		Blocks    []cachedBlockJSON `json:"blocks"`
	}
	mustJSON(t, b, &got)
	truth := env.eng.Cached()
	if len(got.Blocks) == 0 || len(got.Blocks) != len(truth) || got.BlockSize != 16 {
		t.Fatalf("/sim/cache has %d blocks (block size %d); engine has %d", len(got.Blocks), got.BlockSize, len(truth))
	}
	for i, bl := range got.Blocks {
		if bl.Hash != truth[i].Hash || bl.LoRA != "adapter" || len(bl.Tokens) != 16 {
			t.Errorf("block %d = hash %d lora %q %d tokens; want hash %d lora adapter 16 tokens", i, bl.Hash, bl.LoRA, len(bl.Tokens), truth[i].Hash)
		}
	}
	// Hashes are JSON numbers in unsigned decimal, exact above 2^53.
	if !bytes.Contains(b, []byte(fmt.Sprintf(`"hash":%d`, truth[0].Hash))) {
		t.Errorf("body lacks unsigned decimal hash %d", truth[0].Hash)
	}
}

func TestRestartHealthAndPublisher(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	if code, _ := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, longPrompt)); code != 200 {
		t.Fatalf("warm-up status %d", code)
	}
	if len(env.eng.Cached()) == 0 {
		t.Fatal("nothing cached before restart")
	}
	if code, b := env.do(t, "POST", "/sim/restart", ""); code != 200 {
		t.Fatalf("restart = %d %s", code, b)
	}
	if env.events.restarts != 1 {
		t.Errorf("publisher restarts = %d; want 1", env.events.restarts)
	}
	if n := len(env.eng.Cached()); n != 0 {
		t.Errorf("cache after restart holds %d blocks; want 0", n)
	}
	code, b := env.do(t, "GET", "/health", "")
	if code != 503 || len(b) != 0 {
		t.Errorf("health during restart = %d %q; want 503 empty", code, b)
	}
	if code, _ := env.do(t, "POST", "/v1/completions", `{"prompt":"x","max_tokens":1}`); code != 503 {
		t.Errorf("completion during restart = %d; want 503", code)
	}
	env.clock.advance(time.Minute)
	if code, b := env.do(t, "GET", "/health", ""); code != 200 || len(b) != 0 {
		t.Errorf("health after downtime = %d %q; want 200 empty", code, b)
	}
	env.srv.SetDraining()
	if code, _ := env.do(t, "GET", "/health", ""); code != 503 {
		t.Errorf("health while draining = %d; want 503", code)
	}
}

func TestDropRateEndpoint(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	code, b := env.do(t, "POST", "/sim/drop-rate", `{"drop_rate":0.3}`)
	if code != 200 || env.events.DropRate() != 0.3 {
		t.Fatalf("POST drop-rate = %d %s, rate %v; want 200, 0.3", code, b, env.events.DropRate())
	}
	if code, b := env.do(t, "GET", "/sim/drop-rate", ""); code != 200 || string(b) != `{"drop_rate":0.3}` {
		t.Errorf("GET drop-rate = %d %s", code, b)
	}
}

func TestMetricsExposition(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	for range 2 {
		if code, _ := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":3}`, longPrompt)); code != 200 {
			t.Fatalf("status %d", code)
		}
	}
	code, b := env.do(t, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("metrics status %d", code)
	}
	text := string(b)
	labels := `{engine="0",model_name="` + testModel + `"}`
	for _, want := range []string{
		"vllm:num_requests_running" + labels + " 0",
		"vllm:num_requests_waiting" + labels + " 0",
		"vllm:kv_cache_usage_perc" + labels,
		"vllm:prefix_cache_queries_total" + labels,
		"vllm:prefix_cache_hits_total" + labels,
		"vllm:prompt_tokens_total" + labels,
		"vllm:generation_tokens_total" + labels + " 6",
		"vllm:time_to_first_token_seconds_count" + labels + " 2",
		"vllm:e2e_request_latency_seconds_count" + labels + " 2",
		`vllm:request_success_total{engine="0",finished_reason="length",model_name="` + testModel + `"} 2`,
		`vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="512",prefix_caching_hash_algo="sha256_cbor"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	st := env.eng.Stats()
	if want := fmt.Sprintf("vllm:prefix_cache_hits_total%s %d\n", labels, st.PrefixHitsTokens); st.PrefixHitsTokens == 0 || !strings.Contains(text, want) {
		t.Errorf("metrics lack %q (second request should hit)", want)
	}
}

// stubEngine drives the edge through outcomes the real engine produces
// only under races: refused resets and aborted requests.
type stubEngine struct {
	resetOK bool
	outputs []vllmsim.Output
}

func (s *stubEngine) Submit(ctx context.Context, r vllmsim.Request) (*vllmsim.Stream, error) {
	ch := make(chan vllmsim.Output, len(s.outputs))
	for _, o := range s.outputs {
		ch <- o
	}
	close(ch)
	return &vllmsim.Stream{C: ch}, nil
}
func (s *stubEngine) Stats() vllmsim.Stats          { return vllmsim.Stats{BlockSize: 16} }
func (s *stubEngine) Cached() []vllmsim.CachedBlock { return nil }
func (s *stubEngine) ResetPrefixCache() bool        { return s.resetOK }
func (s *stubEngine) Restart()                      {}

func stubServer(t *testing.T, eng *stubEngine) string {
	t.Helper()
	srv := New(Config{Models: []string{testModel}, MaxModelLen: 100}, eng, vllmsim.NewTokenizer(), nil, nil)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

func TestResetPrefixCache(t *testing.T) {
	for _, ok := range []bool{true, false} {
		url := stubServer(t, &stubEngine{resetOK: ok})
		resp, err := http.Post(url+"/reset_prefix_cache", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if ok && (resp.StatusCode != 200 || len(b) != 0) {
			t.Errorf("reset ok = %d %s; want 200 empty", resp.StatusCode, b)
		}
		if !ok {
			if resp.StatusCode != 409 {
				t.Fatalf("refused reset = %d; want 409", resp.StatusCode)
			}
			if e := errorOf(t, b); e.Type != "Conflict" || e.Message != "Prefix cache reset failed." {
				t.Errorf("refused reset body = %+v", e)
			}
		}
	}
}

func TestAbortedRequest(t *testing.T) {
	abort := []vllmsim.Output{{Tokens: []uint32{5}}, {Done: true, FinishReason: "abort"}}
	url := stubServer(t, &stubEngine{outputs: abort})
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("aborted non-streaming = %d; want 503", resp.StatusCode)
	}
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := sseEvents(t, resp.Body)
	if len(events) != 3 || !strings.Contains(events[1], `"finish_reason":"abort"`) || events[2] != "[DONE]" {
		t.Errorf("aborted stream = %q; want a token, finish_reason abort, [DONE]", events)
	}
	// A stream that ends without its Done output is reported in-band.
	url = stubServer(t, &stubEngine{outputs: abort[:1]})
	resp2, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	events = sseEvents(t, resp2.Body)
	if len(events) != 3 || !strings.HasPrefix(events[1], `{"error":`) || events[2] != "[DONE]" {
		t.Errorf("truncated stream = %q; want a token, an error event, [DONE]", events)
	}
}

func TestClientCancelFreesEngine(t *testing.T) {
	cfg := testEngineConfig()
	cfg.TimeScale = 1 // slow enough that the request is still running
	env := newTestEnv(t, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", env.url+"/v1/completions", strings.NewReader(`{"prompt":"hi","max_tokens":1000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the first token, then hang up.
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for env.eng.Stats().Running+env.eng.Stats().Waiting > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("engine still holds the request after the client left: %+v", env.eng.Stats())
		}
		runtime.Gosched()
	}
}

// BenchmarkChatCompletion measures the edge's overhead per non-streaming
// request (HTTP, JSON, tokenizer, engine round trip at TimeScale 1e6).
func BenchmarkChatCompletion(b *testing.B) {
	cfg := testEngineConfig()
	cfg.TimeScale = 1e6
	env := newTestEnv(b, cfg, nil)
	body := `{"messages":[{"role":"user","content":"hello there, how are you?"}],"max_tokens":8}`
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := http.Post(env.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
