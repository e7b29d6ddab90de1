package textroute

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
	"github.com/kvroute/kvroute/vllmsim"
)

// BenchmarkKeysSeenPrefix is the request path's own cost for a chat whose
// leading messages were seen: hash the messages, find the entry (the
// front's split of the messages array is in forward's benchmarks). No
// tokenize call is made; the fake fails the benchmark if one is.
func BenchmarkKeysSeenPrefix(b *testing.B) {
	for _, size := range []int{1024, 8192, 32768} {
		b.Run(fmt.Sprintf("%dk", size/1024), func(b *testing.B) {
			tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
			r := New(Config{Model: "m"}, tok, nil)
			sys := strings.Repeat("the quick brown fox jumps over the lazy dog ", size/9)
			p, msgs := benchChat(b, sys, "a question")
			// Learn the system prompt as the learner would.
			r.enqueue([]int{1}, job{p: p, root: testRoot, msgs: msgs, hashes: textprefix.Chain(r.context(p), msgs)})
			r.learn(context.Background(), <-r.jobs)
			tok.calls = 0
			b.SetBytes(int64(len(p.Messages)))
			b.ResetTimer()
			for b.Loop() {
				keys, _, _ := r.Keys(context.Background(), p, msgs, testRoot)
				if len(keys) == 0 {
					b.Fatal("no keys")
				}
			}
			if tok.calls != 0 {
				b.Fatalf("%d tokenize calls on the request path", tok.calls)
			}
		})
	}
}

func benchChat(b *testing.B, system, user string) (prompt.Prompt, []textprefix.Message) {
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user}}})
	p, err := prompt.Parse(body, true)
	if err != nil {
		b.Fatal(err)
	}
	var raws []json.RawMessage
	json.Unmarshal(p.Messages, &raws)
	return p, []textprefix.Message{{Raw: raws[0], Role: []byte("system")}, {Raw: raws[1], Role: []byte("user")}}
}
