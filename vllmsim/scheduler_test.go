package vllmsim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// smallConfig: 16 blocks of 4 tokens, so eviction and preemption are easy
// to provoke.
func smallConfig() Config {
	c := DefaultConfig()
	c.BlockSize, c.NumGPUBlocks, c.MaxNumSeqs, c.MaxNumBatchedTokens, c.MaxModelLen = 4, 16, 8, 64, 1024
	c.HashAlgo, c.HashSeed, c.HashSeedSet = HashFast, "t", true
	c.Timing = Timing{StepOverhead: time.Millisecond, PrefillPerToken: time.Microsecond, DecodePerSeq: 10 * time.Microsecond}
	return c
}

func newTestCore(t testing.TB, cfg Config) *core {
	t.Helper()
	h, err := newHasher(cfg.HashAlgo, cfg.HashSeed, cfg.HashSeedSet)
	if err != nil {
		t.Fatal(err)
	}
	return newCore(cfg, h)
}

// newSeq builds a sequence whose "model" emits base+1, base+2, ...
func newSeq(prompt []uint32, maxTokens int, base uint32) *seq {
	n := base
	return &seq{tokens: slices.Clone(prompt), nPrompt: len(prompt), maxTokens: maxTokens,
		next: func() uint32 { n++; return n }}
}

func toks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// recorder replays events into hash → copies, as a consumer would.
type recorder struct {
	copies map[uint64]int
	log    []kvevent.Event
}

func newRecorder() *recorder { return &recorder{copies: map[uint64]int{}} }

func (r *recorder) apply(t testing.TB, evs []kvevent.Event) {
	t.Helper()
	for _, e := range evs {
		r.log = append(r.log, e)
		switch e.Kind {
		case kvevent.BlockStored:
			if len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
				t.Fatalf("BlockStored: %d tokens for %d blocks", len(e.TokenIDs), len(e.BlockHashes))
			}
			for _, h := range e.BlockHashes {
				r.copies[h]++
			}
		case kvevent.BlockRemoved:
			for _, h := range e.BlockHashes {
				if r.copies[h] == 0 {
					t.Fatalf("BlockRemoved of unknown hash %d", h)
				}
				if r.copies[h]--; r.copies[h] == 0 {
					delete(r.copies, h)
				}
			}
		case kvevent.AllBlocksCleared:
			clear(r.copies)
		}
	}
}

// step runs one scheduler step and returns its outcomes (nil batch: none).
func step(t testing.TB, c *core, r *recorder) (*batch, []outcome) {
	t.Helper()
	b := c.schedule()
	r.apply(t, c.takeEvents())
	if b == nil {
		return nil, nil
	}
	return b, c.complete(b)
}

// drain steps until nothing runs or waits; it returns the steps taken.
func drain(t testing.TB, c *core, r *recorder) int {
	t.Helper()
	for n := 0; ; n++ {
		if b, _ := step(t, c, r); b == nil {
			if len(c.waiting) > 0 {
				t.Fatalf("idle with %d waiting", len(c.waiting))
			}
			return n
		}
		if n > 100000 {
			t.Fatal("no progress")
		}
	}
}

func checkConsistent(t testing.TB, c *core, r *recorder) {
	t.Helper()
	snap := c.pool.snapshot()
	got := map[uint64]int{}
	present := map[uint64]bool{}
	for _, b := range snap {
		got[b.Hash] += b.Copies
		present[b.Hash] = true
	}
	if len(got) != len(r.copies) {
		t.Errorf("Cached has %d hashes, events say %d", len(got), len(r.copies))
	}
	for h, n := range r.copies {
		if got[h] != n {
			t.Errorf("hash %d: Cached copies %d, events %d", h, got[h], n)
		}
	}
	// Prefix closure: every cached block's parent is cached too.
	for _, b := range snap {
		if b.Parent != nil && !present[*b.Parent] {
			t.Errorf("block %d cached without its parent %d", b.Hash, *b.Parent)
		}
	}
}

func TestHitCap(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	c.add(newSeq(toks(100, 8), 1, 0)) // exactly 2 blocks
	drain(t, c, r)
	cases := []struct {
		name   string
		prompt []uint32
		want   int
	}{
		{"k*bs tokens reuse k-1 blocks", toks(100, 8), 4},
		{"k*bs+1 tokens reuse k blocks", toks(100, 9), 8},
		{"one block minus", toks(100, 4), 0},
		{"diverging second block", append(toks(100, 5), 7, 7, 7, 7), 4},
	}
	for _, tc := range cases {
		q := newSeq(tc.prompt, 1, 0)
		c.add(q)
		drain(t, c, r)
		if q.cachedTokens != tc.want {
			t.Errorf("%s: cached tokens = %d; want %d", tc.name, q.cachedTokens, tc.want)
		}
	}
	checkConsistent(t, c, r)
}

// TestEvictionTailFirst: a finished chain is evicted from its last block
// back, so what stays cached is a prefix; removals precede the stores of
// the request that caused them.
func TestEvictionTailFirst(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	a := newSeq(toks(100, 16), 1, 0) // 4 blocks
	c.add(a)
	drain(t, c, r)
	ah := wires(a.hashes)
	r.log = nil
	b := newSeq(toks(500, 56), 1, 0) // 14 blocks: 12 never used + 2 of a's
	c.add(b)
	drain(t, c, r)
	var kinds []kvevent.Kind
	var removed []uint64
	for _, e := range r.log {
		kinds = append(kinds, e.Kind)
		if e.Kind == kvevent.BlockRemoved {
			removed = append(removed, e.BlockHashes...)
		}
	}
	if want := []uint64{ah[3], ah[2]}; !slices.Equal(removed, want) {
		t.Errorf("removed %v; want %v (tail first)", removed, want)
	}
	if want := []kvevent.Kind{kvevent.BlockRemoved, kvevent.BlockRemoved, kvevent.BlockStored}; !slices.Equal(kinds, want) {
		t.Errorf("event kinds %v; want %v", kinds, want)
	}
	q := newSeq(toks(100, 16), 1, 0)
	c.add(q)
	drain(t, c, r)
	if q.cachedTokens != 8 {
		t.Errorf("after eviction, hit = %d tokens; want 8 (blocks 0-1)", q.cachedTokens)
	}
	checkConsistent(t, c, r)
}

// TestUncachedFirstReuse: a freed partial block is reused before any free
// block, and before cached ones.
func TestUncachedFirstReuse(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	a := newSeq(toks(100, 6), 1, 0) // block 0 full and cached, block 1 partial
	c.add(a)
	first := c.schedule()
	r.apply(t, c.takeEvents())
	partial, full := a.blocks[1], a.blocks[0]
	c.complete(first)
	drain(t, c, r)
	if c.pool.head.next != partial {
		t.Fatalf("head of free queue is block %d; want partial block %d", c.pool.head.next.id, partial.id)
	}
	if c.pool.tail.prev != full {
		t.Errorf("tail of free queue is block %d; want cached block %d", c.pool.tail.prev.id, full.id)
	}
	b := newSeq(toks(900, 3), 1, 0)
	c.add(b)
	c.schedule()
	if b.blocks[0] != partial {
		t.Errorf("new request got block %d; want reused partial block %d", b.blocks[0].id, partial.id)
	}
}

// TestPinnedNeverEvicted: a running request's blocks stay; a request that
// does not fit waits (never an error) and runs once blocks are free.
func TestPinnedNeverEvicted(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	a := newSeq(toks(100, 40), 8, 0) // 10 blocks now, 12 at most
	c.add(a)
	step(t, c, r)
	pinned := wires(a.hashes)
	b := newSeq(toks(500, 40), 1, 0) // needs 10 blocks; 6 free
	c.add(b)
	for a.state == running {
		step(t, c, r)
		if a.state == running && b.state != waiting {
			t.Fatalf("b admitted while a holds its blocks")
		}
		for _, h := range pinned {
			if r.copies[h] == 0 {
				t.Fatalf("pinned block %d evicted", h)
			}
		}
		if st := c.stats(); a.state == running && st.Waiting != 1 {
			t.Fatalf("Waiting = %d; want 1", st.Waiting)
		}
	}
	drain(t, c, r)
	if b.state != finished || b.generated() != 1 {
		t.Errorf("b state %d, generated %d; want finished with 1", b.state, b.generated())
	}
	if c.n.preemptions != 0 {
		t.Errorf("preemptions = %d; want 0", c.n.preemptions)
	}
	checkConsistent(t, c, r)
}

// TestDuplicateCopies: two requests computing the same blocks at once hold
// two copies, announced and later removed twice.
func TestDuplicateCopies(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	p := toks(100, 8)
	a, b := newSeq(p, 6, 0), newSeq(p, 6, 0) // same prompt, same "model" output
	c.add(a)
	c.add(b)
	drain(t, c, r)
	// b hits block 0 only ((8-1)/4 = 1), so it recomputes block 1 and, in
	// step with a, the generated block 2: two copies of each.
	h := wires(a.hashes)
	for i, want := range []int{1, 2, 2} {
		if r.copies[h[i]] != want {
			t.Errorf("block %d: %d copies; want %d", i, r.copies[h[i]], want)
		}
	}
	checkConsistent(t, c, r)
	c.add(newSeq(toks(900, 64), 1, 0)) // needs all 16 blocks: evicts everything
	drain(t, c, r)
	removals := map[uint64]int{}
	for _, e := range r.log {
		if e.Kind == kvevent.BlockRemoved {
			removals[e.BlockHashes[0]]++
		}
	}
	for i, want := range []int{1, 2, 2} {
		if removals[h[i]] != want {
			t.Errorf("block %d removed %d times; want %d", i, removals[h[i]], want)
		}
	}
	checkConsistent(t, c, r)
}

// TestGeneratedTokensCached: blocks filled during decode are stored, and a
// follow-up that carries the answer hits them.
func TestGeneratedTokensCached(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	a := newSeq(toks(100, 6), 10, 1000) // 16 tokens; the last is never computed
	c.add(a)
	drain(t, c, r)
	var stored [][]uint32
	for _, e := range r.log {
		if e.Kind == kvevent.BlockStored {
			stored = append(stored, e.TokenIDs)
		}
	}
	want := [][]uint32{toks(100, 4), {104, 105, 1001, 1002}, {1003, 1004, 1005, 1006}}
	if len(stored) != 3 {
		t.Fatalf("BlockStored events %v; want %v", stored, want)
	}
	for i := range want {
		if !slices.Equal(stored[i], want[i]) {
			t.Errorf("BlockStored %d tokens %v; want %v", i, stored[i], want[i])
		}
	}
	follow := newSeq(slices.Concat(a.tokens, toks(7, 5)), 1, 0)
	c.add(follow)
	drain(t, c, r)
	if follow.cachedTokens != 12 {
		t.Errorf("follow-up hit %d tokens; want 12", follow.cachedTokens)
	}
	checkConsistent(t, c, r)
}

func TestChunkedPrefill(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumBatchedTokens, cfg.NumGPUBlocks = 16, 32
	c, r := newTestCore(t, cfg), newRecorder()
	q := newSeq(toks(100, 50), 3, 0)
	c.add(q)
	var chunks []int
	var firstAt int
	for i := 1; q.state != finished; i++ {
		b, outs := step(t, c, r)
		chunks = append(chunks, b.prefillTokens)
		if len(outs) > 0 && firstAt == 0 {
			firstAt = i
		}
	}
	if want := []int{16, 16, 16, 2, 0, 0}; !slices.Equal(chunks, want) {
		t.Errorf("prefill tokens per step %v; want %v", chunks, want)
	}
	if firstAt != 4 {
		t.Errorf("first token at step %d; want 4", firstAt)
	}
}

// TestDecodeFirst: decoding sequences take their token from the budget
// before a running prefill continues.
func TestDecodeFirst(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumBatchedTokens, cfg.NumGPUBlocks = 16, 64
	c, r := newTestCore(t, cfg), newRecorder()
	a := newSeq(toks(100, 4), 10, 0)
	c.add(a)
	step(t, c, r) // a prefilled, now decoding
	long := newSeq(toks(500, 100), 1, 0)
	c.add(long)
	step(t, c, r) // a decodes 1, long takes 15
	b, _ := step(t, c, r)
	if b.decodeSeqs != 1 || b.prefillTokens != 15 {
		t.Errorf("step: %d decodes, %d prefill tokens; want 1, 15", b.decodeSeqs, b.prefillTokens)
	}
}

func TestPreemption(t *testing.T) {
	cfg := smallConfig()
	cfg.NumGPUBlocks = 8
	c, r := newTestCore(t, cfg), newRecorder()
	a, b := newSeq(toks(100, 12), 12, 1000), newSeq(toks(200, 12), 12, 2000) // 6 blocks each at the end
	c.add(a)
	c.add(b)
	var sawRequeue bool
	for n := 0; a.state != finished || b.state != finished; n++ {
		step(t, c, r)
		if b.state == waiting && b.generated() > 0 {
			sawRequeue = true
			if c.waiting[0] != b {
				t.Fatal("preempted request not at the front of the queue")
			}
		}
		if n > 1000 {
			t.Fatal("no progress")
		}
	}
	if c.n.preemptions == 0 || !sawRequeue {
		t.Fatalf("preemptions = %d; want the later request preempted", c.n.preemptions)
	}
	// Recompute preemption keeps the output stream intact.
	if want := slices.Concat(toks(200, 12), toks(2001, 12)); !slices.Equal(b.tokens, want) {
		t.Errorf("b tokens %v; want %v", b.tokens, want)
	}
	if a.generated() != 12 {
		t.Errorf("a generated %d; want 12", a.generated())
	}
	checkConsistent(t, c, r)
}

func TestResetPrefixCache(t *testing.T) {
	c, r := newTestCore(t, smallConfig()), newRecorder()
	a := newSeq(toks(100, 9), 3, 0)
	c.add(a)
	step(t, c, r)
	if c.pool.clear() {
		t.Fatal("reset succeeded while a request holds blocks")
	}
	drain(t, c, r)
	if !c.pool.clear() {
		t.Fatal("reset failed with no request running")
	}
	r.apply(t, c.takeEvents())
	if last := r.log[len(r.log)-1]; last.Kind != kvevent.AllBlocksCleared {
		t.Errorf("last event %v; want AllBlocksCleared", last.Kind)
	}
	if n := len(c.pool.snapshot()); n != 0 {
		t.Errorf("%d blocks cached after reset", n)
	}
	q := newSeq(toks(100, 9), 1, 0)
	c.add(q)
	drain(t, c, r)
	if q.cachedTokens != 0 {
		t.Errorf("hit %d tokens after reset; want 0", q.cachedTokens)
	}
	checkConsistent(t, c, r)
}

// TestEventConsistencyRandom replays every event of a randomized workload
// with shared prefixes, LoRA, salts, evictions, preemptions and aborts, and
// compares the replayed cache with the ground truth after every step.
func TestEventConsistencyRandom(t *testing.T) {
	for seed := range uint64(5) {
		cfg := smallConfig()
		cfg.NumGPUBlocks, cfg.MaxNumBatchedTokens, cfg.MaxNumSeqs = 48, 40, 6
		c, r := newTestCore(t, cfg), newRecorder()
		rng := rand.New(rand.NewPCG(seed, 1))
		docs := [][]uint32{toks(0, 60), toks(1000, 60), toks(2000, 60)}
		var live []*seq
		for i := range 400 {
			if rng.IntN(3) == 0 {
				d := docs[rng.IntN(len(docs))]
				p := slices.Concat(d[:rng.IntN(len(d))+1], toks(10000+rng.IntN(50)*7, rng.IntN(30)))
				q := newSeq(p, 1+rng.IntN(30), uint32(rng.IntN(3)*100))
				if rng.IntN(6) == 0 {
					q.keys.lora = "L"
				}
				if rng.IntN(8) == 0 {
					q.keys.salt = "s"
				}
				c.add(q)
				live = append(live, q)
			}
			if len(live) > 0 && rng.IntN(25) == 0 {
				c.abort(live[rng.IntN(len(live))])
			}
			if i%97 == 0 && c.pool.clear() {
				r.apply(t, c.takeEvents())
			}
			step(t, c, r)
			checkConsistent(t, c, r)
			if t.Failed() {
				t.Fatalf("seed %d step %d", seed, i)
			}
		}
		drain(t, c, r)
		checkConsistent(t, c, r)
		if c.n.preemptions == 0 {
			t.Logf("seed %d: no preemption", seed)
		}
	}
}

func TestConfigs(t *testing.T) {
	for name, cfg := range map[string]Config{"default": DefaultConfig(), "local": LocalConfig()} {
		if err := cfg.validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if cfg.Timing.Duration(0, 64) < 9*time.Millisecond || cfg.Timing.Duration(0, 64) > 11*time.Millisecond {
			t.Errorf("%s: decode step at batch 64 = %v; want ~10ms", name, cfg.Timing.Duration(0, 64))
		}
	}
	bad := DefaultConfig()
	bad.TimeScale = -1
	if err := bad.validate(); err == nil {
		t.Error("negative TimeScale accepted")
	}
	zero := DefaultConfig()
	zero.TimeScale = 0
	if err := zero.validate(); err != nil || zero.TimeScale != 1 {
		t.Errorf("zero TimeScale: %v, %v; want 1", err, zero.TimeScale)
	}
}
