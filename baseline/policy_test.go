package baseline

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

var t0 = time.Unix(1_700_000_000, 0)

func podsWith(inflight ...int) []Pod {
	out := make([]Pod, len(inflight))
	for i, n := range inflight {
		out[i] = Pod{Name: fmt.Sprintf("pod%d", i+1), InFlight: n}
	}
	return out
}

func TestRoundRobin(t *testing.T) {
	var p RoundRobin
	var got []int
	for range 7 {
		got = append(got, p.Pick(Request{}, podsWith(0, 0, 0), t0))
	}
	if d := cmp.Diff([]int{0, 1, 2, 0, 1, 2, 0}, got); d != "" {
		t.Errorf("RoundRobin picks (-want +got):\n%s", d)
	}
}

func TestLeastLoaded(t *testing.T) {
	tests := []struct {
		name     string
		inflight []int
		want     int
	}{
		{"all idle: lowest index", []int{0, 0, 0}, 0},
		{"one lighter", []int{3, 1, 2}, 1},
		{"tie between two: lowest index", []int{2, 1, 1}, 1},
		{"last", []int{5, 5, 4}, 2},
		{"single pod", []int{9}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (LeastLoaded{}).Pick(Request{}, podsWith(tt.inflight...), t0); got != tt.want {
				t.Errorf("Pick(inflight %v) = %d; want %d", tt.inflight, got, tt.want)
			}
		})
	}
}

// ringHash lays the ring out by hand: "a0" → 100, "b0" → 200, "c0" → 300;
// any other string is parsed as the number it is (a request key).
func ringHash(s string) uint64 {
	switch s {
	case "a0":
		return 100
	case "b0":
		return 200
	case "c0":
		return 300
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(s, "m"), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

func TestCHWBLWalk(t *testing.T) {
	c := newCHWBL([]string{"a", "b", "c"}, CHWBLConfig{Replication: 1, LoadFactor: 1.25}, ringHash)
	tests := []struct {
		name  string
		key   uint64
		loads []int
		want  int
	}{
		{"owner when idle", 150, []int{0, 0, 0}, 1},
		{"exact vnode hash", 200, []int{0, 0, 0}, 1},
		{"wraps past the last vnode", 350, []int{0, 0, 0}, 0},
		// total 3: bound (3+1)/3*1.25 = 1.67; b holds 3, so c.
		{"owner over the bound walks on", 150, []int{0, 3, 0}, 2},
		// total 4: bound 2.08; b (2) passes.
		{"owner at the bound keeps it", 150, []int{1, 2, 1}, 1},
		// total 6: bound 2.92; b 3 and c 3 fail, a wraps in.
		{"walks around the ring", 150, []int{0, 3, 3}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := c.walk(tt.key, tt.loads); got != tt.want {
				t.Errorf("walk(%d, %v) = %d; want %d", tt.key, tt.loads, got, tt.want)
			}
		})
	}
}

func TestCHWBLKeyUsesFirst100Chars(t *testing.T) {
	c := NewCHWBL([]string{"a", "b", "c"}, CHWBLConfig{})
	base := strings.Repeat("é", 100) // 100 characters, 200 bytes
	k := c.Key(Request{Model: "m", FirstUser: base + " tail one"})
	if got := c.Key(Request{Model: "m", FirstUser: base + " another tail"}); got != k {
		t.Error("requests sharing 100 characters hash differently")
	}
	if got := c.Key(Request{Model: "m", FirstUser: base[:len(base)-2] + "x tail"}); got == k {
		t.Error("a change in character 100 did not change the key")
	}
	if got := c.Key(Request{Model: "other", FirstUser: base}); got == k {
		t.Error("the model does not enter the key")
	}
}

func TestCHWBLSpreadsAndSticks(t *testing.T) {
	names := []string{"pod1", "pod2", "pod3"}
	c := NewCHWBL(names, CHWBLConfig{})
	counts := make([]int, 3)
	for i := range 3000 {
		req := Request{Model: "m", FirstUser: fmt.Sprintf("conversation %d system prompt", i)}
		first := c.Pick(req, podsWith(0, 0, 0), t0)
		if again := c.Pick(req, podsWith(0, 0, 0), t0); again != first {
			t.Fatalf("same prefix, idle pods: %d then %d", first, again)
		}
		counts[first]++
	}
	for i, n := range counts {
		// 256 vnodes per pod keep every share within a few percent of 1/3.
		if n < 800 || n > 1200 {
			t.Errorf("pod %d got %d of 3000 distinct prefixes; want about 1000", i, n)
		}
	}
}

func TestCHWBLBoundedUnderHotPrefix(t *testing.T) {
	c := NewCHWBL([]string{"pod1", "pod2", "pod3", "pod4"}, CHWBLConfig{})
	req := Request{Model: "m", FirstUser: "the one system prompt everybody shares"}
	loads := []int{0, 0, 0, 0}
	for range 40 { // 40 concurrent requests, none finishes
		loads[c.Pick(req, podsWith(loads...), t0)]++
	}
	for i, l := range loads {
		// mean 10; the bound (39+1)/4*1.25 = 12.5 admits at most 12 (13 is
		// already over it when the 13th would be counted).
		if l > 13 {
			t.Errorf("pod %d holds %d of 40 hot-prefix requests; loads %v exceed the 1.25 bound", i, l, loads)
		}
	}
}

func approxPods(waiting []float64, kv []float64) []Pod {
	out := make([]Pod, len(waiting))
	for i := range out {
		out[i] = Pod{Name: fmt.Sprintf("pod%d", i+1), Load: Load{Waiting: waiting[i], KVUsage: kv[i]}}
	}
	return out
}

func TestApproxHashes(t *testing.T) {
	a := NewApproxPrefix(2, ApproxConfig{}, rand.New(rand.NewPCG(1, 1)))
	in := strings.Repeat("x", 64*3+10)
	h := a.Hashes(Request{Model: "m", Input: in})
	if len(h) != 3 {
		t.Fatalf("%d bytes gave %d blocks; want 3 full blocks", len(in), len(h))
	}
	// Chained: equal blocks still hash differently by position.
	if h[0] == h[1] || h[1] == h[2] {
		t.Errorf("hashes %v: equal blocks at different positions collide", h)
	}
	longer := a.Hashes(Request{Model: "m", Input: in + strings.Repeat("y", 200)})
	if d := cmp.Diff(h, longer[:3]); d != "" {
		t.Errorf("an extended prompt changed its leading hashes:\n%s", d)
	}
	if other := a.Hashes(Request{Model: "n", Input: in}); other[0] == h[0] {
		t.Error("the model does not seed the chain")
	}
	if salted := a.Hashes(Request{Model: "m", Salt: "s", Input: in}); salted[0] == h[0] {
		t.Error("cache_salt does not seed the chain")
	}
	if got := len(a.Hashes(Request{Model: "m", Input: strings.Repeat("z", 64*300)})); got != 256 {
		t.Errorf("300 blocks truncated to %d; want 256", got)
	}
}

func TestApproxScores(t *testing.T) {
	a := NewApproxPrefix(3, ApproxConfig{}, rand.New(rand.NewPCG(1, 1)))
	req := Request{Model: "m", Input: strings.Repeat("a", 64*4)}
	hashes := a.Hashes(req)
	a.lru[1].add(hashes[:2]) // pod2 holds half the prompt
	a.lru[2].add(hashes)     // pod3 all of it
	got := a.Scores(hashes, approxPods([]float64{0, 2, 4}, []float64{0, 0.5, 1}))
	want := []float64{
		2*1 + 2*1 + 3*0, // emptiest queue, empty cache, no prefix
		2*0.5 + 2*0.5 + 3*0.5,
		2*0 + 2*0 + 3*1,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Scores (-want +got):\n%s", d)
	}
	// Equal queues score 1 each, not 0 or NaN.
	if got := a.Scores(nil, approxPods([]float64{3, 3}, []float64{0, 0})); got[0] != 4 || got[1] != 4 {
		t.Errorf("Scores with equal queues = %v; want [4 4]", got)
	}
}

func TestApproxFollowsHistory(t *testing.T) {
	a := NewApproxPrefix(3, ApproxConfig{}, rand.New(rand.NewPCG(7, 7)))
	idle := approxPods([]float64{0, 0, 0}, []float64{0, 0, 0})
	req := Request{Model: "m", Input: strings.Repeat("shared system prompt ", 40)}
	first := a.Pick(req, idle, t0)
	for i := range 5 {
		if got := a.Pick(req, idle, t0); got != first {
			t.Fatalf("repeat %d went to %d; want %d where it was sent first", i, got, first)
		}
	}
	// A queue on the holder outweighs the prefix: queue 2 + kv 2 beat 3.
	busy := approxPods([]float64{0, 0, 0}, []float64{0, 0, 0})
	busy[first].Load.Waiting = 10
	busy[first].Load.KVUsage = 1
	if got := a.Pick(req, busy, t0); got == first {
		t.Errorf("Pick = %d, the holder with a full queue and cache; want another pod", got)
	}
}

func TestApproxTiesSeeded(t *testing.T) {
	picks := func(seed uint64) []int {
		a := NewApproxPrefix(4, ApproxConfig{}, rand.New(rand.NewPCG(seed, seed)))
		var out []int
		for i := range 40 {
			// Distinct short prompts: no blocks, every pod ties.
			out = append(out, a.Pick(Request{Model: "m", Input: strconv.Itoa(i)}, approxPods(make([]float64, 4), make([]float64, 4)), t0))
		}
		return out
	}
	a, b := picks(1), picks(1)
	if d := cmp.Diff(a, b); d != "" {
		t.Errorf("same seed, different picks:\n%s", d)
	}
	seen := map[int]bool{}
	for _, p := range a {
		seen[p] = true
	}
	if len(seen) != 4 {
		t.Errorf("40 ties reached pods %v; want all 4", seen)
	}
}

func TestBlockLRU(t *testing.T) {
	l := newBlockLRU(3)
	l.add([]uint64{1, 2, 3})
	l.add([]uint64{1}) // refresh 1
	l.add([]uint64{4}) // evicts 2, the least recent
	if got := l.prefixLen([]uint64{1}); got != 1 {
		t.Errorf("refreshed 1 evicted")
	}
	if got := l.prefixLen([]uint64{2}); got != 0 {
		t.Errorf("2 should be evicted; prefixLen = %d", got)
	}
	if got := l.prefixLen([]uint64{3, 4, 1, 9}); got != 3 {
		t.Errorf("prefixLen([3 4 1 9]) = %d; want 3", got)
	}
	l.setCapacity(1)
	if l.len() != 1 {
		t.Errorf("len after shrinking to 1 = %d", l.len())
	}
}

// prefixMatcher holds the first n keys of any chain.
type prefixMatcher int

func (m prefixMatcher) PrefixLen(keys []blockkey.Key) int { return min(int(m), len(keys)) }

func TestPrecise(t *testing.T) {
	tokens := make([]uint32, 16*20+1) // 20 reusable blocks
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	req := Request{Model: "m", Tokens: tokens}
	tests := []struct {
		name     string
		match    []int
		inflight []int
		want     int
	}{
		{"longest match wins", []int{2, 15, 5}, []int{0, 0, 0}, 1},
		{"near-equal match: lighter pod", []int{10, 10, 0}, []int{3, 0, 0}, 1},
		// mean (30+1)/3 ≈ 10.3, bound max(12.9, 14.3); 30 in flight is over it.
		{"holder over the load bound", []int{20, 0, 0}, []int{30, 0, 0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms := make([]route.Matcher, len(tt.match))
			for i, m := range tt.match {
				ms[i] = prefixMatcher(m)
			}
			p := NewPrecise(PreciseConfig{Model: "m", Scheme: blockkey.Scheme{BlockSize: 16, Stride: 1}, Route: route.DefaultConfig()}, ms)
			got := p.Pick(req, podsWith(tt.inflight...), t0)
			switch {
			case tt.want >= 0 && got != tt.want:
				d, _ := p.Decide(req, podsWith(tt.inflight...), t0)
				t.Errorf("Pick = %d; want %d\n%s", got, tt.want, d.Table())
			case tt.want < 0 && got == 0:
				t.Errorf("Pick = 0, the overloaded holder")
			}
		})
	}
}

// tierFake holds the first gpu keys of any chain on its GPU and the cpu
// keys after them on its CPU tier.
type tierFake struct{ gpu, cpu int }

func (m tierFake) PrefixLen(keys []blockkey.Key) int { return min(m.gpu, len(keys)) }
func (m tierFake) Ranks() int                        { return 1 }
func (m tierFake) TierPrefix(keys []blockkey.Key, _ int) (int, int, int) {
	g := min(m.gpu, len(keys))
	return g, min(m.cpu, len(keys)-g), 0
}

// A pod holding the prompt on its CPU tier wins over a short GPU match for
// central-precise (route credits the load at its cost), and loses it when
// the index is read GPU-only (central-precise-gpu-only).
func TestPreciseTiers(t *testing.T) {
	tokens := make([]uint32, 16*20+1)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	req := Request{Model: "m", Tokens: tokens}
	pods := []route.Matcher{tierFake{gpu: 0, cpu: 20}, tierFake{gpu: 15}}
	cfg := PreciseConfig{Model: "m", Scheme: blockkey.Scheme{BlockSize: 16, Stride: 1}, Route: route.DefaultConfig()}
	if got := NewPrecise(cfg, pods).Pick(req, podsWith(0, 0), t0); got != 0 {
		t.Errorf("tier-aware Pick = %d; want 0, the CPU holder", got)
	}
	gpuOnly := []route.Matcher{GPUOnly{pods[0]}, GPUOnly{pods[1]}}
	if got := NewPrecise(cfg, gpuOnly).Pick(req, podsWith(0, 0), t0); got != 1 {
		t.Errorf("GPU-only Pick = %d; want 1, the GPU holder", got)
	}
}

func TestPreciseKeysMatchScheme(t *testing.T) {
	tokens := make([]uint32, 200)
	p := NewPrecise(PreciseConfig{Model: "m"}, nil)
	want := blockkey.DefaultScheme().Request(blockkey.Root("m", "", ""), tokens)
	if d := cmp.Diff(want, p.Keys(Request{Model: "m", Tokens: tokens})); d != "" {
		t.Errorf("Keys (-want +got):\n%s", d)
	}
	lora := p.Keys(Request{Model: "adapter", Tokens: tokens})
	if len(lora) == 0 || lora[0] == want[0] {
		t.Error("another model is not keyed as a LoRA adapter")
	}
	if p.Keys(Request{Model: "m"}) != nil {
		t.Error("keys without tokens")
	}
}

func TestPreciseSpeculates(t *testing.T) {
	tokens := make([]uint32, 16*8+1)
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	rc := route.DefaultRecentConfig()
	p := NewPrecise(PreciseConfig{Model: "m", Route: route.DefaultConfig(), Recent: &rc},
		[]route.Matcher{prefixMatcher(0), prefixMatcher(0), prefixMatcher(0)})
	req := Request{Model: "m", Tokens: tokens}
	first := p.Pick(req, podsWith(0, 0, 0), t0)
	// Before any event arrives, the follow-up goes where the first went,
	// even though that pod is now the busiest.
	inflight := []int{0, 0, 0}
	inflight[first] = 1
	if got := p.Pick(req, podsWith(inflight...), t0.Add(time.Second)); got != first {
		t.Errorf("follow-up Pick = %d; want %d (speculative entry)", got, first)
	}
}

func TestRequestFrom(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		chat      bool
		wantFirst string
		wantInput string
		wantToks  int
	}{
		{"completion text", `{"model":"m","prompt":"hello there"}`, false, "hello there", "hello there", 0},
		{"completion tokens", `{"model":"m","prompt":[1,22,333]}`, false, "1,22,333", "1,22,333", 3},
		{"chat string content", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"user","content":"again"}]}`,
			true, "hi", `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},{"role":"user","content":"again"}]`, 0},
		{"chat parts", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]}`,
			true, "a\nb", `[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]`, 0},
		{"chat without user", `{"messages":[ {"role":"system", "content":"x"} ]}`, true, "", `[{"role":"system","content":"x"}]`, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := prompt.Parse([]byte(tt.body), tt.chat)
			if err != nil {
				t.Fatal(err)
			}
			r := requestFrom(p)
			if r.FirstUser != tt.wantFirst || r.Input != tt.wantInput || len(r.Tokens) != tt.wantToks {
				t.Errorf("requestFrom(%s) = {FirstUser %q, Input %q, %d tokens}; want {%q, %q, %d}",
					tt.body, r.FirstUser, r.Input, len(r.Tokens), tt.wantFirst, tt.wantInput, tt.wantToks)
			}
		})
	}
}

func FuzzRequestFrom(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), false)
	f.Add([]byte(`{"prompt":[[1,2]]}`), false)
	f.Add([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`), true)
	f.Add([]byte(`{"messages":[{"role":"user","content":7}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := prompt.Parse(body, chat)
		if err != nil {
			return
		}
		r := requestFrom(p)
		if !chat && p.Tokens == nil && r.Input != p.Text {
			t.Errorf("completion Input %q != prompt %q", r.Input, p.Text)
		}
		// Every policy must take whatever came out.
		pods := podsWith(1, 0, 2)
		NewCHWBL([]string{"a", "b", "c"}, CHWBLConfig{}).Pick(r, pods, t0)
		NewApproxPrefix(3, ApproxConfig{}, rand.New(rand.NewPCG(1, 1))).Pick(r, pods, t0)
	})
}

// TestPreciseExactLoad: a scrape says pod1 is busy, but nothing this router
// sent is in flight there any more. central-exact believes its own count;
// central-precise believes the scrape.
func TestPreciseExactLoad(t *testing.T) {
	tokens := make([]uint32, 16*8+1)
	pods := podsWith(0, 1, 1)
	pods[0].Load, pods[0].LoadAt = Load{Running: 6, Waiting: 2}, t0.Add(-100*time.Millisecond)
	for _, tc := range []struct {
		exact bool
		want  string
	}{{false, "pod2"}, {true, "pod1"}} {
		p := NewPrecise(PreciseConfig{Model: "m", Route: route.DefaultConfig(), ExactLoad: tc.exact},
			[]route.Matcher{prefixMatcher(0), prefixMatcher(0), prefixMatcher(0)})
		d, _ := p.Decide(Request{Model: "m", Tokens: tokens}, pods, t0)
		if d.Target != tc.want && !(tc.want == "pod2" && d.Target == "pod3") {
			t.Errorf("ExactLoad %v: target %s; want %s\n%s", tc.exact, d.Target, tc.want, d.Table())
		}
	}
}

// setMatcher holds the keys in it.
type setMatcher map[blockkey.Key]bool

func (m setMatcher) PrefixLen(keys []blockkey.Key) int {
	n := 0
	for n < len(keys) && m[keys[n]] {
		n++
	}
	return n
}

// A batch goes whole to the pod whose matches over all its prompts sum
// highest, not to the pod holding the most of one prompt.
func TestPreciseBatchSumsMatches(t *testing.T) {
	prompt := func(seed uint32) []uint32 {
		out := make([]uint32, 16*12+1)
		for i := range out {
			out[i] = seed*1000 + uint32(i)
		}
		return out
	}
	a, b := prompt(1), prompt(2)
	rc := route.DefaultRecentConfig()
	p := NewPrecise(PreciseConfig{Model: "m", Scheme: blockkey.Scheme{BlockSize: 16, Stride: 1}, Route: route.DefaultConfig(), Recent: &rc}, nil)
	ka, kb := p.Keys(Request{Model: "m", Tokens: a}), p.Keys(Request{Model: "m", Tokens: b})
	holds := func(chains ...[]blockkey.Key) setMatcher {
		m := setMatcher{}
		for _, c := range chains {
			for _, k := range c {
				m[k] = true
			}
		}
		return m
	}
	// pod1 holds all of a (12 keys), pod2 8 keys of each (16), pod3 none.
	p.indexes = []route.Matcher{holds(ka), holds(ka[:8], kb[:8]), holds()}
	req := Request{Model: "m", Batch: [][]uint32{a, b}}
	d, _ := p.Decide(req, podsWith(0, 0, 0), t0)
	if d.Target != "pod2" || d.Candidates[1].MatchedKeys != 16 || d.Candidates[0].MatchedKeys != 12 {
		t.Fatalf("batch went to %s; want pod2 (16 keys over both prompts against 12)\n%s", d.Target, d.Table())
	}
	if p.Pick(req, podsWith(0, 0, 0), t0) != 1 {
		t.Fatal("Pick disagrees with Decide")
	}
	// Each prompt was recorded as its own chain: a follow-up with prompt b
	// alone finds pod2's recent forward of all of b.
	p.indexes = []route.Matcher{holds(), holds(), holds()}
	if d, _ := p.Decide(Request{Model: "m", Tokens: b}, podsWith(0, 1, 0), t0.Add(time.Second)); d.Target != "pod2" || d.Candidates[1].MatchedKeys != len(kb) {
		t.Errorf("follow-up of a batched prompt: %s\n%s", d.Target, d.Table())
	}
	// A prompt whose tokens are unknown counts nothing.
	if d, _ := p.Decide(Request{Model: "m", Batch: [][]uint32{nil, b}}, podsWith(0, 0, 0), t0); d.Candidates[1].MatchedKeys != 0 && d.Candidates[1].MatchedKeys != len(kb) {
		t.Errorf("unknown prompt: %+v", d.Candidates[1])
	}
}

// Images key the blocks they overlap with their identifiers, and the
// salt the first block, as the index keys vLLM's blocks.
func TestPreciseKeysImagesAndSalt(t *testing.T) {
	tokens := make([]uint32, 16*8+1)
	p := NewPrecise(PreciseConfig{Model: "m"}, nil)
	s := blockkey.DefaultScheme()
	root := blockkey.ModelRoot("m", "m")
	mm := []blockkey.MM{{ID: "img", Offset: 40, Length: 20}}
	if d := cmp.Diff(s.RequestMM(root, tokens, mm, "salt"), p.Keys(Request{Model: "m", Tokens: tokens, MM: mm, Salt: "salt"})); d != "" {
		t.Errorf("Keys with an image and a salt (-want +got):\n%s", d)
	}
	// Two images in block 6: the key of blocks 0-3 is shared, the next not.
	a := p.Keys(Request{Model: "m", Tokens: tokens, MM: []blockkey.MM{{ID: "a", Offset: 100, Length: 20}}})
	b := p.Keys(Request{Model: "m", Tokens: tokens, MM: []blockkey.MM{{ID: "b", Offset: 100, Length: 20}}})
	if len(a) != 2 || a[0] != b[0] || a[1] == b[1] {
		t.Errorf("keys %v and %v; want the first shared and the second not", a, b)
	}
}
