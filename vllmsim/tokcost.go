package vllmsim

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultTokenizeCost is the wall time a real vLLM API server spends per
// prompt token on tokenization and chat templating: TensorRT-LLM's frontend
// measured 43.7 ms per request on ~38k-token prompts (NVIDIA/TensorRT-LLM
// PR #18389, nsys, GLM tokenizer), 1.15 us per token. The simulator's own
// tokenizer is ~10x faster, so without this charge every benchmark here
// would undercount what a router's /tokenize call costs.
const DefaultTokenizeCost = 1150 * time.Nanosecond

// DefaultTokenizeWorkers is how many tokenizations run at once: vLLM's
// OpenAIServing tokenizes on a ThreadPoolExecutor(max_workers=1) per API
// server process, so concurrent calls queue behind each other.
const DefaultTokenizeWorkers = 1

// TokenizeCost charges tokenization time on a bounded pool, as vLLM's API
// server does: a call holds one of the pool's workers while the real work
// runs and then until tokens × per-token cost has passed. It is safe for
// concurrent use. A nil *TokenizeCost charges nothing.
type TokenizeCost struct {
	per   time.Duration
	slots chan struct{}
	now   func() time.Time

	calls, busy, wait atomic.Int64 // busy and wait in ns
}

// TokenizeStats are a TokenizeCost's totals: tokenizations run, the time
// workers were held, and the time calls waited for a worker (what a busy
// tokenizer costs the requests behind it).
type TokenizeStats struct {
	Calls      uint64
	Busy, Wait time.Duration
}

// Stats returns the totals so far (zero for a nil cost).
func (c *TokenizeCost) Stats() TokenizeStats {
	if c == nil {
		return TokenizeStats{}
	}
	return TokenizeStats{Calls: uint64(c.calls.Load()), Busy: time.Duration(c.busy.Load()), Wait: time.Duration(c.wait.Load())}
}

// NewTokenizeCost returns a charge of per for each token on workers
// workers (at least 1). per 0 charges nothing beyond the real work.
func NewTokenizeCost(per time.Duration, workers int) *TokenizeCost {
	return &TokenizeCost{per: max(per, 0), slots: make(chan struct{}, max(workers, 1)), now: time.Now}
}

// Run waits for a worker, runs tokenize (which returns the number of
// tokens it produced) and holds the worker until the charge has elapsed
// since tokenize began. It returns ctx's error if ctx ends first; tokenize
// then may not have run.
func (c *TokenizeCost) Run(ctx context.Context, tokenize func() int) error {
	if c == nil {
		tokenize()
		return nil
	}
	queued := c.now()
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	start := c.now()
	c.calls.Add(1)
	c.wait.Add(int64(start.Sub(queued)))
	defer func() {
		c.busy.Add(int64(c.now().Sub(start)))
		<-c.slots
	}()
	n := tokenize()
	left := time.Duration(n)*c.per - c.now().Sub(start)
	if left <= 0 {
		return nil
	}
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
