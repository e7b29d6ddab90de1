package loadgen

import (
	"errors"
	"strings"
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
