package loadgen

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func rng(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 7)) }

func smallConfig() Config {
	c := DefaultConfig()
	c.Rate = 20
	c.Duration = 10 * time.Second
	return c
}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range Workloads {
		t.Run(name, func(t *testing.T) {
			a, err := Generate(name, smallConfig(), rng(1))
			if err != nil {
				t.Fatalf("Generate(%s) error %v", name, err)
			}
			// reflect, not go-cmp: a schedule holds millions of tokens.
			b, _ := Generate(name, smallConfig(), rng(1))
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("Generate(%s) differs for one seed", name)
			}
			c, _ := Generate(name, smallConfig(), rng(2))
			if reflect.DeepEqual(a, c) {
				t.Errorf("Generate(%s) equal for seeds 1 and 2", name)
			}
			if a.Workload != name {
				t.Errorf("Workload = %q; want %q", a.Workload, name)
			}
			if !slices.IsSortedFunc(a.Sessions, func(x, y Session) int { return int(x.At - y.At) }) {
				t.Errorf("sessions not in order of At")
			}
			for _, s := range a.Sessions {
				if s.At < 0 || s.At >= smallConfig().Duration {
					t.Fatalf("session %s at %v outside [0, %v)", s.ID, s.At, smallConfig().Duration)
				}
			}
		})
	}
}

func TestGenerateErrors(t *testing.T) {
	tests := []struct {
		name string
		wl   string
		edit func(*Config)
	}{
		{"unknown workload", "nope", func(*Config) {}},
		{"zero rate", "shared-prefix", func(c *Config) { c.Rate = 0 }},
		{"zero duration", "no-reuse", func(c *Config) { c.Duration = 0 }},
		{"no arrivals", "no-reuse", func(c *Config) { c.Rate = 0.001; c.Duration = time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := smallConfig()
			tt.edit(&c)
			if _, err := Generate(tt.wl, c, rng(1)); err == nil {
				t.Errorf("Generate(%s) = nil error; want one", tt.wl)
			}
		})
	}
}

func TestMaxRequests(t *testing.T) {
	for _, name := range Workloads {
		c := smallConfig()
		c.MaxRequests = 13
		s, err := Generate(name, c, rng(3))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Requests(); got != 13 {
			t.Errorf("%s: Requests() = %d; want 13", name, got)
		}
	}
}

func TestPoissonRate(t *testing.T) {
	at := poisson(rng(5), 50, 100*time.Second, 0)
	// 5000 expected; a Poisson count's sd is ~71, so ±5% is > 3 sd.
	if n := len(at); n < 4750 || n > 5250 {
		t.Errorf("poisson(50/s, 100s) gave %d arrivals; want ~5000", n)
	}
	if !slices.IsSorted(at) {
		t.Error("arrivals not sorted")
	}
	if got := len(poisson(rng(5), 50, 100*time.Second, 10)); got != 10 {
		t.Errorf("limit 10 gave %d", got)
	}
}

func TestDistBounds(t *testing.T) {
	tests := []Dist{
		{Mean: 100, Std: 500, Min: 10, Max: 200, LogNormal: true},
		{Mean: 100, Std: 500, Min: 10, Max: 200},
		{Mean: 7},
	}
	r := rng(9)
	for _, d := range tests {
		for range 1000 {
			v := d.Sample(r)
			if d.Std == 0 && v != d.Mean {
				t.Fatalf("%+v.Sample = %v; want %v", d, v, d.Mean)
			}
			if d.Std > 0 && (v < d.Min || v > d.Max) {
				t.Fatalf("%+v.Sample = %v outside bounds", d, v)
			}
		}
	}
}

func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSharedPrefixStructure(t *testing.T) {
	c := smallConfig()
	s := SharedPrefix(c, rng(1))
	sys := c.SharedPrefix.SystemTokens
	wantGroups := int(float64(c.CacheTokens)*c.Fill) / (sys + int(c.SharedPrefix.QuestionTokens.Mean))
	groups := map[string][]uint32{}
	for _, x := range s.Sessions {
		g, _, _ := strings.Cut(x.ID, "-")
		p := x.Turns[0].Prompt
		if prev, ok := groups[g]; ok {
			if n := commonPrefix(prev, p); n < sys {
				t.Fatalf("group %s: requests share %d tokens; want >= %d", g, n, sys)
			}
		}
		groups[g] = p
	}
	for g1, p1 := range groups {
		for g2, p2 := range groups {
			if g1 != g2 && commonPrefix(p1, p2) >= 16 {
				t.Fatalf("groups %s and %s share a first block", g1, g2)
			}
		}
	}
	// 200 requests over ~18 groups: every group appears.
	if len(groups) != wantGroups {
		t.Errorf("%d groups; want %d (cache %d × fill %.2f / prompt)", len(groups), wantGroups, c.CacheTokens, c.Fill)
	}
	// The distinct prefixes fill most of the cluster but not one pod.
	total := len(groups) * sys
	if total < c.CacheTokens/2 || total > c.CacheTokens {
		t.Errorf("distinct prefix tokens %d; want in [%d, %d]", total, c.CacheTokens/2, c.CacheTokens)
	}
}

func TestAgentFanOutSharesSystemPrompt(t *testing.T) {
	c := smallConfig()
	c.Agent.Agents = 3
	s := AgentFanOut(c, rng(1))
	byTask := map[string][][]uint32{}
	byAgent := map[int][][]uint32{}
	for _, x := range s.Sessions {
		var a, task, call int
		if _, err := fmt.Sscanf(x.ID, "a%d-t%d-c%d", &a, &task, &call); err != nil {
			t.Fatalf("session id %q: %v", x.ID, err)
		}
		p := x.Turns[0].Prompt
		byAgent[a] = append(byAgent[a], p)
		k := x.ID[:strings.LastIndex(x.ID, "-")]
		byTask[k] = append(byTask[k], p)
	}
	for a, ps := range byAgent {
		for _, p := range ps[1:] {
			if n := commonPrefix(ps[0], p); n < c.Agent.SystemTokens {
				t.Fatalf("agent %d calls share %d tokens; want >= system prompt %d", a, n, c.Agent.SystemTokens)
			}
		}
	}
	for k, ps := range byTask {
		if len(ps) != c.Agent.FanOut {
			t.Errorf("task %s has %d calls; want %d", k, len(ps), c.Agent.FanOut)
		}
		for _, p := range ps[1:] {
			if n := commonPrefix(ps[0], p); n < c.Agent.SystemTokens+int(c.Agent.ContextTokens.Min) {
				t.Fatalf("task %s calls share only %d tokens", k, n)
			}
			if n := commonPrefix(ps[0], p); n == len(p) {
				t.Fatalf("task %s: two calls are identical", k)
			}
		}
	}
}

func TestDocQAStructure(t *testing.T) {
	c := smallConfig()
	c.DocQA.Docs = 4
	c.MaxPromptTokens = 20000
	s := DocQA(c, rng(2))
	seen := map[string][]uint32{}
	for _, x := range s.Sessions {
		p := x.Turns[0].Prompt
		if len(p) > c.MaxPromptTokens {
			t.Fatalf("prompt of %d tokens over the %d cap", len(p), c.MaxPromptTokens)
		}
		d, _, _ := strings.Cut(x.ID, "-")
		if prev, ok := seen[d]; ok {
			if n := commonPrefix(prev, p); n < int(c.DocQA.DocTokens.Min) {
				t.Fatalf("doc %s questions share %d tokens", d, n)
			}
		}
		seen[d] = p
	}
	if len(seen) != 4 {
		t.Errorf("%d documents asked about; want 4", len(seen))
	}
}

func TestMultiTurnChatShape(t *testing.T) {
	c := smallConfig()
	s := MultiTurnChat(c, rng(4))
	multi := 0
	for _, x := range s.Sessions {
		if x.Kind != Chat || x.System == "" {
			t.Fatalf("session %s: kind %v system %q; want chat with a system prompt", x.ID, x.Kind, x.System)
		}
		if x.Turns[0].Think != 0 {
			t.Errorf("session %s: first turn thinks %v", x.ID, x.Turns[0].Think)
		}
		for k, tu := range x.Turns {
			if tu.User == "" || tu.MaxTokens < 1 {
				t.Fatalf("session %s turn %d: %+v", x.ID, k, tu)
			}
			if k > 0 && tu.Think < time.Second {
				t.Errorf("session %s turn %d: think %v below the 1s minimum", x.ID, k, tu.Think)
			}
		}
		if len(x.Turns) > 1 {
			multi++
		}
	}
	if multi == 0 {
		t.Error("no conversation has more than one turn")
	}
}

func TestNoReuseSharesNothing(t *testing.T) {
	s := NoReuse(smallConfig(), rng(6))
	firsts := map[[16]uint32]bool{}
	for _, x := range s.Sessions {
		var k [16]uint32
		copy(k[:], x.Turns[0].Prompt)
		if firsts[k] {
			t.Fatalf("two no-reuse prompts share their first block")
		}
		firsts[k] = true
	}
}

func TestRandomTextIsOneTokenPerWord(t *testing.T) {
	txt := randomText(rng(1), 50)
	words := 0
	for _, f := range strings.Fields(txt) {
		if len(f) != 4 {
			t.Fatalf("word %q; want four letters", f)
		}
		words++
	}
	if words != 50 {
		t.Errorf("%d words; want 50", words)
	}
}

// MultiLoRA sends the same system prompts to the base model and to every
// adapter: each model's requests share the group's prompt, and every
// (model, group) pair appears.
func TestMultiLoRAStructure(t *testing.T) {
	c := smallConfig()
	c.MultiLoRA.Groups = 4
	s := MultiLoRA(c, rng(1))
	sys := c.MultiLoRA.SystemTokens
	byGroup := map[string][]uint32{}
	pairs := map[string]bool{}
	for _, x := range s.Sessions {
		if x.Model != "" && !slices.Contains(c.MultiLoRA.Adapters, x.Model) {
			t.Fatalf("session %s: model %q; want base or one of %v", x.ID, x.Model, c.MultiLoRA.Adapters)
		}
		model, rest, _ := strings.Cut(x.ID, "-g")
		g, _, _ := strings.Cut(rest, "-")
		want := model
		if model == "base" {
			want = ""
		}
		if x.Model != want {
			t.Fatalf("session %s names model %q", x.ID, x.Model)
		}
		p := x.Turns[0].Prompt
		if prev, ok := byGroup[g]; ok && commonPrefix(prev, p) < sys {
			t.Fatalf("group %s: %s shares %d tokens with the group's prompt; want >= %d", g, x.ID, commonPrefix(prev, p), sys)
		}
		byGroup[g] = p
		pairs[x.Model+"/"+g] = true
	}
	if want := 4 * (1 + len(c.MultiLoRA.Adapters)); len(pairs) != want {
		t.Errorf("%d (model, group) pairs; want %d", len(pairs), want)
	}
	// Derived from the cache: one prefix per model and group.
	c.MultiLoRA.Groups = 0
	wantGroups := int(float64(c.CacheTokens)*c.Fill) / (sys + int(c.MultiLoRA.QuestionTokens.Mean)) / 3
	groups := map[string]bool{}
	for _, x := range MultiLoRA(c, rng(1)).Sessions {
		_, rest, _ := strings.Cut(x.ID, "-g")
		g, _, _ := strings.Cut(rest, "-")
		groups[g] = true
	}
	if len(groups) != wantGroups {
		t.Errorf("%d groups; want %d", len(groups), wantGroups)
	}
}

// The agentic workload: half the sessions per API; every session of an
// agent carries its system prompt and tools; a call on every turn but the
// last, with a result on the next; sub-agents of 2-4 inheriting the
// parent's modes; images (uuids only on Responses); previous_response_id
// continuation only on Responses; the billing header only on Messages.
func TestAgenticShape(t *testing.T) {
	c := smallConfig()
	c.Duration = 60 * time.Second
	s := Agentic(c, rng(8))
	p := c.Agentic
	kinds := map[Kind]int{}
	bySystem := map[string]string{}
	var fanned, images, uuids, continued, responses int
	var check func(x Session, sub bool)
	check = func(x Session, sub bool) {
		if x.Kind != Messages && x.Kind != Responses {
			t.Fatalf("%s: kind %v", x.ID, x.Kind)
		}
		if x.Continue && x.Kind != Responses || x.Billing && x.Kind != Messages {
			t.Errorf("%s: continue %v billing %v on %v", x.ID, x.Continue, x.Billing, x.Kind)
		}
		if len(x.Tools) != p.Tools+1 || x.Tools[len(x.Tools)-1].Name != taskTool {
			t.Fatalf("%s: %d tools; want %d and the task tool last", x.ID, len(x.Tools), p.Tools+1)
		}
		for _, tl := range x.Tools {
			if !json.Valid(tl.Parameters) {
				t.Fatalf("%s: tool %s schema %s", x.ID, tl.Name, tl.Parameters)
			}
		}
		if want, ok := bySystem[x.System]; ok && want != x.Tools[0].Name {
			t.Errorf("%s: one system prompt with two tool lists", x.ID)
		}
		bySystem[x.System] = x.Tools[0].Name
		if len(x.Turns) < 1 || x.Turns[0].User == "" {
			t.Fatalf("%s: first turn %+v; want a task", x.ID, x.Turns)
		}
		for k, tu := range x.Turns {
			last := k == len(x.Turns)-1
			if (tu.Call == nil) != last {
				t.Errorf("%s turn %d of %d: call %v", x.ID, k, len(x.Turns), tu.Call)
			}
			if tu.Call != nil && !json.Valid(tu.Call.Arguments) {
				t.Errorf("%s turn %d: arguments %s", x.ID, k, tu.Call.Arguments)
			}
			if k > 0 && (tu.Result == "") != (len(x.Turns[k-1].Spawn) > 0) {
				t.Errorf("%s turn %d: result %q after a turn with %d sub-agents", x.ID, k, tu.Result, len(x.Turns[k-1].Spawn))
			}
			if k > 0 && tu.Think <= 0 {
				t.Errorf("%s turn %d: no think time", x.ID, k)
			}
			for _, im := range tu.Images {
				images++
				if !strings.HasPrefix(im.URL, "data:image/png;base64,") {
					t.Errorf("%s: image %.30s", x.ID, im.URL)
				}
				if im.UUID != "" {
					uuids++
					if x.Kind != Responses {
						t.Errorf("%s: a uuid on a Messages image", x.ID)
					}
				}
			}
			if len(tu.Spawn) > 0 {
				if sub || tu.Call == nil || tu.Call.Name != taskTool || len(tu.Spawn) < 2 || len(tu.Spawn) > 4 {
					t.Errorf("%s turn %d: %d sub-agents by call %v", x.ID, k, len(tu.Spawn), tu.Call)
				}
				fanned++
				for _, c := range tu.Spawn {
					if c.Kind != x.Kind || c.System != x.System || c.Continue != x.Continue || c.Billing != x.Billing {
						t.Errorf("%s: sub-agent %s does not inherit its parent's modes", x.ID, c.ID)
					}
					check(c, true)
				}
			}
		}
	}
	for _, x := range s.Sessions {
		kinds[x.Kind]++
		if x.Kind == Responses {
			responses++
			if x.Continue {
				continued++
			}
		}
		check(x, false)
	}
	if d := kinds[Messages] - kinds[Responses]; d < 0 || d > 1 {
		t.Errorf("sessions per API %v; want half each", kinds)
	}
	if len(bySystem) != p.Agents {
		t.Errorf("%d system prompts; want %d agents", len(bySystem), p.Agents)
	}
	if fanned == 0 || images == 0 || uuids == 0 || uuids == images || continued == 0 || continued == responses {
		t.Errorf("fan-outs %d, images %d (uuids %d), continued %d of %d: want some of each", fanned, images, uuids, continued, responses)
	}
	// The arrival rate counts sub-agents' requests: ~Rate over the run.
	if rate := float64(s.Requests()) / c.Duration.Seconds(); rate < c.Rate*0.6 || rate > c.Rate*1.4 {
		t.Errorf("%.1f requests/s; want about %v", rate, c.Rate)
	}
}
