//go:build integration

package e2e

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// A killed pod stops receiving forwards within the failure-detection
// window, and no request that a live pod could serve fails meanwhile: a
// forward to the dead pod fails before its first byte and is retried on a
// live one. The test owns its cluster, since it kills a pod.
//
// The sidecar runs memberlist's LAN timings (probe every 1 s, suspicion
// 4·max(1, log10 n)·1 s = 4 s on 3 nodes), so the dead pod should leave the
// peer tables after about 5–6 s; the test allows 30 s and logs the time.
func TestKilledPodStopsReceivingForwards(t *testing.T) {
	if testing.Short() {
		t.Skip("starts its own 3-pod cluster and waits for failure detection")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 3, subnet: 1, secret: true, timeScale: 20, progress: testProgress{t}}, t.Cleanup)
	if err != nil {
		t.Fatal(err)
	}
	rng := seeded(t.Name())
	x, held := f.warm(t, rng, 8)
	dead := f.c.Pod(x).Name
	var live []int
	for i := range f.c.Len() {
		if i != x {
			live = append(live, i)
		}
	}
	// A prefix a live pod holds, for the mix.
	var other []uint32
	for try := 0; other == nil; try++ {
		if try == 10 {
			t.Fatalf("10 new prefixes all landed on %s; want some on a live pod", dead)
		}
		if i, p := f.warm(t, rng, 8); i != x {
			other = p
		}
	}

	if err := f.c.Kill(x); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()

	// Until every live sidecar has dropped the dead pod, keep sending a mix
	// of requests to the live sidecars: the dead pod's prefix (whose
	// routing still points at it), a live pod's prefix and new prefixes,
	// plain and streaming. Every one must succeed on a live pod.
	var sent, retried int
	gone := func() bool {
		for _, i := range live {
			ps, err := f.peers(ctx, f.c.Pod(i).Admin)
			if err != nil {
				t.Fatalf("debug/peers of %s: %v", f.c.Pod(i).Name, err)
			}
			if slices.ContainsFunc(ps, func(p peer) bool { return p.ID == dead }) {
				return false
			}
		}
		return true
	}
	for n := 0; !gone(); n++ {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("%s still listed in /debug/peers %v after the kill", dead, time.Since(killed))
		}
		var prompt []uint32
		switch n % 3 {
		case 0:
			prompt = join(held, tokens(rng, 24))
		case 1:
			prompt = join(other, tokens(rng, 24))
		default:
			prompt = tokens(rng, 6*blockSize)
		}
		via := live[n%len(live)]
		r := f.complete(t, via, body(prompt, 4, n%2 == 1), nil)
		sent++
		if r.Status != http.StatusOK || r.ServedBy == "" || r.ServedBy == dead {
			t.Errorf("request %d via %s, %v after the kill: status %d, served by %q (decision %q): %s",
				n, f.c.Pod(via).Name, time.Since(killed).Round(time.Millisecond), r.Status, r.ServedBy, r.Decision, r.Body)
		}
		if strings.HasSuffix(r.Decision, "-retried") {
			retried++
		}
	}
	t.Logf("%s left every peer table %v after the kill; %d requests meanwhile, %d retried after a failed forward, none failed",
		dead, time.Since(killed).Round(time.Millisecond), sent, retried)

	// From now on the dead pod gets no forward attempts at all: requests
	// for its prefix go straight to a live pod, with no retry.
	before := map[int]float64{}
	for _, i := range live {
		before[i] = metricValue(f.metrics(t, i), "kvroute_forward_retries_total")
	}
	for _, i := range live {
		for range 3 {
			r := f.complete(t, i, body(join(held, tokens(rng, 24)), 4, false), nil)
			if r.Status != http.StatusOK || r.ServedBy == dead || strings.HasSuffix(r.Decision, "-retried") {
				t.Errorf("after detection, via %s: status %d, served by %q, decision %q; want a live pod, no retry",
					f.c.Pod(i).Name, r.Status, r.ServedBy, r.Decision)
			}
		}
		if got := metricValue(f.metrics(t, i), "kvroute_forward_retries_total") - before[i]; got != 0 {
			t.Errorf("%s: kvroute_forward_retries_total rose by %v after detection; want 0", f.c.Pod(i).Name, got)
		}
	}
}
