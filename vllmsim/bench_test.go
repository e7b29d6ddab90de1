package vllmsim

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// simTTFT runs q alone on c and returns the simulated time until its first
// token, summing the model's step durations.
func simTTFT(b *testing.B, c *core, q *seq) time.Duration {
	c.add(q)
	var ttft time.Duration
	for q.generated() == 0 {
		st := c.schedule()
		c.takeEvents()
		if st == nil {
			b.Fatal("request not scheduled")
		}
		ttft += st.dur
		c.complete(st)
	}
	for q.state != finished {
		if st := c.schedule(); st != nil {
			c.complete(st)
		}
	}
	return ttft
}

// BenchmarkTTFTvsCachedFraction reports the simulated TTFT of an 8k-token
// prompt on DefaultConfig when 0–100% of it is already cached.
func BenchmarkTTFTvsCachedFraction(b *testing.B) {
	cfg := DefaultConfig()
	cfg.HashSeedSet = true
	prompt := toks(1, 8192)
	for _, pct := range []int{0, 25, 50, 75, 100} {
		b.Run(fmt.Sprintf("cached=%d%%", pct), func(b *testing.B) {
			var ttft time.Duration
			var hit int
			for b.Loop() {
				h, _ := newHasher(cfg.HashAlgo, "42", true)
				c := newCore(cfg, h)
				if n := len(prompt) * pct / 100; n > 0 {
					simTTFT(b, c, newSeq(prompt[:n], 1, 0))
				}
				q := newSeq(slices.Clone(prompt), 1, 0)
				ttft = simTTFT(b, c, q)
				hit = q.cachedTokens
			}
			b.ReportMetric(float64(ttft.Microseconds())/1000, "sim-ttft-ms")
			b.ReportMetric(float64(hit), "cached-tokens")
		})
	}
}

// BenchmarkEngineThroughput drives the whole engine (fake clock, no
// sleeping) with 64 concurrent requests of 512-token prompts sharing a
// 256-token system prefix and 128 output tokens each, and reports the
// simulated output throughput and how many real requests/s it sustains.
func BenchmarkEngineThroughput(b *testing.B) {
	for _, algo := range []string{HashSHA256CBOR, HashFast} {
		b.Run(algo, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.HashAlgo, cfg.HashSeedSet = algo, true
			e, _, clk := startEngineClock(b, cfg)
			const clients, outTokens = 64, 128
			var simDur float64
			round := 0
			for b.Loop() {
				round++
				// The fake clock outruns goroutines; hold it so that all
				// clients arrive together, as a burst would in sim time.
				clk.pause()
				streams := make([]*Stream, clients)
				for i := range streams {
					p := slices.Concat(toks(0, 256), toks(1_000_000*round+1000*i, 256))
					st, err := e.Submit(context.Background(), Request{PromptTokens: p, MaxTokens: outTokens})
					if err != nil {
						b.Fatal(err)
					}
					streams[i] = st
				}
				clk.unpause()
				var wg sync.WaitGroup
				var mu sync.Mutex
				start, end := 1e18, 0.0
				for _, st := range streams {
					wg.Go(func() {
						outs := collect(b, st)
						mu.Lock()
						start = min(start, outs[0].ArrivalSim)
						end = max(end, outs[len(outs)-1].NowSim)
						mu.Unlock()
					})
				}
				wg.Wait()
				simDur += end - start
			}
			b.ReportMetric(float64(b.N*clients*outTokens)/simDur, "sim-out-tok/s")
			b.ReportMetric(float64(b.N*clients)/b.Elapsed().Seconds(), "real-req/s")
		})
	}
}
