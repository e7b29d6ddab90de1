package main

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/vllmsim"
)

func TestStoryLines(t *testing.T) {
	ms := time.Millisecond
	res := []storyResult{
		{api: "OpenAI chat", entered: "pod2", served: "pod2", cached: 0, prompt: 2101, ttft: 137 * ms},
		{api: "Anthropic Messages", entered: "pod1", served: "pod2", cached: 2080, prompt: 2101, ttft: 11 * ms},
		{entered: "pod3", served: "pod2", cached: 2080, prompt: 2101, ttft: 9 * ms},
	}
	for i, want := range []string{
		"request 1  OpenAI chat         pod2           cached    0 of 2101 prompt tokens   TTFT  137 ms",
		"request 2  Anthropic Messages  pod1 → pod2    cached 2080 of 2101 prompt tokens   TTFT   11 ms",
	} {
		if got := res[i].line(i + 1); got != want {
			t.Errorf("line(%d) = %q; want %q", i+1, got, want)
		}
	}
	if got, want := summarise(res), "1 pod served, the system prompt prefilled 1 of 3 times, mean TTFT 52 ms"; got != want {
		t.Errorf("summarise = %q; want %q", got, want)
	}
	res[1].served = "pod1"
	if got, want := summarise(res[:2]), "2 pods served, the system prompt prefilled 1 of 2 times, mean TTFT 74 ms"; got != want {
		t.Errorf("summarise = %q; want %q", got, want)
	}
}

func TestSystemPromptSize(t *testing.T) {
	p := systemPrompt("billing", storySystemTokens)
	n := len(vllmsim.NewTokenizer().Encode(p, false))
	if n < storySystemTokens || n > storySystemTokens+100 {
		t.Errorf("systemPrompt is %d tokens; want %d to %d", n, storySystemTokens, storySystemTokens+100)
	}
	if systemPrompt("travel", storySystemTokens)[:40] == p[:40] {
		t.Error("the two rounds' system prompts share their start; the second round would hit the first's blocks")
	}
}
