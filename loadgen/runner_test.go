package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// stub is a tiny OpenAI server: it reports as cached the longest prefix
// (in whole 16-token blocks) shared with any earlier prompt, answers
// "answer N" (N counts its requests), checks that a chat request carries the
// previous answer of its conversation, and fails with 500 when asked for 99
// tokens.
type stub struct {
	mu      sync.Mutex
	pod     string
	prompts [][]uint32
	n       int
	answers map[string]bool // answers given, for the history check
}

func newStub(pod string) *stub { return &stub{pod: pod, answers: map[string]bool{}} }

type stubReq struct {
	Prompt        []uint32  `json:"prompt"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	Stream        bool      `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (s *stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var q stubReq
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	if q.MaxTokens == 99 {
		http.Error(w, `{"error":{"message":"boom"}}`, 500)
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	s.mu.Lock()
	prompt := q.Prompt
	if chat {
		for i, m := range q.Messages {
			if m.Role == "assistant" && !s.answers[m.Content] {
				s.mu.Unlock()
				http.Error(w, fmt.Sprintf("message %d: unknown assistant text %q", i, m.Content), 400)
				return
			}
			prompt = append(prompt, uint32(len(m.Content)))
		}
	}
	cached := 0
	for _, p := range s.prompts {
		cached = max(cached, commonPrefix(p, prompt)/16*16)
	}
	s.prompts = append(s.prompts, prompt)
	s.n++
	text := fmt.Sprintf("answer %d", s.n)
	s.answers[text] = true
	s.mu.Unlock()

	w.Header().Set(ServedByHeader, s.pod)
	usage := map[string]any{"prompt_tokens": len(prompt), "completion_tokens": q.MaxTokens,
		"prompt_tokens_details": map[string]any{"cached_tokens": cached}}
	sim := map[string]any{"arrival_s": 1.0, "first_token_s": 1.25, "finish_s": 2.0}
	choice := map[string]any{"text": text}
	if chat {
		choice = map[string]any{"message": map[string]any{"role": "assistant", "content": text}}
	}
	if !q.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{choice}, "usage": usage, "sim": sim})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		w.(http.Flusher).Flush()
	}
	if chat {
		send(map[string]any{"choices": []any{map[string]any{"delta": map[string]any{"role": "assistant", "content": ""}}}})
	}
	for _, word := range strings.SplitAfter(text, " ") {
		if chat {
			send(map[string]any{"choices": []any{map[string]any{"delta": map[string]any{"content": word}}}})
		} else {
			send(map[string]any{"choices": []any{map[string]any{"text": word}}})
		}
	}
	if q.StreamOptions != nil && q.StreamOptions.IncludeUsage {
		send(map[string]any{"choices": []any{}, "usage": usage, "sim": sim})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func completionSchedule(n int, shared []uint32) Schedule {
	s := Schedule{Workload: "test"}
	for i := range n {
		p := concat(shared, []uint32{uint32(i) + 1})
		s.Sessions = append(s.Sessions, Session{ID: sessionID("s", i), At: time.Duration(i) * time.Millisecond,
			Turns: []Turn{{Prompt: p, MaxTokens: 8}}})
	}
	return s
}

func TestRunCompletions(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			srv := httptest.NewServer(newStub("pod-a"))
			defer srv.Close()
			cl := NewClient(srv.Client(), "m")
			cl.Stream = stream
			shared := randomTokens(rng(1), 64)
			s := completionSchedule(10, shared)
			s.Sessions[4].Turns[0].MaxTokens = 99 // the stub fails this one
			samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: cl, Concurrency: 4}, s)
			if err != nil {
				t.Fatal(err)
			}
			if len(samples) != 10 {
				t.Fatalf("%d samples; want 10", len(samples))
			}
			fails := 0
			for _, x := range samples {
				if !x.OK() {
					fails++
					if x.Session != "s-4" || !strings.Contains(x.Err, "500") {
						t.Errorf("failed sample %+v; want s-4 with status 500", x)
					}
					continue
				}
				if x.Pod != "pod-a" || !x.Sim || x.TTFT != 0.25 || x.E2E != 1.0 || x.OutputTokens != 8 || x.PromptTokens != 65 {
					t.Errorf("sample %+v", x)
				}
				if x.WallTTFT <= 0 || x.WallE2E < x.WallTTFT {
					t.Errorf("wall times %v %v", x.WallTTFT, x.WallE2E)
				}
			}
			if fails != 1 {
				t.Errorf("%d failures; want 1", fails)
			}
			res := Summarize("stub", samples, []string{"pod-a"}, 1)
			// 8 successes after the first each reuse the 64 shared tokens.
			if want := 8.0 * 64 / (9 * 65); res.HitRate != want {
				t.Errorf("hit rate %v; want %v", res.HitRate, want)
			}
			if res.SuccessRate != 0.9 {
				t.Errorf("success rate %v; want 0.9", res.SuccessRate)
			}
		})
	}
}

func TestRunChatCarriesAnswers(t *testing.T) {
	srv := httptest.NewServer(newStub("pod-b"))
	defer srv.Close()
	s := Schedule{Workload: "chat"}
	for i := range 3 {
		x := Session{ID: sessionID("c", i), At: time.Duration(i) * time.Millisecond, Kind: Chat, System: "be brief"}
		for k := range 3 {
			x.Turns = append(x.Turns, Turn{User: fmt.Sprintf("q%d", k), MaxTokens: 4, Think: time.Duration(k) * time.Millisecond})
		}
		s.Sessions = append(s.Sessions, x)
	}
	samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: NewClient(nil, "m")}, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 9 {
		t.Fatalf("%d samples; want 9", len(samples))
	}
	turns := map[string][]int{}
	for _, x := range samples {
		if !x.OK() {
			t.Fatalf("sample failed: %s", x.Err)
		}
		turns[x.Session] = append(turns[x.Session], x.Turn)
		// History: system + (user, assistant) per earlier turn + user.
		if want := 2 + 2*x.Turn; x.PromptTokens != want {
			t.Errorf("%s turn %d sent %d messages; want %d", x.Session, x.Turn, x.PromptTokens, want)
		}
	}
	for id, ts := range turns {
		if fmt.Sprint(ts) != "[0 1 2]" {
			t.Errorf("%s turns in order %v", id, ts)
		}
	}
}

func TestRunChatStopsAfterFailure(t *testing.T) {
	srv := httptest.NewServer(newStub("p"))
	defer srv.Close()
	s := Schedule{Sessions: []Session{{ID: "c", Kind: Chat, Turns: []Turn{
		{User: "a", MaxTokens: 4}, {User: "b", MaxTokens: 99}, {User: "c", MaxTokens: 4}}}}}
	samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: NewClient(nil, "")}, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(samples) != 2 || !samples[0].OK() || samples[1].OK() {
		t.Errorf("samples %+v; want one success then one failure", samples)
	}
}

func TestRunStopAndProgress(t *testing.T) {
	srv := httptest.NewServer(newStub("p"))
	defer srv.Close()
	s := Schedule{Sessions: []Session{{ID: "c", Kind: Chat, Turns: []Turn{
		{User: "a", MaxTokens: 4}, {User: "b", MaxTokens: 4, Think: 30 * time.Millisecond}}},
		{ID: "late", At: 20 * time.Millisecond, Turns: []Turn{{Prompt: []uint32{1, 2}, MaxTokens: 4}}}}}
	var out syncBuffer
	samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: NewClient(nil, ""),
		Stop: 10 * time.Millisecond, Progress: &out, ProgressEvery: 5 * time.Millisecond}, s)
	if err != nil {
		t.Fatal(err)
	}
	// The conversation's second turn falls after Stop and is dropped; the
	// late arrival is a first turn and is sent.
	if len(samples) != 2 || samples[0].Session != "c" || samples[1].Session != "late" {
		t.Errorf("samples %+v; want c turn 0 and late", samples)
	}
	if got := out.String(); !strings.Contains(got, "sent 2  done 2  errors 0  in flight 0") {
		t.Errorf("progress output %q lacks the final line", got)
	}
}

func TestRunCancel(t *testing.T) {
	st := newStub("p")
	served := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.ServeHTTP(w, r)
		once.Do(func() { close(served) })
	}))
	defer srv.Close()
	s := completionSchedule(2, nil)
	s.Sessions[1].At = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: NewClient(nil, "")}, s)
		done <- err
	}()
	// Cancel once the first request is served; Run must not wait an hour.
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("first request never served")
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run error %v; want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestClientErrors(t *testing.T) {
	tests := []struct {
		name  string
		body  string
		ctype string
		code  int
		check func(error) bool
	}{
		{"status", `{"error":{"message":"no"}}`, "application/json", 503, func(err error) bool {
			var se *StatusError
			return errors.As(err, &se) && se.Status == 503
		}},
		{"truncated", "data: {\"choices\":[{\"text\":\"a\"}]}\n\n", "text/event-stream", 200, func(err error) bool {
			return errors.Is(err, ErrTruncated)
		}},
		{"error chunk", "data: {\"error\":{\"message\":\"engine closed\"}}\n\ndata: [DONE]\n\n", "text/event-stream", 200, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "engine closed")
		}},
		{"bad chunk", "data: {nope\n\n", "text/event-stream", 200, func(err error) bool { return err != nil }},
		{"bad body", "{nope", "application/json", 200, func(err error) bool { return err != nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tt.ctype)
				w.WriteHeader(tt.code)
				fmt.Fprint(w, tt.body)
			}))
			defer srv.Close()
			_, err := NewClient(nil, "").Do(context.Background(), Endpoint{URL: srv.URL}, Call{Prompt: []uint32{1}, MaxTokens: 1})
			if !tt.check(err) {
				t.Errorf("Do error = %v", err)
			}
		})
	}
}

func TestClientSendsStreamingRequest(t *testing.T) {
	var got stubReq
	var path string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		json.NewDecoder(r.Body).Decode(&got)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	rep, err := NewClient(nil, "m").Do(context.Background(), Endpoint{URL: srv.URL + "/", Pod: "fixed"},
		Call{Kind: Completion, Prompt: []uint32{5, 6}, MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	if path != "/v1/completions" || !got.Stream || got.StreamOptions == nil || !got.StreamOptions.IncludeUsage ||
		got.MaxTokens != 3 || fmt.Sprint(got.Prompt) != "[5 6]" {
		t.Errorf("request %s %+v", path, got)
	}
	if rep.Pod != "fixed" {
		t.Errorf("pod %q; want the endpoint's", rep.Pod)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A session's model reaches the server in every turn; without one the
// client's model is sent.
func TestRunSendsSessionModel(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q struct {
			Model  string   `json:"model"`
			Prompt []uint32 `json:"prompt"`
		}
		json.NewDecoder(r.Body).Decode(&q)
		mu.Lock()
		got[fmt.Sprint(q.Prompt)] = q.Model
		mu.Unlock()
		io.WriteString(w, `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	defer srv.Close()
	s := Schedule{Sessions: []Session{
		{ID: "a", Turns: []Turn{{Prompt: []uint32{1}, MaxTokens: 1}}},
		{ID: "b", Model: "lora-a", Turns: []Turn{{Prompt: []uint32{2}, MaxTokens: 1}}},
	}}
	c := NewClient(nil, "base")
	c.Stream = false
	if _, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL, Pod: "p"}}, Client: c, Concurrency: 2}, s); err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"[1]": "base", "[2]": "lora-a"}; !maps.Equal(got, want) {
		t.Errorf("models sent = %v; want %v", got, want)
	}
}

// TestRunStart: a run given the moment its caller's clock started counts
// its samples' offsets from it, as the caller counts its own events.
func TestRunStart(t *testing.T) {
	srv := httptest.NewServer(newStub("pod-a"))
	defer srv.Close()
	s := completionSchedule(2, randomTokens(rng(1), 16))
	start := time.Now().Add(-300 * time.Millisecond) // the caller's clock, started before
	samples, err := Run(context.Background(), RunConfig{Endpoints: []Endpoint{{URL: srv.URL}}, Client: NewClient(srv.Client(), "m"),
		Start: start}, s)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range samples {
		if x.Sent < 300*time.Millisecond {
			t.Errorf("%s sent at %v from the caller's start; want at least 300ms", x.Session, x.Sent)
		}
	}
}
