package vllmsim

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

// streamBuffer caps a stream's channel buffer. A consumer that falls
// behind does not block the step loop: its outputs are merged into one
// pending Output (tokens concatenated) and delivered when there is room.
const streamBuffer = 64

// drainPoll is how often an idle engine retries delivering final outputs
// to streams whose consumer has not made room yet.
const drainPoll = 5 * time.Millisecond

var errRunTwice = errors.New("engine: Run called twice")

type engineState uint8

const (
	stateNew engineState = iota
	stateRunning
	stateStopped
)

// Engine is the simulated vLLM engine core: scheduler + KV cache. Submit,
// Stats, Cached, ResetPrefixCache and Restart are safe for concurrent use;
// Run is the single step loop.
type Engine struct {
	cfg  Config
	tok  *Tokenizer
	clk  clock
	wake chan struct{} // capacity 1: "there may be work"

	mu    sync.Mutex
	c     *core
	state engineState
	// Simulated time: while idle it advances with real time × TimeScale
	// from the anchor (simA at realA); while busy it runs from step to
	// step and is clamped to the end of the current step.
	simA    time.Duration
	realA   time.Time
	busy    bool
	stepEnd time.Duration
	// draining holds finished sequences whose final Output is pending.
	draining []*seq
}

// stream is the engine side of a Stream.
type stream struct {
	ch      chan Output
	pending *Output
	closed  bool
	stop    func() bool // releases the context.AfterFunc
}

// New builds an engine; call Run to start stepping. A zero TimeScale
// means 1.
func New(cfg Config) (*Engine, error) { return newEngine(cfg, wallClock{}) }

func newEngine(cfg Config, clk clock) (*Engine, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	h, err := newHasher(cfg.HashAlgo, cfg.HashSeed, cfg.HashSeedSet)
	if err != nil {
		return nil, err
	}
	return &Engine{
		cfg:   cfg,
		tok:   NewTokenizerMemo(cfg.TokenizerMemoBytes).WithImageTokens(cfg.ImageTokens),
		clk:   clk,
		wake:  make(chan struct{}, 1),
		c:     newCore(cfg, h),
		realA: clk.now(),
	}, nil
}

// Tokenizer returns the engine's tokenizer.
func (e *Engine) Tokenizer() *Tokenizer { return e.tok }

func (e *Engine) wakeUp() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// simNow is the current simulated time. Callers hold e.mu.
func (e *Engine) simNow() time.Duration {
	s := e.simA + time.Duration(float64(e.clk.now().Sub(e.realA))*e.cfg.TimeScale)
	if s < e.simA {
		s = e.simA
	}
	if e.busy && s > e.stepEnd {
		s = e.stepEnd
	}
	return s
}

// Run steps the engine until ctx is done: each step schedules work,
// publishes its KV events through EventSink, waits the step's simulated
// duration (divided by TimeScale) and delivers outputs. With nothing to do
// it waits for Submit. Run is the only goroutine the engine needs and it
// exits when ctx is done, returning nil after aborting every request;
// Submit then fails with ErrStopped. Run may be called once.
func (e *Engine) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.state != stateNew {
		e.mu.Unlock()
		return errRunTwice
	}
	e.state = stateRunning
	e.mu.Unlock()
	defer e.shutdown()
	for {
		e.mu.Lock()
		b := e.c.schedule()
		events := e.c.takeEvents()
		var realStart time.Time
		switch {
		case b != nil:
			start := e.stepEnd // back to back with the previous step
			if !e.busy {
				start = e.simNow()
			}
			realStart = e.clk.now()
			e.simA, e.realA, e.busy, e.stepEnd = start, realStart, true, start+b.dur
		case e.busy:
			e.simA, e.realA, e.busy = e.stepEnd, e.clk.now(), false
		}
		e.flushDraining()
		drain := len(e.draining) > 0
		e.mu.Unlock()

		e.emit(events)
		if b == nil {
			if err := e.idle(ctx, drain); err != nil {
				return nil
			}
			continue
		}
		wait := realStart.Add(time.Duration(float64(b.dur) / e.cfg.TimeScale)).Sub(e.clk.now())
		err := e.clk.sleep(ctx, wait)
		e.mu.Lock()
		e.deliver(e.c.complete(b), e.stepEnd)
		e.mu.Unlock()
		if err != nil {
			return nil
		}
	}
}

func (e *Engine) idle(ctx context.Context, drain bool) error {
	var retry <-chan time.Time
	if drain {
		t := time.NewTimer(drainPoll)
		defer t.Stop()
		retry = t.C
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-e.wake:
	case <-retry:
	}
	return nil
}

func (e *Engine) emit(events []kvevent.Event) {
	if len(events) == 0 || e.cfg.EventSink == nil {
		return
	}
	e.cfg.EventSink(float64(e.clk.now().UnixNano())/1e9, events)
}

// shutdown stops the engine when Run returns.
func (e *Engine) shutdown() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.state = stateStopped
	e.abortAll()
	for _, q := range e.draining {
		e.closeStream(q.out)
	}
	e.draining = nil
}

// abortAll ends every queued and running request with "abort".
func (e *Engine) abortAll() {
	for _, q := range slices.Concat(e.c.running, e.c.waiting) {
		e.c.abort(q)
		e.send(q, e.output(q, nil, true, "abort"))
	}
}

// Submit queues a request. Cancelling ctx aborts it and frees its blocks.
// Generated text is a pseudo-random function of the prompt (and LoRA and
// images), so the same prompt always yields the same answer, as greedy
// decoding would. Placements in r.MM must be sorted, disjoint, inside the
// prompt and named (ErrInvalid otherwise).
func (e *Engine) Submit(ctx context.Context, r Request) (*Stream, error) {
	n := len(r.PromptTokens)
	switch {
	case n == 0 || r.MaxTokens < 1:
		return nil, ErrInvalid
	case r.MaxTokens > e.cfg.MaxModelLen-n: // no overflow for huge MaxTokens
		return nil, ErrTooLong
	// The last sampled token never needs a slot; anything more than the
	// whole cache could never run, even alone.
	case ceilDiv(n+r.MaxTokens-1, e.cfg.BlockSize) > e.cfg.NumGPUBlocks:
		return nil, ErrTooLong
	}
	if !validMM(r.MM, n) {
		return nil, ErrInvalid
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q := &seq{
		id:        r.ID,
		tokens:    slices.Clone(r.PromptTokens),
		nPrompt:   n,
		maxTokens: r.MaxTokens,
		keys:      blockKeys{lora: r.LoRA, salt: r.CacheSalt, mm: slices.Clone(r.MM)},
		loraID:    r.LoRAID,
		next:      e.tok.generator(promptSeed(r)),
		out:       &stream{ch: make(chan Output, min(r.MaxTokens+2, streamBuffer))},
	}
	e.mu.Lock()
	if e.state == stateStopped {
		e.mu.Unlock()
		return nil, ErrStopped
	}
	q.arrival = e.simNow()
	e.c.add(q)
	// AfterFunc runs its function in a new goroutine, so registering it
	// under the lock cannot deadlock.
	q.out.stop = context.AfterFunc(ctx, func() { e.cancel(q) })
	e.mu.Unlock()
	e.wakeUp()
	return &Stream{C: q.out.ch}, nil
}

func promptSeed(r Request) uint64 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range r.PromptTokens {
		binary.LittleEndian.PutUint32(b[:], t)
		h.Write(b[:])
	}
	h.Write([]byte(r.LoRA))
	// Another image is another prompt to a model; a text-only request
	// keeps the seed it always had.
	for _, m := range r.MM {
		h.Write([]byte{0})
		h.Write([]byte(m.ID))
	}
	return h.Sum64()
}

// validMM reports whether placements are what vLLM's processor yields for
// a prompt of n tokens: non-empty ranges inside it, each with an
// identifier, sorted by offset and disjoint (generate_block_hash_extra_keys
// relies on that order).
func validMM(mm []MMPlacement, n int) bool {
	end := 0
	for _, m := range mm {
		if m.ID == "" || m.Length < 1 || m.Offset < end || m.Offset > n-m.Length {
			return false
		}
		end = m.Offset + m.Length
	}
	return true
}

// cancel aborts q after its context ended.
func (e *Engine) cancel(q *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if q.state != finished {
		e.c.abort(q)
		e.send(q, e.output(q, nil, true, "abort"))
		e.wakeUp() // freed blocks may admit a waiting request
		return
	}
	// Finished, but the consumer left before taking the final output.
	if i := slices.Index(e.draining, q); i >= 0 {
		e.draining = slices.Delete(e.draining, i, i+1)
		e.closeStream(q.out)
	}
}

// output builds q's Output for one step. Callers hold e.mu.
func (e *Engine) output(q *seq, tokens []uint32, done bool, reason string) Output {
	o := Output{
		Tokens:       tokens,
		Done:         done,
		FinishReason: reason,
		Usage:        Usage{PromptTokens: q.nPrompt, CompletionTokens: q.generated(), CachedTokens: max(q.cachedTokens, 0)},
		ArrivalSim:   q.arrival.Seconds(),
		NowSim:       e.simNow().Seconds(),
	}
	if q.generated() > 0 {
		o.FirstTokenSim = q.firstToken.Seconds()
	}
	return o
}

// deliver turns a step's outcomes into outputs stamped with the step's end.
func (e *Engine) deliver(outs []outcome, end time.Duration) {
	for _, x := range outs {
		if x.q.generated() == 1 {
			x.q.firstToken = end
		}
		o := e.output(x.q, []uint32{x.token}, x.done, x.reason)
		o.NowSim = end.Seconds()
		e.send(x.q, o)
	}
}

// send delivers o without blocking, merging it into the pending output
// when the consumer is behind. Callers hold e.mu.
func (e *Engine) send(q *seq, o Output) {
	s := q.out
	if s.closed {
		return
	}
	if p := s.pending; p != nil {
		o.Tokens = append(p.Tokens, o.Tokens...)
		s.pending = nil
	}
	select {
	case s.ch <- o:
		if o.Done {
			e.closeStream(s)
		}
	default:
		s.pending = &o
		if o.Done {
			e.draining = append(e.draining, q)
		}
	}
}

// flushDraining retries the final outputs of finished sequences.
func (e *Engine) flushDraining() {
	keep := e.draining[:0]
	for _, q := range e.draining {
		o := *q.out.pending
		q.out.pending = nil
		select {
		case q.out.ch <- o:
			e.closeStream(q.out)
		default:
			q.out.pending = &o
			keep = append(keep, q)
		}
	}
	clear(e.draining[len(keep):])
	e.draining = keep
}

func (e *Engine) closeStream(s *stream) {
	if s.closed {
		return
	}
	s.closed, s.pending = true, nil
	close(s.ch)
	if s.stop != nil {
		s.stop()
	}
}

// Stats returns current load and counters. Counters restart from zero on
// Restart, as a restarted vLLM's do.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.stats()
}

// Cached returns every cached block (ground truth), sorted by hash.
func (e *Engine) Cached() []CachedBlock {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.c.pool.snapshot()
}

// ResetPrefixCache clears the prefix cache as vLLM's reset_prefix_cache
// does: it fails (false) while any request holds blocks; on success it emits
// AllBlocksCleared (published by the step loop, like every event).
func (e *Engine) ResetPrefixCache() bool {
	e.mu.Lock()
	ok := e.c.pool.clear()
	e.mu.Unlock()
	if ok {
		e.wakeUp()
	}
	return ok
}

// Restart simulates a vLLM process restart: running and waiting requests are
// aborted, the cache is emptied without any event, and the hash seed is
// redrawn unless HashSeedSet. Unpublished events and counters are lost too.
func (e *Engine) Restart() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.abortAll()
	h := e.c.h
	if !e.cfg.HashSeedSet {
		// crypto/rand does not fail on supported platforms; keep the old
		// seed if it ever does.
		if nh, err := newHasher(e.cfg.HashAlgo, "", false); err == nil {
			h = nh
		}
	}
	e.c = newCore(e.cfg, h)
}
