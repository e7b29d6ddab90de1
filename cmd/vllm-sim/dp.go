package main

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvroute/kvroute/vllmsim"
)

// ranks is the engine side of `vllm serve --data-parallel-size N`: one
// engine core per rank behind one API server. Each rank has its own KV
// cache, hash seed (unless PYTHONHASHSEED is set) and event publisher, as
// vLLM's rank processes do. With one rank it is a plain engine.
type ranks struct {
	mu   sync.Mutex // makes a choice and its Submit one step, so bursts spread
	engs []*vllmsim.Engine
}

// pick is vLLM's rule for a request without data_parallel_rank
// (DPLBAsyncMPClient.get_core_engine_for_request): the rank with the
// lowest 4*waiting + running, the lowest rank on a tie (one API server
// starts its scan at rank 0). vLLM reads the counts from the coordinator
// every 100 ms and adds its own assignments since; the simulator reads
// them live, which is what that bookkeeping approximates.
func pick(stats []vllmsim.Stats) int {
	best, bestScore := 0, -1
	for i, s := range stats {
		if score := 4*s.Waiting + s.Running; bestScore < 0 || score < bestScore {
			best, bestScore = i, score
		}
	}
	return best
}

func (r *ranks) Submit(ctx context.Context, q vllmsim.Request) (*vllmsim.Stream, error) {
	if len(r.engs) == 1 {
		return r.engs[0].Submit(ctx, q)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	stats := make([]vllmsim.Stats, len(r.engs))
	for i, e := range r.engs {
		stats[i] = e.Stats()
	}
	return r.engs[pick(stats)].Submit(ctx, q)
}

// SubmitRank submits to rank, the choice of a request carrying
// X-data-parallel-rank; a rank the server does not run is invalid.
func (r *ranks) SubmitRank(ctx context.Context, rank int, q vllmsim.Request) (*vllmsim.Stream, error) {
	if rank >= len(r.engs) {
		return nil, fmt.Errorf("%w: data parallel rank %d out of range [0, %d)", vllmsim.ErrInvalid, rank, len(r.engs))
	}
	return r.engs[rank].Submit(ctx, q)
}

// Stats sums the ranks' gauges and counters; KVUsage is the mean (each rank
// has a cache of the same size) and NumGPUBlocks one rank's.
func (r *ranks) Stats() vllmsim.Stats {
	var t vllmsim.Stats
	for _, e := range r.engs {
		s := e.Stats()
		t.Running += s.Running
		t.Waiting += s.Waiting
		t.KVUsage += s.KVUsage / float64(len(r.engs))
		t.NumGPUBlocks, t.BlockSize = s.NumGPUBlocks, s.BlockSize
		t.PrefixQueriesTokens += s.PrefixQueriesTokens
		t.PrefixHitsTokens += s.PrefixHitsTokens
		t.PromptTokensTotal += s.PromptTokensTotal
		t.GenerationTokensTotal += s.GenerationTokensTotal
		t.RequestsFinishedTotal += s.RequestsFinishedTotal
		t.Preemptions += s.Preemptions
		t.ExternalQueriesTokens += s.ExternalQueriesTokens
		t.ExternalHitsTokens += s.ExternalHitsTokens
		t.CPUBlocks += s.CPUBlocks
	}
	return t
}

// Cached returns every rank's blocks, rank 0's first.
func (r *ranks) Cached() []vllmsim.CachedBlock {
	var out []vllmsim.CachedBlock
	for _, e := range r.engs {
		out = append(out, e.Cached()...)
	}
	return out
}

// ResetPrefixCache resets every rank and reports whether all succeeded.
func (r *ranks) ResetPrefixCache() bool {
	ok := true
	for _, e := range r.engs {
		ok = e.ResetPrefixCache() && ok
	}
	return ok
}

func (r *ranks) Restart() {
	for _, e := range r.engs {
		e.Restart()
	}
}

// publishers fans the admin controls out to every rank's publisher.
type publishers []*publisher

func (ps publishers) Restart(ctx context.Context) error {
	var errs []error
	for _, p := range ps {
		errs = append(errs, p.Restart(ctx))
	}
	return errors.Join(errs...)
}

func (ps publishers) SetDropRate(v float64) error {
	for _, p := range ps {
		if err := p.SetDropRate(v); err != nil {
			return err
		}
	}
	return nil
}

func (ps publishers) DropRate() float64 { return ps[0].DropRate() }

// Stats sums the ranks' publisher counters.
func (ps publishers) Stats() pubStats {
	var t pubStats
	for _, p := range ps {
		s := p.Stats()
		t.Sent += s.Sent
		t.Dropped += s.Dropped
		t.QueueFull += s.QueueFull
		t.EncodeErrors += s.EncodeErrors
		t.Replays += s.Replays
	}
	return t
}
