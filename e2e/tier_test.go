//go:build integration

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// tierDecision is the part of /debug/route's decision that says on which
// tier each candidate holds the prompt.
type tierDecision struct {
	Target     string `json:"target"`
	Reason     string `json:"reason"`
	Candidates []struct {
		ID        string `json:"id"`
		GPUTokens int    `json:"gpu_tokens"`
		CPUTokens int    `json:"cpu_tokens"`
	} `json:"candidates"`
}

func (f *fixture) explainTier(ctx context.Context, i int, b []byte) (tierDecision, error) {
	r, err := f.do(ctx, http.MethodPost, f.c.Pod(i).Admin, "/debug/route", b, nil)
	if err != nil {
		return tierDecision{}, err
	}
	var v struct {
		Decision tierDecision `json:"decision"`
	}
	if err := json.Unmarshal(r.Body, &v); err != nil || r.Status != http.StatusOK {
		return tierDecision{}, fmt.Errorf("debug/route status %d: %v: %s", r.Status, err, r.Body)
	}
	return v.Decision, nil
}

// TestOffloadedPrefixIsServedByHolder: three pods whose simulators offload
// GPU evictions to a native CPU tier. A document cached on pod X is pushed
// out of X's GPU cache (X's engine computes other prompts; vLLM sends a
// GPU removal and a hash-only CPU store for each block it moves). Every
// sidecar's view then shows X holding the document on its CPU tier, and a
// question on it entering any sidecar is sent to X, whose engine loads the
// prefix back instead of computing it: cached_tokens covers it. Before
// tiers, the GPU removal made X look cold and the question went wherever
// rendezvous put a new prefix (issue 27).
func TestOffloadedPrefixIsServedByHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 3-pod cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 64 GPU blocks and a 1 GiB tier of 1 MiB blocks (1,024): the
	// document (32 blocks) and the fillers (3 × 40) fit the tier, not the
	// GPU.
	const gpuBlocks, docBlocks, fillBlocks, fills = 64, 32, 40, 3
	f, err := startCluster(ctx, clusterSpec{pods: 3, subnet: 3, timeScale: 20, progress: testProgress{t},
		simArgs: []string{"--num-gpu-blocks-override", fmt.Sprint(gpuBlocks),
			"--kv-offloading-backend", "native", "--kv-offloading-size", "1", "--sim-kv-bytes-per-block", fmt.Sprint(1 << 20)}},
		t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	rng := seeded(t.Name())
	x, doc := f.warm(t, rng, docBlocks)
	holder := f.c.Pod(x).Name

	// Fill X's GPU from its engine directly, so that no sidecar routes
	// the fillers elsewhere.
	for range fills {
		b := body(tokens(rng, fillBlocks*blockSize), 1, false)
		r, err := f.do(ctx, http.MethodPost, f.c.Pod(x).SimAddr, "/v1/completions", b, http.Header{"Content-Type": {"application/json"}})
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("filler at %s's engine: %v (status %d: %s)", holder, err, r.Status, r.Body)
		}
	}

	probe := body(join(doc, tokens(rng, 8)), 4, false)
	want := blockAligned(len(doc), blockSize)
	for i := range f.c.Len() {
		what := fmt.Sprintf("%s sees %s holding the document on its CPU tier only", f.c.Pod(i).Name, holder)
		waitFor(t, 15*time.Second, what, func(ctx context.Context) (bool, string) {
			d, err := f.explainTier(ctx, i, probe)
			if err != nil {
				return false, err.Error()
			}
			for _, c := range d.Candidates {
				if c.ID == holder {
					// Within a tier stride (8 keys) of the document.
					return d.Target == holder && c.GPUTokens == 0 && c.CPUTokens >= want-8*blockSize,
						fmt.Sprintf("target %s (%s); at %s: gpu %d, cpu %d tokens", d.Target, d.Reason, holder, c.GPUTokens, c.CPUTokens)
				}
			}
			return false, fmt.Sprintf("target %s (%s); %s not a candidate", d.Target, d.Reason, holder)
		})
	}

	before := metricValue(f.metrics(t, 0), `kvroute_route_tier_hits_total{tier="cpu"}`)
	for i := range f.c.Len() {
		r := f.complete(t, i, body(join(doc, tokens(rng, 8)), 4, false), nil)
		if r.Status != http.StatusOK {
			t.Fatalf("via %s: status %d: %s", f.c.Pod(i).Name, r.Status, r.Body)
		}
		if r.ServedBy != holder {
			t.Errorf("via %s: served by %q (decision %q); want the CPU tier's holder %s", f.c.Pod(i).Name, r.ServedBy, r.Decision, holder)
		}
		// The first question loads the document from the CPU; the ones
		// after find it on the GPU again.
		if got := r.cached(); got < want*9/10 {
			t.Errorf("via %s: cached_tokens %d; want >= %d (90%% of the %d-token document)", f.c.Pod(i).Name, got, want*9/10, want)
		}
	}
	if after := metricValue(f.metrics(t, 0), `kvroute_route_tier_hits_total{tier="cpu"}`); after <= before {
		t.Errorf("%s: kvroute_route_tier_hits_total{tier=\"cpu\"} %v, %v before its question; want it counted", f.c.Pod(0).Name, after, before)
	}
}
