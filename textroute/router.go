// Package textroute is the sidecar's text-prefix router: it gives the
// front the routing keys of a chat prompt from the textprefix store when
// the prompt's leading messages were seen before, and otherwise tokenizes
// it on the request path as before. After each request it learns, off the
// request path and one /tokenize call at a time, the prefixes later
// requests will look for: from the prompt's own token ids when it has
// them, else by composing (a known shorter prefix continued with the new
// messages' tokens, tokenized alone behind a stand-in turn), else by
// tokenizing the prefix whole. Compositions are checked against a whole
// tokenization now and then (Config.VerifyEvery), guesses whenever a whole
// tokenization of the request is at hand.
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
	// MaxKeys bounds the store's memory in units of a key (8 bytes): an
	// entry costs its keys, its tail and ~200 bytes of its own
	// (textprefix.Store).
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
	// WholeOnly learns every prefix by tokenizing it whole. By default a
	// prefix that extends a known one is composed: the known entry's
	// chain continued with the new messages' tokens, which are had by
	// tokenizing them alone behind a short stand-in (a few hundred tokens
	// instead of the whole conversation).
	WholeOnly bool
	// VerifyEvery: every VerifyEvery-th composed prefix of a rendering
	// context, and its first verifyFirst, is also tokenized whole and
	// compared; a context whose compositions were wrong more than one time
	// in 20 composes no more, and is not routed on its composed entries.
	// Default 16.
	VerifyEvery int
}

// DefaultConfig returns the defaults described on Config.
func DefaultConfig() Config {
	return Config{Scheme: blockkey.DefaultScheme(), MaxKeys: 1 << 20, Queue: 256, QueueBytes: 64 << 20,
		TokenizeTimeout: 2 * time.Second, VerifyEvery: 16}
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
	// renders is what was learned about each rendering context's
	// template (forgotten past maxRenders contexts).
	renders map[uint64]*rendering
}

const maxRenders = 4096

// rendering is what one rendering context's template was seen to do.
type rendering struct {
	// gen is how many tokens the generation prompt adds at the end of a
	// whole prompt (-1: not known yet): an answer's prompt ids less these
	// are the conversation's own tokens.
	gen int
	// leads are the tokens of each stand-in (leads) rendered alone.
	leads map[string][]uint32
	// composed counts prefixes composed; checks and wrong the ones
	// compared with a whole tokenization.
	composed, checks, wrong int
}

// verifyFirst is how many of a context's first compositions are checked
// whatever VerifyEvery says.
const verifyFirst = 4

// trusted reports whether the context's compositions have been right
// often enough to compose and to route on what was composed.
func (c *rendering) trusted() bool { return c.wrong*20 <= c.checks }

// leads stand in for the known prefix when a longer prefix's new messages
// are tokenized alone, by the role of the prefix's last message: short
// fixed turns ending in that role, so that a template that checks the
// order of roles sees the order the whole conversation has. A prefix
// ending in another role (tool) is tokenized whole.
var leads = map[string]string{
	"system":    `{"role":"system","content":"kvroute"}`,
	"user":      `{"role":"user","content":"kvroute"}`,
	"assistant": `{"role":"user","content":"kvroute"},{"role":"assistant","content":"kvroute"}`,
}

// job is what one served request teaches: the prefixes ks to learn, and
// the guess it was routed on, if any, to check.
type job struct {
	p      prompt.Prompt
	root   blockkey.Key
	render uint64 // the rendering context's hash
	msgs   []textprefix.Message
	hashes []textprefix.Hash
	ks     []int // claimed in Router.learning
	// used is the entry the request was routed on (usedK > 0).
	usedK int
	used  textprefix.Entry
	// ids are the whole prompt's token ids when known, from the answer
	// (idsFrom "answer") or the request path's tokenization ("request").
	ids     []uint32
	idsFrom string
	// keys are Request's keys of ids when the request path computed them.
	keys []blockkey.Key
}

// size is what j keeps alive, for the backlog bound.
func (j job) size() int64 { return int64(len(j.p.Messages) + 4*len(j.ids) + 8*len(j.keys)) }

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
	if cfg.VerifyEvery <= 0 {
		cfg.VerifyEvery = d.VerifyEvery
	}
	r := &Router{cfg: cfg, tok: tok, now: time.Now, jobs: make(chan job, cfg.Queue), m: newMetrics(reg),
		store: textprefix.NewStore(cfg.MaxKeys), learning: map[textprefix.Hash]bool{}, renders: map[uint64]*rendering{},
		tag: fmt.Appendf(nil, "%d/%d/%d/%d:%s", blockkey.Version, cfg.Scheme.BlockSize, cfg.Scheme.Stride, len(cfg.Model), cfg.Model)}
	return r
}

// SetShare makes every prefix this router learns go to f as well (the
// mesh, so that the sidecar a conversation's next turn enters has it).
// f must not block.
func (r *Router) SetShare(f func(textprefix.Hash, textprefix.Entry)) { r.share.Store(&f) }

// Accept stores a prefix another sidecar learned, unless one is held:
// like any entry, it is checked when a request routed on it is learned. A
// chain cursor that does not fit the scheme is dropped (the entry still
// routes; it cannot be composed on).
func (r *Router) Accept(h textprefix.Hash, e textprefix.Entry) {
	if e.Chained && (len(e.Tail) != e.Tokens%max(r.cfg.Scheme.BlockSize, 1)) {
		e.Chained, e.Last, e.Tail = false, 0, nil
	}
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

// rendering returns c's state, made on first use. r.mu must be held.
func (r *Router) rendering(c uint64) *rendering {
	if rc, ok := r.renders[c]; ok {
		return rc
	}
	if len(r.renders) >= maxRenders {
		clear(r.renders)
	}
	rc := &rendering{gen: -1, leads: map[string][]uint32{}}
	r.renders[c] = rc
	return rc
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

// Keys implements the front's TextPrefixes (forward): root is the chain
// root of p's model.
func (r *Router) Keys(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, root blockkey.Key) ([]blockkey.Key, int, func([]uint32)) {
	c := r.context(p)
	hs := textprefix.Chain(c, msgs)
	j := job{p: p, root: root, render: xxhash.Sum64(c), msgs: msgs, hashes: hs}
	r.mu.Lock()
	plan := r.store.Plan(hs, msgs, continued(p))
	if plan.Use && plan.Entry.Composed && !r.rendering(j.render).trusted() {
		plan.Use = false // composed under a template since seen not to compose
	}
	r.mu.Unlock()
	after := func(ids []uint32) { // j as the branch below leaves it
		if ids != nil {
			j.ids, j.idsFrom, j.keys = ids, "answer", nil
		}
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
	j.ids, j.idsFrom, j.keys = ids, "request", r.cfg.Scheme.Request(root, ids)
	return j.keys, len(ids), after
}

func continued(p prompt.Prompt) bool {
	return p.ContinueFinalMessage != nil && *p.ContinueFinalMessage
}

// tokenize calls /tokenize with the configured timeout, and times and
// counts it.
func (r *Router) tokenize(ctx context.Context, p prompt.Prompt, path string) ([]uint32, error) {
	tctx, cancel := context.WithTimeout(ctx, r.cfg.TokenizeTimeout)
	defer cancel()
	t0 := r.now()
	ids, err := r.tok.Tokenize(tctx, p)
	r.m.seconds.WithLabelValues(path).Observe(r.now().Sub(t0).Seconds())
	r.m.tokens.WithLabelValues(path).Add(float64(len(ids)))
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

// learn checks j's guess against the truth, when it is known, and learns
// j's prefixes (see prefix). An entry is stored only if it is a prefix of
// the truth, as routing on it will assume.
func (r *Router) learn(ctx context.Context, j job) {
	defer r.release(j)
	defer r.queued.Add(-j.size())
	var truth *textprefix.Entry // the whole prompt's, generation prompt included
	if j.ids != nil {
		keys := j.keys
		if keys == nil {
			keys = r.cfg.Scheme.Request(j.root, j.ids)
		}
		truth = &textprefix.Entry{Keys: keys, Tokens: len(j.ids)}
	}
	if j.usedK > 0 && truth != nil {
		r.mu.Lock()
		r.guess(r.check(r.store.Check(j.hashes[j.usedK-1], j.used, *truth)))
		r.mu.Unlock()
	}
	for _, k := range j.ks {
		h := j.hashes[k-1]
		e, how, whole, ok := r.prefix(ctx, j, k)
		if !ok {
			r.m.learned.WithLabelValues("failed").Inc()
			continue
		}
		r.mu.Lock()
		if truth == nil && j.usedK > 0 && j.usedK <= k {
			if whole {
				r.guess(r.check(r.store.Check(j.hashes[j.usedK-1], j.used, e)))
			} else {
				r.m.guesses.WithLabelValues("unchecked").Inc()
			}
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

// prefix is the entry of j's first k messages, how it was learned, and
// whether from a whole tokenization (so that it can check a guess). In
// order of cost: the whole conversation from the prompt's own token ids
// ("answer" or "request"), less the generation prompt; composed from the
// longest known shorter prefix ("composed"); a /tokenize call of the
// prefix rendered as inside a longer conversation, without generation
// prompt ("stored").
func (r *Router) prefix(ctx context.Context, j job, k int) (textprefix.Entry, string, bool, bool) {
	bytes := 0
	for _, m := range j.msgs[:k] {
		bytes += len(m.Raw)
	}
	entry := func(ids []uint32) textprefix.Entry {
		return textprefix.NewEntry(r.cfg.Scheme.Prefix(j.root, ids), bytes)
	}
	r.mu.Lock()
	rc := r.rendering(j.render)
	gen, trusted := rc.gen, rc.trusted()
	base, be := r.base(j, k)
	r.mu.Unlock()
	whole := k == len(j.msgs) && j.ids != nil && !continued(j.p)
	if ag := j.p.AddGenerationPrompt; whole && ag != nil && !*ag {
		gen = 0
	}
	if whole && gen >= 0 && gen <= len(j.ids) {
		return entry(j.ids[:len(j.ids)-gen]), j.idsFrom, true, true
	}
	if base > 0 && trusted && !r.cfg.WholeOnly && !whole {
		if e, ok := r.compose(ctx, j, rc, base, be, k, bytes); ok {
			r.mu.Lock()
			verify := rc.composed < verifyFirst || rc.composed%r.cfg.VerifyEvery == 0
			rc.composed++
			r.mu.Unlock()
			if !verify {
				return e, "composed", false, true
			}
			ids, err := r.tokenizeMessages(ctx, j.p, j.msgs[:k], "verify")
			if err != nil || len(ids) == 0 {
				return e, "composed", false, true
			}
			w := entry(ids)
			right := w.Tokens == e.Tokens && w.Last == e.Last && slices.Equal(w.Keys, e.Keys) && slices.Equal(w.Tail, e.Tail)
			r.mu.Lock()
			rc.checks++
			if !right {
				rc.wrong++
			}
			r.mu.Unlock()
			r.m.composeChecks.WithLabelValues(rightWrong(right)).Inc()
			return w, "stored", true, true
		}
	}
	ids, err := r.tokenizeMessages(ctx, j.p, j.msgs[:k], "learn")
	if err != nil || len(ids) == 0 {
		return textprefix.Entry{}, "", false, false
	}
	if whole && len(ids) <= len(j.ids) && slices.Equal(ids, j.ids[:len(ids)]) {
		r.mu.Lock()
		rc.gen = len(j.ids) - len(ids)
		r.mu.Unlock()
	}
	return entry(ids), "stored", true, true
}

// base returns the longest prefix of j shorter than k messages whose
// entry can be composed on (0 if none). r.mu must be held.
func (r *Router) base(j job, k int) (int, textprefix.Entry) {
	for i := k - 1; i >= 1; i-- {
		if i == j.usedK && j.used.Chained {
			return i, j.used
		}
		if e, ok := r.store.Get(j.hashes[i-1]); ok && e.Chained {
			return i, e
		}
	}
	return 0, textprefix.Entry{}
}

// compose returns the entry of j's first k messages as base's entry be
// continued with the tokens of messages base..k-1, tokenized behind the
// stand-in for base's last role. It fails when there is no stand-in for
// that role, or the tokens do not start with the stand-in's own (the
// template renders a message differently by what follows it).
func (r *Router) compose(ctx context.Context, j job, rc *rendering, base int, be textprefix.Entry, k, bytes int) (textprefix.Entry, bool) {
	role := string(j.msgs[base-1].Role)
	lead, ok := leads[role]
	if !ok {
		return textprefix.Entry{}, false
	}
	r.mu.Lock()
	pre, ok := rc.leads[role]
	r.mu.Unlock()
	if !ok {
		q := j.p
		q.Messages = []byte("[" + lead + "]")
		ids, err := r.tokenizeMessages(ctx, q, nil, "lead")
		if err != nil || len(ids) == 0 {
			return textprefix.Entry{}, false
		}
		pre = ids
		r.mu.Lock()
		rc.leads[role] = pre
		r.mu.Unlock()
	}
	msgs := append([]textprefix.Message{{Raw: []byte(lead)}}, j.msgs[base:k]...)
	ids, err := r.tokenizeMessages(ctx, j.p, msgs, "compose")
	if err != nil || len(ids) <= len(pre) || !slices.Equal(ids[:len(pre)], pre) {
		if err == nil {
			r.m.composeChecks.WithLabelValues("lead").Inc()
		}
		return textprefix.Entry{}, false
	}
	e := textprefix.NewEntry(r.cfg.Scheme.Continue(be.Prefix(), ids[len(pre):]), bytes)
	e.Composed = true
	return e, true
}

// tokenizeMessages tokenizes p with msgs for its messages (nil: p's own)
// rendered as inside a longer conversation: every message closed, no
// generation prompt.
func (r *Router) tokenizeMessages(ctx context.Context, p prompt.Prompt, msgs []textprefix.Message, path string) ([]uint32, error) {
	if msgs != nil {
		p.Messages = joinMessages(msgs)
	}
	no := false
	p.AddGenerationPrompt, p.ContinueFinalMessage = &no, nil
	return r.tokenize(ctx, p, path)
}

func rightWrong(ok bool) string {
	if ok {
		return "right"
	}
	return "wrong"
}

// guess counts the check of a request's routing guess.
func (r *Router) guess(ok bool) { r.m.guesses.WithLabelValues(rightWrong(ok)).Inc() }

func (r *Router) check(ok bool) bool {
	r.m.checks.WithLabelValues(rightWrong(ok)).Inc()
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
	requests, learned, checks, guesses, composeChecks, tokens *prometheus.CounterVec
	seconds                                                   *prometheus.HistogramVec
	entries                                                   prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "requests_total",
			Help: "Chat requests by how their keys were found: prefix (a learned entry, no tokenization on the request path), tokenized (the whole prompt, on the request path), untokenized (tokenize failed: routed by load).",
		}, []string{"path"}),
		learned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "learned_total",
			Help: "Conversation prefixes learned: request or answer (from the prompt's own token ids, tokenized on the request path or returned in the engine's answer), composed (a known prefix continued with the new messages' tokens), stored (tokenized whole after a request), shared (from a peer), failed (tokenize error) or dropped (learning backlog full).",
		}, []string{"result"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "checks_total",
			Help: "Entries checked against a longer prefix's tokens (a request's own, or a later tokenization): right, or wrong (the entry's keys were not a prefix of them; it was dropped). Counts guesses and new entries.",
		}, []string{"result"}),
		guesses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "guesses_total",
			Help: "Requests routed on an entry, by the check of their guess against a whole tokenization of the request (its own or a later one): right, wrong (the request was routed on keys it does not have), or unchecked (its prefix was composed and not verified).",
		}, []string{"result"}),
		composeChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "compose_checks_total",
			Help: "Composed prefixes compared with a whole tokenization of them: right or wrong; lead counts compositions given up because the new messages' tokens did not start with the stand-in's.",
		}, []string{"result"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "tokenized_tokens_total",
			Help: "Tokens the local vLLM returned to the router's /tokenize calls, by path: request (on the request path), learn (a prefix whole), compose (new messages behind a stand-in), lead (a stand-in alone), verify (a composed prefix whole).",
		}, []string{"path"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "tokenize_duration_seconds",
			Help:    "Latency of the router's /tokenize calls: on the request path (request) or after it (learn, compose, lead, verify).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}, NativeHistogramBucketFactor: 1.1,
		}, []string{"path"}),
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "textprefix", Name: "entries",
			Help: "Conversation prefixes held.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.learned, m.checks, m.guesses, m.composeChecks, m.tokens, m.seconds, m.entries)
	}
	return m
}
