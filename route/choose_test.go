package route

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// fresh returns a peer with a load report taken at t0.
func fresh(id string, l Load) PeerView {
	return PeerView{ID: id, KeyScheme: blockkey.Version, Load: l, LoadAt: t0}
}

func keysN(start, n int) []blockkey.Key {
	ks := make([]blockkey.Key, n)
	for i := range ks {
		ks[i] = blockkey.Key(start + i)
	}
	return ks
}

func holds(keys ...[]blockkey.Key) keySet {
	s := keySet{}
	for _, ks := range keys {
		for _, k := range ks {
			s[k] = true
		}
	}
	return s
}

func TestExcluded(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		name  string
		p     PeerView
		model string
		want  string
	}{
		{"healthy", PeerView{}, "llama", ""},
		{"draining", PeerView{Draining: true}, "llama", "draining"},
		{"failed just now", PeerView{LastFailure: t0}, "", "failed 0s ago"},
		{"failed 9.9s ago", PeerView{LastFailure: t0.Add(-9900 * time.Millisecond)}, "", "failed 9.9s ago"},
		{"failed exactly FailFor ago", PeerView{LastFailure: t0.Add(-10 * time.Second)}, "", ""},
		{"failure in the future (clock skew)", PeerView{LastFailure: t0.Add(time.Second)}, "", "failed -1s ago"},
		{"other model", PeerView{Models: []string{"qwen"}}, "llama", "model"},
		{"one of its models", PeerView{Models: []string{"qwen", "llama"}}, "llama", ""},
		{"empty Models serves all", PeerView{}, "anything", ""},
		{"request without model", PeerView{Models: []string{"qwen"}}, "", ""},
		{"draining wins over failure", PeerView{Draining: true, LastFailure: t0}, "", "draining"},
		{"engine down", PeerView{Engine: EngineDown}, "llama", "engine down"},
		{"pushes stopped 1.6s ago", PeerView{Load: Load{Fronted: true}, LoadAt: t0.Add(-1600 * time.Millisecond)}, "", "silent 1.6s"},
		{"pushed 1.4s ago: two refreshes missed", PeerView{Load: Load{Fronted: true}, LoadAt: t0.Add(-1400 * time.Millisecond)}, "", ""},
		{"a sidecar that never pushed to us", PeerView{Load: Load{Fronted: true}}, "", "silent: no push yet"},
		{"scraped load 9s old is no silence", PeerView{LoadAt: t0.Add(-9 * time.Second)}, "", ""},
		{"the local pod is never silent", PeerView{Local: true, Load: Load{Fronted: true}, LoadAt: t0.Add(-time.Minute)}, "", ""},
		{"engine starting", PeerView{Engine: EngineStarting}, "", "engine starting"},
		{"engine down wins over draining", PeerView{Engine: EngineDown, Draining: true}, "", "engine down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := excluded(&cfg, &tt.p, &Request{Model: tt.model}, new(momentOf(&cfg, t0))); got != tt.want {
				t.Errorf("excluded(%+v, %q) = %q; want %q", tt.p, tt.model, got, tt.want)
			}
		})
	}
	if got := excluded(&Config{}, &PeerView{LastFailure: t0}, &Request{}, new(momentOf(&Config{}, t0))); got != "" {
		t.Errorf("FailFor 0: excluded = %q; want eligible", got)
	}
}

// A peer whose model list was truncated serves an unlisted model only on
// the evidence of its digest: the request's first MinMatchKeys keys, which
// are seeded with the model's name. Load alone never makes it a candidate.
func TestExcludedTruncatedModels(t *testing.T) {
	cfg := DefaultConfig() // MinMatchKeys 2
	keys := keysN(100, 8)
	trunc := func(d Matcher, at time.Time) PeerView {
		return PeerView{Models: []string{"base"}, ModelsTruncated: true, KeyScheme: blockkey.Version, Digest: d, DigestAt: at}
	}
	tests := []struct {
		name string
		p    PeerView
		keys []blockkey.Key
		want string
	}{
		{"holds the first two keys", trunc(holds(keys[:2]), t0), keys, ""},
		{"holds only the first key", trunc(holds(keys[:1]), t0), keys, "model"},
		{"holds later keys, not the first", trunc(holds(keys[1:]), t0), keys, "model"},
		{"no digest", trunc(nil, t0), keys, "model"},
		{"no keys (tokenize failed)", trunc(holds(keys), t0), nil, "model"},
		{"prompt shorter than MinMatchKeys", trunc(holds(keys), t0), keys[:1], "model"},
		{"other key scheme", func() PeerView { p := trunc(holds(keys), t0); p.KeyScheme = blockkey.Version + 1; return p }(), keys, "model"},
		{"not truncated: the list is the truth", func() PeerView { p := trunc(holds(keys), t0); p.ModelsTruncated = false; return p }(), keys, "model"},
		{"listed model needs no evidence", PeerView{Models: []string{"base", "alice"}, ModelsTruncated: true}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := excluded(&cfg, &tt.p, &Request{Model: "alice", Keys: tt.keys}, new(momentOf(&cfg, t0))); got != tt.want {
				t.Errorf("excluded = %q; want %q", got, tt.want)
			}
		})
	}
	// The explanation says why an unlisted peer is a candidate.
	p := trunc(holds(keys), t0)
	p.ID, p.Load, p.LoadAt = "x", Load{}, t0
	d := Affinity{Config: cfg}.Choose(Request{Model: "alice", Keys: keys}, []PeerView{p}, t0)
	if len(d.Candidates) != 1 || !d.Candidates[0].Eligible || !strings.Contains(d.Candidates[0].Note, "model unlisted, in digest") {
		t.Errorf("candidate %+v; want eligible with note \"model unlisted, in digest\"", d.Candidates)
	}
	ttl := cfg
	ttl.DigestTTL = time.Minute
	old := trunc(holds(keys), t0.Add(-time.Hour))
	if got := excluded(&ttl, &old, &Request{Model: "alice", Keys: keys}, new(momentOf(&ttl, t0))); got != "model" {
		t.Errorf("digest older than DigestTTL: excluded = %q; want model", got)
	}
}

func TestLoad(t *testing.T) {
	cfg := DefaultConfig()
	tests := []struct {
		name       string
		l          Load
		at         time.Time
		want       float64
		wantQueued int
		wantStale  bool
	}{
		{"idle", Load{}, t0, 0, 0, false},
		{"sum of requests", Load{Running: 3, Waiting: 2, InFlight: 1}, t0, 6, 0, false},
		{"kv usage below the knee", Load{KVUsage: 0.5}, t0, 0, 0, false},
		{"kv usage above the knee", Load{KVUsage: 0.9}, t0, 2, 0, false},
		{"kv usage clamped", Load{KVUsage: 7}, t0, 4, 0, false},
		{"kv usage NaN ignored", Load{KVUsage: math.NaN()}, t0, 0, 0, false},
		{"queued prefill is work, not requests", Load{QueuedPrefillTokens: 8192, Serving: 1, Fronted: true}, t0, 1, 8192, false},
		{"queued and sent since", Load{QueuedPrefillTokens: 100, InFlightPrefillTokens: 50}, t0, 0, 150, false},
		{"serving above the scrape", Load{Running: 1, Serving: 4, InFlight: 1}, t0, 5, 0, false},
		{"scrape above serving", Load{Running: 3, Waiting: 2, Serving: 4}, t0, 5, 0, false},
		{"fronted: serving only", Load{Running: 3, Waiting: 2, Serving: 1, Fronted: true, InFlight: 1}, t0, 2, 0, false},
		{"fronted idle", Load{Running: 3, Fronted: true}, t0, 0, 0, false},
		{"negative counts ignored", Load{Running: -5, Waiting: -1, Serving: -3, InFlight: -2, QueuedPrefillTokens: -7, InFlightPrefillTokens: -1}, t0, 0, 0, false},
		{"negative serving fronted", Load{Serving: -3, Fronted: true}, t0, 0, 0, false},
		{"report at the TTL is fresh", Load{Running: 3, InFlight: 1}, t0.Add(-5 * time.Second), 4, 0, false},
		{"stale report: in flight only", Load{Running: 3, KVUsage: 1, InFlight: 1, QueuedPrefillTokens: 900, InFlightPrefillTokens: 40}, t0.Add(-6 * time.Second), 1, 40, true},
		{"no report: in flight only", Load{Running: 3, InFlight: 2}, time.Time{}, 2, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, queued, _, stale := load(&cfg, &PeerView{Load: tt.l, LoadAt: tt.at}, new(momentOf(&cfg, t0)))
			if got != tt.want || queued != tt.wantQueued || stale != tt.wantStale {
				t.Errorf("load(%+v) = %v, %d, %v; want %v, %d, %v", tt.l, got, queued, stale, tt.want, tt.wantQueued, tt.wantStale)
			}
		})
	}
}

// TestLoadAhead: the requests ahead are the pushed ones while fresh, and
// this sidecar's in flight always.
func TestLoadAhead(t *testing.T) {
	cfg := DefaultConfig()
	l := Load{Fronted: true, Serving: 5, Prefilling: 3, QueuedPrefillTokens: 900, InFlight: 2, InFlightPrefilling: 1, InFlightPrefillTokens: 40}
	for _, tt := range []struct {
		at   time.Time
		want int
	}{{t0, 4}, {t0.Add(-6 * time.Second), 1}, {time.Time{}, 1}} {
		if _, _, got, _ := load(&cfg, &PeerView{Load: l, LoadAt: tt.at}, new(momentOf(&cfg, t0))); got != tt.want {
			t.Errorf("report at %v: ahead %d; want %d", tt.at, got, tt.want)
		}
	}
	l.Prefilling, l.InFlightPrefilling = -3, -1
	if _, _, got, _ := load(&cfg, &PeerView{Load: l, LoadAt: t0}, new(momentOf(&cfg, t0))); got != 0 {
		t.Errorf("negative counts: ahead %d; want 0", got)
	}
}

func TestBound(t *testing.T) {
	tests := []struct {
		name      string
		loads     []int
		wantMean  float64
		wantBound float64
		wantOver  []bool
	}{
		// Idle: mean (0+1)/4, headroom dominates.
		{"idle", []int{0, 0, 0, 0}, 0.25, 4.25, []bool{false, false, false, false}},
		// Quiet: m = 13/4 = 3.25, bound 7.25: 7+1 > 7.25.
		{"headroom", []int{7, 2, 2, 1}, 3.25, 7.25, []bool{true, false, false, false}},
		// Busy: m = 81/4 = 20.25, bound 25.3125: slack dominates.
		{"slack", []int{25, 24, 16, 15}, 20.25, 25.3125, []bool{true, false, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var peers []PeerView
			for i, l := range tt.loads {
				peers = append(peers, fresh(string(rune('a'+i)), Load{Running: l}))
			}
			cfg := DefaultConfig()
			cfg.Slack = 0.25 // KubeAI's, so the slack case is easy to check by hand
			cfg.MinHeadroom = 4
			a := assess(&cfg, &Request{}, peers, t0, make([]row, len(peers)))
			if a.d.Mean != tt.wantMean || a.d.Bound != tt.wantBound {
				t.Errorf("mean, bound = %v, %v; want %v, %v", a.d.Mean, a.d.Bound, tt.wantMean, tt.wantBound)
			}
			for i, c := range a.decision(nil).Candidates {
				if c.Over != tt.wantOver[i] {
					t.Errorf("peer %s load %v: Over = %v; want %v", c.ID, c.Load, c.Over, tt.wantOver[i])
				}
			}
		})
	}
}

// TestIneligibleExcludedFromMean checks that the bound is over eligible
// peers only: a draining peer's huge load must not lift it.
func TestIneligibleExcludedFromMean(t *testing.T) {
	draining := fresh("z", Load{Running: 1000})
	draining.Draining = true
	a := assess(new(DefaultConfig()), &Request{}, []PeerView{fresh("a", Load{}), draining}, t0, make([]row, 2))
	if a.d.Eligible != 1 || a.d.Mean != 1 {
		t.Errorf("Eligible, Mean = %d, %v; want 1, 1", a.d.Eligible, a.d.Mean)
	}
}

func TestRendezvousKey(t *testing.T) {
	tests := []struct {
		name   string
		n      int
		keys   []blockkey.Key
		want   blockkey.Key
		wantOK bool
	}{
		{"no keys", 4, nil, 0, false},
		{"long prompt", 4, keysN(10, 8), 13, true},
		{"short prompt uses last key", 4, keysN(10, 2), 11, true},
		{"first key only", 1, keysN(10, 8), 10, true},
		{"below 1 means 1", 0, keysN(10, 8), 10, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := rendezvousKey(Config{RendezvousKeys: tt.n}, tt.keys)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("rendezvousKey(%d, %v) = %v, %v; want %v, %v", tt.n, tt.keys, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// TestWeightPinned pins the rendezvous hash: sidecars of different
// versions in one cluster must agree, so a change here is a protocol change.
func TestWeightPinned(t *testing.T) {
	tests := []struct {
		id   string
		k    blockkey.Key
		want uint64
	}{
		// Values from an independent Python implementation of FNV-1a + splitmix64.
		{"", 0, 0xf52a15e9a9b5e89b},
		{"pod-a", 1, 0x75a2db1ac6f14de8},
		{"pod-b", 1, 0x5658ab716ab340b1},
		{"pod-a", 0xdeadbeefcafef00d, 0x9a6fd9794b356884},
	}
	for _, tt := range tests {
		if got := weight(tt.id, tt.k); got != tt.want {
			t.Errorf("weight(%q, %#x) = %#x; want %#x", tt.id, uint64(tt.k), got, tt.want)
		}
	}
}

// With the idle bound on (IdleSlack 0.5, IdleHeadroom 2), while a peer
// idles a peer with requests waiting is over the tighter bound, and the
// holder's next request goes elsewhere; with nobody idle, nothing
// waiting, or the rule off (the default), the loose bound alone decides.
func TestIdleBound(t *testing.T) {
	keys := keysN(1, 40)
	holder := fresh("a", Load{Fronted: true, Serving: 5, Prefilling: 1, QueuedPrefillTokens: 50})
	holder.Digest = holds(keys)
	peers := func(idleLoad int) []PeerView {
		return []PeerView{holder, fresh("b", Load{Fronted: true, Serving: idleLoad}), fresh("c", Load{Fronted: true, Serving: 4})}
	}
	req := Request{Keys: keys, PromptTokens: 640}
	for _, tt := range []struct {
		name       string
		idleLoad   int
		off        bool
		wantTarget string
		wantOver   bool
	}{
		{"a peer idles: the holder with requests waiting is over", 0, false, "b", true}, // least load
		{"nobody idles: the loose bound keeps the holder", 3, false, "a", false},
		{"the rule off", 0, true, "a", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if !tt.off {
				cfg.IdleSlack, cfg.IdleHeadroom = 0.5, 2
			}
			d := DefaultChain(cfg, nil).Choose(req, peers(tt.idleLoad), t0)
			if d.Target != tt.wantTarget || d.Candidates[0].Over != tt.wantOver {
				t.Errorf("target %s, holder over %v; want %s, %v\n%s", d.Target, d.Candidates[0].Over, tt.wantTarget, tt.wantOver, d.Table())
			}
			if tt.wantOver != strings.Contains(d.Note, "a peer idles") {
				t.Errorf("note %q", d.Note)
			}
		})
	}
	// Nothing waiting at the holder: it keeps its prefix, idle peer or not.
	calm := holder
	calm.Load.Prefilling, calm.Load.QueuedPrefillTokens = 0, 0
	on := DefaultConfig()
	on.IdleSlack, on.IdleHeadroom = 0.5, 2
	if d := DefaultChain(on, nil).Choose(req, []PeerView{calm, fresh("b", Load{Fronted: true})}, t0); d.Target != "a" {
		t.Errorf("holder with nothing waiting: target %s; want a\n%s", d.Target, d.Table())
	}
	// A burst: what waits at a is the request just sent there with this
	// prefix (claimed, not in its digest yet), so the tight bound spares
	// it; without the claim the same queue is over.
	burst := fresh("a", Load{Fronted: true, Serving: 5, Prefilling: 1, QueuedPrefillTokens: 640})
	burst.Claims = ClaimsFor(on, keys, 0)
	for i := range burst.Claims {
		burst.Claims[i].At = t0
	}
	for _, claimed := range []bool{true, false} {
		a := burst
		if !claimed {
			a.Claims = nil
			a.Digest = holds(keys)
		}
		d := DefaultChain(on, nil).Choose(req, []PeerView{a, fresh("b", Load{Fronted: true}), fresh("c", Load{Fronted: true, Serving: 4})}, t0)
		if over := d.Candidates[0].Over; over == claimed || (d.Target == "a") != claimed {
			t.Errorf("claimed %v: target %s, a over %v; want a kept only when claimed\n%s", claimed, d.Target, over, d.Table())
		}
	}
}

// TestIdleLoadTokens: while a pod idles, Affinity prices a request of
// load at a peer with two or more requests waiting at IdleLoadTokens (512
// by default), so a queued holder of a short prefix yields to the idle
// pod, while a holder of a long one, a holder with little load or one
// request waiting, or any holder when nobody idles keeps its prefix.
func TestIdleLoadTokens(t *testing.T) {
	keys := keysN(1, 64) // 64 keys of 64 tokens
	peers := func(held, load, waiting, idleLoad int) []PeerView {
		a := fresh("a", Load{Fronted: true, Serving: load, Prefilling: waiting})
		a.Digest = holds(keys[:held])
		return []PeerView{a, fresh("b", Load{Fronted: true, Serving: idleLoad}), fresh("c", Load{Fronted: true, Serving: 6})}
	}
	req := Request{Keys: keys, TokensPerKey: 64, PromptTokens: 4096}
	for _, tt := range []struct {
		name string
		// keys a holds (38 of 64: 2432 tokens, an agent's system prompt
		// and tools; 64: 4096), its load and its requests waiting
		held, load, waiting int
		idleLoad            int
		off                 bool
		want                string
	}{
		{"short prefix, 8 requests, 2 waiting, a pod idles: yields", 38, 8, 2, 0, false, "b"},
		{"short prefix, the price off: keeps", 38, 8, 2, 0, true, "a"},
		{"short prefix, nobody idles: keeps", 38, 8, 2, 1, false, "a"},
		{"short prefix, 1 waiting (perhaps an old report): keeps", 38, 8, 1, 0, false, "a"},
		{"short prefix, 4 requests: keeps", 38, 4, 2, 0, false, "a"},
		{"long prefix, 7 requests, a pod idles: keeps", 64, 7, 2, 0, false, "a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.off {
				cfg.IdleLoadTokens = 0
			}
			d := DefaultChain(cfg, nil).Choose(req, peers(tt.held, tt.load, tt.waiting, tt.idleLoad), t0)
			if d.Target != tt.want {
				t.Errorf("target %s; want %s\n%s", d.Target, tt.want, d.Table())
			}
			if idles := !tt.off && tt.idleLoad == 0 && tt.waiting >= 2; idles != strings.Contains(d.Note, "a request of load costs 512 tokens where requests wait") {
				t.Errorf("note %q", d.Note)
			}
		})
	}
}

func TestProductCost(t *testing.T) {
	keys := keysN(1, 64) // 64 keys of 64 tokens
	req := Request{Keys: keys, TokensPerKey: 64, PromptTokens: 4096}
	for _, tt := range []struct {
		name    string
		load    int // at a, which holds 48 keys: 1,024 tokens uncached
		product bool
		want    string
	}{
		{"1,024 × 5 against an idle pod's 4,096: yields", 4, true, "b"},
		{"1,024 × 3 against 4,096: keeps", 2, true, "a"},
		{"the sum: 3,072 saved less 4 × 64: keeps", 4, false, "a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := fresh("a", Load{Fronted: true, Serving: tt.load})
			a.Digest = holds(keys[:48])
			peers := []PeerView{a, fresh("b", Load{Fronted: true}), fresh("c", Load{Fronted: true, Serving: 1})}
			cfg := DefaultConfig()
			cfg.ProductCost = tt.product
			d := DefaultChain(cfg, nil).Choose(req, peers, t0)
			if d.Target != tt.want {
				t.Errorf("target %s; want %s\n%s", d.Target, tt.want, d.Table())
			}
		})
	}
}

// TestBestIsOnePass checks that best, which breaks ties only among the
// rows of the top score, picks the row that one pass of better over
// every scored row picks: scores that tie, NaN first or later, signed
// zeros, infinities, IDs that tie.
func TestBestIsOnePass(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	scores := []float64{-1, 0, math.Copysign(0, -1), 2, math.Inf(1), math.Inf(-1), math.NaN()}
	for n := range 2000 {
		peers := make([]PeerView, 1+rng.IntN(12))
		rows := make([]row, len(peers))
		a := assessment{peers: peers, rows: rows}
		k := blockkey.Key(rng.Uint64())
		hi := top{i: -1}
		for i := range rows {
			peers[i].ID = fmt.Sprintf("p%d", rng.IntN(4))
			if rng.IntN(5) == 0 {
				continue // not scored
			}
			r := &rows[i]
			r.flags |= rowScored
			r.score = scores[rng.IntN(len(scores))]
			hi.see(i, r.score)
		}
		want := -1
		for i := range rows {
			if rows[i].is(rowScored) && (want < 0 || a.better(k, i, want)) {
				want = i
			}
		}
		if got := a.best(k, hi); got != want {
			t.Fatalf("case %d: best %d; one pass %d (top %+v, rows %+v)", n, got, want, hi, rows)
		}
	}
}
