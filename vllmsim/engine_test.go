package vllmsim

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// fakeClock stands still except in sleep, which advances it at once: the
// engine then runs as fast as the CPU allows and sim time is exact. While
// paused, sleep blocks, holding the engine inside a step.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	resume chan struct{} // non-nil while paused
}

func (f *fakeClock) now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

func (f *fakeClock) sleep(ctx context.Context, d time.Duration) error {
	f.mu.Lock()
	r := f.resume
	f.mu.Unlock()
	if r != nil {
		select {
		case <-ctx.Done():
		case <-r:
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if d > 0 {
		f.t = f.t.Add(d)
	}
	return nil
}

func (f *fakeClock) pause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resume = make(chan struct{})
}

func (f *fakeClock) unpause() {
	f.mu.Lock()
	defer f.mu.Unlock()
	close(f.resume)
	f.resume = nil
}

// syncRecorder is a recorder fed by EventSink from the step loop.
type syncRecorder struct {
	mu    sync.Mutex
	r     *recorder
	calls int
	t     testing.TB
}

func (s *syncRecorder) sink(ts float64, evs []kvevent.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(evs) == 0 || ts <= 0 {
		s.t.Errorf("EventSink(%v, %d events)", ts, len(evs))
	}
	s.calls++
	s.r.apply(s.t, evs)
}

func (s *syncRecorder) copies() map[uint64]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps(s.r.copies)
}

func maps(m map[uint64]int) map[uint64]int {
	out := make(map[uint64]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// startEngine runs an engine on a fake clock until the test ends.
func startEngine(t testing.TB, cfg Config) (*Engine, *syncRecorder) {
	t.Helper()
	e, rec, _ := startEngineClock(t, cfg)
	return e, rec
}

func startEngineClock(t testing.TB, cfg Config) (*Engine, *syncRecorder, *fakeClock) {
	t.Helper()
	rec := &syncRecorder{r: newRecorder(), t: t}
	cfg.EventSink = rec.sink
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	e, err := newEngine(cfg, clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	return e, rec, clk
}

// collect reads a stream to its end, failing after a deadline.
func collect(t testing.TB, st *Stream) []Output {
	t.Helper()
	var outs []Output
	deadline := time.After(20 * time.Second)
	for {
		select {
		case o, ok := <-st.C:
			if !ok {
				if len(outs) == 0 || !outs[len(outs)-1].Done {
					t.Fatal("stream closed without a Done output")
				}
				return outs
			}
			outs = append(outs, o)
		case <-deadline:
			t.Fatalf("stream stalled after %d outputs", len(outs))
		}
	}
}

func run(t testing.TB, e *Engine, r Request) []Output {
	t.Helper()
	st, err := e.Submit(context.Background(), r)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return collect(t, st)
}

func timingConfig() Config {
	c := DefaultConfig()
	c.NumGPUBlocks, c.MaxNumBatchedTokens, c.MaxModelLen = 1000, 256, 4096
	c.HashSeed, c.HashSeedSet = "42", true
	c.Timing = Timing{StepOverhead: 5 * time.Millisecond, PrefillPerToken: 70 * time.Microsecond, DecodePerSeq: 50 * time.Microsecond}
	return c
}

// TestTTFTMatchesModel: a lone request's time to first token is exactly
// ceil(uncached/budget) step overheads plus uncached × PrefillPerToken,
// and each later token one decode step.
func TestTTFTMatchesModel(t *testing.T) {
	cfg := timingConfig()
	e, _ := startEngine(t, cfg)
	tm := cfg.Timing
	cases := []struct {
		name       string
		warm       []uint32
		prompt     []uint32
		wantCached int
	}{
		{"0% cached", nil, toks(0, 1000), 0},
		{"50% cached", toks(10000, 500), slices.Concat(toks(10000, 500), toks(20000, 500)), 496},
		{"100% cached", toks(30000, 1000), toks(30000, 1000), 992},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.warm != nil {
				run(t, e, Request{ID: "warm", PromptTokens: c.warm, MaxTokens: 1})
			}
			outs := run(t, e, Request{ID: "r", PromptTokens: c.prompt, MaxTokens: 3})
			first := outs[0]
			uncached := len(c.prompt) - c.wantCached
			steps := (uncached + cfg.MaxNumBatchedTokens - 1) / cfg.MaxNumBatchedTokens
			want := time.Duration(steps)*tm.StepOverhead + time.Duration(uncached)*tm.PrefillPerToken
			got := first.FirstTokenSim - first.ArrivalSim
			if math.Abs(got-want.Seconds()) > 1e-9 {
				t.Errorf("TTFT = %.9fs; want %.9fs (%d steps, %d uncached)", got, want.Seconds(), steps, uncached)
			}
			if first.Usage.CachedTokens != c.wantCached || first.Usage.PromptTokens != len(c.prompt) {
				t.Errorf("usage %+v; want cached %d", first.Usage, c.wantCached)
			}
			if len(outs) != 3 || len(first.Tokens) != 1 || !outs[2].Done || outs[2].FinishReason != "length" {
				t.Fatalf("outputs %+v; want 3, the last Done with length", outs)
			}
			decode := (tm.StepOverhead + tm.DecodePerSeq).Seconds()
			if d := outs[1].NowSim - outs[0].NowSim; math.Abs(d-decode) > 1e-9 {
				t.Errorf("inter-token time = %.9fs; want %.9fs", d, decode)
			}
			if outs[2].Usage.CompletionTokens != 3 {
				t.Errorf("final usage %+v; want 3 completion tokens", outs[2].Usage)
			}
		})
	}
}

func TestSubmitErrors(t *testing.T) {
	cfg := smallConfig() // 16 blocks × 4 tokens, MaxModelLen 1024
	e, _ := startEngine(t, cfg)
	cases := []struct {
		name string
		r    Request
		want error
	}{
		{"empty prompt", Request{MaxTokens: 1}, ErrInvalid},
		{"no max tokens", Request{PromptTokens: toks(0, 4)}, ErrInvalid},
		{"over max model len", Request{PromptTokens: toks(0, 1000), MaxTokens: 25}, ErrTooLong},
		{"prompt over cache", Request{PromptTokens: toks(0, 65), MaxTokens: 1}, ErrTooLong},
		{"prompt+output over cache", Request{PromptTokens: toks(0, 60), MaxTokens: 6}, ErrTooLong},
		{"huge max tokens", Request{PromptTokens: toks(0, 4), MaxTokens: math.MaxInt}, ErrTooLong},
		{"exactly the cache", Request{PromptTokens: toks(0, 60), MaxTokens: 5}, nil},
	}
	for _, c := range cases {
		st, err := e.Submit(context.Background(), c.r)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: Submit err = %v; want %v", c.name, err, c.want)
		}
		if err == nil {
			collect(t, st)
		}
	}
}

func TestStoppedEngine(t *testing.T) {
	e, err := newEngine(smallConfig(), &fakeClock{})
	if err != nil {
		t.Fatal(err)
	}
	// Submitted before Run: it waits, then Run's shutdown aborts it.
	st, err := e.Submit(context.Background(), Request{PromptTokens: toks(0, 4), MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Run(ctx); err != nil {
		t.Errorf("Run = %v; want nil", err)
	}
	outs := collect(t, st)
	if last := outs[len(outs)-1]; last.FinishReason != "abort" {
		t.Errorf("finish reason %q; want abort", last.FinishReason)
	}
	if _, err := e.Submit(context.Background(), Request{PromptTokens: toks(0, 4), MaxTokens: 1}); !errors.Is(err, ErrStopped) {
		t.Errorf("Submit after Run = %v; want ErrStopped", err)
	}
	if err := e.Run(context.Background()); err == nil {
		t.Error("second Run succeeded")
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New(zero Config) succeeded")
	}
}

// TestCancelAborts cancels a request in the middle of a step: it ends
// with "abort" and its blocks are free at once.
func TestCancelAborts(t *testing.T) {
	e, _, clk := startEngineClock(t, smallConfig())
	clk.pause()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.Submit(ctx, Request{PromptTokens: toks(0, 10), MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return e.Stats().Running == 1 })
	if u := e.Stats().KVUsage; u == 0 {
		t.Fatal("running request holds no blocks")
	}
	cancel()
	outs := collect(t, st)
	if last := outs[len(outs)-1]; last.FinishReason != "abort" || len(outs) != 1 {
		t.Errorf("outputs %+v; want one abort", outs)
	}
	if s := e.Stats(); s.Running != 0 || s.Waiting != 0 || s.KVUsage != 0 {
		t.Errorf("stats after cancel %+v; want nothing running, no blocks used", s)
	}
	clk.unpause()
	run(t, e, Request{PromptTokens: toks(0, 10), MaxTokens: 2}) // the engine goes on
}

// TestSlowConsumer: a consumer that does not read does not stall the
// engine; it later gets every token, merged, and the Done output.
func TestSlowConsumer(t *testing.T) {
	cfg := smallConfig()
	cfg.NumGPUBlocks = 200
	e, _ := startEngine(t, cfg)
	slow, err := e.Submit(context.Background(), Request{PromptTokens: toks(0, 4), MaxTokens: 200})
	if err != nil {
		t.Fatal(err)
	}
	// Another request completes while nobody reads the first stream.
	run(t, e, Request{PromptTokens: toks(100, 4), MaxTokens: 300})
	waitFor(t, func() bool { return e.Stats().RequestsFinishedTotal == 2 })
	outs := collect(t, slow)
	var n int
	for _, o := range outs {
		n += len(o.Tokens)
	}
	if n != 200 || !outs[len(outs)-1].Done {
		t.Errorf("got %d tokens in %d outputs; want 200 and Done", n, len(outs))
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(20 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("condition not met before deadline")
		}
	}
}

// TestEngineEventsMatchCached: concurrent clients with shared prefixes and
// evictions; the events replayed equal the engine's cache.
func TestEngineEventsMatchCached(t *testing.T) {
	cfg := smallConfig()
	cfg.NumGPUBlocks, cfg.MaxNumBatchedTokens = 64, 48
	e, rec := startEngine(t, cfg)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				p := slices.Concat(toks(1000*(i%3), 20+g), toks(50000+g*100+i, i%7))
				st, err := e.Submit(context.Background(), Request{PromptTokens: p, MaxTokens: 1 + (g+i)%9})
				if err != nil {
					t.Error(err)
					return
				}
				collect(t, st)
				_ = e.Stats()
			}
		})
	}
	wg.Wait()
	got := map[uint64]int{}
	for _, b := range e.Cached() {
		got[b.Hash] += b.Copies
	}
	want := rec.copies()
	if len(got) != len(want) {
		t.Errorf("Cached has %d hashes; events %d", len(got), len(want))
	}
	for h, n := range want {
		if got[h] != n {
			t.Errorf("hash %d: Cached %d copies; events %d", h, got[h], n)
		}
	}
	s := e.Stats()
	if s.RequestsFinishedTotal != 160 || s.PrefixHitsTokens == 0 || s.PrefixHitsTokens > s.PrefixQueriesTokens {
		t.Errorf("stats %+v", s)
	}
}

func TestRestartAndReset(t *testing.T) {
	for _, seedSet := range []bool{false, true} {
		cfg := smallConfig()
		cfg.HashSeedSet = seedSet
		e, rec, clk := startEngineClock(t, cfg)
		p := toks(0, 9)
		run(t, e, Request{PromptTokens: p, MaxTokens: 1})
		before := e.Cached()
		clk.pause()
		long, err := e.Submit(context.Background(), Request{PromptTokens: toks(500, 8), MaxTokens: 50})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return e.Stats().Running == 1 })
		if e.ResetPrefixCache() {
			t.Error("ResetPrefixCache succeeded while a request runs")
		}
		rec.mu.Lock()
		calls := rec.calls
		rec.mu.Unlock()
		e.Restart()
		outs := collect(t, long)
		if r := outs[len(outs)-1].FinishReason; r != "abort" {
			t.Errorf("finish reason after Restart %q; want abort", r)
		}
		if n := len(e.Cached()); n != 0 {
			t.Errorf("%d cached blocks after Restart", n)
		}
		clk.unpause()
		if s := e.Stats(); s.RequestsFinishedTotal != 0 || s.Running != 0 {
			t.Errorf("stats after Restart %+v", s)
		}
		run(t, e, Request{PromptTokens: p, MaxTokens: 1})
		after := e.Cached()
		if same := after[0].Hash == before[0].Hash; same != seedSet {
			t.Errorf("seedSet=%v: hash after restart equal = %v", seedSet, same)
		}
		rec.mu.Lock()
		for _, ev := range rec.r.log[calls:] {
			if ev.Kind == kvevent.BlockRemoved || ev.Kind == kvevent.AllBlocksCleared {
				t.Errorf("event %v after Restart; a restart emits none", ev.Kind)
			}
		}
		rec.mu.Unlock()
		if !e.ResetPrefixCache() {
			t.Fatal("ResetPrefixCache failed on an idle engine")
		}
		waitFor(t, func() bool {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			return rec.r.log[len(rec.r.log)-1].Kind == kvevent.AllBlocksCleared
		})
	}
}

// TestChatFollowUpHits: the second turn of a conversation reuses the first
// turn's prompt and answer, to the block.
func TestChatFollowUpHits(t *testing.T) {
	cfg := timingConfig()
	e, _ := startEngine(t, cfg)
	tok := e.Tokenizer()
	msgs := []Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name three rivers of Europe and say something about each."}}
	o := ChatOptions{AddGenerationPrompt: true}
	p1, _ := tok.Chat(msgs, o)
	var gen []uint32
	for _, out := range run(t, e, Request{PromptTokens: p1, MaxTokens: 40}) {
		gen = append(gen, out.Tokens...)
	}
	msgs = append(msgs, Message{Role: "assistant", Content: tok.Decode(gen)}, Message{Role: "user", Content: "And two more?"})
	p2, _ := tok.Chat(msgs, o)
	outs := run(t, e, Request{PromptTokens: p2, MaxTokens: 1})
	bs := cfg.BlockSize
	want := min((len(p1)+len(gen)-1)/bs, (len(p2)-1)/bs) * bs
	if got := outs[0].Usage.CachedTokens; got != want || want == 0 {
		t.Errorf("follow-up cached %d tokens; want %d", got, want)
	}
	// Same prompt, same answer.
	var again []uint32
	for _, out := range run(t, e, Request{PromptTokens: p1, MaxTokens: 40}) {
		again = append(again, out.Tokens...)
	}
	if !slices.Equal(again, gen) {
		t.Error("same prompt generated a different answer")
	}
}

// TestWallClock runs the real clock at a high TimeScale.
func TestWallClock(t *testing.T) {
	cfg := smallConfig()
	cfg.TimeScale = 100
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	outs := run(t, e, Request{PromptTokens: toks(0, 8), MaxTokens: 5})
	last := outs[len(outs)-1]
	if last.NowSim < last.FirstTokenSim || last.FirstTokenSim <= last.ArrivalSim {
		t.Errorf("timestamps arrival %v first %v now %v", last.ArrivalSim, last.FirstTokenSim, last.NowSim)
	}
	// 5 steps of at least 1 ms sim each.
	if d := last.NowSim - last.ArrivalSim; d < 0.005 {
		t.Errorf("request took %vs of sim time; want ≥ 5 steps", d)
	}
}
