package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// agentStub serves Messages and Responses as a pod with vLLM's Responses
// store would: it flattens every request into its conversation (one
// string per block or item; a previous_response_id prepends the stored
// conversation and its answer, as construct_input_messages does), answers
// "answer N", and refuses an assistant text it never gave (the history
// must grow by actual answers) or an unknown stored id (404, as vLLM).
type agentStub struct {
	mu      sync.Mutex
	n       int
	answers map[string]bool
	stored  map[string][]string
	convs   map[string][]string // by X-Request-Id: what the request said
	prev    map[string]string   // by X-Request-Id: its previous_response_id
}

func newAgentStub() *agentStub {
	return &agentStub{answers: map[string]bool{}, stored: map[string][]string{}, convs: map[string][]string{}, prev: map[string]string{}}
}

type stubBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	Role      string          `json:"role"`
	CallID    string          `json:"call_id"`
	Output    string          `json:"output"`
	ImageURL  string          `json:"image_url"`
	UUID      string          `json:"uuid"`
	Source    *struct {
		Data string `json:"data"`
	} `json:"source"`
}

type stubAgentReq struct {
	System   []stubBlock `json:"system"`
	Messages []struct {
		Role    string      `json:"role"`
		Content []stubBlock `json:"content"`
	} `json:"messages"`
	Instructions string      `json:"instructions"`
	Input        []stubBlock `json:"input"`
	Store        *bool       `json:"store"`
	Previous     string      `json:"previous_response_id"`
	Stream       bool        `json:"stream"`
}

func (s *agentStub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var q stubAgentReq
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var conv []string
	check := func(text string) bool { return s.answers[text] }
	if r.URL.Path == "/v1/messages" {
		for _, b := range q.System {
			if !strings.HasPrefix(b.Text, "x-anthropic-billing-header") {
				conv = append(conv, "system:"+b.Text)
			}
		}
		for _, m := range q.Messages {
			for _, b := range m.Content {
				switch b.Type {
				case "text":
					if m.Role == "assistant" && !check(b.Text) {
						http.Error(w, "unknown answer "+b.Text, 400)
						return
					}
					conv = append(conv, m.Role+":"+b.Text)
				case "image":
					conv = append(conv, "image:"+b.Source.Data[:8])
				case "tool_use":
					conv = append(conv, "call:"+b.ID)
				case "tool_result":
					var c string
					json.Unmarshal(b.Content, &c)
					conv = append(conv, "result:"+b.ToolUseID+":"+c)
				}
			}
		}
	} else {
		conv = append(conv, "system:"+q.Instructions)
		if q.Previous != "" {
			prev, ok := s.stored[q.Previous]
			if !ok {
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","code":404}}`, q.Previous)
				return
			}
			conv = append(conv, prev[1:]...) // instructions do not carry over
		}
		for _, it := range q.Input {
			switch it.Type {
			case "message":
				var text string
				if json.Unmarshal(it.Content, &text) == nil {
					if it.Role == "assistant" && !check(text) {
						http.Error(w, "unknown answer "+text, 400)
						return
					}
					conv = append(conv, it.Role+":"+text)
					continue
				}
				var parts []stubBlock
				json.Unmarshal(it.Content, &parts)
				for _, p := range parts {
					if p.Type == "input_image" {
						conv = append(conv, "image:"+strings.TrimPrefix(p.ImageURL, "data:image/png;base64,")[:8])
					} else {
						conv = append(conv, it.Role+":"+p.Text)
					}
				}
			case "function_call":
				conv = append(conv, "call:"+it.CallID)
			case "function_call_output":
				conv = append(conv, "result:"+it.CallID+":"+it.Output)
			}
		}
	}
	id := r.Header.Get("X-Request-Id")
	s.convs[id], s.prev[id] = conv, q.Previous
	s.n++
	text := fmt.Sprintf("answer %d", s.n)
	s.answers[text] = true
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/v1/messages" {
		fmt.Fprintf(w, `{"id":"msg_%d","type":"message","content":[{"type":"text","text":%q}],"usage":{"input_tokens":%d,"output_tokens":2}}`, s.n, text, len(conv))
		return
	}
	rid := fmt.Sprintf("resp_%d", s.n)
	if q.Store == nil || *q.Store {
		s.stored[rid] = append(slices.Clip(conv), "assistant:"+text)
	}
	fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":%q}]}],"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":2}}`,
		rid, text, len(conv))
}

func TestRunAgentSessions(t *testing.T) {
	c := smallConfig()
	c.Agentic.FanOut = 1
	c.Agentic.Images = 0.5
	c.Agentic.Continue = 1
	c.Agentic.Think = Dist{Mean: 0.001}
	s := Agentic(c, rng(3))
	s.Sessions = s.Sessions[:4] // two of each API
	for i := range s.Sessions {
		s.Sessions[i].At = time.Duration(i) * time.Millisecond
	}
	stub := newAgentStub()
	srv := httptest.NewServer(stub)
	defer srv.Close()
	cl := NewClient(nil, "m")
	cl.Stream = false
	samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL, Pod: "p"}}, Client: cl, RequestIDs: true}, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != s.Requests() {
		t.Fatalf("%d samples for %d requests", len(samples), s.Requests())
	}
	for _, x := range samples {
		if !x.OK() {
			t.Fatalf("%s turn %d: %s", x.Session, x.Turn, x.Err)
		}
		if want := map[bool]string{true: "responses", false: "messages"}[strings.HasPrefix(x.Session, "r-")]; x.API != want {
			t.Errorf("%s: API %q; want %q", x.Session, x.API, want)
		}
	}
	stub.mu.Lock()
	defer stub.mu.Unlock()
	var walk func(x Session, parent []string)
	walk = func(x Session, parent []string) {
		var prevConv []string
		for k, tu := range x.Turns {
			id := RequestID(x.ID, k)
			conv, ok := stub.convs[id]
			if !ok {
				t.Fatalf("request %s not seen", id)
			}
			if k == 0 && parent != nil && !slices.Equal(conv[:len(parent)], parent) {
				t.Errorf("%s: sub-agent starts with %q; want the parent's turn %q", id, conv, parent)
			}
			if k > 0 {
				// The history grows: the last turn's conversation, its
				// actual answer, the scripted call, then the result.
				if !slices.Equal(conv[:len(prevConv)], prevConv) {
					t.Errorf("%s: %q does not extend the previous turn's %q", id, conv, prevConv)
				}
				rest := conv[len(prevConv):]
				if len(rest) < 3 || !strings.HasPrefix(rest[0], "assistant:answer ") || rest[1] != "call:"+x.Turns[k-1].Call.ID ||
					!strings.HasPrefix(rest[2], "result:"+x.Turns[k-1].Call.ID+":") {
					t.Errorf("%s: new items %q; want the answer, the call and its result", id, rest)
				}
				if len(x.Turns[k-1].Spawn) > 0 && !strings.Contains(rest[2], "answer ") {
					t.Errorf("%s: result %q; want the sub-agents' answers", id, rest[2])
				}
				if x.Continue && stub.prev[id] == "" {
					t.Errorf("%s: a continued session's turn %d sent no previous_response_id", id, k)
				}
			}
			if len(tu.Images) > 0 && !slices.ContainsFunc(conv, func(s string) bool { return strings.HasPrefix(s, "image:") }) {
				t.Errorf("%s: no image sent", id)
			}
			for _, sub := range tu.Spawn {
				walk(sub, conv)
			}
			prevConv = conv
		}
	}
	spawned := 0
	for _, x := range s.Sessions {
		walk(x, nil)
		for _, tu := range x.Turns {
			spawned += len(tu.Spawn)
		}
	}
	if spawned == 0 {
		t.Error("no session spawned sub-agents")
	}
}

// A Continue session whose follow-ups reach a pod without its stored
// response gets vLLM's 404 and ends there, as a user of a plain Service
// would see it.
func TestRunContinuedOnWrongPod(t *testing.T) {
	c := smallConfig()
	c.Agentic.FanOut, c.Agentic.Continue = 0, 1
	c.Agentic.Think = Dist{Mean: 0.001}
	s := Agentic(c, rng(5))
	var x Session
	for _, y := range s.Sessions {
		if y.Kind == Responses && len(y.Turns) >= 2 {
			x = y
			break
		}
	}
	x.At = 0
	a, b := httptest.NewServer(newAgentStub()), httptest.NewServer(newAgentStub())
	defer a.Close()
	defer b.Close()
	// Pick per request alternates between the pods for this seed's draws:
	// find a seed that sends turn 1 elsewhere.
	for seed := range uint64(32) {
		samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: a.URL, Pod: "a"}, {URL: b.URL, Pod: "b"}},
			Client: NewClient(nil, "m"), Seed: seed}, Schedule{Sessions: []Session{x}})
		if err != nil {
			t.Fatal(err)
		}
		if len(samples) < 2 || samples[0].Pod == samples[1].Pod {
			continue
		}
		if len(samples) != 2 || samples[1].OK() || samples[1].Status != http.StatusNotFound || !samples[1].Continued {
			t.Fatalf("samples %+v; want the continued turn failed with 404 and the session ended", samples)
		}
		return
	}
	t.Fatal("no seed sent a follow-up to the other pod")
}
