package baseline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
)

// tokenizerPod answers /tokenize with one id per byte of its body's
// prompt or messages (so a test can tell which text was tokenized) and
// /v1/chat/completions/render with fixed ids and one image, or 404 when
// render is off, as vLLM without --enable-scale-out.
type tokenizerPod struct {
	mu     sync.Mutex
	render bool
	calls  map[string][]string // path → bodies
}

func (s *tokenizerPod) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.calls[r.URL.Path] = append(s.calls[r.URL.Path], string(b))
	s.mu.Unlock()
	switch {
	case r.URL.Path == "/tokenize":
		var q struct {
			Prompt   string          `json:"prompt"`
			Messages json.RawMessage `json:"messages"`
		}
		json.Unmarshal(b, &q)
		n := len(q.Prompt) + len(q.Messages)
		ids := make([]int, n)
		fmt.Fprintf(w, `{"count":%d,"tokens":%s}`, n, mustJSON(ids))
	case r.URL.Path == "/v1/chat/completions/render" && s.render:
		fmt.Fprint(w, `{"request_id":"r","token_ids":[1,2,3,4],"features":{"mm_hashes":["img-1"],"mm_placeholders":[{"offset":1,"length":2}],"kwargs_data":null}}`)
	default:
		http.NotFound(w, r)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func preciseProxy(t *testing.T, render bool) (*Proxy, *tokenizerPod) {
	t.Helper()
	tp := &tokenizerPod{render: render, calls: map[string][]string{}}
	be := fakePod(t, "pod1", tp.ServeHTTP)
	be.Events = "ipc:///nowhere" // New needs it; Run, which subscribes, is not called
	p, err := New(Config{Policy: NameCentralPrecise, Model: "m", Backends: []Backend{be}})
	if err != nil {
		t.Fatal(err)
	}
	return p, tp
}

// central-precise takes every API's prompt the way vLLM will compute it:
// Messages and Responses converted to chat and tokenized with /tokenize's
// chat variant, a batch's texts one by one, a chat with images rendered
// (its images placed), without render /tokenize.
func TestProxyTokensPerAPI(t *testing.T) {
	tests := []struct {
		name     string
		api      prompt.API
		body     string
		render   bool
		want     Request
		wantPath string
	}{
		{name: "messages", api: prompt.APIMessages,
			body:     `{"model":"m","max_tokens":8,"system":"sys","messages":[{"role":"user","content":"hi"}]}`,
			wantPath: "/tokenize"},
		{name: "responses", api: prompt.APIResponses,
			body:     `{"model":"m","instructions":"sys","input":[{"type":"message","role":"user","content":"hi"}]}`,
			wantPath: "/tokenize"},
		{name: "batch", api: prompt.APICompletions, body: `{"model":"m","prompt":["ab","cde"]}`,
			want: Request{Batch: [][]uint32{{0, 0}, {0, 0, 0}}}, wantPath: "/tokenize"},
		{name: "batch of ids", api: prompt.APICompletions, body: `{"model":"m","prompt":[[5,6],[7]]}`,
			want: Request{Batch: [][]uint32{{5, 6}, {7}}}},
		{name: "image rendered", api: prompt.APIResponses, render: true,
			body: `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA","detail":"auto"},{"type":"input_text","text":"x"}]}]}`,
			want: Request{Tokens: []uint32{1, 2, 3, 4}, MM: []blockkey.MM{{ID: "img-1", Offset: 1, Length: 2}}}, wantPath: "/v1/chat/completions/render"},
		{name: "image without render", api: prompt.APIChat,
			body:     `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA"}}]}]}`,
			wantPath: "/tokenize"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, tp := preciseProxy(t, tt.render)
			pr, err := prompt.ParseAPI([]byte(tt.body), tt.api)
			if err != nil {
				t.Fatalf("ParseAPI: %v", err)
			}
			req := requestFrom(pr)
			p.tokens(context.Background(), pr, &req)
			switch tt.wantPath {
			case "/tokenize":
				if tt.want.Batch == nil {
					// One id per byte of what was tokenized: the converted
					// chat messages themselves.
					var sent struct {
						Messages json.RawMessage `json:"messages"`
					}
					json.Unmarshal([]byte(tp.calls["/tokenize"][0]), &sent)
					if string(sent.Messages) != string(pr.Messages) || len(req.Tokens) != len(pr.Messages) {
						t.Errorf("tokenized %s (%d ids); want the converted messages %s", sent.Messages, len(req.Tokens), pr.Messages)
					}
				}
			case "/v1/chat/completions/render":
				if got := tp.calls[tt.wantPath]; len(got) != 1 || got[0] != string(prompt.ChatBody(pr, pr.MaxTokens)) {
					t.Errorf("render got %q; want the converted chat body", got)
				}
			}
			if tt.want.Batch != nil {
				if d := cmp.Diff(tt.want.Batch, req.Batch); d != "" {
					t.Errorf("Batch (-want +got):\n%s", d)
				}
				if len(tp.calls["/tokenize"]) != map[string]int{"/tokenize": 2}[tt.wantPath] {
					t.Errorf("%d /tokenize calls", len(tp.calls["/tokenize"]))
				}
			}
			if tt.want.MM != nil {
				if d := cmp.Diff(tt.want.Tokens, req.Tokens); d != "" {
					t.Errorf("Tokens (-want +got):\n%s", d)
				}
				if d := cmp.Diff(tt.want.MM, req.MM); d != "" {
					t.Errorf("MM (-want +got):\n%s", d)
				}
			}
		})
	}
}
