package baseline

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// ownFirst is the rule with cold prefixes to the front's own pod.
func ownFirst() UncoordinatedConfig {
	c := DefaultUncoordinatedConfig()
	c.ColdLeastLoaded = false
	return c
}

func TestFrontChoice(t *testing.T) {
	d := ownFirst()
	anyMatch := d
	anyMatch.MinMatchFraction = 0
	ll := d
	ll.ColdLeastLoaded = true
	tests := []struct {
		name     string
		cfg      UncoordinatedConfig
		saved    []int
		inflight []int
		rank     []uint64
		want     int
	}{
		{"cold prefix: own pod, even busier", d, []int{0, 0, 0}, []int{5, 0, 0}, []uint64{0, 9, 9}, 0},
		{"a peer's remembered match", d, []int{0, 200, 0}, []int{0, 0, 0}, []uint64{0, 0, 0}, 1},
		{"own exact match", d, []int{200, 0, 0}, []int{3, 0, 0}, []uint64{0, 0, 0}, 0},
		{"longest wins over own", d, []int{100, 200, 0}, []int{0, 3, 0}, []uint64{0, 0, 0}, 1},
		// 90 of 320 tokens is 28%, under SGLang's 0.3.
		{"match under the threshold counts as cold", d, []int{0, 90, 0}, []int{0, 0, 0}, []uint64{0, 0, 0}, 0},
		{"threshold 0: any match", anyMatch, []int{0, 16, 0}, []int{0, 0, 0}, []uint64{0, 0, 0}, 1},
		{"peers tie on everything: the first", d, []int{0, 200, 200}, []int{0, 0, 0}, []uint64{0, 9, 9}, 1},
		{"own ties a peer: own, though busier", d, []int{200, 200, 0}, []int{3, 0, 0}, []uint64{0, 9, 0}, 0},
		{"peers tie: the lighter", d, []int{0, 200, 200}, []int{0, 2, 1}, []uint64{0, 9, 0}, 2},
		{"peers tie, equal load: rank", d, []int{0, 200, 200}, []int{0, 1, 1}, []uint64{0, 5, 9}, 2},
		// 70 − 0 > 64 and 70 > 1.5 × 0: balance whatever the match.
		{"imbalanced: least loaded", d, []int{320, 0, 0}, []int{70, 0, 3}, []uint64{0, 0, 0}, 1},
		{"imbalanced, own among the least: own", d, []int{0, 320, 0}, []int{0, 70, 0}, []uint64{0, 0, 9}, 0},
		{"imbalanced peers tie: rank", d, []int{0, 0, 0}, []int{70, 0, 0}, []uint64{0, 1, 9}, 2},
		{"cold, least loaded: the lightest, own or not", ll, []int{0, 0, 0}, []int{2, 0, 1}, []uint64{9, 0, 0}, 1},
		{"cold, least loaded: ties by rank, own not first", ll, []int{0, 0, 0}, []int{0, 1, 0}, []uint64{3, 0, 7}, 2},
		{"least loaded still follows a match", ll, []int{0, 0, 200}, []int{0, 0, 3}, []uint64{0, 0, 0}, 2},
		{"least loaded: equal matches by load, not own", ll, []int{200, 200, 0}, []int{1, 0, 0}, []uint64{0, 0, 0}, 1},
		// 64 apart is not over 64.
		{"at the absolute threshold: affinity", d, []int{320, 0, 0}, []int{64, 0, 0}, []uint64{0, 0, 0}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := frontChoice(tt.cfg, 0, tt.saved, 320, tt.inflight, tt.rank); got != tt.want {
				t.Errorf("frontChoice(own 0, saved %v, in flight %v, rank %v) = %d; want %d",
					tt.saved, tt.inflight, tt.rank, got, tt.want)
			}
		})
	}
}

func uncoordinatedFor(n int, cfg UncoordinatedConfig, ms []route.Matcher) *Uncoordinated {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("pod%d", i+1)
	}
	rc := route.DefaultRecentConfig()
	pc := PreciseConfig{Model: "m", Scheme: blockkey.Scheme{BlockSize: 16, Stride: 1}, Route: route.DefaultConfig(), Recent: &rc}
	return NewUncoordinated(names, pc, cfg, ms, 1)
}

func holdsKeys(chains ...[]blockkey.Key) setMatcher {
	m := setMatcher{}
	for _, c := range chains {
		for _, k := range c {
			m[k] = true
		}
	}
	return m
}

// A front sees its own pod's index and nobody else's: the pod holding a
// prompt is a hit for its own front and unknown to every other.
func TestUncoordinatedOwnPodOnly(t *testing.T) {
	req := Request{Model: "m", Tokens: seq(0, 16*20+1)}
	u := uncoordinatedFor(3, ownFirst(), nil)
	keys := u.p.Keys(req)
	u.p.indexes = []route.Matcher{holdsKeys(keys), setMatcher{}, setMatcher{}}
	pods := podsWith(0, 0, 0)
	if d := cmp.Diff([]int{320, 0, 0}, u.Saved(0, req, pods, t0)); d != "" {
		t.Errorf("front 0's view (-want +got):\n%s", d)
	}
	for f := 1; f < 3; f++ {
		if d := cmp.Diff([]int{0, 0, 0}, u.Saved(f, req, pods, t0)); d != "" {
			t.Errorf("front %d sees pod1's index (-want +got):\n%s", f, d)
		}
		// Cold to it: its own pod serves.
		if got := u.route(u.fronts[f], req, pods, t0); got != f {
			t.Errorf("front %d routed pod1's prompt to %d; want its own pod %d", f, got, f)
		}
	}
	if got := u.route(u.fronts[0], req, pods, t0); got != 0 {
		t.Errorf("front 0 routed its own pod's prompt to %d", got)
	}
	// Front 1's forward to its own pod counts there until events come
	// (its recent entries); front 2 knows nothing of it.
	if got := u.Saved(1, req, pods, t0.Add(time.Second))[1]; got != 320 {
		t.Errorf("front 1's recent forward to its pod: %d tokens saved; want 320", got)
	}
	if got := u.Saved(2, req, pods, t0.Add(time.Second))[1]; got != 0 {
		t.Errorf("front 2 sees front 1's forward: %d tokens", got)
	}
}

// A front remembers what it sent a peer, and follows it; another front
// does not know. The forward happens when the front's own counts are
// imbalanced (a gate set to open at any gap).
func TestUncoordinatedRemembersItsForwards(t *testing.T) {
	cfg := ownFirst()
	cfg.BalanceAbs, cfg.BalanceRel = 0, 1
	u := uncoordinatedFor(3, cfg, []route.Matcher{setMatcher{}, setMatcher{}, setMatcher{}})
	pods := podsWith(0, 0, 0)
	fr := u.fronts[0]
	busy := Request{Model: "m", Tokens: seq(50_000, 16*4+1)}
	if got := u.route(fr, busy, pods, t0); got != 0 {
		t.Fatalf("cold request went to %d; want own pod 0", got)
	}
	fr.inFlight[0]++ // front 0 now has one in flight at its pod
	req := Request{Model: "m", Tokens: seq(0, 16*20+1)}
	peer := u.route(fr, req, pods, t0)
	if peer == 0 {
		t.Fatalf("imbalanced front kept its own pod")
	}
	fr.inFlight[0]--
	if got := u.Saved(0, req, pods, t0)[peer]; got != 320 {
		t.Errorf("front 0 remembers %d tokens at pod %d; want 320", got, peer)
	}
	if got := u.route(fr, req, pods, t0.Add(time.Minute)); got != peer {
		t.Errorf("the prompt again went to %d; want %d, where front 0 sent it", got, peer)
	}
	other := u.fronts[3-peer] // neither front 0 nor the peer's own front
	if got := u.Saved(other.own, req, pods, t0)[peer]; got != 0 {
		t.Errorf("front %d knows front 0's forward: %d tokens", other.own, got)
	}
}

// The memory of a peer is a bounded LRU, sized as the front's own pod's
// scraped cache when not set.
func TestUncoordinatedMemoryBounded(t *testing.T) {
	cfg := DefaultUncoordinatedConfig()
	cfg.BalanceAbs, cfg.BalanceRel = 0, 1
	u := uncoordinatedFor(2, cfg, []route.Matcher{setMatcher{}, setMatcher{}})
	pods := podsWith(0, 0)
	pods[0].Load.NumGPUBlocks = 10
	fr := u.fronts[0]
	fr.inFlight[0] = 1 // every route goes to pod 2 and is remembered
	a := Request{Model: "m", Tokens: seq(0, 16*8+1)}
	b := Request{Model: "m", Tokens: seq(9000, 16*8+1)}
	if u.route(fr, a, pods, t0) != 1 || u.route(fr, b, pods, t0) != 1 {
		t.Fatal("the imbalanced front did not forward to pod 2")
	}
	if n := fr.sent[1].len(); n != 10 {
		t.Errorf("memory of pod 2 holds %d keys; want 10, its own pod's blocks", n)
	}
	// b's 8 keys are the most recent; of a only its last 2 are left, so
	// none of a's prefix is.
	if got := u.Saved(0, a, pods, t0); got[1] != 0 {
		t.Errorf("a's head keys survived b: %v", got)
	}
	if got := u.Saved(0, b, pods, t0); got[1] != 128 {
		t.Errorf("b remembered for %v tokens; want 128", got)
	}
}

// A request reaches a front at random, seeded: one seed gives one
// sequence, and every front is reached.
func TestUncoordinatedFrontsSeeded(t *testing.T) {
	fronts := func() []int {
		u := uncoordinatedFor(4, DefaultUncoordinatedConfig(), nil)
		var out []int
		for i := range 40 {
			// Every prompt cold: each goes to the pod of the front it reached.
			out = append(out, u.Pick(Request{Model: "m", Tokens: seq(uint32(i)*1000, 40)}, podsWith(0, 0, 0, 0), t0))
		}
		return out
	}
	a := fronts()
	if d := cmp.Diff(a, fronts()); d != "" {
		t.Errorf("same seed, different fronts:\n%s", d)
	}
	seen := map[int]bool{}
	for _, p := range a {
		seen[p] = true
	}
	if len(seen) != 4 {
		t.Errorf("40 requests reached fronts %v; want all 4", seen)
	}
}

// Track counts the request in flight at its front until end.
func TestUncoordinatedTrack(t *testing.T) {
	u := uncoordinatedFor(2, DefaultUncoordinatedConfig(), nil)
	pod, end := u.Track(Request{Model: "m"}, podsWith(0, 0), t0)
	total := func() (n int) {
		for _, f := range u.fronts {
			for _, c := range f.inFlight {
				n += c
			}
		}
		return n
	}
	if total() != 1 || u.fronts[pod].inFlight[pod] != 1 {
		t.Fatalf("after Track to %d: counts %v, %v", pod, u.fronts[0].inFlight, u.fronts[1].inFlight)
	}
	end()
	if total() != 0 {
		t.Errorf("after end: counts %v, %v", u.fronts[0].inFlight, u.fronts[1].inFlight)
	}
}

// Through the proxy, the new policies serve every request, count each
// one in flight until its answer ends (the fronts' counts too), and keep
// a stored response's follow-ups on the pod that created it.
func TestProxyNewPolicies(t *testing.T) {
	for _, policy := range []string{NameLMetric, NameUncoordinated} {
		t.Run(policy, func(t *testing.T) {
			var backends []Backend
			for i := range 3 {
				b := responsesPod(t, fmt.Sprintf("pod%d", i+1), false)
				b.Events = "ipc:///nowhere" // New needs it; Run is not called
				backends = append(backends, b)
			}
			p, err := New(Config{Policy: policy, Model: "m", Backends: backends})
			if err != nil {
				t.Fatal(err)
			}
			srv := newServer(t, p)
			post := func(body string) (string, string) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv+"/v1/responses", strings.NewReader(body))
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var v struct {
					ID string `json:"id"`
				}
				if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 200 {
					t.Fatalf("status %d, %v", resp.StatusCode, err)
				}
				return resp.Header.Get(ServedByHeader), v.ID
			}
			first, id := post(`{"model":"m","input":"hi","store":true}`)
			for i := range 6 {
				served, next := post(fmt.Sprintf(`{"model":"m","input":"more %d","previous_response_id":%q}`, i, id))
				if served != first {
					t.Fatalf("follow-up %d served by %s; want %s", i, served, first)
				}
				id = next
			}
			var wg sync.WaitGroup
			for i := range 12 {
				wg.Go(func() { post(fmt.Sprintf(`{"model":"m","input":"new %d"}`, i)) })
			}
			wg.Wait()
			idle := func() bool {
				for _, s := range p.Stats() {
					if s.InFlight != 0 {
						return false
					}
				}
				return true
			}
			// The client can read the end of an answer before the handler returns.
			if !eventually(idle) {
				t.Errorf("Stats() = %+v; want nothing in flight after every answer", p.Stats())
			}
			served := 0
			for _, s := range p.Stats() {
				served += s.Served
			}
			if served != 19 {
				t.Errorf("served %d; want 19", served)
			}
		})
	}
}

// The proxy tells the fronts when their requests end: while answers are
// held, the fronts count them; once released, nothing.
func TestProxyUncoordinatedCountsFronts(t *testing.T) {
	release := make(chan struct{})
	var arrived sync.WaitGroup
	blocking := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" {
			http.NotFound(w, r) // /tokenize: routed by load
			return
		}
		arrived.Done()
		<-release
	}
	var backends []Backend
	for i := range 3 {
		b := fakePod(t, fmt.Sprintf("pod%d", i+1), blocking)
		b.Events = "ipc:///nowhere"
		backends = append(backends, b)
	}
	p, err := New(Config{Policy: NameUncoordinated, Model: "m", Backends: backends})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, p)
	u := p.policy.(*Uncoordinated)
	counted := func() (n int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, f := range u.fronts {
			for _, c := range f.inFlight {
				n += c
			}
		}
		return n
	}
	var done sync.WaitGroup
	for range 5 {
		arrived.Add(1)
		done.Go(func() {
			resp, err := http.Post(srv+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
			if err == nil {
				resp.Body.Close()
			}
		})
	}
	arrived.Wait()
	if n := counted(); n != 5 {
		t.Errorf("fronts count %d in flight; want the 5 held", n)
	}
	close(release)
	done.Wait()
	// The client can read the end of an answer before the handler returns.
	if !eventually(func() bool { return counted() == 0 }) {
		t.Errorf("fronts count %d in flight after every answer; want 0", counted())
	}
}

// eventually polls cond until it holds or 5s pass.
func eventually(cond func() bool) bool {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// With ColdLeastLoaded a front spreads cold prefixes by its own counts
// and then follows what it sent where; another front does not know.
func TestUncoordinatedColdLeastLoaded(t *testing.T) {
	cfg := DefaultUncoordinatedConfig()
	cfg.ColdLeastLoaded = true
	u := uncoordinatedFor(3, cfg, []route.Matcher{setMatcher{}, setMatcher{}, setMatcher{}})
	pods := podsWith(0, 0, 0)
	fr := u.fronts[0]
	fr.inFlight[0] = 1 // its own pod is the busiest by its count
	req := Request{Model: "m", Tokens: seq(0, 16*20+1)}
	peer := u.route(fr, req, pods, t0)
	if peer == 0 {
		t.Fatal("cold prefix went to the front's busier own pod")
	}
	fr.inFlight[peer] = 2 // now the holder is the busiest: the match still wins
	if got := u.route(fr, req, pods, t0.Add(time.Minute)); got != peer {
		t.Errorf("the prompt again went to %d; want %d, where front 0 sent it", got, peer)
	}
	if got := u.Saved(3-peer, req, pods, t0)[peer]; got != 0 {
		t.Errorf("front %d knows front 0's forward: %d tokens", 3-peer, got)
	}
}
