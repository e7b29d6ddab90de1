package loadgen

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kind is the OpenAI endpoint a session uses.
type Kind uint8

const (
	// Completion sends token-id prompts to /v1/completions, which avoids any
	// tokenizer drift between the generator and the server.
	Completion Kind = iota
	// Chat sends messages to /v1/chat/completions; later turns carry the
	// assistant text actually returned by earlier ones.
	Chat
)

func (k Kind) String() string {
	if k == Chat {
		return "chat"
	}
	return "completion"
}

// Turn is one request of a session.
type Turn struct {
	// Prompt is the whole token-id prompt (Completion sessions).
	Prompt []uint32
	// Trace, when set, stands for Prompt and is materialised when sent.
	Trace *TracePrompt
	// User is this turn's user message (Chat sessions); the runner prepends
	// the session's system prompt and the history so far.
	User string
	// MaxTokens is the output length asked for.
	MaxTokens int
	// Think is the pause after the previous turn's response arrived before
	// this turn is sent; zero for the first turn.
	Think time.Duration
}

// Session is a sequence of turns sent one after another, each only after
// the previous response arrived. Single-request workloads have one turn per
// session.
type Session struct {
	ID string
	// At is the first turn's offset from the start of the run.
	At   time.Duration
	Kind Kind
	// Model is the model every turn names; "" means the client's model
	// (the base model). A LoRA adapter is named like a model, as in vLLM.
	Model string

	System string // Chat only
	Turns  []Turn
}

// Schedule is a workload instance: sessions in order of At.
type Schedule struct {
	Workload string
	Sessions []Session
}

// Requests is the number of requests the schedule sends if every turn runs.
func (s Schedule) Requests() int {
	n := 0
	for _, x := range s.Sessions {
		n += len(x.Turns)
	}
	return n
}

// PromptTokens is the total prompt size of the completion turns; chat
// turns count 0, since their size depends on the server's answers.
func (s Schedule) PromptTokens() int {
	n := 0
	for _, x := range s.Sessions {
		for _, t := range x.Turns {
			n += len(t.Prompt)
			if t.Trace != nil {
				n += t.Trace.Length
			}
		}
	}
	return n
}

func sortSessions(ss []Session) {
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].At < ss[j].At })
}

// tokens returns the turn's token-id prompt.
func (t Turn) tokens() []uint32 {
	if t.Trace != nil {
		return t.Trace.Tokens()
	}
	return t.Prompt
}

// Token ids the generators use: clear of the small special-token ids every
// vocabulary starts with, and inside the simulator's vocabulary.
const (
	tokenBase = 1000
	tokenSpan = 100000
)

func randomTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = tokenBase + uint32(r.IntN(tokenSpan))
	}
	return out
}

func concat(parts ...[]uint32) []uint32 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]uint32, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// letters is the alphabet of generated words: with a leading space, a
// lowercase word of up to four letters is one token in the simulator's
// tokenizer (and about one in BPE vocabularies), so words ≈ tokens.
const letters = "abcdefghijklmnopqrstuvwxyz"

// randomText returns about n tokens of text: n random four-letter words.
func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(5 * n)
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		for range 4 {
			b.WriteByte(letters[r.IntN(len(letters))])
		}
	}
	return b.String()
}

// Dist is a bounded distribution of a positive quantity, as the
// inference-perf workload catalog states them: mean and standard deviation,
// clamped to [Min, Max]. A zero Std means the constant Mean.
type Dist struct {
	Mean, Std, Min, Max float64
	// LogNormal picks a log-normal with this mean and std; otherwise normal.
	LogNormal bool
}

// Sample draws one value.
func (d Dist) Sample(r *rand.Rand) float64 {
	v := d.Mean
	if d.Std > 0 {
		if d.LogNormal && d.Mean > 0 {
			s2 := math.Log(1 + d.Std*d.Std/(d.Mean*d.Mean))
			mu := math.Log(d.Mean) - s2/2
			v = math.Exp(mu + math.Sqrt(s2)*r.NormFloat64())
		} else {
			v = d.Mean + d.Std*r.NormFloat64()
		}
	}
	if d.Max > d.Min {
		v = min(max(v, d.Min), d.Max)
	}
	return v
}

// Int draws one value rounded to an int, at least 1.
func (d Dist) Int(r *rand.Rand) int {
	return max(1, int(math.Round(d.Sample(r))))
}

// poisson returns arrival offsets of a Poisson process of rate per second
// inside [0, dur), at most limit of them (limit <= 0: no limit).
func poisson(r *rand.Rand, rate float64, dur time.Duration, limit int) []time.Duration {
	if rate <= 0 || dur <= 0 {
		return nil
	}
	var out []time.Duration
	t := 0.0
	for {
		t += r.ExpFloat64() / rate
		at := time.Duration(t * float64(time.Second))
		if at >= dur || (limit > 0 && len(out) >= limit) {
			return out
		}
		out = append(out, at)
	}
}

func sessionID(prefix string, i int) string {
	return prefix + "-" + strconv.Itoa(i)
}
