package textroute

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/textprefix"
	"github.com/kvroute/kvroute/vllmsim"
)

// simTokenizer is the simulator's tokenizer and chat template, as the
// local vLLM's /tokenize would answer; calls counts the calls. broken
// renders each prompt with its message count first, so no prefix's tokens
// are a prefix of a longer conversation's.
// indexed renders each message with its position first, so a message's
// tokens depend on what came before it (and a composition is wrong).
type simTokenizer struct {
	tok     *vllmsim.Tokenizer
	tmpl    vllmsim.ChatTemplate
	broken  bool
	indexed bool
	fail    bool
	mu      sync.Mutex
	calls   int
}

func (s *simTokenizer) Tokenize(_ context.Context, p prompt.Prompt) ([]uint32, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.fail {
		return nil, errors.New("tokenize: connection refused")
	}
	var msgs []vllmsim.Message
	if err := json.Unmarshal(p.Messages, &msgs); err != nil {
		return nil, err
	}
	o := vllmsim.ChatOptions{Template: s.tmpl, AddGenerationPrompt: p.AddGenerationPrompt == nil || *p.AddGenerationPrompt}
	if s.indexed {
		var ids []uint32
		for i, m := range msgs {
			turn, _ := s.tok.Chat([]vllmsim.Message{m}, vllmsim.ChatOptions{})
			ids = append(append(ids, uint32(200+i)), turn...)
		}
		gen, err := s.tok.Chat(nil, o)
		return append(ids, gen...), err
	}
	ids, err := s.tok.Chat(msgs, o)
	if s.broken {
		ids = append([]uint32{uint32(100 + len(msgs))}, ids...)
	}
	return ids, err
}

func (s *simTokenizer) count() int { s.mu.Lock(); defer s.mu.Unlock(); return s.calls }

func chat(t *testing.T, turns ...string) (prompt.Prompt, []textprefix.Message) {
	t.Helper()
	return conversation(t, true, turns)
}

// userChat is chat without a system message: user first, then
// alternating assistant and user turns.
func userChat(t *testing.T, turns ...string) (prompt.Prompt, []textprefix.Message) {
	t.Helper()
	return conversation(t, false, turns)
}

// conversation parses a chat of turns (the first a system message when
// system is set, then user and assistant in turn) and splits its messages.
func conversation(t *testing.T, system bool, turns []string) (prompt.Prompt, []textprefix.Message) {
	t.Helper()
	var ms []map[string]string
	for i, c := range turns {
		j := i
		if system {
			j--
		}
		role := "user"
		switch {
		case j < 0:
			role = "system"
		case j%2 == 1:
			role = "assistant"
		}
		ms = append(ms, map[string]string{"role": role, "content": c})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": ms})
	p, err := prompt.Parse(b, true)
	if err != nil {
		t.Fatal(err)
	}
	var raws []json.RawMessage
	json.Unmarshal(p.Messages, &raws)
	out := make([]textprefix.Message, len(raws))
	for i, r := range raws {
		out[i] = textprefix.Message{Raw: r, Role: []byte(ms[i]["role"])}
	}
	return p, out
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

type env struct {
	r    *Router
	tok  *simTokenizer
	reg  *prometheus.Registry
	stop func()
}

func newEnv(t *testing.T, tok *simTokenizer, cfg Config) *env {
	reg := prometheus.NewRegistry()
	cfg.Model = "m"
	r := New(cfg, tok, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &env{r: r, tok: tok, reg: reg}
}

func (e *env) waitLearned(t *testing.T, n float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := value(e.r.m.checks.WithLabelValues("wrong"))
		for _, l := range []string{"stored", "composed", "request", "answer", "failed"} {
			got += value(e.r.m.learned.WithLabelValues(l))
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("learned %v of %v prefixes in 5s", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *env) path(p string) float64 { return value(e.r.m.requests.WithLabelValues(p)) }

// testRoot is the test model's chain root; keysOf the front's rule for it.
var testRoot = blockkey.Root("m", "", "")

func keysOf(ids []uint32) []blockkey.Key { return blockkey.DefaultScheme().Request(testRoot, ids) }

var sys = strings.Repeat("You are a careful assistant who answers in full sentences. ", 40)

func TestSeenPrefixesRouteWithoutTokenizing(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
	e := newEnv(t, tok, Config{})
	scheme := blockkey.DefaultScheme()
	root := blockkey.Root("m", "", "")
	truth := func(p prompt.Prompt) []blockkey.Key { return scheme.Request(root, tok.answer(t, p)) }

	// First sight: tokenized on the request path, exactly as before.
	p, msgs := chat(t, sys, "What is a prefix cache?")
	keys, n, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	if want := truth(p); !slices.Equal(keys, want) || tok.count() != 1 || e.path("tokenized") != 1 || n < 400 {
		t.Fatalf("first request: %d keys (want %d), %d tokens, %d tokenize calls", len(keys), len(want), n, tok.count())
	}
	after(nil)
	e.waitLearned(t, 2) // the system prompt alone, and the whole conversation
	for path, want := range map[string]uint64{"request": 1, "learn": 2} {
		var m dto.Metric
		e.r.m.seconds.WithLabelValues(path).(prometheus.Histogram).Write(&m)
		if got := m.GetHistogram().GetSampleCount(); got != want {
			t.Errorf("%s tokenize calls timed: %d, want %d", path, got, want)
		}
	}

	// Another question under the same system prompt: no call on the path;
	// the keys are the system prompt's, a prefix of the exact keys.
	p2, msgs2 := chat(t, sys, "And how is it evicted?")
	keys2, n2, after2 := e.r.Keys(context.Background(), p2, msgs2, testRoot)
	exact := truth(p2)
	if tok.count() != 3 || e.path("prefix") != 1 || len(keys2) == 0 || len(keys2) > len(exact) || !slices.Equal(keys2, exact[:len(keys2)]) {
		t.Fatalf("second request: %d tokenize calls, prefix %v, keys %d of exact %d", tok.count(), e.path("prefix"), len(keys2), len(exact))
	}
	if n2 < len(keys2)*scheme.TokensPerKey() {
		t.Fatalf("estimated %d tokens under %d keys", n2, len(keys2))
	}
	after2(nil)
	e.waitLearned(t, 3)

	// The first conversation's next turn, entering with the answer.
	p3, msgs3 := chat(t, sys, "What is a prefix cache?", "It keeps the attention state of prompts it has seen.", "Where is it kept?")
	keys3, _, after3 := e.r.Keys(context.Background(), p3, msgs3, testRoot)
	exact3 := truth(p3)
	prev := truth(p)
	if e.path("prefix") != 2 || len(keys3) < len(prev)-1 || !slices.Equal(keys3, exact3[:len(keys3)]) {
		t.Fatalf("follow-up: prefix %v, %d keys, the previous turn had %d", e.path("prefix"), len(keys3), len(prev))
	}
	after3(nil)
	e.waitLearned(t, 4)
	if right, wrong := value(e.r.m.checks.WithLabelValues("right")), value(e.r.m.checks.WithLabelValues("wrong")); right < 3 || wrong != 0 {
		t.Fatalf("checks right %v wrong %v", right, wrong)
	}
	// A different tool list renders differently: no entry applies.
	p4, msgs4 := chat(t, sys, "And how is it evicted?")
	p4.Tools = json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	if e.r.Keys(context.Background(), p4, msgs4, testRoot); e.path("tokenized") != 2 {
		t.Fatalf("tools changed, yet routed on a prefix: tokenized %v", e.path("tokenized"))
	}
}

// A template whose prefixes are not prefixes: each system-prompt entry
// fails its check against the whole prompt it was learned with and is not
// stored, so no new question is routed on a guess; a conversation's own
// entry, guessed for its follow-up, fails the follow-up's check and is
// dropped.
func TestTemplateWithoutPrefixPropertyIsCaught(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer(), broken: true}
	e := newEnv(t, tok, Config{})
	for i := range 5 {
		p, msgs := chat(t, sys, "question "+strings.Repeat("x", i))
		_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
		after(nil)
		e.waitLearned(t, float64(2*(i+1)))
	}
	wrong := func() float64 { return value(e.r.m.checks.WithLabelValues("wrong")) }
	if e.path("prefix") != 0 || e.path("tokenized") != 5 || wrong() != 5 {
		t.Fatalf("prefix %v tokenized %v wrong %v", e.path("prefix"), e.path("tokenized"), wrong())
	}
	p, msgs := chat(t, sys, "question ", "answer", "next")
	_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	after(nil)
	e.waitLearned(t, 12)
	if e.path("prefix") != 1 || wrong() != 6 || e.r.store.Has(textprefix.Chain(e.r.context(p), msgs)[1]) {
		t.Fatalf("follow-up: prefix %v wrong %v, wrong entry kept %v", e.path("prefix"), wrong(), e.r.store.Has(textprefix.Chain(e.r.context(p), msgs)[1]))
	}
}

func TestTokenizeFailureRoutesByLoad(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer(), fail: true}
	e := newEnv(t, tok, Config{})
	p, msgs := chat(t, sys, "q")
	keys, n, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	after(nil)
	if keys != nil || n != 0 || e.path("untokenized") != 1 {
		t.Fatalf("keys %v tokens %d untokenized %v", keys, n, e.path("untokenized"))
	}
}

// Without Run the backlog fills and further prefixes are dropped, never
// blocking the request that offered them.
func TestFullBacklogDrops(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
	r := New(Config{Model: "m", Queue: 2}, tok, nil)
	for i := range 3 {
		p, msgs := chat(t, sys, "q"+strings.Repeat("y", i))
		_, _, after := r.Keys(context.Background(), p, msgs, testRoot)
		after(nil)
	}
	// 1st: one job for the system prompt and the conversation; 2nd: the
	// system prompt is being learned, its conversation queued; 3rd: its
	// conversation dropped.
	if d := value(r.m.learned.WithLabelValues("dropped")); d != 1 || len(r.jobs) != 2 {
		t.Fatalf("dropped %v, queued %d", d, len(r.jobs))
	}
}

func TestRenderContext(t *testing.T) {
	yes, no := true, false
	base := prompt.Prompt{Model: "m"}
	seen := map[string]string{}
	for name, p := range map[string]prompt.Prompt{
		"base":       base,
		"model":      {Model: "m2"},
		"salt":       {Model: "m", CacheSalt: "s"},
		"tools":      {Model: "m", Tools: json.RawMessage(`[]`)},
		"kwargs":     {Model: "m", ChatTemplateKwargs: json.RawMessage(`{}`)},
		"special":    {Model: "m", AddSpecialTokens: &yes},
		"no special": {Model: "m", AddSpecialTokens: &no},
		"split":      {Model: "m1", CacheSalt: ":"},
	} {
		c := string(renderContext(p))
		if prev, dup := seen[c]; dup {
			t.Errorf("%s renders like %s", name, prev)
		}
		seen[c] = name
	}
	gen := base
	gen.AddGenerationPrompt = &no
	if string(renderContext(gen)) != string(renderContext(base)) {
		t.Error("the generation-prompt flag changed a prefix's context")
	}
}

// Two sidecars: what one learns, the other routes on (the mesh between
// them is a function call here).
func TestSharedPrefixesServeTheNextTurnElsewhere(t *testing.T) {
	a := newEnv(t, &simTokenizer{tok: vllmsim.NewTokenizer()}, Config{})
	b := newEnv(t, &simTokenizer{tok: vllmsim.NewTokenizer()}, Config{})
	a.r.SetShare(b.r.Accept)
	p, msgs := chat(t, sys, "What is a prefix cache?")
	_, _, after := a.r.Keys(context.Background(), p, msgs, testRoot)
	after(nil)
	a.waitLearned(t, 2)
	deadline := time.Now().Add(5 * time.Second)
	for value(b.r.m.learned.WithLabelValues("shared")) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("b never got a's prefixes")
		}
		time.Sleep(time.Millisecond)
	}
	p2, msgs2 := chat(t, sys, "What is a prefix cache?", "It keeps attention state.", "Where?")
	keys, _, _ := b.r.Keys(context.Background(), p2, msgs2, testRoot)
	if b.tok.count() != 0 || b.path("prefix") != 1 || len(keys) == 0 {
		t.Fatalf("b: %d tokenize calls, prefix %v, %d keys", b.tok.count(), b.path("prefix"), len(keys))
	}
	// A held entry is not replaced by a shared one.
	h := textprefix.Chain(b.r.context(p2), msgs2)[1]
	b.r.Accept(h, textprefix.Entry{Tokens: 1})
	if e, _ := b.r.store.Get(h); e.Tokens == 1 {
		t.Fatal("a shared entry replaced a held one")
	}
}

// The backlog's bytes are bounded too: a request too large for it is not
// learned, and the bytes of learned jobs are given back.
func TestBacklogBytesBound(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
	p, _ := chat(t, sys, "q")
	size := len(p.Messages) + 4*len(tok.answer(t, p)) // a job keeps the messages and the request's ids
	r := New(Config{Model: "m", QueueBytes: int64(size * 3 / 2)}, tok, nil)
	for _, q := range []string{"q", "r"} { // one job fits, not two
		p, msgs := chat(t, sys, q)
		_, _, after := r.Keys(context.Background(), p, msgs, testRoot)
		after(nil)
	}
	if d := value(r.m.learned.WithLabelValues("dropped")); d != 1 || len(r.jobs) != 1 {
		t.Fatalf("dropped %v queued %d; want 1 and 1", d, len(r.jobs))
	}
	r.learn(context.Background(), <-r.jobs)
	if q := r.queued.Load(); q != 0 {
		t.Fatalf("%d bytes still counted after the job ran", q)
	}
}

// answer is the prompt's token ids as the engine's answer carries them
// (return_token_ids): the whole prompt with its generation prompt. It is
// not counted as a tokenize call.
func (s *simTokenizer) answer(t *testing.T, p prompt.Prompt) []uint32 {
	t.Helper()
	ids, err := s.Tokenize(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.calls--
	s.mu.Unlock()
	return ids
}

// With the answer's prompt ids, a conversation is learned without a
// second tokenization once the context's generation-prompt length is
// known, every guess is checked against the request's own tokens, and a
// wrong one is counted and dropped.
func TestLearnsFromTheAnswer(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
	e := newEnv(t, tok, Config{})
	waitChecks := func(n float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for value(e.r.m.checks.WithLabelValues("right"))+value(e.r.m.checks.WithLabelValues("wrong")) < n {
			if time.Now().After(deadline) {
				t.Fatalf("%v checks in 5s; want %v", value(e.r.m.checks.WithLabelValues("right")), n)
			}
			time.Sleep(time.Millisecond)
		}
	}

	// First sight: tokenized on the path; the system prompt and (once, to
	// learn the generation prompt's length) the conversation after it.
	p, msgs := chat(t, sys, "What is a prefix cache?")
	_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	after(tok.answer(t, p))
	e.waitLearned(t, 2)
	if tok.count() != 3 {
		t.Fatalf("%d tokenize calls; want 3", tok.count())
	}

	// The next turn is routed on the conversation's entry and learned from
	// its answer alone; its guess checks right.
	p2, msgs2 := chat(t, sys, "What is a prefix cache?", "It keeps attention state.", "Where?")
	_, _, after2 := e.r.Keys(context.Background(), p2, msgs2, testRoot)
	if e.path("prefix") != 1 {
		t.Fatal("the follow-up was not routed on the first turn's entry")
	}
	after2(tok.answer(t, p2))
	deadline := time.Now().Add(5 * time.Second)
	for value(e.r.m.learned.WithLabelValues("answer")) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the follow-up was not learned from its answer")
		}
		time.Sleep(time.Millisecond)
	}
	if tok.count() != 3 || value(e.r.m.guesses.WithLabelValues("right")) != 1 {
		t.Fatalf("%d tokenize calls (want 3), guesses right %v (want 1)", tok.count(), value(e.r.m.guesses.WithLabelValues("right")))
	}
	// The entry is what a tokenization without the generation prompt gives.
	no := false
	closed := p2
	closed.AddGenerationPrompt = &no
	want := keysOf(tok.answer(t, closed))
	got, ok := e.get(textprefix.Chain(e.r.context(p2), msgs2)[3])
	if !ok || !slices.Equal(got.Keys, want) {
		t.Fatalf("learned entry: %v, %d keys; want the %d keys of the closed conversation", ok, len(got.Keys), len(want))
	}

	// A guess the answer contradicts (here: the engine reports other
	// tokens) is wrong, counted, and its entry dropped.
	p3, msgs3 := chat(t, sys, "What is a prefix cache?", "It keeps attention state.", "Where?", "On the GPU.", "Why?")
	_, _, after3 := e.r.Keys(context.Background(), p3, msgs3, testRoot)
	other, _ := chat(t, "another system prompt", "x")
	checks := value(e.r.m.checks.WithLabelValues("right")) + value(e.r.m.checks.WithLabelValues("wrong"))
	after3(tok.answer(t, other))
	waitChecks(checks + 2) // the guess, and the new entry against the truth
	if value(e.r.m.guesses.WithLabelValues("wrong")) != 1 || e.has(textprefix.Chain(e.r.context(p2), msgs2)[3]) {
		t.Fatalf("guesses wrong %v; entry kept %v", value(e.r.m.guesses.WithLabelValues("wrong")), e.has(textprefix.Chain(e.r.context(p2), msgs2)[3]))
	}
}

func (e *env) has(h textprefix.Hash) bool {
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	return e.r.store.Has(h)
}

func (e *env) get(h textprefix.Hash) (textprefix.Entry, bool) {
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	return e.r.store.Get(h)
}

// A conversation's turns, each routed on the previous turn's entry, are
// learned by tokenizing only their new messages: every entry is exactly
// what a whole tokenization gives, the first verifyFirst are checked
// against one, and the tokenizer sees a small part of the tokens.
func TestComposesTheNewMessagesOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tmpl   vllmsim.ChatTemplate
		system bool
	}{
		{"chatml", vllmsim.ChatML, true},
		{"llama3", vllmsim.Llama3, true},
		// Llama 3's template puts a system block first even without a
		// system message: the stand-in turn gets it too.
		{"llama3 without a system message", vllmsim.Llama3, false},
	} {
		t.Run(tc.name, func(t *testing.T) { composeTurns(t, tc.tmpl, tc.system) })
	}
}

func composeTurns(t *testing.T, tmpl vllmsim.ChatTemplate, system bool) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer(), tmpl: tmpl}
	e := newEnv(t, tok, Config{VerifyEvery: 1000})
	turns := []string{sys, "What is a prefix cache?"}
	talk := chat
	if !system {
		turns, talk = []string{sys + " What is a prefix cache?"}, userChat
	}
	p, msgs := talk(t, turns...)
	_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	after(nil)
	e.waitLearned(t, float64(len(turns)))
	learned := float64(len(turns))
	const followUps = 8
	wholeTokens := 0
	for i := range followUps {
		turns = append(turns, "An answer of some length, number "+strings.Repeat("x", i), "Question "+strings.Repeat("y", i)+"?")
		p, msgs := talk(t, turns...)
		keys, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
		exact := keysOf(tok.answer(t, p))
		if e.path("prefix") != float64(i+1) || len(keys) == 0 || !slices.Equal(keys, exact[:len(keys)]) {
			t.Fatalf("turn %d: prefix %v, %d keys not a prefix of the %d exact ones", i, e.path("prefix"), len(keys), len(exact))
		}
		after(nil)
		learned++
		e.waitLearned(t, learned)
		no := false
		closed := p
		closed.AddGenerationPrompt = &no
		ids := tok.answer(t, closed)
		wholeTokens += len(ids)
		got, ok := e.get(textprefix.Chain(e.r.context(p), msgs)[len(msgs)-1])
		if want := blockkey.DefaultScheme().Prefix(testRoot, ids); !ok || got.Tokens != want.Tokens || got.Last != want.Last ||
			!slices.Equal(got.Keys, want.Keys) || !slices.Equal(got.Tail, want.Tail) {
			t.Fatalf("turn %d: entry %v (%d tokens, %d keys); want %d tokens, %d keys", i, ok, got.Tokens, len(got.Keys), want.Tokens, len(want.Keys))
		}
	}
	composed := value(e.r.m.learned.WithLabelValues("composed"))
	right := value(e.r.m.composeChecks.WithLabelValues("right"))
	if composed != followUps-verifyFirst || right != verifyFirst || value(e.r.m.composeChecks.WithLabelValues("wrong")) != 0 {
		t.Errorf("composed %v, verified right %v; want %d and %d", composed, right, followUps-verifyFirst, verifyFirst)
	}
	if g := value(e.r.m.guesses.WithLabelValues("unchecked")); g != followUps-verifyFirst {
		t.Errorf("unchecked guesses %v; want %d", g, followUps-verifyFirst)
	}
	// The unverified ones tokenized only their new messages.
	var verify dto.Metric
	e.r.m.seconds.WithLabelValues("verify").(prometheus.Histogram).Write(&verify)
	composedTokens := value(e.r.m.tokens.WithLabelValues("compose"))
	if composedTokens <= 0 || composedTokens*4 > float64(wholeTokens) || verify.GetHistogram().GetSampleCount() != verifyFirst {
		t.Errorf("compose tokenized %v tokens against %d whole; %d verifications", composedTokens, wholeTokens, verify.GetHistogram().GetSampleCount())
	}
}

// A template that renders a message by its place in the conversation
// composes wrong: the first composition is checked, found wrong, the
// whole tokenization stored instead, and the context composes no more.
func TestWrongCompositionIsCaught(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer(), indexed: true}
	e := newEnv(t, tok, Config{})
	turns := []string{sys, "q"}
	p, msgs := chat(t, turns...)
	_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
	after(nil)
	e.waitLearned(t, 2)
	for i := range 3 {
		turns = append(turns, "a", "q"+strings.Repeat("y", i))
		p, msgs := chat(t, turns...)
		_, _, after := e.r.Keys(context.Background(), p, msgs, testRoot)
		after(nil)
		e.waitLearned(t, float64(3+i))
		no := false
		closed := p
		closed.AddGenerationPrompt = &no
		got, ok := e.get(textprefix.Chain(e.r.context(p), msgs)[len(msgs)-1])
		if want := keysOf(tok.answer(t, closed)); !ok || !slices.Equal(got.Keys, want) || got.Composed {
			t.Fatalf("turn %d: entry %v composed %v, keys equal to the whole tokenization's: %v", i, ok, got.Composed, slices.Equal(got.Keys, want))
		}
	}
	if w, c := value(e.r.m.composeChecks.WithLabelValues("wrong")), value(e.r.m.learned.WithLabelValues("composed")); w != 1 || c != 0 {
		t.Errorf("compositions wrong %v, learned composed %v; want 1 and 0", w, c)
	}
	if n := value(e.r.m.tokens.WithLabelValues("compose")); n == 0 {
		t.Error("no composition was tried")
	}
}

// A composed entry is not routed on once its context's compositions were
// found wrong.
func TestComposedEntriesOfADistrustedContext(t *testing.T) {
	tok := &simTokenizer{tok: vllmsim.NewTokenizer()}
	e := newEnv(t, tok, Config{})
	p, msgs := chat(t, sys, "q", "a", "q2")
	c := e.r.context(p)
	hs := textprefix.Chain(c, msgs)
	e.r.mu.Lock()
	e.r.store.Put(hs[1], textprefix.Entry{Keys: []blockkey.Key{1}, Tokens: 100, Composed: true})
	e.r.mu.Unlock()
	if e.r.Keys(context.Background(), p, msgs, testRoot); e.path("prefix") != 1 {
		t.Fatal("a composed entry of a trusted context was not routed on")
	}
	e.r.mu.Lock()
	e.r.rendering(xxhash.Sum64(c)).wrong, e.r.rendering(xxhash.Sum64(c)).checks = 1, 10
	e.r.mu.Unlock()
	if e.r.Keys(context.Background(), p, msgs, testRoot); e.path("prefix") != 1 || e.path("tokenized") != 1 {
		t.Fatalf("distrusted: prefix %v tokenized %v; want 1 and 1", e.path("prefix"), e.path("tokenized"))
	}
}
