package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestReadStream(t *testing.T) {
	in := "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
		": keep-alive comment\n\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"Hello\"}}]}\n\n" +
		"data:{\"choices\":[{\"delta\":{\"content\":\" world\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}," +
		"\"sim\":{\"arrival_s\":2,\"first_token_s\":2.5,\"finish_s\":3}}\n\n" +
		"data: [DONE]\n\n"
	var rep Reply
	if err := readStream(strings.NewReader(in), &rep, time.Now()); err != nil {
		t.Fatal(err)
	}
	want := Reply{Text: "Hello world", PromptTokens: 40, CachedTokens: 32, OutputTokens: 2,
		Sim: &SimTiming{ArrivalS: 2, FirstTokenS: 2.5, FinishS: 3}}
	rep.WallTTFT = 0
	if rep.Text != want.Text || rep.PromptTokens != 40 || rep.CachedTokens != 32 || rep.OutputTokens != 2 || *rep.Sim != *want.Sim {
		t.Errorf("readStream = %+v; want %+v", rep, want)
	}
	s := sampleOf(rep)
	if s.TTFT != 0.5 || s.E2E != 1 || !s.Sim {
		t.Errorf("sample TTFT %v E2E %v sim %v; want 0.5, 1, true", s.TTFT, s.E2E, s.Sim)
	}
}

// A stream cut after some text keeps how far it got: its text chunks.
func TestStreamCutKeepsChunks(t *testing.T) {
	var rep Reply
	in := "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\n"
	if err := readStream(strings.NewReader(in), &rep, time.Now()); !errors.Is(err, ErrTruncated) || rep.Chunks != 2 {
		t.Errorf("readStream = %v, %d chunks; want ErrTruncated after 2 (the empty one not counted)", err, rep.Chunks)
	}
	if s := sampleOf(rep); s.Chunks != 2 {
		t.Errorf("sample chunks %d; want 2", s.Chunks)
	}
}

func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"prompt_tokens_details\":null},\"sim\":{}}\n\ndata: [DONE]\n"))
	f.Add([]byte("data: {\"error\":{\"message\":\"x\"}}\n"))
	f.Add([]byte("event: x\ndata: [DONE]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var rep Reply
		err := readStream(strings.NewReader(string(b)), &rep, time.Now())
		if err == nil && !strings.Contains(string(b), "[DONE]") {
			t.Fatalf("accepted a stream without [DONE]")
		}
		if errors.Is(err, ErrTruncated) && strings.HasPrefix(string(b), "data: [DONE]\n") {
			t.Fatalf("truncated despite a leading [DONE]: %q", b)
		}
		// The non-streaming decoder must not panic either.
		var rep2 Reply
		if err := readBody(strings.NewReader(string(b)), &rep2); err != nil {
			return
		}
	})
}

func TestShouldRetry(t *testing.T) {
	conn := errors.New("connection reset by peer")
	tests := []struct {
		name               string
		err                error
		answered, streamed bool
		want               bool
	}{
		{"success", nil, true, false, false},
		{"connection error", conn, false, true, true},
		{"canceled", context.Canceled, false, false, false},
		{"deadline", fmt.Errorf("do: %w", context.DeadlineExceeded), false, false, false},
		{"408", &StatusError{Status: 408}, true, false, true},
		{"409", &StatusError{Status: 409}, true, false, true},
		{"429", &StatusError{Status: 429}, true, true, true},
		{"503", &StatusError{Status: 503}, true, false, true},
		{"400", &StatusError{Status: 400}, true, false, false},
		{"404", &StatusError{Status: 404}, true, false, false},
		{"plain body cut", io.ErrUnexpectedEOF, true, false, true},
		{"stream cut", ErrTruncated, true, true, false},
	}
	for _, tc := range tests {
		if got := shouldRetry(tc.err, tc.answered, tc.streamed); got != tc.want {
			t.Errorf("%s: shouldRetry(%v, %v, %v) = %v; want %v", tc.name, tc.err, tc.answered, tc.streamed, got, tc.want)
		}
	}
}

func TestRetryPolicyWait(t *testing.T) {
	p := SDKRetry(nil)
	for k, want := range []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second} {
		if got := p.wait(k + 1); got != want {
			t.Errorf("wait(%d) = %v; want %v", k+1, got, want)
		}
	}
	p.Retries = 10
	if got := p.wait(10); got != 8*time.Second {
		t.Errorf("wait(10) = %v; want the 8s cap", got)
	}
	p.Jitter = func() float64 { return 0.999999 }
	if got := p.wait(1); got < 375*time.Millisecond || got > 376*time.Millisecond {
		t.Errorf("wait(1) with full jitter = %v; want 375ms", got)
	}
}

// A server that fails twice with 503 and then answers: the SDK policy
// succeeds on the third attempt, the zero policy reports the first 503.
func TestClientRetries(t *testing.T) {
	var calls atomic.Int32
	var mu sync.Mutex
	var numbered []string // each attempt's RetryCountHeader, as the SDKs send it
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		numbered = append(numbered, r.Header.Get(RetryCountHeader))
		mu.Unlock()
		if calls.Add(1)%3 != 0 {
			http.Error(w, `{"error":{"message":"busy"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set(DecisionHeader, "affinity")
		io.WriteString(w, `{"choices":[{"text":"ok"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	defer srv.Close()
	var waits []time.Duration
	c := NewClient(nil, "m")
	c.Stream = false
	c.Retry = SDKRetry(nil)
	c.sleep = func(_ context.Context, d time.Duration) bool { waits = append(waits, d); return true }
	rep, err := c.Do(context.Background(), Endpoint{URL: srv.URL}, Call{Kind: Completion, Prompt: []uint32{1, 2, 3}, MaxTokens: 1})
	if err != nil || rep.Attempts != 3 || rep.Text != "ok" || rep.Decision != "affinity" || rep.LocalAddr == "" {
		t.Fatalf("Do = %+v, %v; want ok after 3 attempts, decision and local address set", rep, err)
	}
	if want := []time.Duration{500 * time.Millisecond, time.Second}; !slices.Equal(waits, want) {
		t.Errorf("backoffs %v; want %v", waits, want)
	}
	if want := []string{"0", "1", "2"}; !slices.Equal(numbered, want) {
		t.Errorf("attempts numbered %q; want %q", numbered, want)
	}
	c.Retry = RetryPolicy{}
	rep, err = c.Do(context.Background(), Endpoint{URL: srv.URL}, Call{Kind: Completion, Prompt: []uint32{1}, MaxTokens: 1})
	var se *StatusError
	if !errors.As(err, &se) || se.Status != 503 || rep.Attempts != 1 || rep.Status != 503 {
		t.Errorf("Do without retries = %+v, %v; want one attempt ending in 503", rep, err)
	}
}
