package forward

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
)

// countingTokenizer is byteTokenizer counting its calls.
type countingTokenizer struct{ n atomic.Int32 }

func (t *countingTokenizer) Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error) {
	t.n.Add(1)
	return byteTokenizer{}.Tokenize(ctx, p)
}

// countingText keys every chat on one key, counting its calls.
type countingText struct{ n *atomic.Int32 }

func (t countingText) Keys(context.Context, prompt.Prompt, []textprefix.Message, blockkey.Key) ([]blockkey.Key, int, func([]uint32)) {
	t.n.Add(1)
	return []blockkey.Key{1}, 16, func([]uint32) {}
}

// TestIDsOnlyCallsNoEngine checks idsOnly, by which a request skips the
// watch over its engine calls, against routeKeys: a prompt it calls ids
// only is keyed without a /tokenize or text-prefix call, and the token
// prompts it is for are called so.
func TestIDsOnlyCallsNoEngine(t *testing.T) {
	tok := &countingTokenizer{}
	cfg := DefaultConfig()
	cfg.Model, cfg.Scheme = "m", perBlock
	h := New(cfg, nil, tok, nil, zerolog.Nop())
	h.text = countingText{&tok.n}
	tests := []struct {
		body string
		api  prompt.API
		ids  bool
	}{
		{`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`, prompt.APICompletions, true},
		{`{"model":"m","prompt":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],[4,5,6]]}`, prompt.APICompletions, true},
		{`{"model":"m","prompt":"0123456789abcdef0"}`, prompt.APICompletions, false},
		{`{"model":"m","prompt":["0123456789abcdef0","x"]}`, prompt.APICompletions, false},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, prompt.APIChat, false},
		{`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`, prompt.APIMessages, false},
		{`{"model":"m","input":"hi"}`, prompt.APIResponses, false},
		{`{"model":`, prompt.APICompletions, true},
	}
	for _, tt := range tests {
		p, perr := prompt.ParseAPI([]byte(tt.body), tt.api)
		if got := idsOnly(p, perr); got != tt.ids {
			t.Errorf("%s: idsOnly = %v; want %v", tt.body, got, tt.ids)
		}
		tok.n.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		k := h.routeKeys(ctx, p, perr)
		cancel()
		if n := tok.n.Load(); idsOnly(p, perr) && n != 0 {
			t.Errorf("%s: ids only, but keying it called the engine %d times", tt.body, n)
		}
		if tt.ids && perr == nil && len(k.keys) == 0 {
			t.Errorf("%s: no keys", tt.body)
		}
	}
}
