package vllmsim

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// seqState is where a sequence is in its life.
type seqState uint8

const (
	waiting seqState = iota
	running
	finished // done or aborted; it holds no blocks
)

// seq is one request inside the scheduler (vLLM's Request).
type seq struct {
	id        string
	tokens    []uint32 // prompt, then generated tokens
	nPrompt   int
	maxTokens int
	keys      blockKeys // LoRA name, salt and images: the blocks' extra keys
	loraID    int64
	next      func() uint32 // the "model": the next generated token

	state  seqState
	hashes []digest   // hashes of full blocks of tokens, computed lazily
	blocks []*kvBlock // physical blocks, in token order
	// computed counts tokens whose KV exists (num_computed_tokens).
	computed int
	// cachedBlocks counts leading blocks registered in the cache
	// (num_cached_block): hits, then blocks this sequence filled.
	cachedBlocks int
	// cachedTokens is the prefix hit at first scheduling (usage), -1 before.
	cachedTokens int
	stepNo       uint64 // last step that scheduled it
	newTokens    int    // tokens scheduled in that step

	// Engine side (guarded by the engine's mutex).
	arrival, firstToken time.Duration
	out                 *stream
}

func (q *seq) generated() int { return len(q.tokens) - q.nPrompt }

// decoding: it has produced output and only its last sampled token lacks KV.
func (q *seq) decoding() bool { return q.generated() > 0 && len(q.tokens)-q.computed == 1 }

// batch is what one scheduler step runs.
type batch struct {
	seqs          []*seq
	prefillTokens int // uncached tokens computed (prefill chunks, recomputes)
	loadTokens    int // tokens loaded from the CPU tier
	decodeSeqs    int
	dur           time.Duration
}

// outcome is one sequence's progress in a completed step.
type outcome struct {
	q      *seq
	token  uint32
	done   bool
	reason string
}

// counters are the monotonic figures of Stats.
type counters struct {
	queries, hits, prompt, gen, finished, preemptions uint64
	// extQueries and extHits are the tier's share: tokens looked up past
	// the GPU hit, and tokens loaded.
	extQueries, extHits uint64
}

// core is the scheduler and KV cache: a state machine with no clock and no
// goroutines. schedule picks a step's work and allocates its blocks (this is
// where KV events arise); complete applies the step's results. The engine's
// loop calls them in turn with the simulated step time in between.
type core struct {
	cfg     Config
	pool    *pool
	h       hasher
	waiting []*seq // FCFS; preempted sequences go back to the front
	running []*seq // in scheduling order; the tail is preempted first
	stepNo  uint64
	n       counters
}

func newCore(cfg Config, h hasher) *core {
	return &core{cfg: cfg, pool: newPool(cfg.NumGPUBlocks, cfg.BlockSize, cfg.Offload), h: h}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// add queues q at the back of the waiting queue.
func (c *core) add(q *seq) {
	q.state, q.cachedTokens = waiting, -1
	c.waiting = append(c.waiting, q)
}

// schedule plans one step as vLLM's V1 scheduler does, with one ordering
// choice of ours: decoding sequences take their one token from the budget
// before running prefills continue (vLLM V1 walks the running list in
// order). It returns nil when there is nothing to run.
func (c *core) schedule() *batch {
	c.stepNo++
	b := &batch{}
	budget := c.cfg.MaxNumBatchedTokens
	preempted := false
	for _, decode := range []bool{true, false} {
		for i := 0; i < len(c.running) && budget > 0; {
			q := c.running[i]
			if q.stepNo == c.stepNo || q.decoding() != decode {
				i++
				continue
			}
			n := min(len(q.tokens)-q.computed, budget)
			fits, shifted := true, false
			for !c.grow(q, n) {
				v := c.victim(q)
				c.preempt(v)
				preempted, shifted = true, true
				if v == q {
					fits = false
					break
				}
			}
			if fits {
				c.plan(b, q, n, decode)
				budget -= n
			}
			// Preemption reshapes c.running; rescan (scheduled ones are
			// skipped by stepNo).
			if shifted {
				i = 0
			} else {
				i++
			}
		}
	}
	// vLLM admits nobody in a step that had to preempt.
	for !preempted && len(c.waiting) > 0 && len(c.running) < c.cfg.MaxNumSeqs && budget > 0 {
		q := c.waiting[0]
		n, ok := c.admit(b, q, budget)
		if !ok {
			break // FCFS: the head waits for blocks, the rest wait behind it
		}
		c.waiting = c.waiting[1:]
		c.running = append(c.running, q)
		c.plan(b, q, n, false)
		budget -= n
	}
	if len(b.seqs) == 0 {
		return nil
	}
	b.dur = c.cfg.Timing.Duration(b.prefillTokens, b.decodeSeqs) +
		time.Duration(b.loadTokens)*c.cfg.Timing.LoadPerToken
	return b
}

func (c *core) plan(b *batch, q *seq, n int, decode bool) {
	q.stepNo, q.newTokens = c.stepNo, n
	b.seqs = append(b.seqs, q)
	if decode {
		b.decodeSeqs++
	} else {
		b.prefillTokens += n
	}
}

// admit looks up q's prefix hit and allocates blocks for its first n tokens
// past the hit (n ≤ budget: chunked prefill). It changes nothing when the
// blocks do not fit.
func (c *core) admit(b *batch, q *seq, budget int) (int, bool) {
	bs := c.cfg.BlockSize
	q.hashes = c.h.chain(q.hashes, q.tokens, bs, q.keys)
	// The last token is always recomputed to get logits: (n-1)//bs.
	max := (len(q.tokens) - 1) / bs
	hit := c.pool.lookup(q.hashes, max)
	hitTokens := len(hit) * bs
	// The tier extends the GPU hit (vLLM asks the connector for tokens
	// past the local hit); loaded blocks need GPU blocks like computed
	// ones but cost no token budget.
	loaded := c.pool.offloaded(q.hashes, len(hit), max)
	loadTokens := loaded * bs
	n := min(len(q.tokens)-hitTokens-loadTokens, budget)
	need := ceilDiv(hitTokens+loadTokens+n, bs) - len(hit)
	if !c.pool.canAllocate(need, hit) {
		return 0, false
	}
	c.pool.touch(hit)
	if loaded > 0 {
		// Refreshed before take: the evictions take offloads must not push
		// out what this request is loading.
		c.pool.load(q.hashes[len(hit) : len(hit)+loaded])
		b.loadTokens += loadTokens
	}
	q.blocks = append(slices.Clip(hit), c.pool.take(need)...)
	q.cachedBlocks, q.computed = len(hit), hitTokens+loadTokens
	c.cacheFull(q, hitTokens+loadTokens+n)
	q.state = running
	c.n.queries += uint64(len(q.tokens))
	c.n.hits += uint64(hitTokens)
	if c.pool.tier != nil {
		c.n.extQueries += uint64(len(q.tokens) - hitTokens)
		c.n.extHits += uint64(loadTokens)
	}
	if q.cachedTokens < 0 {
		// vLLM's num_cached_tokens counts local and external hits.
		q.cachedTokens = hitTokens + loadTokens
	}
	return n, true
}

// grow allocates blocks for n more tokens of a running sequence and caches
// the blocks they fill.
func (c *core) grow(q *seq, n int) bool {
	need := ceilDiv(q.computed+n, c.cfg.BlockSize) - len(q.blocks)
	if need > 0 {
		if !c.pool.canAllocate(need, nil) {
			return false
		}
		q.blocks = append(q.blocks, c.pool.take(need)...)
	}
	c.cacheFull(q, q.computed+n)
	return true
}

// cacheFull registers the blocks that are full once upto tokens have KV.
// Like vLLM it does so when the step is scheduled, counting the sampled
// token whose KV this step computes.
func (c *core) cacheFull(q *seq, upto int) {
	bs := c.cfg.BlockSize
	full := min(upto, len(q.tokens)) / bs
	if full <= q.cachedBlocks {
		return
	}
	q.hashes = c.h.chain(q.hashes, q.tokens[:full*bs], bs, q.keys)
	c.pool.store(q.blocks, q.hashes, q.tokens, q.cachedBlocks, full, q.keys, q.loraID)
	q.cachedBlocks = full
}

// victim picks whom to preempt so q can grow: the most recently scheduled
// running sequence not yet scheduled in this step, else q itself.
func (c *core) victim(q *seq) *seq {
	for i := len(c.running) - 1; i >= 0; i-- {
		if v := c.running[i]; v != q && v.stepNo != c.stepNo {
			return v
		}
	}
	return q
}

// preempt frees v's blocks and puts it back at the front of the queue; it
// will recompute its tokens (vLLM's recompute preemption).
func (c *core) preempt(v *seq) {
	c.release(v)
	v.state = waiting
	c.waiting = slices.Insert(c.waiting, 0, v)
	c.n.preemptions++
}

// release frees v's blocks and removes it from the running list.
func (c *core) release(v *seq) {
	c.pool.free(v.blocks)
	v.blocks, v.computed, v.cachedBlocks = nil, 0, 0
	if i := slices.Index(c.running, v); i >= 0 {
		c.running = slices.Delete(c.running, i, i+1)
	}
}

// complete applies a step's results: KV for the scheduled tokens now
// exists, and each sequence whose tokens are all computed samples one new
// token. Sequences aborted meanwhile are skipped.
func (c *core) complete(b *batch) []outcome {
	var out []outcome
	for _, q := range b.seqs {
		if q.state != running || q.stepNo != c.stepNo {
			continue
		}
		q.computed += q.newTokens
		if q.computed < len(q.tokens) {
			continue // a prefill chunk: no token yet
		}
		t := q.next()
		q.tokens = append(q.tokens, t)
		c.n.gen++
		if q.generated() == 1 {
			c.n.prompt += uint64(q.nPrompt)
		}
		o := outcome{q: q, token: t}
		if q.generated() >= q.maxTokens {
			o.done, o.reason = true, "length"
			c.release(q)
			q.state = finished
			c.n.finished++
		}
		out = append(out, o)
	}
	return out
}

// abort drops q wherever it is and frees its blocks.
func (c *core) abort(q *seq) {
	switch q.state {
	case running:
		c.release(q)
	case waiting:
		if i := slices.Index(c.waiting, q); i >= 0 {
			c.waiting = slices.Delete(c.waiting, i, i+1)
		}
	}
	q.state = finished
}

// takeEvents returns the KV events recorded since the last call.
func (c *core) takeEvents() []kvevent.Event { return c.pool.takeEvents() }

// stats fills the load and counter fields of Stats.
func (c *core) stats() Stats {
	return Stats{
		Running:               len(c.running),
		Waiting:               len(c.waiting),
		KVUsage:               float64(c.pool.used()) / float64(len(c.pool.blocks)),
		NumGPUBlocks:          len(c.pool.blocks),
		BlockSize:             c.cfg.BlockSize,
		PrefixQueriesTokens:   c.n.queries,
		PrefixHitsTokens:      c.n.hits,
		PromptTokensTotal:     c.n.prompt,
		GenerationTokensTotal: c.n.gen,
		RequestsFinishedTotal: c.n.finished,
		Preemptions:           c.n.preemptions,
		ExternalQueriesTokens: c.n.extQueries,
		ExternalHitsTokens:    c.n.extHits,
		CPUBlocks:             c.cpuBlocks(),
	}
}

// cpuBlocks is the tier's occupancy in blocks (0 without a tier).
func (c *core) cpuBlocks() int {
	if c.pool.tier == nil {
		return 0
	}
	return c.pool.tier.len()
}
