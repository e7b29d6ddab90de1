package simhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/vllmsim"
)

// otherPrompt shares no block with longPrompt.
var otherPrompt = strings.Repeat("Pack my box with five dozen liquor jugs. ", 12)

// A batch is one engine request per prompt, its choices numbered by
// prompt, its usage summed (cached tokens too), as vLLM's completions
// serving answers a list of prompts.
func TestBatchCompletions(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	tok := env.eng.Tokenizer()
	ea, eb := tok.Encode(longPrompt, true), tok.Encode(otherPrompt, true)
	// Warm longPrompt's blocks: the batch hits them for its first prompt.
	if code, b := env.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"prompt":%q,"max_tokens":1}`, longPrompt)); code != 200 {
		t.Fatalf("warm-up: %d %s", code, b)
	}
	idsA, _ := json.Marshal(ea)
	idsB, _ := json.Marshal(eb)
	warmA, warmB := (len(ea)-1)/16*16, (len(eb)-1)/16*16
	for _, tt := range []struct {
		name, prompts string
		cached        int
	}{
		// The second prompt is cold the first time only.
		{"texts", fmt.Sprintf(`[%q,%q]`, longPrompt, otherPrompt), warmA},
		{"ids", fmt.Sprintf(`[%s,%s]`, idsA, idsB), warmA + warmB},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prompts := tt.prompts
			code, b := env.do(t, "POST", "/v1/completions", `{"prompt":`+prompts+`,"max_tokens":3,"return_token_ids":true}`)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			var r completionResponse
			mustJSON(t, b, &r)
			if len(r.Choices) != 2 {
				t.Fatalf("choices = %+v; want 2", r.Choices)
			}
			for i, want := range [][]uint32{ea, eb} {
				c := r.Choices[i]
				if c.Index != i || !cmp.Equal(c.PromptTokenIDs, want) || len(c.TokenIDs) != 3 || c.Text == "" ||
					c.FinishReason == nil || *c.FinishReason != "length" {
					t.Errorf("choice %d = %+v; want index %d, its prompt's ids, 3 tokens, length", i, c, i)
				}
			}
			u := r.Usage
			if u.PromptTokens != len(ea)+len(eb) || u.CompletionTokens != 6 || u.TotalTokens != len(ea)+len(eb)+6 {
				t.Errorf("usage = %+v; want prompt %d completion 6", u, len(ea)+len(eb))
			}
			if u.PromptTokensDetails.CachedTokens != tt.cached {
				t.Errorf("cached_tokens = %d; want both prompts' hits summed, %d", u.PromptTokensDetails.CachedTokens, tt.cached)
			}
			if r.Sim == nil || r.Sim.FinishS < r.Sim.FirstTokenS || r.Sim.FirstTokenS < r.Sim.ArrivalS {
				t.Errorf("sim = %+v", r.Sim)
			}
		})
	}
}

// A streamed batch's chunks each carry one choice and its index; each
// prompt's first chunk has its prompt ids, each ends with one
// finish_reason, and the usage chunk sums them.
func TestBatchCompletionsStream(t *testing.T) {
	env := newTestEnv(t, testEngineConfig(), nil)
	tok := env.eng.Tokenizer()
	prompts := [][]uint32{tok.Encode(longPrompt, true), tok.Encode(otherPrompt, true), tok.Encode("third", true)}
	chunks := streamChunks(t, env, "/v1/completions", fmt.Sprintf(
		`{"prompt":[%q,%q,"third"],"max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, longPrompt, otherPrompt))
	var final completionResponse
	mustJSON(t, []byte(chunks[len(chunks)-1]), &final)
	if len(final.Choices) != 0 || final.Usage == nil || final.Sim == nil {
		t.Fatalf("last chunk = %s; want the usage chunk", chunks[len(chunks)-1])
	}
	gen := make([][]uint32, 3)
	finishes := make([]int, 3)
	seen := make([]bool, 3)
	for _, s := range chunks[:len(chunks)-1] {
		var ch completionResponse
		mustJSON(t, []byte(s), &ch)
		if len(ch.Choices) != 1 || ch.Usage != nil {
			t.Fatalf("chunk %s: want one choice, no usage", s)
		}
		c := ch.Choices[0]
		if c.Index < 0 || c.Index > 2 {
			t.Fatalf("chunk %s: index out of range", s)
		}
		if first := !seen[c.Index]; first != (c.PromptTokenIDs != nil) || first && !cmp.Equal(c.PromptTokenIDs, prompts[c.Index]) {
			t.Errorf("choice %d chunk %s: prompt_token_ids on its first chunk only, its own", c.Index, s)
		}
		seen[c.Index] = true
		gen[c.Index] = append(gen[c.Index], c.TokenIDs...)
		if c.FinishReason != nil {
			finishes[c.Index]++
		}
	}
	for i := range 3 {
		if len(gen[i]) != 4 || finishes[i] != 1 {
			t.Errorf("choice %d: %d tokens, %d finish reasons; want 4 and 1", i, len(gen[i]), finishes[i])
		}
	}
	if u := final.Usage; u.PromptTokens != len(prompts[0])+len(prompts[1])+len(prompts[2]) || u.CompletionTokens != 12 {
		t.Errorf("usage = %+v; want the three prompts summed and 12 completion tokens", u)
	}
}

// recordingEngine records what is submitted; its streams end at once.
type recordingEngine struct {
	stubEngine
	mu   sync.Mutex
	reqs []vllmsim.Request
}

func (e *recordingEngine) Submit(ctx context.Context, r vllmsim.Request) (*vllmsim.Stream, error) {
	e.mu.Lock()
	e.reqs = append(e.reqs, r)
	e.mu.Unlock()
	return e.stubEngine.Submit(ctx, r)
}

// Each prompt of a batch is its own engine request, named as vLLM names
// them (the response id, "-", the prompt's index).
func TestBatchEngineRequests(t *testing.T) {
	eng := &recordingEngine{stubEngine: stubEngine{outputs: []vllmsim.Output{{Tokens: []uint32{7}, Done: true, FinishReason: "length"}}}}
	srv := New(Config{Models: []string{testModel}}, eng, vllmsim.NewTokenizer(), nil, nil)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	resp, err := http.Post(hs.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[[1,2],[3],[4,5,6]],"max_tokens":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var r completionResponse
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	var got [][]uint32
	for i, q := range eng.reqs {
		if q.ID != fmt.Sprintf("%s-%d", r.ID, i) {
			t.Errorf("engine request %d id %q; want %s-%d", i, q.ID, r.ID, i)
		}
		got = append(got, q.PromptTokens)
	}
	if want := [][]uint32{{1, 2}, {3}, {4, 5, 6}}; !cmp.Equal(got, want) {
		t.Errorf("engine prompts %v; want %v", got, want)
	}
}

// Render endpoints exist only with ScaleOut, as vLLM v0.30 registers them
// only with --enable-scale-out: without, their paths are 404 like any
// unknown path (405 for /v1/responses/render, whose path GET
// /v1/responses/{id} matches, as in FastAPI).
func TestRenderGate(t *testing.T) {
	paths := map[string]string{
		"/v1/chat/completions/render": `{"messages":[{"role":"user","content":"hi"}]}`,
		"/v1/completions/render":      `{"prompt":["a","b"]}`,
		"/v1/messages/render":         `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`,
		"/v1/responses/render":        `{"input":"hi"}`,
	}
	off := newTestEnv(t, testEngineConfig(), nil)
	for path, body := range paths {
		code, b := off.do(t, "POST", path, body)
		want, wantBody := 404, `{"detail":"Not Found"}`
		if path == "/v1/responses/render" {
			want, wantBody = 405, `{"detail":"Method Not Allowed"}`
		}
		if code != want || string(b) != wantBody {
			t.Errorf("without ScaleOut POST %s = %d %s; want %d %s", path, code, b, want, wantBody)
		}
	}
	on := newTestEnv(t, testEngineConfig(), func(c *Config) { c.ScaleOut = true })
	for _, path := range []string{"/v1/chat/completions/render", "/v1/completions/render"} {
		if code, b := on.do(t, "POST", path, paths[path]); code != 200 {
			t.Errorf("with ScaleOut POST %s = %d %s; want 200", path, code, b)
		}
	}
	// A batch renders one GenerateRequest per prompt.
	_, b := on.do(t, "POST", "/v1/completions/render", paths["/v1/completions/render"])
	var gs []generateRequest
	mustJSON(t, b, &gs)
	tok := on.eng.Tokenizer()
	if len(gs) != 2 || !cmp.Equal(gs[0].TokenIDs, tok.Encode("a", true)) || !cmp.Equal(gs[1].TokenIDs, tok.Encode("b", true)) || gs[0].RequestID == gs[1].RequestID {
		t.Errorf("batch render = %s", b)
	}
}
