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

	"github.com/cespare/xxhash/v2"
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
	// suffix is, per rendering context, how many tokens the generation
	// prompt adds at the end of a whole prompt: an answer's prompt ids less
	// these are the conversation's own tokens. Learned by one tokenization
	// per context (and forgotten past maxSuffixes contexts).
	suffix map[uint64]int
}

const maxSuffixes = 4096

// job is what one served request teaches: the prefixes ks to learn, and
// the guess it was routed on, if any, to check.
type job struct {
	p      prompt.Prompt
	keysOf func([]uint32) []blockkey.Key
	msgs   []textprefix.Message
	hashes []textprefix.Hash
	ks     []int // claimed in Router.learning
	// used is the entry the request was routed on (usedK > 0). The truth
	// is the whole prompt: ids are its token ids when the answer carried
	// them; full its keys when it was tokenized on the request path.
	usedK int
	used  textprefix.Entry
	full  *textprefix.Entry
	ids   []uint32
}

// size is what j keeps alive, for the backlog bound.
func (j job) size() int64 { return int64(len(j.p.Messages) + 4*len(j.ids)) }

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
		store: textprefix.NewStore(cfg.MaxKeys), learning: map[textprefix.Hash]bool{}, suffix: map[uint64]int{},
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
func (r *Router) Keys(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, keysOf func([]uint32) []blockkey.Key) ([]blockkey.Key, int, func([]uint32)) {
	hs := textprefix.Chain(r.context(p), msgs)
	r.mu.Lock()
	plan := r.store.Plan(hs, msgs, continued(p))
	r.mu.Unlock()
	j := job{p: p, keysOf: keysOf, msgs: msgs, hashes: hs}
	after := func(ids []uint32) { // j as the branch below leaves it
		j.ids = ids
		r.enqueue(plan.Learn, j)
	}
	if plan.Use {
		r.m.requests.WithLabelValues("prefix").Inc()
		j.usedK, j.used = plan.K, plan.Entry
		return plan.Entry.Keys, plan.Tokens, after
	}
	ids, err := r.tokenize(ctx, p, "request")
	if err != nil || len(ids) == 0 {
		r.m.requests.WithLabelValues("untokenized").Inc()
		return nil, 0, after
	}
	r.m.requests.WithLabelValues("tokenized").Inc()
	j.full = &textprefix.Entry{Keys: keysOf(ids), Tokens: len(ids)}
	return j.full.Keys, len(ids), after
}

func continued(p prompt.Prompt) bool {
	return p.ContinueFinalMessage != nil && *p.ContinueFinalMessage
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

// enqueue queues j with the prefixes of ks that are not being learned
// already; a job with nothing to learn is still queued when it has a guess
// to check. It never blocks: a full backlog drops the job.
func (r *Router) enqueue(ks []int, j job) {
	r.mu.Lock()
	for _, k := range ks {
		if h := j.hashes[k-1]; !r.learning[h] {
			r.learning[h] = true
			j.ks = append(j.ks, k)
		}
	}
	r.mu.Unlock()
	if len(j.ks) == 0 && (j.usedK == 0 || j.ids == nil) {
		return
	}
	n := j.size()
	if r.queued.Add(n) <= r.cfg.QueueBytes {
		select {
		case r.jobs <- j:
			return
		default:
		}
	}
	r.queued.Add(-n)
	r.m.learned.WithLabelValues("dropped").Add(float64(len(j.ks)))
	r.release(j)
}

func (r *Router) release(j job) {
	r.mu.Lock()
	for _, k := range j.ks {
		delete(r.learning, j.hashes[k-1])
	}
	r.mu.Unlock()
}

// learn checks j's guess against the truth, when the truth is known, and
// learns j's prefixes: the whole conversation from the answer's token ids
// when it carried them, the rest by tokenizing it as the engine renders it
// inside a longer conversation (no generation prompt). An entry is stored
// only if it is a prefix of the truth, as routing on it will assume.
func (r *Router) learn(ctx context.Context, j job) {
	defer r.release(j)
	defer r.queued.Add(-j.size())
	truth := j.full
	if j.ids != nil {
		truth = &textprefix.Entry{Keys: j.keysOf(j.ids), Tokens: len(j.ids)}
	}
	if j.usedK > 0 && truth != nil {
		r.mu.Lock()
		r.guess(r.check(r.store.Check(j.hashes[j.usedK-1], j.used, *truth)))
		r.mu.Unlock()
	}
	for _, k := range j.ks {
		h := j.hashes[k-1]
		e, how, ok := r.prefix(ctx, j, k)
		if !ok {
			r.m.learned.WithLabelValues("failed").Inc()
			continue
		}
		r.mu.Lock()
		if truth == nil && j.usedK > 0 && j.usedK <= k {
			r.guess(r.check(r.store.Check(j.hashes[j.usedK-1], j.used, e)))
		}
		if truth != nil && !r.check(r.store.Check(h, e, *truth)) {
			r.mu.Unlock()
			continue
		}
		r.store.Put(h, e)
		r.m.learned.WithLabelValues(how).Inc()
		r.m.entries.Set(float64(r.store.Len()))
		r.mu.Unlock()
		if f := r.share.Load(); f != nil {
			(*f)(h, e)
		}
	}
}

// prefix is the entry of j's first k messages, and how it was learned:
// "answer" (from the answer's token ids, no tokenization) or "stored" (a
// /tokenize call).
func (r *Router) prefix(ctx context.Context, j job, k int) (textprefix.Entry, string, bool) {
	bytes := 0
	for _, m := range j.msgs[:k] {
		bytes += len(m.Raw)
	}
	entry := func(ids []uint32) textprefix.Entry {
		return textprefix.Entry{Keys: j.keysOf(ids), Tokens: len(ids), Bytes: bytes}
	}
	whole := k == len(j.msgs) && j.ids != nil && !continued(j.p)
	var ch uint64
	if whole {
		if ag := j.p.AddGenerationPrompt; ag != nil && !*ag {
			return entry(j.ids), "answer", true
		}
		ch = xxhash.Sum64(r.context(j.p))
		r.mu.Lock()
		g, ok := r.suffix[ch]
		r.mu.Unlock()
		if ok && g <= len(j.ids) {
			return entry(j.ids[:len(j.ids)-g]), "answer", true
		}
	}
	q := j.p
	q.Messages = joinMessages(j.msgs[:k])
	no := false
	q.AddGenerationPrompt, q.ContinueFinalMessage = &no, nil
	ids, err := r.tokenize(ctx, q, "learn")
	if err != nil || len(ids) == 0 {
		return textprefix.Entry{}, "", false
	}
	if whole && len(ids) <= len(j.ids) && slices.Equal(ids, j.ids[:len(ids)]) {
		r.mu.Lock()
		if len(r.suffix) >= maxSuffixes {
			clear(r.suffix)
		}
		r.suffix[ch] = len(j.ids) - len(ids)
		r.mu.Unlock()
	}
	return entry(ids), "stored", true
}

// guess counts the check of a request's routing guess.
func (r *Router) guess(ok bool) {
	if ok {
		r.m.guesses.WithLabelValues("right").Inc()
	} else {
		r.m.guesses.WithLabelValues("wrong").Inc()
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
	requests, learned, checks, guesses *prometheus.CounterVec
	seconds                            *prometheus.HistogramVec
	entries                            prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "requests_total",
			Help: "Chat requests by how their keys were found: prefix (a learned entry, no tokenization on the request path), tokenized (the whole prompt, on the request path), untokenized (tokenize failed: routed by load).",
		}, []string{"path"}),
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "learned_total",
			Help: "Conversation prefixes learned: answer (from the prompt token ids of the engine's answer), stored (tokenized here after a request), shared (from a peer), failed (tokenize error) or dropped (learning backlog full).",
		}, []string{"result"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "checks_total",
			Help: "Entries checked against a longer prefix's tokens (a request's own, or a later tokenization): right, or wrong (the entry's keys were not a prefix of them; it was dropped). Counts guesses and new entries.",
		}, []string{"result"}),
		guesses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "guesses_total",
			Help: "Requests routed on an entry whose guess was checked against the request's own tokens: right, or wrong (the request was routed on keys it does not have).",
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
		reg.MustRegister(m.requests, m.learned, m.checks, m.guesses, m.seconds, m.entries)
	}
	return m
}
