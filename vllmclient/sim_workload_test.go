//go:build integration

package vllmclient_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// workload is a randomized prefix-sharing request mix: Docs "documents"
// of random tokens, each request a document's prefix plus a random suffix.
// The same DocSeed gives the same documents; ReqSeed picks the requests.
type workload struct {
	DocSeed, ReqSeed uint64
	Docs             int // distinct shared prefixes (a few hundred)
	Requests         int // requests sent
	Workers          int // concurrent clients
}

// job is one /v1/completions request.
type job struct {
	prompt    []uint32
	maxTokens int
}

// Token ids of workload prompts; sentinels use ids far above.
const minToken, maxToken = 1000, 60_000

// jobs returns the requests in order. Prompts are 20–600 tokens: a
// document prefix (whole in most requests) plus a 4–120 token suffix;
// max_tokens is 1–20. Popularity is skewed (r² over the documents) so some
// prefixes stay hot, while the long tail keeps a small cache evicting.
//
// Two shapes make the engine hold duplicate copies of a hash, as vLLM
// does: a prompt that is exactly whole blocks (vLLM recomputes the last
// block even on a full hit, (n-1)//16, and stores a second copy), and a
// repeat of a recent prompt (its generated blocks are computed again).
func (w workload) jobs() []job {
	dr := rand.New(rand.NewPCG(w.DocSeed, 1))
	docs := make([][]uint32, w.Docs)
	for i := range docs {
		docs[i] = tokens(dr, 16+dr.IntN(465))
	}
	r := rand.New(rand.NewPCG(w.ReqSeed, 2))
	out := make([]job, w.Requests)
	for i := range out {
		if i > 0 && r.IntN(10) == 0 {
			prev := out[max(0, i-1-r.IntN(32))]
			out[i] = job{prompt: prev.prompt, maxTokens: 1 + r.IntN(20)}
			continue
		}
		f := r.Float64()
		doc := docs[int(f*f*float64(len(docs)))]
		var p []uint32
		switch n := len(doc); r.IntN(8) {
		case 0: // whole blocks only
			if n < 32 {
				p = append(doc[:n:n], tokens(r, 32-n)...)
			} else {
				p = doc[: n/16*16 : n/16*16]
			}
		case 1, 2: // a partial prefix: chains fork mid-document
			n = 1 + r.IntN(n)
			p = append(doc[:n:n], tokens(r, 4+r.IntN(117))...)
		default:
			p = append(doc[:n:n], tokens(r, 4+r.IntN(117))...)
		}
		if len(p) < 20 {
			p = append(p, tokens(r, 20-len(p))...)
		}
		out[i] = job{prompt: p[:min(len(p), 600)], maxTokens: 1 + r.IntN(20)}
	}
	return out
}

func tokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(minToken + r.IntN(maxToken-minToken))
	}
	return t
}

// run sends every job with w.Workers concurrent clients and fails the test
// on the first error. It returns the prompt tokens sent.
func (w workload) run(t *testing.T, ctx context.Context, s *sim) int {
	t.Helper()
	jobs := w.jobs()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	var sent atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range w.Workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(jobs) || ctx.Err() != nil {
					return
				}
				if err := s.complete(ctx, jobs[i].prompt, jobs[i].maxTokens); err != nil {
					once.Do(func() { first = fmt.Errorf("request %d: %w", i, err); cancel() })
					return
				}
				sent.Add(int64(len(jobs[i].prompt)))
			}
		})
	}
	wg.Wait()
	if first != nil {
		t.Fatal(first)
	}
	return int(sent.Load())
}
