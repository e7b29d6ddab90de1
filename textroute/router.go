// Package textroute is the sidecar's text-prefix router: it gives the
// front the routing keys of a chat prompt from the textprefix store when
// the prompt's leading messages were seen before, and otherwise tokenizes
// it on the request path as before. After each request it tokenizes, off
// the request path and one call at a time, the prefixes later requests
// will look for, and checks every guess against them.
package textroute

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
)

// Tokenizer is the local vLLM's /tokenize as the router needs it.
type Tokenizer interface {
	Tokenize(ctx context.Context, p prompt.Prompt) ([]uint32, error)
}

// Config of a Router; zero fields take DefaultConfig's values.
type Config struct {
	// Model is the base model's name; it goes into every prefix hash.
	Model  string
	Scheme blockkey.Scheme
	// MaxKeys bounds the store (8 bytes each plus ~100 per entry).
	// Default 1<<20: 8 MiB, a 32k-token prefix per ~2000 conversations.
	MaxKeys int
	// Queue and QueueBytes bound the learning backlog in prefixes and in
	// the request bytes they keep alive; past either a prefix is not
	// learned (a later request pays a tokenization instead). Default 256
	// and 64 MiB.
	Queue      int
	QueueBytes int64
	// TokenizeTimeout bounds each /tokenize call. Default 2 s.
	TokenizeTimeout time.Duration
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{Scheme: blockkey.DefaultScheme(), MaxKeys: 1 << 20, Queue: 256, QueueBytes: 64 << 20, TokenizeTimeout: 2 * time.Second}
}

// Router implements the front's TextPrefixes (forward). Run must be
// running for it to learn; without it every chat prompt is tokenized on the
// request path.
type Router struct {
	cfg    Config
	tok    Tokenizer
	now    func() time.Time // injected for tests; time.Now
	jobs   chan job
	queued atomic.Int64 // bytes of the queued jobs' messages
	m      metrics

	// tag goes first in every hash: entries shared between sidecars
	// match only under the same key scheme and base model.
	tag   []byte
	share atomic.Pointer[func(textprefix.Hash, textprefix.Entry)]

	mu       sync.Mutex
	store    *textprefix.Store
	learning map[textprefix.Hash]bool
}

// job is one prefix to learn, with what it is checked against.
type job struct {
	p      prompt.Prompt
	keysOf func([]uint32) []blockkey.Key
	msgs   []textprefix.Message
	hashes []textprefix.Hash
	k      int
	// used is the entry the request was routed on (usedK > 0), full the
	// keys of the whole prompt when it was tokenized (full != nil).
	usedK int
	used  textprefix.Entry
	full  *textprefix.Entry
}

// New returns a Router that tokenizes through tok; reg may be nil.
func New(cfg Config, tok Tokenizer, reg prometheus.Registerer) *Router {
	d := DefaultConfig()
	if cfg.Scheme.BlockSize == 0 {
		cfg.Scheme = d.Scheme
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = d.MaxKeys
	}
	if cfg.Queue <= 0 {
		cfg.Queue = d.Queue
	}
	if cfg.QueueBytes <= 0 {
		cfg.QueueBytes = d.QueueBytes
	}
	if cfg.TokenizeTimeout <= 0 {
		cfg.TokenizeTimeout = d.TokenizeTimeout
	}
	r := &Router{cfg: cfg, tok: tok, now: time.Now, jobs: make(chan job, cfg.Queue), m: newMetrics(reg),
		store: textprefix.NewStore(cfg.MaxKeys), learning: map[textprefix.Hash]bool{},
		tag: fmt.Appendf(nil, "%d/%d/%d/%d:%s", blockkey.Version, cfg.Scheme.BlockSize, cfg.Scheme.Stride, len(cfg.Model), cfg.Model)}
	return r
}

// SetShare makes every prefix this router learns go to f as well (the
// mesh, so that the sidecar a conversation's next turn enters has it).
// f must not block.
func (r *Router) SetShare(f func(textprefix.Hash, textprefix.Entry)) { r.share.Store(&f) }

// Accept stores a prefix another sidecar learned, unless one is held:
// like any entry, it is checked when a request routed on it is learned.
func (r *Router) Accept(h textprefix.Hash, e textprefix.Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.store.Has(h) {
		return
	}
	r.store.Put(h, e)
	r.m.learned.WithLabelValues("shared").Inc()
	r.m.entries.Set(float64(r.store.Len()))
}

// context is the bytes every prefix hash of p starts from.
func (r *Router) context(p prompt.Prompt) []byte {
	return append(slices.Clip(r.tag), renderContext(p)...)
}

// Run learns queued prefixes, one /tokenize call at a time (vLLM
// tokenizes on one thread: more would only queue there, in front of the
// requests it serves), until ctx is done.
func (r *Router) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-r.jobs:
			r.learn(ctx, j)
		}
	}
}

// Keys implements the front's TextPrefixes (forward).
func (r *Router) Keys(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, keysOf func([]uint32) []blockkey.Key) ([]blockkey.Key, int, func()) {
	hs := textprefix.Chain(r.context(p), msgs)
	r.mu.Lock()
	plan := r.store.Plan(hs, msgs, p.ContinueFinalMessage != nil && *p.ContinueFinalMessage)
	r.mu.Unlock()
	if plan.Use {
		r.m.requests.WithLabelValues("prefix").Inc()
		return plan.Entry.Keys, plan.Tokens, func() {
			r.enqueue(plan.Learn, job{p: p, keysOf: keysOf, msgs: msgs, hashes: hs, usedK: plan.K, used: plan.Entry})
		}
	}
	ids, err := r.tokenize(ctx, p, "request")
	if err != nil || len(ids) == 0 {
		r.m.requests.WithLabelValues("untokenized").Inc()
		return nil, 0, func() {}
	}
	r.m.requests.WithLabelValues("tokenized").Inc()
	full := &textprefix.Entry{Keys: keysOf(ids), Tokens: len(ids)}
	return full.Keys, len(ids), func() {
		r.enqueue(plan.Learn, job{p: p, keysOf: keysOf, msgs: msgs, hashes: hs, full: full})
	}
}

// tokenize calls /tokenize with the configured timeout and times it.
func (r *Router) tokenize(ctx context.Context, p prompt.Prompt, path string) ([]uint32, error) {
	tctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	t0 := r.now()
	ids, err := r.tok.Tokenize(tctx, p)
	r.m.seconds.WithLabelValues(path).Observe(r.now().Sub(t0).Seconds())
	return ids, err
}

// enqueue queues the prefixes ks of j that are not being learned already.
// It never blocks: a full queue drops them.
func (r *Router) enqueue(ks []int, j job) {
	for _, k := range ks {
		h := j.hashes[k-1]
		r.mu.Lock()
		busy := r.learning[h]
		if !busy {
			r.learning[h] = true
		}
		r.mu.Unlock()
		if busy {
			continue
		}
		j.k = k
		n := int64(len(j.p.Messages))
		if r.queued.Add(n) > r.cfg.QueueBytes {
			r.queued.Add(-n)
			r.m.learned.WithLabelValues("dropped").Inc()
			r.done(h)
			continue
		}
		select {
		case r.jobs <- j:
		default:
			r.queued.Add(-n)
			r.m.learned.WithLabelValues("dropped").Inc()
			r.done(h)
		}
	}
}

func (r *Router) done(h textprefix.Hash) {
	r.mu.Lock()
	delete(r.learning, h)
	r.mu.Unlock()
}

// learn tokenizes j's first k messages as the engine renders them inside
// a longer conversation (no generation prompt), checks the guesses it can
// and stores the entry.
func (r *Router) learn(ctx context.Context, j job) {
	h := j.hashes[j.k-1]
	defer r.done(h)
	defer r.queued.Add(-int64(len(j.p.Messages)))
	q := j.p
	q.Messages = joinMessages(j.msgs[:j.k])
	no := false
	q.AddGenerationPrompt, q.ContinueFinalMessage = &no, nil
	ids, err := r.tokenize(ctx, q, "learn")
	if err != nil || len(ids) == 0 {
		r.m.learned.WithLabelValues("failed").Inc()
		return
	}
	bytes := 0
	for _, m := range j.msgs[:j.k] {
		bytes += len(m.Raw)
	}
	e := textprefix.Entry{Keys: j.keysOf(ids), Tokens: len(ids), Bytes: bytes}
	r.mu.Lock()
	defer r.mu.Unlock()
	if j.usedK > 0 && j.usedK <= j.k {
		r.check(r.store.Check(j.hashes[j.usedK-1], j.used, e))
	}
	if j.full != nil {
		// The whole prompt's tokens are at hand: store the entry only if
		// it is a prefix of them, as routing on it will assume.
		if !r.check(r.store.Check(h, e, *j.full)) {
			return
		}
	}
	r.store.Put(h, e)
	r.m.learned.WithLabelValues("stored").Inc()
	r.m.entries.Set(float64(r.store.Len()))
	if f := r.share.Load(); f != nil {
		(*f)(h, e)
	}
}

func (r *Router) check(ok bool) bool {
	if ok {
		r.m.checks.WithLabelValues("right").Inc()
	} else {
		r.m.checks.WithLabelValues("wrong").Inc()
	}
	return ok
}

// renderContext is everything besides the messages that changes a
// prefix's tokens or keys. The generation-prompt flags only change the
// end of the whole prompt, never a prefix's tokens.
func renderContext(p prompt.Prompt) []byte {
	var b bytes.Buffer
	field := func(v []byte) {
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.Write(v)
	}
	field([]byte(p.Model))
	field([]byte(p.CacheSalt))
	field(p.Tools)
	field(p.ChatTemplateKwargs)
	switch {
	case p.AddSpecialTokens == nil:
		b.WriteByte('-')
	case *p.AddSpecialTokens:
		b.WriteByte('t')
	default:
		b.WriteByte('f')
	}
	return b.Bytes()
}

func joinMessages(msgs []textprefix.Message) []byte {
	n := 2
	for _, m := range msgs {
		n += len(m.Raw) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, '[')
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m.Raw...)
	}
	return append(b, ']')
}

type metrics struct {
	requests, learned, checks *prometheus.CounterVec
	seconds                   *prometheus.HistogramVec
	entries                   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "requests_total",
			Help: "Chat requests by how their keys were found: prefix (a learned entry, no tokenization on the request path), tokenized (the whole prompt, on the request path), untokenized (tokenize failed: routed by load).",
		}, []string{"path"}),
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "learned_total",
			Help: "Conversation prefixes learned: stored (tokenized here after a request), shared (from a peer), failed (tokenize error) or dropped (learning backlog full).",
		}, []string{"result"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "checks_total",
			Help: "Guesses checked against a later tokenization: right, or wrong (the prefix's keys were not a prefix of the conversation's; the entry was dropped).",
		}, []string{"result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "tokenize_duration_seconds",
			Help:    "Latency of the router's /tokenize calls: on the request path (request) or after it (learn).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, NativeHistogramBucketFactor: 1.1,
		}, []string{"path"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "entries",
			Help: "Conversation prefixes held.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.learned, m.checks, m.seconds, m.entries)
	}
	return m
}
