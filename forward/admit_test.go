package forward

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

func TestAdmit(t *testing.T) {
	req := bounds{MaxRequests: 2}
	wait := bounds{MaxWait: 2 * time.Second, PrefillRate: 1000} // full at 2000 queued tokens
	both := bounds{MaxRequests: 2, MaxWait: 2 * time.Second, PrefillRate: 1000}
	share := bounds{MaxShare: 0.9}
	stepped := bounds{MaxShare: 0.9, StepTokens: 8192}
	w := func(ns ...int) []podQueue {
		var qs []podQueue
		for _, n := range ns {
			qs = append(qs, podQueue{Waiting: n})
		}
		return qs
	}
	tests := []struct {
		name string
		qs   []podQueue
		b    bounds
		want bool
	}{
		{"bounds off", w(100, 100), bounds{}, true},
		{"negative bound is off", w(100), bounds{MaxRequests: -1}, true},
		{"a wait bound without a rate is off", []podQueue{{Prefill: 1 << 30}}, bounds{MaxWait: time.Second}, true},
		{"no pod could serve: not refused for the queue", nil, req, true},
		{"every pod below", w(0, 1), req, true},
		{"one pod below", w(5, 1, 9), req, true},
		{"every pod at the bound", w(2, 2), req, false},
		{"every pod past the bound", w(3, 7), req, false},
		{"a lone pod at the bound", w(1), bounds{MaxRequests: 1}, false},
		{"a lone idle pod", w(0), bounds{MaxRequests: 1}, true},
		{"busy, nothing waiting: not full", []podQueue{{Waiting: 0, Prefill: 1999}}, both, true},
		{"every pod's prefill at the wait bound", []podQueue{{Prefill: 2000}, {Prefill: 5000}}, wait, false},
		{"one pod's prefill below the wait bound", []podQueue{{Prefill: 2000}, {Prefill: 1999}}, wait, true},
		{"full by either bound", []podQueue{{Waiting: 2}, {Prefill: 2000}}, both, false},
		{"room by both bounds at one pod", []podQueue{{Waiting: 2}, {Waiting: 1, Prefill: 1000}}, both, true},
		{"prefill share at the bound, long prompt", []podQueue{{Share: 0.9, Work: 5000}, {Share: 0.95, Work: 2000}}, share, false},
		{"prefill share at the bound, short prompt", []podQueue{{Share: 0.99, Work: SmallPrefill}}, share, true},
		{"prefill share below at one pod", []podQueue{{Share: 0.95, Work: 5000}, {Share: 0.89, Work: 5000}}, share, true},
		{"prefill share, work not known", []podQueue{{Share: 1}}, share, true},
		{"prefill share bound of 1 is off", []podQueue{{Share: 1, Work: 5000}}, bounds{MaxShare: 1}, true},
		{"full by the queue or the share", []podQueue{{Waiting: 2}, {Share: 0.9, Work: 5000}}, bounds{MaxRequests: 2, MaxShare: 0.9}, false},
		{"prefill share, the queue within a step with the prompt", []podQueue{{Share: 0.95, Prefill: 3000, Work: 5000}}, stepped, true},
		{"prefill share, a step's budget queued with the prompt", []podQueue{{Share: 0.95, Prefill: 3192, Work: 5000}}, stepped, true},
		{"prefill share, past a step with the prompt", []podQueue{{Share: 0.95, Prefill: 3193, Work: 5000}}, stepped, false},
		{"prefill share, a prompt longer than a step alone", []podQueue{{Share: 0.95, Work: 32000}}, stepped, false},
		{"past a step, but the share below", []podQueue{{Share: 0.85, Prefill: 20000, Work: 5000}}, stepped, true},
		{"one pod past a step, one within", []podQueue{{Share: 1, Prefill: 9000, Work: 2000}, {Share: 1, Prefill: 1000, Work: 2000}}, stepped, true},
	}
	for _, tt := range tests {
		if got := admit(tt.qs, tt.b); got != tt.want {
			t.Errorf("%s: admit(%v, %+v) = %v; want %v", tt.name, tt.qs, tt.b, got, tt.want)
		}
	}
}

func TestQueueAt(t *testing.T) {
	cfg := route.DefaultConfig()
	now := time.Now()
	tests := []struct {
		name string
		p    route.PeerView
		want podQueue
	}{
		{"fresh report", route.PeerView{Load: route.Load{Waiting: 4, Running: 9, Serving: 13, QueuedPrefillTokens: 700}, LoadAt: now}, podQueue{Waiting: 4, Prefill: 700}},
		{"fresh report and sends since", route.PeerView{Load: route.Load{Waiting: 4, InFlight: 2, InFlightPrefillTokens: 50}, LoadAt: now.Add(-time.Second)}, podQueue{Waiting: 6, Prefill: 50}},
		{"stale report: only sends since", route.PeerView{Load: route.Load{Waiting: 4, InFlight: 2, QueuedPrefillTokens: 9}, LoadAt: now.Add(-cfg.LoadTTL - time.Second)}, podQueue{Waiting: 2, Prefill: 0}},
		{"no report", route.PeerView{Load: route.Load{Waiting: 4}}, podQueue{}},
		{"negative fields count 0", route.PeerView{Load: route.Load{Waiting: -3, InFlight: -1, QueuedPrefillTokens: -5}, LoadAt: now}, podQueue{}},
		// The batch is full at the scrape (9 running); 5 arrived since and
		// wait for their first token, so 5 wait although the scrape said 1.
		{"fronted: arrivals since the scrape wait", route.PeerView{Load: route.Load{Fronted: true, Waiting: 1, Running: 9, Serving: 14, Prefilling: 5}, LoadAt: now}, podQueue{Waiting: 5, Prefill: 0}},
		// A burst of 8 since the scrape, 6 of them answered already: vLLM
		// scheduled them, at most 2 wait (agent fan-out's calls were
		// refused so, the scrape 250 ms behind).
		{"fronted: arrivals since the scrape, most answered", route.PeerView{Load: route.Load{Fronted: true, Running: 4, Serving: 12, Prefilling: 2}, LoadAt: now}, podQueue{Waiting: 2, Prefill: 0}},
		{"fronted: the scrape's own queue when larger", route.PeerView{Load: route.Load{Fronted: true, Waiting: 6, Running: 9, Serving: 10, Prefilling: 1}, LoadAt: now}, podQueue{Waiting: 6, Prefill: 0}},
		{"not fronted: the scrape alone", route.PeerView{Load: route.Load{Waiting: 1, Running: 9, Serving: 14}, LoadAt: now}, podQueue{Waiting: 1, Prefill: 0}},
		// The share goes on from the report with the queue it gave: up
		// while tokens were queued, down while none were.
		{"share of a busy pod, a window on", route.PeerView{Load: route.Load{PrefillShare: 0.5, QueuedPrefillTokens: 10}, LoadAt: now.Add(-route.ShareWindow)}, podQueue{Prefill: 10, Share: 1 - 0.5*math.Exp(-1)}},
		{"share of an idle pod, a window on", route.PeerView{Load: route.Load{PrefillShare: 0.5}, LoadAt: now.Add(-route.ShareWindow)}, podQueue{Share: 0.5 * math.Exp(-1)}},
		{"share of a stale report: none", route.PeerView{Load: route.Load{PrefillShare: 1, QueuedPrefillTokens: 10}, LoadAt: now.Add(-cfg.LoadTTL - time.Second)}, podQueue{}},
	}
	for _, tt := range tests {
		if got := queueAt(cfg, &tt.p, now); got.Waiting != tt.want.Waiting || got.Prefill != tt.want.Prefill || math.Abs(got.Share-tt.want.Share) > 1e-9 {
			t.Errorf("%s: queueAt = %+v; want %+v", tt.name, got, tt.want)
		}
	}
}

func TestCandidateQueuesSkipIneligible(t *testing.T) {
	now := time.Now()
	peers := []route.PeerView{
		{ID: "a", Local: true, Load: route.Load{Waiting: 3}, LoadAt: now},
		{ID: "b", Load: route.Load{Waiting: 0}, LoadAt: now, Engine: route.EngineDown},
		{ID: "c", Load: route.Load{Waiting: 5}, LoadAt: now},
	}
	waiting := func(qs []podQueue) []int {
		var out []int
		for _, q := range qs {
			out = append(out, q.Waiting)
		}
		return out
	}
	d := route.Decision{Candidates: []route.Candidate{{ID: "a", Eligible: true}, {ID: "b"}, {ID: "c", Eligible: true}}}
	if got := waiting(candidateQueues(route.DefaultConfig(), d, peers, 0, now)); !slices.Equal(got, []int{3, 5}) {
		t.Fatalf("candidateQueues = %v; want [3 5] (b is not eligible)", got)
	}
	// Candidates in another order than the peers are still matched by ID.
	d.Candidates[0], d.Candidates[2] = d.Candidates[2], d.Candidates[0]
	if got := waiting(candidateQueues(route.DefaultConfig(), d, peers, 0, now)); !slices.Equal(got, []int{5, 3}) {
		t.Fatalf("reordered: candidateQueues = %v; want [5 3]", got)
	}
}

// A Decision among many peers lists only some; admission reads the
// peers it omits once the listed ones are full, so a pod with room that
// is heavier by load than every listed one still admits the request.
func TestCandidateQueuesReadOmittedPeers(t *testing.T) {
	now := time.Now()
	peers := make([]route.PeerView, 3*route.ListPeers)
	for i := range peers {
		peers[i] = route.PeerView{ID: fmt.Sprintf("p%03d", i), LoadAt: now, Load: route.Load{Waiting: 2}}
	}
	heavy := &peers[len(peers)-1]
	heavy.Load = route.Load{Running: 10} // room, but the heaviest by load
	heavy.Draining = false
	peers[5].Draining = true
	cfg := route.DefaultConfig()
	d := route.DefaultChain(cfg, nil).Choose(route.Request{Keys: []blockkey.Key{1, 2}}, peers, now)
	if d.Omitted == 0 || slices.ContainsFunc(d.Candidates, func(c route.Candidate) bool { return c.ID == heavy.ID }) {
		t.Fatalf("omitted %d, %s listed: the test needs it left out", d.Omitted, heavy.ID)
	}
	qs := candidateQueues(cfg, d, peers, 100, now)
	if len(qs) != len(peers)-1 {
		t.Fatalf("%d queues; want every eligible peer's, %d", len(qs), len(peers)-1)
	}
	var room int
	for _, q := range qs {
		if q.Waiting == 0 {
			room++
		}
	}
	if room != 1 {
		t.Fatalf("%d queues with room; want the heavy peer's", room)
	}
	b := bounds{MaxRequests: 2}
	if !admit(qs, b) {
		t.Fatal("refused with a pod that has room")
	}
}

// fullPair is holderPair with a queue bound of 2 and both pods' engines
// reporting the given requests waiting.
func fullPair(t *testing.T, waitA, waitB int) (a, b *node) {
	a, b = holderPair(t)
	a.h.cfg.MaxQueue = 2
	a.peers.views[0].Load.Waiting = waitA
	a.peers.views[1].Load.Waiting = waitB
	return a, b
}

const messagesBody = `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"` + testPrompt + `"}]}`

func TestFullMeshIsRefused(t *testing.T) {
	t.Run("openai", func(t *testing.T) {
		a, b := fullPair(t, 2, 3)
		// A third pod with room whose engine is down cannot serve: it does
		// not keep the mesh from being full.
		a.peers.views = append(a.peers.views, route.PeerView{ID: "c", Addr: "127.0.0.1:1", KeyScheme: blockkey.Version, LoadAt: time.Now(), Engine: route.EngineDown})
		resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("status %d Retry-After %q body %s; want 429, 1", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != 429 || e.Error.Message == "" {
			t.Fatalf("body %s: not an OpenAI 429 error (%v)", body, err)
		}
		if len(*a.seen)+len(*b.seen) != 0 {
			t.Errorf("vLLMs saw %d+%d requests; want none (refused before proxying)", len(*a.seen), len(*b.seen))
		}
		var m dto.Metric
		a.h.metrics.badRequests.WithLabelValues(queueFullKind, "completions").Write(&m)
		if n := m.GetCounter().GetValue(); n != 1 {
			t.Errorf("request_errors_total{kind=queue_full} = %v; want 1", n)
		}
	})
	t.Run("anthropic", func(t *testing.T) {
		// The SDK's last attempt: the queue bounds refuse it too (only
		// the prefill share is waived for it).
		a, b := fullPair(t, 2, 2)
		resp := post(t, a.srv.URL+"/v1/messages", messagesBody, map[string]string{RetryCountHeader: "2"})
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("status %d Retry-After %q body %s; want 429, 1", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		var e anthropicError
		if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type != "rate_limit_error" || e.Error.Message == "" {
			t.Fatalf("body %s: not Anthropic's rate_limit_error (%v)", body, err)
		}
		if len(*a.seen)+len(*b.seen) != 0 {
			t.Errorf("vLLMs saw %d+%d requests; want none", len(*a.seen), len(*b.seen))
		}
	})
}

func TestMeshWithRoomIsServed(t *testing.T) {
	for _, tt := range []struct {
		name         string
		waitA, waitB int
		pod          string
	}{
		// Admission only: which pod serves is the choice's (here the idle
		// local one, by load), so any pod is fine.
		{"holder has room", 5, 1, ""},
		// The holder is full, the local pod is not: served, not refused.
		{"only the local pod has room", 1, 2, "a"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := fullPair(t, tt.waitA, tt.waitB)
			for _, req := range []struct{ path, body string }{
				{"/v1/completions", `{"model":"m","prompt":"` + testPrompt + `"}`},
				{"/v1/messages", messagesBody},
			} {
				resp := post(t, a.srv.URL+req.path, req.body, nil)
				if resp.StatusCode != 200 || resp.Header.Get("Retry-After") != "" {
					t.Fatalf("%s: status %d Retry-After %q; want 200", req.path, resp.StatusCode, resp.Header.Get("Retry-After"))
				}
				if req.path == "/v1/completions" && tt.pod != "" && resp.Header.Get("X-Pod") != tt.pod {
					t.Errorf("%s: served by %q; want %s", req.path, resp.Header.Get("X-Pod"), tt.pod)
				}
			}
		})
	}
	t.Run("bound off", func(t *testing.T) {
		a, _ := fullPair(t, 50, 50)
		a.h.cfg.MaxQueue = 0
		if resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil); resp.StatusCode != 200 {
			t.Fatalf("status %d; want 200 with the bound off", resp.StatusCode)
		}
	})
}

// TestFullHopIsServedNotForwarded checks a request forwarded to a pod
// whose own view says every pod is full: the sender admitted it, so it is
// served there, neither refused with 429 nor forwarded on (no ping-pong).
func TestFullHopIsServedNotForwarded(t *testing.T) {
	a, b, c := threeNodes(t)
	b.h.cfg.MaxQueue = 1
	now := time.Now()
	b.peers.views = []route.PeerView{
		{ID: "b", Local: true, KeyScheme: blockkey.Version, Load: route.Load{Waiting: 9}, LoadAt: now},
		{ID: "c", Addr: hostOf(c.srv), KeyScheme: blockkey.Version, Load: route.Load{Waiting: 9}, LoadAt: now},
	}
	valid := NewHop([]byte("k"), time.Minute).Sign("a", "b", now)
	resp := post(t, b.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, map[string]string{HopHeader: valid})
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "b" || resp.Header.Get(DecisionHeader) != "hop" {
		t.Fatalf("hop to full b: status %d pod %q decision %q; want 200 from b, hop", resp.StatusCode, resp.Header.Get("X-Pod"), resp.Header.Get(DecisionHeader))
	}
	if len(*c.seen) != 0 || len(*a.seen) != 0 {
		t.Errorf("the hop went on: a saw %d, c saw %d; want 0", len(*a.seen), len(*c.seen))
	}
	// And a client request to b, whose view is full, is refused there.
	if resp := post(t, b.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, nil); resp.StatusCode != 429 {
		t.Errorf("client request to full b: status %d; want 429", resp.StatusCode)
	}
	if len(*c.seen) != 0 {
		t.Errorf("c saw %d requests; want 0", len(*c.seen))
	}
}

// TestNoEngineIsRetryable503 checks that when no pod's engine can serve
// (the local one and every peer's marked down), the client gets a
// retryable 503 at once: within a second, with Retry-After.
func TestNoEngineIsRetryable503(t *testing.T) {
	for _, maxQueue := range []int{0, 2} {
		a, b := holderPair(t)
		a.h.cfg.MaxQueue = maxQueue
		a.h.SetLocalReady(false)
		a.vllm.Close()
		a.peers.views[1].Engine = route.EngineDown
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, "POST", a.srv.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"`+testPrompt+`"}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("max-queue %d: no answer within 1 s: %v", maxQueue, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if err != nil {
			t.Fatalf("max-queue %d: body not read within 1 s: %v", maxQueue, err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("max-queue %d: status %d Retry-After %q body %s; want a retryable 503", maxQueue, resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if len(*b.seen) != 0 {
			t.Errorf("max-queue %d: b's down engine was sent %d requests", maxQueue, len(*b.seen))
		}
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != 503 {
			t.Errorf("max-queue %d: body %s: not an OpenAI 503 (%v)", maxQueue, body, err)
		}
		resp = post(t, a.srv.URL+"/v1/messages", messagesBody, nil)
		var ae anthropicError
		if err := json.NewDecoder(resp.Body).Decode(&ae); err != nil || resp.StatusCode != 503 || ae.Error.Type != "overloaded_error" {
			t.Errorf("max-queue %d: messages: status %d error %+v (%v); want 503 overloaded_error", maxQueue, resp.StatusCode, ae, err)
		}
	}
}

// TestRefusalsAreNotRetriedAcrossTheMesh checks a mesh of pods that all
// refuse (503, their engines gone since our view) costs a request at most
// Retry.MaxAttempts attempts however many pods there are, and its client
// gets a retryable 503 of its own; a 429 from a pod is never retried.
func TestRefusalsAreNotRetriedAcrossTheMesh(t *testing.T) {
	for _, tt := range []struct {
		name   string
		status int
	}{{"refused", 503}, {"rate limited", 429}} {
		t.Run(tt.name, func(t *testing.T) {
			a := newNode(t, "a")
			a.h.SetLocalReady(false) // the peers are all there is
			var hits atomic.Int64
			now := time.Now()
			a.peers.views = []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, LoadAt: now}}
			for i := range 8 {
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					hits.Add(1)
					if tt.status == 503 {
						w.Header().Set(RefusedHeader, "engine-down")
					}
					writeAPIError(w, prompt.APICompletions, tt.status, "no")
				}))
				t.Cleanup(srv.Close)
				a.peers.views = append(a.peers.views, route.PeerView{ID: fmt.Sprintf("p%d", i), Addr: hostOf(srv), KeyScheme: blockkey.Version, LoadAt: now})
			}
			resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil)
			io.Copy(io.Discard, resp.Body)
			want := int64(1)
			if tt.status == 503 {
				want = int64(a.h.cfg.Retry.MaxAttempts)
			}
			if n := hits.Load(); n != want {
				t.Errorf("8 refusing pods were tried %d times; want %d", n, want)
			}
			if resp.StatusCode != tt.status || resp.Header.Get("Retry-After") == "" || resp.Header.Get(RefusedHeader) != "" {
				t.Errorf("client got %d Retry-After %q %s %q; want %d with Retry-After and no refusal marker",
					resp.StatusCode, resp.Header.Get("Retry-After"), RefusedHeader, resp.Header.Get(RefusedHeader), tt.status)
			}
		})
	}
}

// TestSteer: an admitted request goes to the first pod of the failover
// order with room; the order is otherwise kept, and the full pods follow.
func TestSteer(t *testing.T) {
	b := bounds{MaxRequests: 2}
	d := route.Decision{Target: "h", Attempts: []string{"h", "x", "y"}, Candidates: []route.Candidate{
		{ID: "h", Chosen: true, MatchedTokens: 512}, {ID: "x", Local: true}, {ID: "y"}}}
	for _, tt := range []struct {
		name    string
		qs      map[string]podQueue
		want    []string
		steered bool
	}{
		{"holder has room", map[string]podQueue{"h": {Waiting: 1}, "x": {Waiting: 9}}, []string{"h", "x", "y"}, false},
		{"holder full", map[string]podQueue{"h": {Waiting: 2}, "x": {Waiting: 0}}, []string{"x", "y", "h"}, true},
		{"holder and next full", map[string]podQueue{"h": {Waiting: 3}, "x": {Waiting: 2}}, []string{"y", "h", "x"}, true},
		{"all full: as chosen (admission refuses first)", map[string]podQueue{"h": {Waiting: 3}, "x": {Waiting: 2}, "y": {Waiting: 5}}, []string{"h", "x", "y"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, steered := steer(d, tt.qs, b)
			if !slices.Equal(got.Attempts, tt.want) || steered != tt.steered || got.Target != tt.want[0] {
				t.Fatalf("steer = %v target %q steered %v; want %v, %v", got.Attempts, got.Target, steered, tt.want, tt.steered)
			}
			chosen := ""
			for _, c := range got.Candidates {
				if c.Chosen {
					chosen += c.ID
				}
			}
			if chosen != tt.want[0] || got.Local != (tt.want[0] == "x") {
				t.Errorf("chosen %q local %v; want %s", chosen, got.Local, tt.want[0])
			}
			if d.Candidates[0].Chosen != true || d.Attempts[0] != "h" {
				t.Error("steer modified its argument")
			}
		})
	}
	if got, steered := steer(d, map[string]podQueue{"h": {Waiting: 9}}, bounds{}); steered || got.Target != "h" {
		t.Errorf("bounds off: steered to %q", got.Target)
	}
}

// TestPrefillBusyMesh: with every pod's engine prefilling for over
// MaxPrefillShare of its recent time (and StepTokens 0: any queue is a
// backlog), a long prompt is refused with 429 (prefill_busy) and a short
// one is served; with one pod below the share, the long prompt goes there;
// with StepTokens, where the queues and the prompt fit in a step, it is
// served.
func TestPrefillBusyMesh(t *testing.T) {
	long := `{"model":"m","prompt":"` + strings.Repeat("x", 3000) + `"}`
	busy := func(t *testing.T, aBusy, bBusy bool) (a, b *node) {
		a, b = holderPair(t)
		a.h.cfg.MaxBodyBytes, b.h.cfg.MaxBodyBytes = 16<<10, 16<<10
		a.h.cfg.StepTokens = 0
		now := time.Now()
		if aBusy {
			a.h.share = prefillShare{v: 0.95, busy: true, since: now}
		}
		if bBusy {
			a.peers.views[1].Load = route.Load{Fronted: true, PrefillShare: 0.95, QueuedPrefillTokens: 9000}
		}
		return a, b
	}
	t.Run("every pod busy", func(t *testing.T) {
		a, b := busy(t, true, true)
		resp := post(t, a.srv.URL+"/v1/completions", long, nil)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("status %d Retry-After %q body %s; want 429, 1", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != 429 || !strings.Contains(e.Error.Message, "prefilling") {
			t.Fatalf("body %s: not an OpenAI 429 saying why (%v)", body, err)
		}
		if len(*a.seen)+len(*b.seen) != 0 {
			t.Errorf("vLLMs saw %d+%d requests; want none", len(*a.seen), len(*b.seen))
		}
		var m dto.Metric
		a.h.metrics.badRequests.WithLabelValues(prefillBusyKind, "completions").Write(&m)
		if n := m.GetCounter().GetValue(); n != 1 {
			t.Errorf("request_errors_total{kind=prefill_busy} = %v; want 1", n)
		}
		// A short prompt costs the engines' decoding little: served.
		if resp := post(t, a.srv.URL+"/v1/completions", `{"model":"m","prompt":"`+testPrompt+`"}`, nil); resp.StatusCode != 200 {
			t.Errorf("short prompt: status %d; want 200", resp.StatusCode)
		}
	})
	t.Run("every pod busy, the queues within a step", func(t *testing.T) {
		a, _ := busy(t, true, true)
		a.h.cfg.StepTokens = 8192
		a.peers.views[1].Load.QueuedPrefillTokens = 1000
		if resp := post(t, a.srv.URL+"/v1/completions", long, nil); resp.StatusCode != 200 {
			t.Errorf("status %d; want 200", resp.StatusCode)
		}
		a.peers.views[1].Load.QueuedPrefillTokens = 9000
		a.h.cfg.StepTokens = 1 // a's own queue, empty, and the prompt are past it
		if resp := post(t, a.srv.URL+"/v1/completions", long, nil); resp.StatusCode != 429 {
			t.Errorf("past a step: status %d; want 429", resp.StatusCode)
		}
	})
	t.Run("a client's last attempt", func(t *testing.T) {
		a, b := busy(t, true, true)
		for _, tt := range []struct {
			attempt string
			want    int
		}{{"", 429}, {"0", 429}, {"1", 429}, {"x", 429}, {"2", 200}, {"3", 200}} {
			resp := post(t, a.srv.URL+"/v1/completions", long, map[string]string{RetryCountHeader: tt.attempt})
			if resp.StatusCode != tt.want {
				t.Errorf("attempt %q: status %d; want %d", tt.attempt, resp.StatusCode, tt.want)
			}
		}
		var m dto.Metric
		a.h.metrics.shareWaived.WithLabelValues("completions").Write(&m)
		if n := m.GetCounter().GetValue(); n != 2 {
			t.Errorf("prefill_share_waived_total = %v; want 2", n)
		}
		if len(*a.seen)+len(*b.seen) != 2 {
			t.Errorf("vLLMs saw %d+%d requests; want the 2 last attempts", len(*a.seen), len(*b.seen))
		}
		a.h.cfg.ServeRetry = 0
		if resp := post(t, a.srv.URL+"/v1/completions", long, map[string]string{RetryCountHeader: "2"}); resp.StatusCode != 429 {
			t.Errorf("--serve-retry 0: status %d; want 429", resp.StatusCode)
		}
	})
	t.Run("a last attempt goes past a full queue", func(t *testing.T) {
		// Both pods past the share, b's queue full too: the last attempt
		// is admitted for a, and steered there whichever pod was chosen.
		for _, text := range []string{"x", "y", "z", "w"} {
			a, b := busy(t, true, true)
			// b's queue full by its scraped count, which the choice does
			// not read for a fronted pod (it has the exact one), and no
			// prefill queued (its share falls to the bound in half a
			// second), so that the choice falls on b for some prompts.
			a.peers.views[1].Load.Waiting = a.h.cfg.MaxQueue
			a.peers.views[1].Load.QueuedPrefillTokens = 0
			a.peers.views[1].Load.PrefillShare = 0.999
			a.peers.views[1].LoadAt = time.Now()
			body := `{"model":"m","prompt":"` + strings.Repeat(text, 3000) + `"}`
			resp := post(t, a.srv.URL+"/v1/completions", body, map[string]string{RetryCountHeader: "2"})
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "a" || len(*b.seen) != 0 {
				t.Errorf("prompt of %q: status %d from %q, b saw %d; want 200 from a", text, resp.StatusCode, resp.Header.Get("X-Pod"), len(*b.seen))
			}
		}
	})
	t.Run("one pod below the share", func(t *testing.T) {
		for _, tt := range []struct {
			aBusy, bBusy bool
			want         string
		}{{true, false, "b"}, {false, true, "a"}} {
			a, _ := busy(t, tt.aBusy, tt.bBusy)
			resp := post(t, a.srv.URL+"/v1/completions", long, nil)
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != tt.want {
				t.Errorf("a busy %v, b busy %v: status %d from %q; want 200 from %s", tt.aBusy, tt.bBusy, resp.StatusCode, resp.Header.Get("X-Pod"), tt.want)
			}
		}
	})
}

// TestPrefillShareRepushed: once the local queue is empty, the front
// reports its engine's share again when it falls below the bound, though
// no request starts or answers then: peers holding a later report of the
// scraped load would otherwise take the old share as current.
func TestPrefillShareRepushed(t *testing.T) {
	a := newNode(t, "a")
	a.h.mu.Lock()
	a.h.share = prefillShare{v: 0.95, busy: true, since: time.Now()}
	a.h.mu.Unlock()
	a.h.track(func() {}, "") // the queue is empty: idle from now
	deadline := time.Now().Add(5 * time.Second)
	for {
		a.peers.mu.Lock()
		s := slices.Clone(a.peers.shares)
		a.peers.mu.Unlock()
		if len(s) >= 2 && s[len(s)-1] < a.h.cfg.MaxPrefillShare {
			if s[0] < a.h.cfg.MaxPrefillShare {
				t.Fatalf("first report %v; want the share at the bound or above", s[0])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("shares reported %v; want one below %v within 5s", s, a.h.cfg.MaxPrefillShare)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
