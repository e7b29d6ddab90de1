package simhttp

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/vllmsim"
)

func TestRenderEndpoints(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut = true })
	tok := env.eng.Tokenizer()
	hi := []vllmsim.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}
	chatIDs := must(tok.Chat(hi, vllmsim.ChatOptions{AddGenerationPrompt: true}))

	code, b := env.do(t, "POST", "/v1/chat/completions/render",
		`{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":7,"cache_salt":"s1","stream":true,"stream_options":{"include_usage":true}}`)
	if code != 200 {
		t.Fatalf("chat render: %d %s", code, b)
	}
	var g generateRequest
	mustJSON(t, b, &g)
	if !strings.HasPrefix(g.RequestID, "chatcmpl-") || !cmp.Equal(g.TokenIDs, chatIDs) || g.SamplingParams.MaxTokens != 7 ||
		g.Model == nil || *g.Model != "sim-model" || g.CacheSalt == nil || *g.CacheSalt != "s1" || !g.Stream ||
		g.StreamOptions == nil || !g.StreamOptions.IncludeUsage || g.Features != nil {
		t.Errorf("chat render = %s", b)
	}
	var raw map[string]json.RawMessage
	mustJSON(t, b, &raw)
	for _, k := range []string{"request_id", "token_ids", "features", "sampling_params", "model", "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("chat render lacks %q (GenerateRequest field)", k)
		}
	}
	// The rendered ids are what /tokenize and generation use.
	code, b = env.do(t, "POST", "/tokenize", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`)
	var tr tokenizeResponse
	mustJSON(t, b, &tr)
	if code != 200 || !cmp.Equal(tr.Tokens, chatIDs) {
		t.Errorf("/tokenize %v differs from render %v", tr.Tokens, chatIDs)
	}

	for name, body := range map[string]string{
		"text":      `{"prompt":"hello world"}`,
		"text list": `{"prompt":["hello world"]}`,
		"ids":       `{"prompt":[1,5000,5001]}`,
	} {
		code, b := env.do(t, "POST", "/v1/completions/render", body)
		var gs []generateRequest
		mustJSON(t, b, &gs)
		want := tok.Encode("hello world", true)
		if name == "ids" {
			want = []uint32{1, 5000, 5001}
		}
		if code != 200 || len(gs) != 1 || !cmp.Equal(gs[0].TokenIDs, want) || !strings.HasPrefix(gs[0].RequestID, "cmpl-") ||
			gs[0].Model != nil || gs[0].SamplingParams.MaxTokens != defaultMaxTokens || gs[0].StreamOptions != nil {
			t.Errorf("%s: completions render = %d %s", name, code, b)
		}
	}

	for _, tt := range []struct{ path, body, want string }{
		{"/v1/chat/completions/render", `{"messages":[]}`, "messages"},
		{"/v1/chat/completions/render", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, "does not exist"},
		{"/v1/chat/completions/render", `{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, "Cannot set both"},
		{"/v1/chat/completions/render", `not json`, "invalid JSON"},
		{"/v1/completions/render", `{"prompt":"` + strings.Repeat("word ", 2100) + `"}`, "maximum context length"},
		{"/v1/completions/render", `{"prompt":[]}`, "empty"},
	} {
		code, b := env.do(t, "POST", tt.path, tt.body)
		if e := errorOf(t, b); code/100 != 4 || !strings.Contains(e.Message, tt.want) {
			t.Errorf("%s %.40s: %d %s; want a 4xx saying %q", tt.path, tt.body, code, b, tt.want)
		}
	}
}

// /tokenize pays the configured cost: a lower bound on its latency, so the
// check cannot pass by luck.
func TestTokenizeIsCharged(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) {
		c.TokenizeCost = vllmsim.NewTokenizeCost(50*time.Microsecond, 1)
		c.ScaleOut = true
	})
	ids := env.eng.Tokenizer().Encode(longPrompt, true)
	for _, path := range []string{"/tokenize", "/v1/completions/render"} {
		start := time.Now()
		code, b := env.do(t, "POST", path, `{"prompt":"`+longPrompt+`"}`)
		if took, want := time.Since(start), time.Duration(len(ids))*50*time.Microsecond; code != 200 || took < want {
			t.Errorf("%s: %d in %v; want 200 after at least %v (%d tokens): %s", path, code, took, want, len(ids), b)
		}
	}
}

// A generation answer says how long the simulator took to its first byte,
// tokenization included: at least the charge, at most what the client saw;
// and when its handler started, in between.
func TestServiceTimeHeader(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), func(c *Config) {
		c.TokenizeCost = vllmsim.NewTokenizeCost(50*time.Microsecond, 1)
		c.Now = time.Now
	})
	ids := env.eng.Tokenizer().Encode(longPrompt, true)
	for _, stream := range []bool{false, true} {
		start := time.Now()
		resp, err := http.Post(env.url+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"prompt":%q,"max_tokens":2,"stream":%v}`, longPrompt, stream)))
		if err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		us, err := strconv.ParseInt(resp.Header.Get(ServiceHeader), 10, 64)
		charge := time.Duration(len(ids)) * 50 * time.Microsecond
		if got := time.Duration(us) * time.Microsecond; err != nil || got < charge || got > took {
			t.Errorf("stream %v: %s = %q; want between the charge %v and the client's %v", stream, ServiceHeader, resp.Header.Get(ServiceHeader), charge, took)
		}
		at, err := strconv.ParseInt(resp.Header.Get(StartHeader), 10, 64)
		if err != nil || at < start.UnixMicro() || at > start.Add(took).UnixMicro()-us {
			t.Errorf("stream %v: %s = %q; want after the request left (%d) and a service time before the answer came (%d)",
				stream, StartHeader, resp.Header.Get(StartHeader), start.UnixMicro(), start.Add(took).UnixMicro())
		}
	}
}
