package loadgen

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Workload names accepted by Generate. The Mooncake replay is built from a
// trace file instead (Mooncake).
var Workloads = []string{"shared-prefix", "agent-fanout", "doc-qa", "multi-turn-chat", "no-reuse", "multi-lora", "agentic"}

// Config sizes the synthetic workloads. Prefix routing only matters when
// the cluster's KV cache is under pressure, so the prefix-heavy workloads
// size their set of distinct prefixes from CacheTokens and Fill: together
// they fill most of the cluster's cache, and no single pod can hold them
// all. DefaultConfig documents the defaults.
type Config struct {
	// Rate is the offered load in requests per second (sessions of several
	// turns start at Rate divided by the mean number of turns).
	Rate float64
	// Duration bounds the arrivals: sessions start in [0, Duration).
	Duration time.Duration
	// MaxRequests caps the number of requests; 0 means no cap.
	MaxRequests int
	// CacheTokens is the KV capacity of the whole cluster in tokens (pods ×
	// blocks per pod × block size).
	CacheTokens int
	// Fill is the fraction of CacheTokens the distinct prefixes occupy.
	// Default 0.73, the KV fill of llm-d's published comparison (docs/reference/anchors.md §2).
	Fill float64
	// MaxPromptTokens caps any prompt (the server's context length minus the
	// output); 0 means no cap.
	MaxPromptTokens int

	SharedPrefix SharedPrefixParams
	Agent        AgentParams
	DocQA        DocQAParams
	Chat         ChatParams
	NoReuse      NoReuseParams
	MultiLoRA    MultiLoRAParams
	Agentic      AgenticParams
}

// SharedPrefixParams: the B2B-SaaS shape of llm-d's benchmark (many groups
// of users, each group with its own long system prompt, a fresh question per
// request), scaled from 6,000 + 1,200 tokens to fit a simulated cluster.
type SharedPrefixParams struct {
	// Groups is the number of distinct system prompts; 0 derives it from
	// Config.CacheTokens × Fill / SystemTokens.
	Groups         int
	SystemTokens   int  // default 4000
	QuestionTokens Dist // default mean 400
	OutputTokens   int  // default 64
}

// AgentParams: an agent task fans out into parallel calls that share the
// agent's long system prompt (tool definitions) and the task's context, the
// agentic-trace-replay profile's 92 % shared-prefix calls in miniature.
type AgentParams struct {
	// Agents is the number of distinct system prompts; 0 derives it from
	// the cache size as SharedPrefixParams.Groups does.
	Agents        int
	SystemTokens  int  // default 6000
	ContextTokens Dist // per task, default mean 1000
	FanOut        int  // parallel calls per task, default 8
	CallTokens    Dist // per call, default mean 200
	OutputTokens  int  // default 64
	// Jitter spreads a task's calls over [0, Jitter) after the task starts.
	Jitter time.Duration // default 50ms
}

// DocQAParams: long shared documents, several questions each.
type DocQAParams struct {
	// Docs is the number of documents; 0 derives it from the cache size and
	// the mean document length.
	Docs           int
	DocTokens      Dist // default mean 12000, 2000..32000
	QuestionTokens Dist // default mean 100
	OutputTokens   int  // default 128
}

// ChatParams: the inference-perf interactive-chat profile with its lengths
// halved and its think time compressed (mean 45 s → 5 s) so a benchmark of a
// minute sees several turns per conversation.
type ChatParams struct {
	Systems      int  // distinct system prompts, default 4
	SystemTokens int  // default 1000 (catalog: 1000)
	FirstTokens  Dist // first user message, default mean 2000 (catalog 4000)
	TurnTokens   Dist // later user messages, default mean 50 (catalog 50)
	Turns        Dist // default mean 4, 1..15 (catalog)
	Think        Dist // seconds, default mean 5, 1..30
	OutputTokens Dist // default mean 150, 10..500
}

// MultiLoRAParams: the shared-prefix shape served by a base model and its
// LoRA adapters at once (one tenant's fine-tune per adapter), with the same
// system prompts sent to every model. vLLM hashes the adapter's name into
// every block, so each (model, system prompt) pair is a prefix of its own:
// a router must key by adapter, or it sends an adapter's request to the pod
// that holds the same text for another model, where nothing is reused.
type MultiLoRAParams struct {
	// Adapters are the LoRA adapter names; requests pick the base model
	// (Session.Model "") or one of them uniformly. Default lora-a, lora-b.
	Adapters []string
	// Groups is the number of distinct system prompts; 0 derives it from
	// the cache size, counting one prefix per model and prompt.
	Groups         int
	SystemTokens   int  // default 3000
	QuestionTokens Dist // default mean 300
	OutputTokens   int  // default 64
}

// NoReuseParams: random prompts, the control where prefix routing must
// cost nothing.
type NoReuseParams struct {
	PromptTokens Dist // default mean 2000
	OutputTokens int  // default 64
}

// DefaultConfig is a prefix-heavy load at 8 requests/s for 30 s on a
// cluster of 4 simulated pods of 2048 blocks of 16 tokens.
func DefaultConfig() Config {
	return Config{
		Rate:        8,
		Duration:    30 * time.Second,
		CacheTokens: 4 * 2048 * 16,
		Fill:        0.73,
		SharedPrefix: SharedPrefixParams{
			SystemTokens:   4000,
			QuestionTokens: Dist{Mean: 400, Std: 200, Min: 50, Max: 1200, LogNormal: true},
			OutputTokens:   64,
		},
		Agent: AgentParams{
			SystemTokens:  6000,
			ContextTokens: Dist{Mean: 1000, Std: 500, Min: 100, Max: 4000, LogNormal: true},
			FanOut:        8,
			CallTokens:    Dist{Mean: 200, Std: 100, Min: 20, Max: 800, LogNormal: true},
			OutputTokens:  64,
			Jitter:        50 * time.Millisecond,
		},
		DocQA: DocQAParams{
			DocTokens:      Dist{Mean: 12000, Std: 6000, Min: 2000, Max: 32000},
			QuestionTokens: Dist{Mean: 100, Std: 50, Min: 10, Max: 400, LogNormal: true},
			OutputTokens:   128,
		},
		Chat: ChatParams{
			Systems:      4,
			SystemTokens: 1000,
			FirstTokens:  Dist{Mean: 2000, Std: 1250, Min: 250, Max: 7500, LogNormal: true},
			TurnTokens:   Dist{Mean: 50, Std: 40, Min: 10, Max: 1000, LogNormal: true},
			Turns:        Dist{Mean: 4, Std: 2.5, Min: 1, Max: 15, LogNormal: true},
			Think:        Dist{Mean: 5, Std: 4, Min: 1, Max: 30, LogNormal: true},
			OutputTokens: Dist{Mean: 150, Std: 75, Min: 10, Max: 500},
		},
		NoReuse: NoReuseParams{
			PromptTokens: Dist{Mean: 2000, Std: 1000, Min: 100, Max: 8000, LogNormal: true},
			OutputTokens: 64,
		},
		MultiLoRA: MultiLoRAParams{
			Adapters:       []string{"lora-a", "lora-b"},
			SystemTokens:   3000,
			QuestionTokens: Dist{Mean: 300, Std: 150, Min: 50, Max: 900, LogNormal: true},
			OutputTokens:   64,
		},
		Agentic: DefaultAgenticParams(),
	}
}

// Generate builds the named workload. The result depends only on c and
// the state of r.
func Generate(name string, c Config, r *rand.Rand) (Schedule, error) {
	if c.Rate <= 0 || c.Duration <= 0 {
		return Schedule{}, fmt.Errorf("workload %s: rate %v and duration %v must be positive", name, c.Rate, c.Duration)
	}
	var s Schedule
	switch name {
	case "shared-prefix":
		s = SharedPrefix(c, r)
	case "agent-fanout":
		s = AgentFanOut(c, r)
	case "doc-qa":
		s = DocQA(c, r)
	case "multi-turn-chat":
		s = MultiTurnChat(c, r)
	case "no-reuse":
		s = NoReuse(c, r)
	case "multi-lora":
		s = MultiLoRA(c, r)
	case "agentic":
		s = Agentic(c, r)
	default:
		return Schedule{}, fmt.Errorf("unknown workload %q (have %v, or mooncake with a trace)", name, Workloads)
	}
	if len(s.Sessions) == 0 {
		return s, fmt.Errorf("workload %s: no requests in %v at %v/s", name, c.Duration, c.Rate)
	}
	return s, nil
}

// prefixCount is how many distinct prefixes of size tokens fill c's cache.
func (c Config) prefixCount(tokens int) int {
	if c.CacheTokens <= 0 || tokens <= 0 {
		return 1
	}
	return max(1, int(float64(c.CacheTokens)*c.Fill)/tokens)
}

// clip cuts p to c.MaxPromptTokens, keeping its head (the shared prefix).
func (c Config) clip(p []uint32) []uint32 {
	if c.MaxPromptTokens > 0 && len(p) > c.MaxPromptTokens {
		return p[:c.MaxPromptTokens]
	}
	return p
}

// SharedPrefix: each request is one group's system prompt plus a fresh
// question; groups are picked uniformly.
func SharedPrefix(c Config, r *rand.Rand) Schedule {
	p := c.SharedPrefix
	groups := p.Groups
	if groups <= 0 {
		groups = c.prefixCount(p.SystemTokens + int(p.QuestionTokens.Mean))
	}
	systems := make([][]uint32, groups)
	for i := range systems {
		systems[i] = randomTokens(r, p.SystemTokens)
	}
	s := Schedule{Workload: "shared-prefix"}
	for i, at := range poisson(r, c.Rate, c.Duration, c.MaxRequests) {
		g := r.IntN(groups)
		prompt := c.clip(concat(systems[g], randomTokens(r, p.QuestionTokens.Int(r))))
		s.Sessions = append(s.Sessions, Session{ID: sessionID(fmt.Sprintf("g%d", g), i), At: at, Group: fmt.Sprintf("g%d", g),
			Turns: []Turn{{Prompt: prompt, MaxTokens: p.OutputTokens}}})
	}
	return s
}

// AgentFanOut: tasks arrive as a Poisson process of rate Rate/FanOut; each
// picks an agent and sends FanOut calls within Jitter that share the
// agent's system prompt and the task's context.
func AgentFanOut(c Config, r *rand.Rand) Schedule {
	p := c.Agent
	fan := max(1, p.FanOut)
	agents := p.Agents
	if agents <= 0 {
		agents = c.prefixCount(p.SystemTokens + int(p.ContextTokens.Mean))
	}
	systems := make([][]uint32, agents)
	for i := range systems {
		systems[i] = randomTokens(r, p.SystemTokens)
	}
	s := Schedule{Workload: "agent-fanout"}
	limit := 0
	if c.MaxRequests > 0 {
		limit = (c.MaxRequests + fan - 1) / fan
	}
	for t, at := range poisson(r, c.Rate/float64(fan), c.Duration, limit) {
		a := r.IntN(agents)
		task := concat(systems[a], randomTokens(r, p.ContextTokens.Int(r)))
		for k := range fan {
			if c.MaxRequests > 0 && len(s.Sessions) >= c.MaxRequests {
				break
			}
			off := time.Duration(0)
			if p.Jitter > 0 {
				off = time.Duration(r.Int64N(int64(p.Jitter)))
			}
			prompt := c.clip(concat(task, randomTokens(r, p.CallTokens.Int(r))))
			s.Sessions = append(s.Sessions, Session{ID: fmt.Sprintf("a%d-t%d-c%d", a, t, k), At: at + off,
				Turns: []Turn{{Prompt: prompt, MaxTokens: p.OutputTokens}}})
		}
	}
	sortSessions(s.Sessions)
	return s
}

// DocQA: questions arrive as a Poisson process; each picks a document
// uniformly and asks a fresh question after it.
func DocQA(c Config, r *rand.Rand) Schedule {
	p := c.DocQA
	docs := p.Docs
	if docs <= 0 {
		docs = c.prefixCount(int(p.DocTokens.Mean))
	}
	texts := make([][]uint32, docs)
	for i := range texts {
		texts[i] = randomTokens(r, p.DocTokens.Int(r))
	}
	s := Schedule{Workload: "doc-qa"}
	for i, at := range poisson(r, c.Rate, c.Duration, c.MaxRequests) {
		d := r.IntN(docs)
		q := randomTokens(r, p.QuestionTokens.Int(r))
		doc := texts[d]
		if c.MaxPromptTokens > 0 && len(doc)+len(q) > c.MaxPromptTokens {
			doc = doc[:max(0, c.MaxPromptTokens-len(q))]
		}
		s.Sessions = append(s.Sessions, Session{ID: sessionID(fmt.Sprintf("d%d", d), i), At: at, Group: fmt.Sprintf("d%d", d),
			Turns: []Turn{{Prompt: concat(doc, q), MaxTokens: p.OutputTokens}}})
	}
	return s
}

// MultiTurnChat: conversations start as a Poisson process of rate
// Rate / Turns.Mean; each turn is sent after the previous answer plus a
// think time, and carries the whole history.
func MultiTurnChat(c Config, r *rand.Rand) Schedule {
	p := c.Chat
	systems := make([]string, max(1, p.Systems))
	for i := range systems {
		systems[i] = randomText(r, p.SystemTokens)
	}
	mean := max(1, p.Turns.Mean)
	s := Schedule{Workload: "multi-turn-chat"}
	n := 0
	for i, at := range poisson(r, c.Rate/mean, c.Duration, 0) {
		if c.MaxRequests > 0 && n >= c.MaxRequests {
			break
		}
		turns := p.Turns.Int(r)
		if c.MaxRequests > 0 {
			turns = min(turns, c.MaxRequests-n)
		}
		x := Session{ID: sessionID("conv", i), At: at, Kind: Chat, System: systems[r.IntN(len(systems))]}
		for k := range turns {
			t := Turn{MaxTokens: p.OutputTokens.Int(r)}
			if k == 0 {
				t.User = randomText(r, p.FirstTokens.Int(r))
			} else {
				t.User = randomText(r, p.TurnTokens.Int(r))
				t.Think = time.Duration(p.Think.Sample(r) * float64(time.Second))
			}
			x.Turns = append(x.Turns, t)
		}
		n += turns
		s.Sessions = append(s.Sessions, x)
	}
	return s
}

// NoReuse: independent random prompts.
func NoReuse(c Config, r *rand.Rand) Schedule {
	p := c.NoReuse
	s := Schedule{Workload: "no-reuse"}
	for i, at := range poisson(r, c.Rate, c.Duration, c.MaxRequests) {
		s.Sessions = append(s.Sessions, Session{ID: sessionID("r", i), At: at,
			Turns: []Turn{{Prompt: c.clip(randomTokens(r, p.PromptTokens.Int(r))), MaxTokens: p.OutputTokens}}})
	}
	return s
}

// MultiLoRA: each request is one group's system prompt plus a fresh
// question, for the base model or one of the adapters; group and model are
// picked uniformly and independently.
func MultiLoRA(c Config, r *rand.Rand) Schedule {
	p := c.MultiLoRA
	models := append([]string{""}, p.Adapters...)
	groups := p.Groups
	if groups <= 0 {
		groups = max(1, c.prefixCount(p.SystemTokens+int(p.QuestionTokens.Mean))/len(models))
	}
	systems := make([][]uint32, groups)
	for i := range systems {
		systems[i] = randomTokens(r, p.SystemTokens)
	}
	s := Schedule{Workload: "multi-lora"}
	for i, at := range poisson(r, c.Rate, c.Duration, c.MaxRequests) {
		g, m := r.IntN(groups), models[r.IntN(len(models))]
		prompt := c.clip(concat(systems[g], randomTokens(r, p.QuestionTokens.Int(r))))
		name := m
		if name == "" {
			name = "base"
		}
		group := fmt.Sprintf("%s-g%d", name, g)
		s.Sessions = append(s.Sessions, Session{ID: sessionID(group, i), At: at, Model: m, Group: group,
			Turns: []Turn{{Prompt: prompt, MaxTokens: p.OutputTokens}}})
	}
	return s
}
