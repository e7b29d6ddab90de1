package baseline

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

func TestLMetricCost(t *testing.T) {
	tests := []struct {
		name               string
		uncached, inFlight int
		want               int
	}{
		{"idle pod: its uncached tokens", 300, 0, 300},
		{"busy pod multiplies", 300, 3, 1200},
		{"all cached but the floor: load still counts", 0, 4, 5},
		{"unknown tokens cost in-flight + 1", 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := lmetricCost(tt.uncached, tt.inFlight); got != tt.want {
				t.Errorf("lmetricCost(%d, %d) = %d; want %d", tt.uncached, tt.inFlight, got, tt.want)
			}
		})
	}
}

func TestCheapest(t *testing.T) {
	tests := []struct {
		name  string
		costs []int
		rank  []uint64
		want  int
	}{
		{"lowest cost", []int{9, 4, 7}, []uint64{9, 1, 9}, 1},
		{"tie to the highest rank", []int{4, 9, 4}, []uint64{1, 9, 2}, 2},
		{"tie, first ranks higher", []int{4, 4}, []uint64{5, 2}, 0},
		{"single pod", []int{7}, []uint64{0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cheapest(tt.costs, tt.rank); got != tt.want {
				t.Errorf("cheapest(%v, %v) = %d; want %d", tt.costs, tt.rank, got, tt.want)
			}
		})
	}
}

// seq returns n tokens from start on.
func seq(start uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = start + uint32(i)
	}
	return out
}

func lmetricFor(ms []route.Matcher, recent bool) *LMetric {
	cfg := PreciseConfig{Model: "m", Scheme: blockkey.Scheme{BlockSize: 16, Stride: 1}, Route: route.DefaultConfig()}
	if recent {
		rc := route.DefaultRecentConfig()
		cfg.Recent = &rc
	}
	return NewLMetric(cfg, ms, 1)
}

// The cost trades cache against load with no weights: 321 tokens, 20
// reusable blocks of 16.
func TestLMetricPick(t *testing.T) {
	req := Request{Model: "m", Tokens: seq(0, 16*20+1)}
	tests := []struct {
		name     string
		match    []int // blocks each pod holds
		inflight []int
		want     int
		costs    []int
	}{
		{"holder wins idle", []int{15, 0, 0}, []int{0, 0, 0}, 0, []int{81, 321, 321}},
		{"a busy holder loses to a cold idle pod", []int{15, 0, 0}, []int{4, 0, 1}, 1, []int{405, 321, 642}},
		// 81×4 = 324 and 161×2 = 322 both lose to 321×1 by a token or three.
		{"no weights: the product decides", []int{15, 10, 0}, []int{3, 1, 0}, 2, []int{324, 322, 321}},
		{"whole prompt cached still counts load", []int{20, 20, 0}, []int{2, 1, 0}, 1, []int{3, 2, 321}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ms := make([]route.Matcher, len(tt.match))
			for i, m := range tt.match {
				ms[i] = prefixMatcher(m)
			}
			l := lmetricFor(ms, false)
			pods := podsWith(tt.inflight...)
			if d := cmp.Diff(tt.costs, l.Costs(req, pods, t0)); d != "" {
				t.Errorf("Costs (-want +got):\n%s", d)
			}
			if got := l.Pick(req, pods, t0); got != tt.want {
				t.Errorf("Pick = %d; want %d", got, tt.want)
			}
		})
	}
}

// Ties are decided by the seed and the request's prefix alone: one seed,
// one answer for a prefix, and different prefixes spread.
func TestLMetricTies(t *testing.T) {
	ms := []route.Matcher{prefixMatcher(0), prefixMatcher(0), prefixMatcher(0), prefixMatcher(0)}
	idle := podsWith(0, 0, 0, 0)
	seen := map[int]bool{}
	for i := range 40 {
		req := Request{Model: "m", Tokens: seq(uint32(i)*1000, 16*6+1)}
		first := lmetricFor(ms, false).Pick(req, idle, t0)
		if again := lmetricFor(ms, false).Pick(req, idle, t0); again != first {
			t.Fatalf("prefix %d: %d then %d from the same seed", i, first, again)
		}
		seen[first] = true
	}
	if len(seen) != 4 {
		t.Errorf("40 tied prefixes reached pods %v; want all 4", seen)
	}
	// Unknown tokens: least loaded.
	if got := lmetricFor(ms, false).Pick(Request{Model: "m"}, podsWith(2, 1, 3, 2), t0); got != 1 {
		t.Errorf("Pick without tokens = %d; want 1, the least loaded", got)
	}
}

// Before any event, the follow-up of a request is priced as cached where
// the first went (central-precise's speculative entries).
func TestLMetricSpeculates(t *testing.T) {
	l := lmetricFor([]route.Matcher{prefixMatcher(0), prefixMatcher(0), prefixMatcher(0)}, true)
	req := Request{Model: "m", Tokens: seq(7, 16*20+1)}
	first := l.Pick(req, podsWith(0, 0, 0), t0)
	inflight := []int{0, 0, 0}
	inflight[first] = 1
	// 1 uncached token × 2 against 321 × 1.
	if got := l.Pick(req, podsWith(inflight...), t0.Add(time.Second)); got != first {
		t.Errorf("follow-up Pick = %d; want %d", got, first)
	}
}

// A batch's uncached tokens are the sum over its prompts.
func TestLMetricBatch(t *testing.T) {
	a, b := seq(1000, 16*12+1), seq(5000, 16*12+1)
	l := lmetricFor(nil, false)
	ka, kb := l.p.Keys(Request{Model: "m", Tokens: a}), l.p.Keys(Request{Model: "m", Tokens: b})
	// pod1 all of a (12 blocks), pod2 8 blocks of each (16), pod3 none.
	l.p.indexes = []route.Matcher{holdsKeys(ka), holdsKeys(ka[:8], kb[:8]), holdsKeys()}
	req := Request{Model: "m", Batch: [][]uint32{a, b}}
	want := []int{1 + 193, 65 + 65, 193 + 193}
	if d := cmp.Diff(want, l.Costs(req, podsWith(0, 0, 0), t0)); d != "" {
		t.Errorf("batch Costs (-want +got):\n%s", d)
	}
	if got := l.Pick(req, podsWith(0, 0, 0), t0); got != 1 {
		t.Errorf("batch Pick = %d; want 1", got)
	}
}
