//go:build integration

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The agents' APIs through three sidecars (issue 24): Anthropic Messages,
// OpenAI Responses with vLLM's store, batch completions, images. The
// cluster's simulators keep a Responses store, as vLLM does with
// VLLM_ENABLE_RESPONSES_API_STORE=1, and offer the render endpoints, as
// vLLM v0.30 does with --enable-scale-out.

var apisOnce struct {
	sync.Once
	f   *fixture
	err error
}

func apiCluster(t *testing.T) *fixture {
	t.Helper()
	apisOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		var progress io.Writer = io.Discard
		if testing.Verbose() {
			progress = os.Stderr // the cluster outlives the test that starts it
		}
		apisOnce.f, apisOnce.err = startCluster(ctx, clusterSpec{
			pods: 3, subnet: 7, secret: true, timeScale: 20, progress: progress,
			simArgs: []string{"--enable-scale-out"},
			simEnv:  []string{"VLLM_ENABLE_RESPONSES_API_STORE=1"},
		}, nil)
	})
	if apisOnce.err != nil {
		t.Fatalf("start the APIs' cluster: %v", apisOnce.err)
	}
	return apisOnce.f
}

// longSystem is a system prompt of about 2k tokens, unique to name.
func longSystem(name string) string {
	var b strings.Builder
	for i := range 150 {
		fmt.Fprintf(&b, "Rule %d of %s: answer politely and cite the policy section. ", i, name)
	}
	return b.String()
}

// post sends body to path at pod i's sidecar.
func (f *fixture) post(t *testing.T, i int, path string, body any) reply {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).API, path, b, nil)
	if err != nil {
		t.Fatalf("POST %s to %s: %v", path, f.c.Pod(i).Name, err)
	}
	return r
}

// usage is the part of every API's usage the tests read.
type usage struct {
	// chat, completions
	PromptDetails *struct {
		Cached int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// responses
	InputDetails *struct {
		Cached int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	// messages
	CacheRead *int `json:"cache_read_input_tokens"`
}

// cachedOf is the cached prompt tokens an answer of any API reports, -1
// when it has none.
func cachedOf(r reply) int {
	var v struct {
		Usage *usage `json:"usage"`
	}
	if json.Unmarshal(r.Body, &v) != nil || v.Usage == nil {
		return -1
	}
	switch u := v.Usage; {
	case u.PromptDetails != nil:
		return u.PromptDetails.Cached
	case u.InputDetails != nil:
		return u.InputDetails.Cached
	case u.CacheRead != nil:
		return *u.CacheRead
	}
	return -1
}

// explainAPI asks pod i how it would route body of api.
func (f *fixture) explainAPI(ctx context.Context, i int, api string, body any) (decision, error) {
	b, _ := json.Marshal(body)
	r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).Admin, "/debug/route?api="+api, b, nil)
	if err != nil {
		return decision{}, err
	}
	if r.Status != http.StatusOK {
		return decision{}, fmt.Errorf("debug/route status %d: %s", r.Status, r.Body)
	}
	var v struct {
		Decision decision `json:"decision"`
	}
	return v.Decision, json.Unmarshal(r.Body, &v)
}

func messagesBody(system, user string) map[string]any {
	return map[string]any{"model": model, "max_tokens": 4, "system": system,
		"messages": []any{map[string]any{"role": "user", "content": user}}}
}

func responsesBody(instructions, input string) map[string]any {
	return map[string]any{"model": model, "max_output_tokens": 4, "instructions": instructions, "input": input}
}

// A conversation's next turn on Messages or Responses reaches the pod that
// holds its prefix from every sidecar, and that pod reports the prefix
// cached in the API's own usage field.
func TestAgentAPIsFollowUpsReachHolder(t *testing.T) {
	f := apiCluster(t)
	for _, tc := range []struct {
		api, path string
		body      func(sys, user string) map[string]any
	}{
		{"messages", "/v1/messages", messagesBody},
		{"responses", "/v1/responses", responsesBody},
	} {
		t.Run(tc.api, func(t *testing.T) {
			sys := longSystem(t.Name())
			first := f.post(t, 0, tc.path, tc.body(sys, "first question"))
			if first.Status != http.StatusOK {
				t.Fatalf("first: %d %s", first.Status, first.Body)
			}
			holder := first.ServedBy
			// Every sidecar learns where the prefix is before the follow-ups.
			for i := range f.c.Len() {
				waitFor(t, 15*time.Second, f.c.Pod(i).Name+" routes the follow-up to "+holder, func(ctx context.Context) (bool, string) {
					d, err := f.explainAPI(ctx, i, tc.api, tc.body(sys, "probe"))
					if err != nil {
						return false, err.Error()
					}
					return d.Target == holder && d.Reason == "affinity", fmt.Sprintf("target %q (%s)", d.Target, d.Reason)
				})
			}
			for i := range f.c.Len() {
				r := f.post(t, i, tc.path, tc.body(sys, fmt.Sprintf("follow-up %d", i)))
				if r.Status != http.StatusOK || r.ServedBy != holder {
					t.Errorf("via %s: %d served by %q (%s); want the holder %s", f.c.Pod(i).Name, r.Status, r.ServedBy, r.Decision, holder)
					continue
				}
				if got := cachedOf(r); got < 1500 {
					t.Errorf("via %s: %d cached tokens; want the ~2k-token system prompt", f.c.Pod(i).Name, got)
				}
			}
		})
	}
}

// A stored response is fetched, cancelled and continued from every
// sidecar, on the pod that made it; also after that pod's sidecar
// restarts (its vLLM, and so its store, lives on).
func TestStoredResponseFromEverySidecar(t *testing.T) {
	f := apiCluster(t)
	sys := longSystem(t.Name())
	id, owner := f.store(t, 1, sys, "remember 42")
	x := f.index(owner)
	check := func(when string) {
		for i := range f.c.Len() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			got, err := f.do(ctx, http.MethodGet, f.c.Pod(i).API, "/v1/responses/"+id, nil, nil)
			cancel()
			if err != nil || got.Status != http.StatusOK || got.ServedBy != owner {
				t.Errorf("%s: GET via %s: %v %d from %q: %s", when, f.c.Pod(i).Name, err, got.Status, got.ServedBy, got.Body)
			}
			// instructions are not carried over from the stored response
			// (vLLM's construct_input_messages, as OpenAI's API): a client
			// sends them again.
			next := f.post(t, i, "/v1/responses", map[string]any{"model": model, "max_output_tokens": 4,
				"instructions": sys, "previous_response_id": id, "input": "which number?"})
			if next.Status != http.StatusOK || next.ServedBy != owner || next.Decision != "stored" {
				t.Errorf("%s: continued via %s: %d from %q (%s): %s", when, f.c.Pod(i).Name, next.Status, next.ServedBy, next.Decision, next.Body)
			}
			if c := cachedOf(next); c < 1500 {
				t.Errorf("%s: continued via %s: %d cached tokens; want the stored conversation's", when, f.c.Pod(i).Name, c)
			}
		}
	}
	check("created a moment ago")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := f.c.RestartSidecar(ctx, x); err != nil {
		t.Fatalf("restart %s's sidecar: %v", owner, err)
	}
	check("after the owner's sidecar restarted")
}

// dataURL is a fake PNG's data URL; seed makes a different image.
func dataURL(seed string) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("\x89PNG fake image "+seed))
}

func imageChat(sys, image, user string) map[string]any {
	return map[string]any{"model": model, "max_tokens": 4, "messages": []any{
		map[string]any{"role": "system", "content": sys},
		map[string]any{"role": "user", "content": []any{
			map[string]any{"type": "text", "text": "Look at this."},
			map[string]any{"type": "image_url", "image_url": map[string]any{"url": image}},
			map[string]any{"type": "text", "text": strings.Repeat("Describe it in detail. ", 40) + user},
		}},
	}}
}

// A chat with a different image is not predicted as cached past the
// blocks before the image; the same image is, to the end of its prompt.
func TestDifferentImageIsNotPredicted(t *testing.T) {
	f := apiCluster(t)
	sys := longSystem(t.Name())
	first := f.post(t, 0, "/v1/chat/completions", imageChat(sys, dataURL("A"), "one"))
	if first.Status != http.StatusOK {
		t.Fatalf("first: %d %s", first.Status, first.Body)
	}
	var u struct {
		Usage struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	json.Unmarshal(first.Body, &u)
	holder := first.ServedBy
	matched := func(i int, image string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d, err := f.explainAPI(ctx, i, "chat", imageChat(sys, image, "two"))
		if err != nil {
			t.Fatal(err)
		}
		return d.matched(holder)
	}
	// The holder's digest, not only a claim, has reached pod 3: the same
	// image matches (nearly) every block of the prompt.
	whole := (u.Usage.Prompt - 1) / blockSize
	var same int
	waitFor(t, 15*time.Second, "pod3 sees the whole image chat at "+holder, func(context.Context) (bool, string) {
		same = matched(2, dataURL("A"))
		return same >= whole-4, fmt.Sprintf("%d of %d keys", same, whole)
	})
	other := matched(2, dataURL("B"))
	if other >= same || other < 100 {
		t.Fatalf("another image matched %d keys at %s, the same image %d: want the system prompt's blocks only", other, holder, same)
	}
	r := f.post(t, 2, "/v1/chat/completions", imageChat(sys, dataURL("B"), "three"))
	if r.Status != http.StatusOK || r.ServedBy != holder {
		t.Fatalf("other image: %d served by %q: %s", r.Status, r.ServedBy, r.Body)
	}
	// What the engine reused of the other image's prompt is the part before
	// the image, and the prediction says no more than that.
	c := cachedOf(r)
	if c > u.Usage.Prompt-64 {
		t.Fatalf("the engine reused %d of %d tokens of another image's prompt", c, u.Usage.Prompt)
	}
	if other*blockSize > c+blockSize {
		t.Fatalf("%d tokens predicted for another image, the engine reused %d", other*blockSize, c)
	}
}

// A two-prompt batch whose prefixes one pod holds goes there whole.
func TestBatchLandsWhole(t *testing.T) {
	f := apiCluster(t)
	rng := seeded(t.Name())
	x, prefix := f.warm(t, rng, 24)
	holder := f.c.Pod(x).Name
	for i := range f.c.Len() {
		b := map[string]any{"model": model, "max_tokens": 4,
			"prompt": [][]uint32{join(prefix, tokens(rng, 20)), join(prefix, tokens(rng, 20))}}
		r := f.post(t, i, "/v1/completions", b)
		if r.Status != http.StatusOK || r.ServedBy != holder {
			t.Errorf("via %s: %d served by %q (%s); want %s", f.c.Pod(i).Name, r.Status, r.ServedBy, r.Decision, holder)
			continue
		}
		var v struct {
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
		}
		json.Unmarshal(r.Body, &v)
		if len(v.Choices) != 2 || v.Choices[0].Index != 0 || v.Choices[1].Index != 1 {
			t.Errorf("via %s: choices %+v; want indices 0 and 1", f.c.Pod(i).Name, v.Choices)
		}
		if c := cachedOf(r); c < 2*blockAligned(len(prefix), blockSize) {
			t.Errorf("via %s: %d cached tokens; want both prompts' prefixes", f.c.Pod(i).Name, c)
		}
	}
}

// Malformed bodies of each API get that API's error, from the sidecar
// that received them, never a 502.
func TestMalformedBodiesGetTheirAPIsError(t *testing.T) {
	f := apiCluster(t)
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages", `{"model":"sim-model","messages":[{"role":"user","content":`},
		{"/v1/messages", `{"model":"sim-model","max_tokens":4,"messages":"hi"}`},
		{"/v1/responses", `{"model":"sim-model","input":{"x":1}`},
		{"/v1/responses", `{"model":"sim-model","input":[{"type":"message","role":"user","content":7}]}`},
		{"/v1/completions", `{"model":"sim-model","prompt":[[1,2],"x"]}`},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"image_url","image_url":7}]}]}`},
	} {
		for i := range f.c.Len() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).API, tc.path, []byte(tc.body), nil)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if r.Status/100 != 4 {
				t.Errorf("%s %s via %s: status %d: %s", tc.path, tc.body, f.c.Pod(i).Name, r.Status, r.Body)
				continue
			}
			var anth struct {
				Type  string `json:"type"`
				Error *struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			json.Unmarshal(r.Body, &anth)
			if tc.path == "/v1/messages" {
				if anth.Type != "error" || anth.Error == nil || anth.Error.Message == "" {
					t.Errorf("%s via %s: not Anthropic's error shape: %s", tc.path, f.c.Pod(i).Name, r.Body)
				}
				continue
			}
			if _, code, msg, ok := r.apiError(); !ok || code/100 != 4 || msg == "" {
				t.Errorf("%s via %s: not OpenAI's error shape: %s", tc.path, f.c.Pod(i).Name, r.Body)
			}
		}
	}
}

// cache_salt keeps its meaning on every API that has it: a prefix cached
// under one salt is not predicted, nor reused by the engine, under another.
func TestCacheSaltKeepsItsMeaning(t *testing.T) {
	f := apiCluster(t)
	for _, tc := range []struct {
		api, path string
		body      func(sys, user string) map[string]any
	}{
		{"chat", "/v1/chat/completions", func(sys, user string) map[string]any {
			return map[string]any{"model": model, "max_tokens": 4, "messages": []any{
				map[string]any{"role": "system", "content": sys}, map[string]any{"role": "user", "content": user}}}
		}},
		{"responses", "/v1/responses", responsesBody},
	} {
		t.Run(tc.api, func(t *testing.T) {
			sys := longSystem(t.Name())
			salted := func(salt, user string) map[string]any {
				b := tc.body(sys, user)
				b["cache_salt"] = salt + "-" + tc.api // the subtests' prompts share a first block
				return b
			}
			first := f.post(t, 0, tc.path, salted("tenant-a", "one"))
			if first.Status != http.StatusOK {
				t.Fatalf("first: %d %s", first.Status, first.Body)
			}
			holder := first.ServedBy
			for i := range f.c.Len() {
				waitFor(t, 15*time.Second, f.c.Pod(i).Name+" sees tenant a's prefix at "+holder, func(ctx context.Context) (bool, string) {
					d, err := f.explainAPI(ctx, i, tc.api, salted("tenant-a", "two"))
					if err != nil {
						return false, err.Error()
					}
					return d.matched(holder) >= 100, fmt.Sprintf("%d keys at %s", d.matched(holder), holder)
				})
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				d, err := f.explainAPI(ctx, i, tc.api, salted("tenant-b", "two"))
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				if n := d.matched(holder); n != 0 {
					t.Errorf("via %s: tenant b's request matches %d keys of tenant a's prefix", f.c.Pod(i).Name, n)
				}
			}
			// The engine agrees: at the holder another salt reuses nothing.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			b, _ := json.Marshal(salted("tenant-b", "three"))
			r, err := f.do(ctx, http.MethodPost, f.c.Pod(f.index(holder)).SimAddr, tc.path, b, nil)
			if err != nil || r.Status != http.StatusOK {
				t.Fatalf("tenant b at %s's engine: %v %d %s", holder, err, r.Status, r.Body)
			}
			if c := cachedOf(r); c != 0 {
				t.Fatalf("the engine reused %d tokens across salts", c)
			}
		})
	}
}

// A stored response whose pod is gone gets a 404 saying so from every
// sidecar, not a 502 and not another pod's answer.
func TestStoredResponseOnGonePod(t *testing.T) {
	f := apiCluster(t)
	created := f.post(t, 0, "/v1/responses", responsesBody(longSystem(t.Name()), "keep this"))
	if created.Status != http.StatusOK {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	var resp struct {
		ID string `json:"id"`
	}
	json.Unmarshal(created.Body, &resp)
	x := f.index(created.ServedBy)
	f.waitEngineReached(t, x)
	// Every sidecar has heard where it is stored (a response made a
	// moment before its pod died is simply lost).
	for i := range f.c.Len() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r, err := f.do(ctx, http.MethodGet, f.c.Pod(i).API, "/v1/responses/"+resp.ID, nil, nil)
		cancel()
		if err != nil || r.Status != http.StatusOK || r.ServedBy != created.ServedBy {
			t.Fatalf("GET via %s: %v %d from %q", f.c.Pod(i).Name, err, r.Status, r.ServedBy)
		}
	}
	if err := f.c.Kill(x); err != nil {
		t.Fatal(err)
	}
	f.restartAtCleanup(t, x)
	for i := range f.c.Len() {
		if i == x {
			continue
		}
		// Its address stays (loopback), and nothing listens there: the
		// sidecars that reached its vLLM before say so at once, without
		// memberlist's detection (5-10 s here) and respown.DefaultGrace
		// (10 s), which it took before (forward/direct.go). The first
		// request may meet the dead sidecar still a member, and get a 503.
		f.waitGone(t, i, resp.ID, 8*time.Second)
	}
}

// While the owner pod's sidecar is dead and its vLLM alive, every other
// sidecar serves the stored response from that vLLM itself: a read, and
// a continuation, with no wait for the sidecar to be back.
func TestStoredResponseWhileItsSidecarIsDead(t *testing.T) {
	f := apiCluster(t)
	id, owner := f.store(t, 2, longSystem(t.Name()), "remember 7")
	x := f.index(owner)
	f.waitEngineReached(t, x)
	for i := range f.c.Len() {
		r := f.get(t, i, "/v1/responses/"+id)
		if r.Status != http.StatusOK || r.ServedBy != owner {
			t.Fatalf("GET via %s: %d from %q", f.c.Pod(i).Name, r.Status, r.ServedBy)
		}
	}
	if err := f.c.KillSidecar(x); err != nil {
		t.Fatal(err)
	}
	f.restartAtCleanup(t, x)
	for i := range f.c.Len() {
		if i == x {
			continue
		}
		// The first request may find the dead sidecar still a member, and
		// get a retryable 503; the next goes to the vLLM itself.
		waitFor(t, 8*time.Second, f.c.Pod(i).Name+" serves it from the owner's vLLM", func(ctx context.Context) (bool, string) {
			r, err := f.do(ctx, http.MethodGet, f.c.Pod(i).API, "/v1/responses/"+id, nil, nil)
			if err != nil {
				return false, err.Error()
			}
			return r.Status == http.StatusOK && r.ServedBy == owner, fmt.Sprintf("%d from %q: %s", r.Status, r.ServedBy, r.Body)
		})
		next := f.post(t, i, "/v1/responses", map[string]any{"model": model, "max_output_tokens": 4,
			"previous_response_id": id, "input": "which number?"})
		if next.Status != http.StatusOK || next.ServedBy != owner || next.Decision != "stored" {
			t.Errorf("continued via %s with %s's sidecar dead: %d from %q (%s): %s", f.c.Pod(i).Name, owner, next.Status, next.ServedBy, next.Decision, next.Body)
		}
	}
}

// waitEngineReached waits until every other sidecar has reached pod x's
// vLLM itself at the address x's sidecar advertised (each dials it once
// on seeing it, within 2 s; /debug/peers says so).
func (f *fixture) waitEngineReached(t *testing.T, x int) {
	t.Helper()
	owner := f.c.Pod(x).Name
	for i := range f.c.Len() {
		if i == x {
			continue
		}
		waitFor(t, 10*time.Second, f.c.Pod(i).Name+" reached "+owner+"'s vLLM", func(ctx context.Context) (bool, string) {
			ps, err := f.peers(ctx, f.c.Pod(i).Admin)
			if err != nil {
				return false, err.Error()
			}
			for _, p := range ps {
				if p.ID == owner {
					return p.EngineReached, fmt.Sprintf("%+v", p)
				}
			}
			return false, owner + " not among the peers"
		})
	}
}

// get GETs path at pod i's API.
func (f *fixture) get(t *testing.T, i int, path string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := f.do(ctx, http.MethodGet, f.c.Pod(i).API, path, nil, nil)
	if err != nil {
		t.Fatalf("GET %s via %s: %v", path, f.c.Pod(i).Name, err)
	}
	return r
}

// store creates a stored response through pod i; it returns its id and
// the pod that made it.
func (f *fixture) store(t *testing.T, i int, instructions, input string) (id, owner string) {
	t.Helper()
	body := responsesBody(instructions, input)
	body["store"] = true
	created := f.post(t, i, "/v1/responses", body)
	if created.Status != http.StatusOK {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	var resp struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(created.Body, &resp); err != nil || resp.ID == "" {
		t.Fatalf("create: no id in %s (%v)", created.Body, err)
	}
	return resp.ID, created.ServedBy
}

// A pod deleted gracefully stops vLLM before its (native) sidecar, whose
// shutdown then tells the mesh that the pod's stored responses are gone:
// every other sidecar answers their follow-ups with the final 404 at
// once, not after respown's 10 s grace. The sidecars here advertise no
// engine address (as where a NetworkPolicy closes vLLM's port), so no
// sidecar can ask the pod's vLLM itself, and only that message tells.
func TestStoredResponseOfAPodDeletedGracefully(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 6, timeScale: 20,
		// Debug: what the other sidecar answered, and when it heard the
		// owner go, are in the log tails of a failure.
		args:    []string{"--engine-advertise-addr", "none", "--log-level", "debug"},
		simEnv:  []string{"VLLM_ENABLE_RESPONSES_API_STORE=1"},
		simArgs: []string{"--enable-scale-out"}, failed: t}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	id, owner := f.store(t, 0, longSystem(t.Name()), "keep this")
	x := f.index(owner)
	other := 1 - x
	waitFor(t, 10*time.Second, f.c.Pod(other).Name+" reads it", func(ctx context.Context) (bool, string) {
		r, err := f.do(ctx, http.MethodGet, f.c.Pod(other).API, "/v1/responses/"+id, nil, nil)
		if err != nil {
			return false, err.Error()
		}
		return r.Status == http.StatusOK && r.ServedBy == owner, fmt.Sprintf("%d from %q", r.Status, r.ServedBy)
	})
	if err := f.c.KillSim(x); err != nil { // vLLM's container exits first
		t.Fatal(err)
	}
	if err := f.c.StopSidecar(x); err != nil { // then the sidecar, SIGTERM
		t.Fatal(err)
	}
	left := time.Now()
	f.waitGone(t, other, id, 5*time.Second)
	t.Logf("the 404 came %v after the sidecar stopped", time.Since(left).Round(10*time.Millisecond))
}

// restartAtCleanup starts pod x's processes again when the test ends, so
// the shared cluster has all its pods for the next test.
func (f *fixture) restartAtCleanup(t *testing.T, x int) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := f.c.Restart(ctx, x); err != nil {
			t.Errorf("bring %s back: %v", f.c.Pod(x).Name, err)
		}
	})
}

// waitGone waits up to within until pod i's sidecar answers GET of
// stored response id with the 404 that says the pod holding it is gone.
func (f *fixture) waitGone(t *testing.T, i int, id string, within time.Duration) {
	t.Helper()
	waitFor(t, within, f.c.Pod(i).Name+" says the pod is gone", func(ctx context.Context) (bool, string) {
		r, err := f.do(ctx, http.MethodGet, f.c.Pod(i).API, "/v1/responses/"+id, nil, nil)
		if err != nil {
			return false, err.Error()
		}
		_, _, msg, _ := r.apiError()
		return r.Status == http.StatusNotFound && strings.Contains(msg, "which is gone"), fmt.Sprintf("%d %s", r.Status, r.Body)
	})
}
