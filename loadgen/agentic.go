package loadgen

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"strings"
	"time"
)

// AgenticParams: coding agents as Claude Code and Codex drive vLLM, half
// through Anthropic's Messages API and half through OpenAI's Responses
// API. Each session is one agent's tool loop: the user's task, then the
// assistant's answer with a tool call, the tool's result, the next answer
// and call, ... until a last answer; every request carries the agent's long
// system prompt and tool list (rendered into the prompt before the
// conversation, so they are the prefix every session of the agent shares)
// and the history so far, which grows by each turn's actual answer. Some
// sessions fan a turn out to parallel sub-agents that start from the
// parent's conversation; some turns carry an image; some Responses
// sessions continue a stored response with previous_response_id instead of
// resending the history.
type AgenticParams struct {
	// Agents is the number of agent types: each has its own system prompt,
	// tools and reference images.
	Agents       int // default 3
	SystemTokens int // default 1200
	// Tools per agent (besides "task", which starts sub-agents), each with
	// about ToolTokens words of description and parameter docs.
	Tools      int // default 10
	ToolTokens int // default 120
	// TaskTokens is the user's task, ResultTokens one tool result.
	TaskTokens   Dist // default mean 150
	ResultTokens Dist // default mean 800, 20..2400
	// Turns is the requests of one session (the last answers without a
	// call).
	Turns        Dist // default mean 6, 3..9
	OutputTokens Dist // default mean 60, 16..256
	// Think is the seconds a tool runs between an answer and the next
	// request.
	Think Dist // default mean 0.4, 0.05..2
	// FanOut is the fraction of sessions with a turn whose call starts
	// SubAgents sub-agents of SubTurns requests each.
	FanOut    float64 // default 0.3
	SubAgents Dist    // default 2..4
	SubTurns  Dist    // default mean 2, 1..3
	// Images is the fraction of turns that carry an image: on a session's
	// first turn one of the agent's reference images (the same bytes in
	// every session that shows it), later a screenshot of its own.
	// UUIDs is the fraction of Responses images sent with a uuid.
	Images float64 // default 0.15
	UUIDs  float64 // default 0.5
	// Continue is the fraction of Responses sessions that store their
	// answers and continue with previous_response_id (the simulators need
	// VLLM_ENABLE_RESPONSES_API_STORE=1).
	Continue float64 // default 0.5
	// Billing sends Claude Code's per-request billing header as the first
	// system block of every Messages request.
	Billing bool // default true
}

// DefaultAgenticParams sizes a 4-pod run at 8 requests/s for 30 s: about
// 30 sessions of ~8 requests (sub-agents included), prompts of 3k to ~12k
// tokens of which the agent's 2.4k are shared: a coding agent's history
// (file contents, command output) soon outweighs its system prompt, so
// most of a prompt is cached only where its session ran before.
func DefaultAgenticParams() AgenticParams {
	return AgenticParams{
		Agents:       3,
		SystemTokens: 1200,
		Tools:        10,
		ToolTokens:   120,
		TaskTokens:   Dist{Mean: 150, Std: 80, Min: 20, Max: 600, LogNormal: true},
		ResultTokens: Dist{Mean: 800, Std: 600, Min: 20, Max: 2400, LogNormal: true},
		Turns:        Dist{Mean: 6, Std: 2, Min: 3, Max: 9},
		OutputTokens: Dist{Mean: 60, Std: 30, Min: 16, Max: 256, LogNormal: true},
		Think:        Dist{Mean: 0.4, Std: 0.3, Min: 0.05, Max: 2, LogNormal: true},
		FanOut:       0.3,
		SubAgents:    Dist{Mean: 3, Std: 1, Min: 2, Max: 4},
		SubTurns:     Dist{Mean: 2, Std: 0.7, Min: 1, Max: 3},
		Images:       0.15,
		UUIDs:        0.5,
		Continue:     0.5,
		Billing:      true,
	}
}

// agentType is one agent's fixed part.
type agentType struct {
	system string
	tools  []Tool
	refs   []string // reference images, data URLs
}

// taskTool is the call that starts sub-agents, as Claude Code's Task tool.
const taskTool = "task"

func newAgentType(r *rand.Rand, p AgenticParams) agentType {
	a := agentType{system: randomText(r, p.SystemTokens)}
	for range max(0, p.Tools) {
		a.tools = append(a.tools, randomTool(r, randomWord(r)+"_"+randomWord(r), p.ToolTokens))
	}
	a.tools = append(a.tools, randomTool(r, taskTool, p.ToolTokens))
	for range 2 {
		a.refs = append(a.refs, randomImage(r))
	}
	return a
}

func randomWord(r *rand.Rand) string {
	var b [4]byte
	for i := range b {
		b[i] = letters[r.IntN(len(letters))]
	}
	return string(b[:])
}

// schemaProperty is one parameter of a tool schema; the order of fields is
// the order of the JSON keys.
type schemaProperty struct {
	Type        string `json:"type"`
	Description string `json:"description"`
}

// randomTool is a tool of about words words: a description and two to four
// string parameters, the first required.
func randomTool(r *rand.Rand, name string, words int) Tool {
	nparam := 2 + r.IntN(3)
	per := max(1, words/(2+nparam))
	var b bytes.Buffer
	b.WriteString(`{"type":"object","properties":{`)
	var first string
	for i := range nparam {
		name := randomWord(r) + fmt.Sprint(i) // distinct within the tool
		if i == 0 {
			first = name
		} else {
			b.WriteByte(',')
		}
		v, _ := json.Marshal(schemaProperty{Type: "string", Description: randomText(r, per)})
		fmt.Fprintf(&b, "%q:%s", name, v)
	}
	fmt.Fprintf(&b, `},"required":[%q]}`, first)
	return Tool{Name: name, Description: randomText(r, 2*per), Parameters: json.RawMessage(b.Bytes())}
}

// toolCall is a call of t with short random arguments for its parameters,
// in the schema's order.
func toolCall(r *rand.Rand, t Tool, id string) *ToolCall {
	var schema struct {
		Properties json.RawMessage `json:"properties"`
	}
	json.Unmarshal(t.Parameters, &schema)
	dec := json.NewDecoder(bytes.NewReader(schema.Properties))
	var b bytes.Buffer
	b.WriteByte('{')
	if tok, err := dec.Token(); err == nil && tok == json.Delim('{') {
		for n := 0; dec.More(); n++ {
			key, err := dec.Token()
			if err != nil {
				break
			}
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				break
			}
			if n > 0 {
				b.WriteByte(',')
			}
			v, _ := json.Marshal(randomText(r, 1+r.IntN(6)))
			fmt.Fprintf(&b, "%q:%s", key, v)
		}
	}
	b.WriteByte('}')
	return &ToolCall{ID: id, Name: t.Name, Arguments: json.RawMessage(b.Bytes())}
}

// randomImage is a 16x16 PNG of random pixels as a data URL: a real image
// (a real vLLM decodes it), small enough to cost nothing to send.
func randomImage(r *rand.Rand) string {
	im := image.NewNRGBA(image.Rect(0, 0, 16, 16))
	for i := range im.Pix {
		im.Pix[i] = uint8(r.IntN(256))
	}
	for i := 3; i < len(im.Pix); i += 4 {
		im.Pix[i] = 0xff
	}
	im.Set(0, 0, color.NRGBA{A: 0xff})
	var b bytes.Buffer
	png.Encode(&b, im) // writing to a bytes.Buffer cannot fail
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// meanRequests is a session's expected requests, sub-agents included.
func (p AgenticParams) meanRequests() float64 {
	return max(1, p.Turns.Mean) + p.FanOut*p.SubAgents.Mean*p.SubTurns.Mean
}

// Agentic: sessions arrive as a Poisson process of rate Rate divided by a
// session's mean requests; they alternate between Messages and Responses,
// pick an agent type uniformly, and run the agent's tool loop.
func Agentic(c Config, r *rand.Rand) Schedule {
	p := c.Agentic
	agents := make([]agentType, max(1, p.Agents))
	for i := range agents {
		agents[i] = newAgentType(r, p)
	}
	s := Schedule{Workload: "agentic"}
	budget := c.MaxRequests
	for i, at := range poisson(r, c.Rate/p.meanRequests(), c.Duration, 0) {
		if c.MaxRequests > 0 && budget <= 0 {
			break
		}
		a := r.IntN(len(agents))
		x := Session{At: at, Kind: Messages, System: agents[a].system, Tools: agents[a].tools, Billing: p.Billing}
		if i%2 == 1 {
			x.Kind, x.Billing = Responses, false
			x.Continue = r.Float64() < p.Continue
		}
		x.ID = sessionID(fmt.Sprintf("%s-a%d", x.Kind.String()[:1], a), i)
		g := agentGen{r: r, p: p, agent: agents[a], kind: x.Kind}
		x.Turns = g.turns(x.ID, p.Turns.Int(r), true)
		inherit(&x)
		if c.MaxRequests > 0 {
			budget -= trimSession(&x, budget)
		}
		s.Sessions = append(s.Sessions, x)
	}
	return s
}

// agentGen draws one session's turns.
type agentGen struct {
	r     *rand.Rand
	p     AgenticParams
	agent agentType
	kind  Kind
}

// callID is a tool call id in the API's own form.
func (g agentGen) callID(id string, k int) string {
	if g.kind == Messages {
		return fmt.Sprintf("toolu_%s_%d", strings.ReplaceAll(id, "-", ""), k)
	}
	return fmt.Sprintf("call_%s_%d", strings.ReplaceAll(id, "-", ""), k)
}

// image draws turn k's image, if it has one.
func (g agentGen) image(k int) []Image {
	if g.r.Float64() >= g.p.Images {
		return nil
	}
	im := Image{}
	if k == 0 {
		j := g.r.IntN(len(g.agent.refs))
		im.URL = g.agent.refs[j]
		if g.kind == Responses && g.r.Float64() < g.p.UUIDs {
			im.UUID = fmt.Sprintf("ref-%x", fnvString(im.URL))
		}
	} else {
		im.URL = randomImage(g.r)
		if g.kind == Responses && g.r.Float64() < g.p.UUIDs {
			im.UUID = fmt.Sprintf("shot-%x", fnvString(im.URL))
		}
	}
	return []Image{im}
}

func fnvString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// turns draws n turns of session id; top sessions may fan out once.
func (g agentGen) turns(id string, n int, top bool) []Turn {
	fan := -1
	if top && n >= 2 && g.r.Float64() < g.p.FanOut {
		fan = g.r.IntN(n - 1) // a turn with a next one, which reports the sub-agents' work
	}
	out := make([]Turn, n)
	for k := range out {
		t := Turn{MaxTokens: g.p.OutputTokens.Int(g.r)}
		if k == 0 {
			t.User = randomText(g.r, g.p.TaskTokens.Int(g.r))
		} else {
			t.Think = time.Duration(g.p.Think.Sample(g.r) * float64(time.Second))
			t.Result = randomText(g.r, g.p.ResultTokens.Int(g.r))
			if ims := g.image(k); ims != nil {
				t.User, t.Images = randomText(g.r, 8), ims
			}
		}
		if k == 0 {
			t.Images = g.image(0)
		}
		if k < n-1 {
			tool := g.agent.tools[g.r.IntN(len(g.agent.tools)-1)]
			if k == fan {
				tool = g.agent.tools[len(g.agent.tools)-1]
			}
			t.Call = toolCall(g.r, tool, g.callID(id, k))
		}
		if k == fan {
			t.Spawn = g.subAgents(id, k)
		}
		out[k] = t
	}
	if fan >= 0 {
		out[fan+1].Result = "" // the runner reports the sub-agents' answers
	}
	return out
}

// subAgents draws the sub-agents turn k of session id starts.
func (g agentGen) subAgents(id string, k int) []Session {
	n := g.p.SubAgents.Int(g.r)
	subs := make([]Session, n)
	for i := range subs {
		sid := fmt.Sprintf("%s.t%d.sub%d", id, k, i)
		subs[i] = Session{ID: sid, Turns: g.turns(sid, g.p.SubTurns.Int(g.r), false)}
	}
	return subs
}

// trimSession cuts x to at most budget requests (sub-agents counted) and
// returns the requests left: later turns go first, then sub-agents.
func trimSession(x *Session, budget int) int {
	n := 0
	for k := range x.Turns {
		if n >= budget {
			x.Turns = x.Turns[:k]
			break
		}
		n++
		t := &x.Turns[k]
		for i := range t.Spawn {
			if n >= budget {
				t.Spawn = t.Spawn[:i]
				break
			}
			n += trimSession(&t.Spawn[i], budget-n)
		}
	}
	if t := len(x.Turns) - 1; t >= 0 && len(x.Turns[t].Spawn) == 0 {
		x.Turns[t].Call = nil // the last answer makes no call (but one that starts sub-agents)
	}
	return n
}

// inherit gives every sub-agent its parent's kind, model, system prompt,
// tools and modes, recursively.
func inherit(x *Session) {
	for k := range x.Turns {
		for i := range x.Turns[k].Spawn {
			c := &x.Turns[k].Spawn[i]
			c.Kind, c.Model, c.System, c.Tools, c.Billing, c.Continue = x.Kind, x.Model, x.System, x.Tools, x.Billing, x.Continue
			inherit(c)
		}
	}
}
