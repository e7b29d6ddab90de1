//go:build integration

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// TestMixedStridesRouteToHolder: three pods whose sidecars key their
// digests at different strides (16, 4 and 1 vLLM blocks), as in a rolling
// change of --routing-stride. Each advertises its stride in its node meta,
// and each probes a peer's digest at the positions that peer keeps, so a
// prefix cached on any pod is found by every sidecar, in its own keys, and
// a request for it entering any sidecar is served by the holder, whose
// vLLM reuses the prefix. Before strides were advertised, a sidecar of
// stride 4 looked up keys a stride-16 digest never holds (positions 3, 7,
// 11 against 15, 31, ...) and saw that pod cold.
func TestMixedStridesRouteToHolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 3-pod cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	strides := []int{16, 4, 1}
	var podArgs [][]string
	for _, s := range strides {
		podArgs = append(podArgs, []string{"--routing-stride", fmt.Sprint(s)})
	}
	f, err := startCluster(ctx, clusterSpec{pods: 3, subnet: 6, timeScale: 20, progress: testProgress{t}, podArgs: podArgs}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	rng := seeded(t.Name())
	const blocks = 32 // 2 keys at stride 16, 8 at 4, 32 at 1
	for x := range f.c.Len() {
		holder := f.c.Pod(x).Name
		prefix := tokens(rng, blocks*blockSize)
		// The holder's own vLLM computes the prefix: no sidecar chose it.
		r, err := f.do(ctx, http.MethodPost, f.c.Pod(x).SimAddr, "/v1/completions", body(join(prefix, tokens(rng, 8)), 2, false), nil)
		if err != nil || r.Status != http.StatusOK {
			t.Fatalf("warm %s's vLLM: %v, status %d: %s", holder, err, r.Status, r.Body)
		}
		probe := body(join(prefix, tokens(rng, 8)), 2, false)
		for i, s := range strides {
			f.waitRoute(t, i, probe, holder, blocks/s) // the whole prefix, in i's keys
		}
		for i := range f.c.Len() {
			r := f.complete(t, i, body(join(prefix, tokens(rng, 8)), 2, false), nil)
			if r.Status != http.StatusOK {
				t.Fatalf("via %s: status %d: %s", f.c.Pod(i).Name, r.Status, r.Body)
			}
			if r.ServedBy != holder || r.Decision != "affinity" {
				t.Errorf("prefix on %s (stride %d), via %s (stride %d): served by %q, decision %q; want the holder by affinity",
					holder, strides[x], f.c.Pod(i).Name, strides[i], r.ServedBy, r.Decision)
			}
			if got := r.cached(); got < blocks*blockSize {
				t.Errorf("via %s: cached_tokens %d; want >= %d (the prefix)", f.c.Pod(i).Name, got, blocks*blockSize)
			}
		}
	}
}
