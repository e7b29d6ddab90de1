package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
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
	// Messages sends Anthropic Messages requests to /v1/messages (vLLM's
	// /v1/messages): system blocks, content blocks, tools with
	// input_schema, Anthropic's SSE events.
	Messages
	// Responses sends OpenAI Responses requests to /v1/responses:
	// instructions, input items, flat tools, and previous_response_id for
	// sessions that continue a stored response (Session.Continue).
	Responses
)

func (k Kind) String() string {
	switch k {
	case Chat:
		return "chat"
	case Messages:
		return "messages"
	case Responses:
		return "responses"
	}
	return "completion"
}

// API names the request shape as kvroute's sidecar labels its metrics
// (prompt.API's names): "completions", "chat", "messages", "responses".
func (k Kind) API() string {
	if k == Completion {
		return "completions"
	}
	return k.String()
}

// agentic reports whether k's sessions are agent conversations (Messages
// or Responses), run by the agent loop (agent.go).
func (k Kind) agentic() bool { return k == Messages || k == Responses }

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

	// Agent turns (Messages and Responses sessions):

	// Images go with User, before its text on a session's first turn
	// (a reference the task is about), after it later (a screenshot).
	Images []Image
	// Result answers the previous turn's Call (its tool's output); after a
	// turn that spawned sub-agents the runner puts their answers here
	// instead.
	Result string
	// Call is the tool call the assistant makes in its answer to this
	// turn: the simulator answers text only, so the agent appends the call
	// the schedule scripted to the answer's actual text, as a model's
	// tool_use would follow its text. nil on a session's last turn.
	Call *ToolCall
	// Spawn are sub-agents started when this turn's answer arrives, all at
	// once: each inherits the conversation as this turn sent it (the
	// parent's prefix) and adds its own task; the next turn's Result is
	// their last answers.
	Spawn []Session
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

	System string // Chat, Messages and Responses
	Turns  []Turn
	// Group names the long prefix the session shares with other sessions
	// (a document, a group's system prompt), "" when it shares none worth
	// naming: the first request of a group, like a session's first turn,
	// is a compulsory miss that no routing can turn into a hit
	// (PolicyResult.RepeatTTFTP90 leaves them out).
	Group string

	// Agent sessions (Messages and Responses):

	// Tools are offered on every turn (rendered into the prompt after the
	// system prompt, so they are part of the shared prefix).
	Tools []Tool
	// Billing sends Claude Code's per-request attribution header as the
	// first system block (Messages): vLLM strips it before rendering
	// (vllm/entrypoints/anthropic/serving.py, _convert_system_message), so
	// a router that keys it would see every request as new.
	Billing bool
	// Continue (Responses) stores each answer and sends the next turn with
	// previous_response_id and only the new items, instead of the history:
	// only the pod holding the stored response can serve it.
	Continue bool
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
		n += x.requests()
	}
	return n
}

// requests counts x's turns and its sub-agents' turns.
func (x Session) requests() int {
	n := len(x.Turns)
	for _, t := range x.Turns {
		for _, c := range t.Spawn {
			n += c.requests()
		}
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

// Stretched returns a copy of s with every arrival and think time k times
// as long: the same schedule for a cluster whose simulated clocks run at
// 1/k of the wall clock (kvbench --slow), so that in simulated time it
// arrives as s does. k <= 1 returns s itself.
func (s Schedule) Stretched(k float64) Schedule {
	if k <= 1 {
		return s
	}
	out := s
	out.Sessions = stretchSessions(s.Sessions, k)
	return out
}

func stretchSessions(xs []Session, k float64) []Session {
	if xs == nil {
		return nil
	}
	out := make([]Session, len(xs))
	for i, x := range xs {
		x.At = scaled(x.At, k)
		x.Turns = slices.Clone(x.Turns)
		for j := range x.Turns {
			t := &x.Turns[j]
			t.Think = scaled(t.Think, k)
			t.Spawn = stretchSessions(t.Spawn, k)
		}
		out[i] = x
	}
	return out
}

func scaled(d time.Duration, k float64) time.Duration { return time.Duration(float64(d) * k) }
