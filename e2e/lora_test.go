//go:build integration

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// LoRA serving as a new user sets it up: every simulator serves the base
// model and the adapters alice and bob (--lora-modules), with runtime
// loading allowed (VLLM_ALLOW_RUNTIME_LORA_UPDATING), as vLLM does.
//
// The subtests share one cluster (its own subnet; a subtest that loads an
// adapter uses a name of its own, so order does not matter).
func TestLoRA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 3-pod cluster")
	}
	t.Setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True") // the simulators inherit it
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 3, subnet: 4, timeScale: 20, progress: testProgress{t},
		simArgs: []string{"--served-model-name", "alias", "--lora-modules", "alice=/loras/alice", "bob=/loras/bob"},
		args:    []string{"--models-interval", "1s"}}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	// The sidecars advertise what /v1/models lists shortly after start.
	for i := range f.c.Len() {
		f.waitEligible(t, bodyFor("alice", tokens(seeded(t.Name()), 64), 4), i, true, 10*time.Second)
	}
	t.Run("AdapterFindsNoBaseBlocks", func(t *testing.T) { adapterFindsNoBaseBlocks(t, f) })
	t.Run("AliasIsTheBaseModel", func(t *testing.T) { aliasIsTheBaseModel(t, f) })
	t.Run("RuntimeLoadAndUnload", func(t *testing.T) { runtimeLoadAndUnload(t, f) })
	t.Run("DirectLoadIsFoundByRefresh", func(t *testing.T) { directLoadIsFoundByRefresh(t, f) })
	t.Run("TruncatedModelList", func(t *testing.T) { truncatedModelList(t, f) })
}

func bodyFor(model string, prompt []uint32, maxTokens int) []byte {
	b, _ := json.Marshal(completion{Model: model, Prompt: prompt, MaxTokens: maxTokens})
	return b
}

// servedAt sends b through pod i's sidecar and returns the serving pod's
// index, failing on anything but 200.
func (f *fixture) servedAt(t *testing.T, i int, b []byte) (int, reply) {
	t.Helper()
	r := f.complete(t, i, b, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("via %s: status %d: %s", f.c.Pod(i).Name, r.Status, r.Body)
	}
	x := f.index(r.ServedBy)
	if x < 0 {
		t.Fatalf("via %s: served by %q; want a pod name", f.c.Pod(i).Name, r.ServedBy)
	}
	return x, r
}

// A prompt cached for the base model is no match for an adapter (vLLM
// hashes the adapter's name into every block), and an adapter's own cached
// prompt pulls its follow-ups, from every sidecar, to the pod that holds it.
func adapterFindsNoBaseBlocks(t *testing.T, f *fixture) {
	rng := seeded(t.Name())
	const blocks = 16
	x, prefix := f.warm(t, rng, blocks) // a base-model prefix, visible everywhere
	want := blockAligned(len(prefix), blockSize)

	// Every sidecar sees X holding the prefix for the base model, and no
	// one holding it for alice.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	probe := bodyFor("alice", join(prefix, tokens(rng, 8)), 4)
	for i := range f.c.Len() {
		d, err := f.explain(ctx, i, probe)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range d.Candidates {
			if c.MatchedKeys != 0 || !c.Eligible {
				t.Errorf("via %s: alice request: %s matched %d keys, eligible %v (%s); want 0, eligible", f.c.Pod(i).Name, c.ID, c.MatchedKeys, c.Eligible, c.Excluded)
			}
		}
	}
	// Served for alice, even by X, the prompt is computed from scratch.
	y, r := f.servedAt(t, 0, probe)
	if got := r.cached(); got != 0 {
		t.Errorf("alice request on %s (base prefix holder %s) cached_tokens %d; want 0", f.c.Pod(y).Name, f.c.Pod(x).Name, got)
	}
	holder := f.c.Pod(y).Name
	for i := range f.c.Len() {
		f.waitRoute(t, i, bodyFor("alice", join(prefix, tokens(rng, 8)), 4), holder, blocks)
	}
	for i := range f.c.Len() {
		got, r := f.servedAt(t, i, bodyFor("alice", join(prefix, tokens(rng, 24)), 4))
		if got != y || r.Decision != "affinity" {
			t.Errorf("alice follow-up via %s: served by %s (%s); want %s by affinity", f.c.Pod(i).Name, r.ServedBy, r.Decision, holder)
		}
		if c := r.cached(); c < want {
			t.Errorf("alice follow-up via %s: cached_tokens %d; want >= %d", f.c.Pod(i).Name, c, want)
		}
	}
	// bob shares the prompt text, not alice's blocks.
	d, err := f.explain(ctx, 1, bodyFor("bob", join(prefix, tokens(rng, 8)), 4))
	if err != nil {
		t.Fatal(err)
	}
	if n := d.matched(holder); n != 0 {
		t.Errorf("bob request: %s matched %d keys of alice's blocks; want 0", holder, n)
	}
}

// A request naming another --served-model-name of the base model is the
// base model's in vLLM (no adapter in its hashes), and routing agrees: it
// follows the base model's cached blocks.
func aliasIsTheBaseModel(t *testing.T, f *fixture) {
	rng := seeded(t.Name())
	const blocks = 8
	x, prefix := f.warm(t, rng, blocks)
	for i := range f.c.Len() {
		got, r := f.servedAt(t, i, bodyFor("alias", join(prefix, tokens(rng, 8)), 4))
		if got != x || r.Decision != "affinity" || r.cached() < blockAligned(len(prefix), blockSize) {
			t.Errorf("alias via %s: served by %s (%s), cached %d; want %s by affinity, >= %d", f.c.Pod(i).Name, r.ServedBy, r.Decision, r.cached(), f.c.Pod(x).Name, len(prefix))
		}
	}
}

// adapterPost loads or unloads an adapter through pod i's sidecar, which
// passes the call to its vLLM.
func (f *fixture) adapterPost(t *testing.T, addr, path, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := fmt.Sprintf(`{"lora_name":%q,"lora_path":"/loras/%s"}`, name, name)
	r, err := f.do(ctx, http.MethodPost, addr, path, []byte(b), nil)
	if err != nil || r.Status != http.StatusOK {
		t.Fatalf("POST %s %s on %s: %v (status %d: %s)", path, name, addr, err, r.Status, r.Body)
	}
}

// waitEligible waits until every sidecar's choice for b counts pod x as
// eligible (or, with want false, excluded for its model), and returns how
// long that took.
func (f *fixture) waitEligible(t *testing.T, b []byte, x int, want bool, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	name := f.c.Pod(x).Name
	waitFor(t, timeout, fmt.Sprintf("%s eligible=%v everywhere", name, want), func(ctx context.Context) (bool, string) {
		for i := range f.c.Len() {
			d, err := f.explain(ctx, i, b)
			if err != nil {
				return false, err.Error()
			}
			for _, c := range d.Candidates {
				if c.ID != name {
					continue
				}
				if want && !c.Eligible || !want && c.Excluded != "model" {
					return false, fmt.Sprintf("via %s: %s eligible %v excluded %q", f.c.Pod(i).Name, name, c.Eligible, c.Excluded)
				}
			}
		}
		return true, ""
	})
	return time.Since(start)
}

// An adapter loaded at run time on one pod is routed there from every
// sidecar within a meta update (the sidecar that proxied the load
// refreshes at once); once unloaded it is no longer routed there, though
// that pod's cache still holds its blocks.
func runtimeLoadAndUnload(t *testing.T, f *fixture) {
	rng := seeded(t.Name())
	const x = 1
	prompt := tokens(rng, 8*blockSize)
	b := bodyFor("carol", prompt, 4)
	// Before the load nobody serves carol: the receiving pod's vLLM says so.
	if r := f.complete(t, 0, b, nil); r.Status != http.StatusNotFound {
		t.Fatalf("carol before load: status %d (%s); want 404", r.Status, r.Body)
	}
	f.adapterPost(t, f.c.Pod(x).API, "/v1/load_lora_adapter", "carol")
	took := f.waitEligible(t, b, x, true, 5*time.Second)
	t.Logf("carol routable from every sidecar %v after the load", took.Round(time.Millisecond))
	for i := range f.c.Len() {
		if got, r := f.servedAt(t, i, bodyFor("carol", join(prompt, tokens(rng, 8)), 4)); got != x {
			t.Errorf("carol via %s: served by %s (%s); want %s, the only pod with carol", f.c.Pod(i).Name, r.ServedBy, r.Decision, f.c.Pod(x).Name)
		}
	}
	f.waitRoute(t, 0, bodyFor("carol", join(prompt, tokens(rng, 8)), 4), f.c.Pod(x).Name, 8)
	// A text prompt for carol is tokenized where it arrives; pod1's vLLM
	// has no carol and answers its /tokenize with 404, so the sidecar
	// tokenizes it as the base model's (an adapter shares its tokenizer)
	// and still finds carol's blocks on the holder.
	var words []string
	for range 240 {
		words = append(words, fmt.Sprintf("w%d", rng.IntN(5000)))
	}
	text, _ := json.Marshal(map[string]any{"model": "carol", "prompt": strings.Join(words, " "), "max_tokens": 4})
	if got, r := f.servedAt(t, x, text); got != x {
		t.Fatalf("carol text prompt via its holder: served by %s", r.ServedBy)
	}
	f.waitRoute(t, 0, text, f.c.Pod(x).Name, 8)

	f.adapterPost(t, f.c.Pod(x).API, "/v1/unload_lora_adapter", "carol")
	took = f.waitEligible(t, b, x, false, 5*time.Second)
	t.Logf("carol excluded everywhere %v after the unload", took.Round(time.Millisecond))
	// The holder's digest still has carol's blocks, but no sidecar sends
	// carol there: the client gets vLLM's own 404 from the receiving pod.
	r := f.complete(t, 0, b, nil)
	if r.Status != http.StatusNotFound || r.ServedBy != f.c.Pod(0).Name {
		t.Errorf("carol after unload via %s: status %d served by %q; want 404 from %s", f.c.Pod(0).Name, r.Status, r.ServedBy, f.c.Pod(0).Name)
	}
}

// An adapter loaded on vLLM directly, not through the sidecar, is found
// by the periodic refresh (--models-interval 1s here).
func directLoadIsFoundByRefresh(t *testing.T, f *fixture) {
	rng := seeded(t.Name())
	const x = 2
	b := bodyFor("dave", tokens(rng, 4*blockSize), 4)
	f.adapterPost(t, f.c.Pod(x).SimAddr, "/v1/load_lora_adapter", "dave")
	took := f.waitEligible(t, b, x, true, 5*time.Second)
	t.Logf("dave routable from every sidecar %v after a direct load", took.Round(time.Millisecond))
	if got, r := f.servedAt(t, 0, b); got != x {
		t.Errorf("dave via %s: served by %s; want %s", f.c.Pod(0).Name, r.ServedBy, f.c.Pod(x).Name)
	}
}

// With more adapters than the 512-byte node meta can list, a pod's list is
// truncated. Its peers then route an unlisted adapter there only on the
// evidence of its digest (blocks keyed with that adapter's name), never by
// load alone.
func truncatedModelList(t *testing.T, f *fixture) {
	rng := seeded(t.Name())
	const x = 2
	var names []string
	for i := range 30 {
		names = append(names, fmt.Sprintf("tenant-adapter-with-a-long-name-%02d", i))
	}
	for _, n := range names {
		f.adapterPost(t, f.c.Pod(x).API, "/v1/load_lora_adapter", n)
	}
	last := names[len(names)-1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waitFor(t, 5*time.Second, "a truncated model list in pod1's view", func(ctx context.Context) (bool, string) {
		r, err := f.do(ctx, http.MethodGet, f.c.Pod(0).Admin, "/debug/peers", nil, nil)
		if err != nil {
			return false, err.Error()
		}
		var ps []struct {
			ID        string   `json:"id"`
			Models    []string `json:"models"`
			Truncated bool     `json:"models_truncated"`
		}
		if err := json.Unmarshal(r.Body, &ps); err != nil {
			return false, err.Error()
		}
		for _, p := range ps {
			if p.ID == f.c.Pod(x).Name {
				return p.Truncated && len(p.Models) > 3 && !slices.Contains(p.Models, last),
					fmt.Sprintf("%s lists %d models, truncated %v", p.ID, len(p.Models), p.Truncated)
			}
		}
		return false, "no such peer"
	})
	// Unlisted and uncached: pod x is not a candidate, the client gets the
	// receiving pod's 404 rather than a forward on a guess.
	prompt := tokens(rng, 8*blockSize)
	b := bodyFor(last, join(prompt, tokens(rng, 8)), 4)
	d, err := f.explain(ctx, 0, b)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Candidates {
		if c.ID == f.c.Pod(x).Name && c.Excluded != "model" {
			t.Errorf("unlisted, uncached adapter: %s eligible %v excluded %q; want excluded: model", c.ID, c.Eligible, c.Excluded)
		}
	}
	// Served once on x (its own sidecar knows its whole list), its blocks
	// are the evidence: follow-ups from the other sidecars go there.
	if got, r := f.servedAt(t, x, b); got != x {
		t.Fatalf("%s via its own pod: served by %s", last, r.ServedBy)
	}
	for i := range f.c.Len() {
		f.waitRoute(t, i, bodyFor(last, join(prompt, tokens(rng, 8)), 4), f.c.Pod(x).Name, 8)
	}
	if got, r := f.servedAt(t, 0, bodyFor(last, join(prompt, tokens(rng, 8)), 4)); got != x || r.cached() < len(prompt) {
		t.Errorf("%s follow-up via %s: served by %s, cached %d; want %s, >= %d", last, f.c.Pod(0).Name, r.ServedBy, r.cached(), f.c.Pod(x).Name, len(prompt))
	}
	for _, n := range names {
		f.adapterPost(t, f.c.Pod(x).API, "/v1/unload_lora_adapter", n)
	}
}

// A pod whose vLLM runs two data-parallel ranks publishes each rank's KV
// events on its own socket (port + rank; _dp1 for ipc). The sidecar
// subscribes to both (--kv-events-dp-ranks 2), and peers route to the pod
// a prefix either rank holds.
func TestDataParallelPod(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 2-pod cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 4, timeScale: 1, progress: testProgress{t},
		simArgs: []string{"--data-parallel-size", "2"},
		args:    []string{"--kv-events-dp-ranks", "2"}}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	rng := seeded(t.Name())
	const x, blocks = 0, 8
	p0, p1 := tokens(rng, blocks*blockSize), tokens(rng, blocks*blockSize)
	// Straight to pod x's vLLM, which spreads requests by its own rule
	// (lowest 4*waiting + running): a long stream keeps rank 0 busy, so
	// the second prompt is computed on rank 1.
	sim := "http://" + f.c.Pod(x).SimAddr
	sb, _ := json.Marshal(completion{Model: model, Prompt: join(p0, tokens(rng, 8)), MaxTokens: 2000, Stream: true})
	sctx, stopStream := context.WithCancel(ctx)
	defer stopStream()
	req, _ := http.NewRequestWithContext(sctx, http.MethodPost, sim+"/v1/completions", strings.NewReader(string(sb)))
	req.Header.Set("Content-Type", "application/json")
	stream, err := f.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if _, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil {
		t.Fatalf("stream on rank 0: %v", err)
	}
	if r, err := f.do(ctx, http.MethodPost, f.c.Pod(x).SimAddr, "/v1/completions", body(join(p1, tokens(rng, 8)), 1, false), nil); err != nil || r.Status != http.StatusOK {
		t.Fatalf("second prompt: %v (status %d)", err, r.Status)
	}
	stopStream()
	// Both ranks computed a prompt.
	r, err := f.do(ctx, http.MethodGet, f.c.Pod(x).SimAddr, "/metrics", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []string{"0", "1"} {
		series := fmt.Sprintf(`vllm:prompt_tokens_total{engine="%s",model_name="%s"}`, e, model)
		if v := metricValue(string(r.Body), series); v < blocks*blockSize {
			t.Errorf("%s = %v; want >= %d (one prompt per rank)", series, v, blocks*blockSize)
		}
	}
	// Each rank's blocks reach the other sidecar as pod x's.
	for _, p := range [][]uint32{p0, p1} {
		f.waitRoute(t, 1, body(join(p, tokens(rng, 8)), 4, false), f.c.Pod(x).Name, blocks)
	}
	// Inside the pod, vLLM would pick the rank by load alone (both idle:
	// rank 0); the follow-up is pinned to rank 1, which holds the prefix,
	// once pod 1 sees pod x's rank count (TestDataParallelRouting has
	// every rank and sidecar).
	probe := body(join(p1, tokens(rng, 8)), 4, false)
	waitFor(t, 15*time.Second, "rank 1 pinned", func(ctx context.Context) (bool, string) {
		target, rank, _, table, err := f.explainRank(ctx, 1, probe)
		return err == nil && target == f.c.Pod(x).Name && rank == 1, fmt.Sprintf("%v\n%s", err, table)
	})
	got, r := f.servedAt(t, 1, probe)
	if got != x || r.Decision != "affinity" {
		t.Errorf("rank 1's prefix via %s: served by %s (%s); want %s by affinity", f.c.Pod(1).Name, r.ServedBy, r.Decision, f.c.Pod(x).Name)
	}
	if want := blocks * blockSize * 9 / 10; r.cached() < want {
		t.Errorf("rank 1's prefix, follow-up on %s: cached_tokens %d of %d; want >= %d (pinned to rank 1)", r.ServedBy, r.cached(), len(p1), want)
	}
}
