//go:build integration

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// A request whose prefix pod X caches is served by X whichever sidecar
// receives it, and X's vLLM really reuses the prefix: its cached_tokens
// covers the shared prefix, block-aligned.
func TestCachedPrefixIsServedByHolder(t *testing.T) {
	f := shared(t)
	rng := seeded(t.Name())
	const blocks = 24
	x, prefix := f.warm(t, rng, blocks)
	holder := f.c.Pod(x).Name
	want := blockAligned(len(prefix), blockSize)
	for i := range f.c.Len() {
		// A new suffix per sidecar: each request shares only the prefix
		// with what X has seen.
		r := f.complete(t, i, body(join(prefix, tokens(rng, 24)), 4, false), nil)
		if r.Status != http.StatusOK {
			t.Fatalf("via %s: status %d: %s", f.c.Pod(i).Name, r.Status, r.Body)
		}
		if r.ServedBy != holder {
			t.Errorf("via %s: served by %q (decision %q); want the holder %s", f.c.Pod(i).Name, r.ServedBy, r.Decision, holder)
		}
		if r.Decision != "affinity" {
			t.Errorf("via %s: decision %q; want affinity", f.c.Pod(i).Name, r.Decision)
		}
		if got := r.cached(); got < want {
			t.Errorf("via %s: cached_tokens %d; want >= %d (the %d-block prefix)", f.c.Pod(i).Name, got, want, blocks)
		}
	}
}

// A burst of new requests sharing a new prefix, spread round-robin over
// every sidecar, lands on one pod: every sidecar names the same pod for its
// first request without asking the others (least load, rendezvous
// tie-break), and the requests after the first follow the claims it shared
// (route.Claim) while that pod's load, which every sidecar sees within
// ~25 ms, grows.
//
// Size: 2 requests per sidecar, 6 in all, not 24, because the load bound
// is meant to split a larger burst (docs/design.md D4: never a hot spot). A
// peer is over the bound when Load+1 > max(2·m, m+4), m the mean load
// counting this request (route.DefaultConfig): with T burst requests in
// flight on 3 pods the winner spills from T = 6 on. The prefix is 1024
// tokens: a claimed prefix pulls a request to a pod only while the tokens
// it saves outweigh half the prefill queued there (the first request's
// whole prompt) and 64 per request, and a short one (128 tokens) rightly
// spreads once the winner has two.
func TestBurstOfNewPrefixLandsOnOnePod(t *testing.T) {
	const burstGap = 30 * time.Millisecond
	f := shared(t)
	rng := seeded(t.Name())
	const perSidecar = 2
	prefix := tokens(rng, 64*blockSize)
	n := perSidecar * f.c.Len()
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = body(join(prefix, tokens(rng, 24)), 8, false)
	}

	// Every sidecar, asked on its own, names the same pod, once the loads
	// they see have settled (a request of the previous test may have
	// finished within the last load push, 25 ms).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var want string
	waitFor(t, 5*time.Second, "every sidecar to name one pod for the new prefix", func(ctx context.Context) (bool, string) {
		var tables strings.Builder
		want = ""
		agree := true
		for i := range f.c.Len() {
			d, err := f.explain(ctx, i, bodies[0])
			if err != nil {
				return false, err.Error()
			}
			if d.Reason != "rendezvous" {
				t.Fatalf("%s explains reason %q for a new prefix; want rendezvous", f.c.Pod(i).Name, d.Reason)
			}
			r, _ := f.do(ctx, http.MethodPost, f.c.Pod(i).Admin, "/debug/route?format=text", bodies[0], nil)
			fmt.Fprintf(&tables, "%s:\n%s\n", f.c.Pod(i).Name, r.Body)
			if want == "" {
				want = d.Target
			}
			agree = agree && d.Target == want
		}
		return agree, tables.String()
	})

	w := f.index(want)
	waitFor(t, 5*time.Second, want+" scraped its vLLM just now", func(ctx context.Context) (bool, string) {
		ps, err := f.peers(ctx, f.c.Pod(w).Admin)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range ps {
			if p.Local {
				return p.LoadAgeS < 0.2, fmt.Sprintf("local load %.2fs old", p.LoadAgeS)
			}
		}
		return false, "no local peer"
	})
	replies := make([]reply, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			// 30 ms apart: past one load push (25 ms), so each request's
			// sidecar knows where the ones before it went. Requests within
			// one push interval of each other may split over the least-loaded
			// pods, and their claims then keep the rest of the burst there.
			time.Sleep(time.Duration(i) * burstGap)
			replies[i], errs[i] = f.do(ctx, http.MethodPost, f.c.Pod(i%f.c.Len()).API, "/v1/completions", bodies[i], nil)
		})
	}
	close(start)
	wg.Wait()
	for i, r := range replies {
		if errs[i] != nil {
			t.Errorf("request %d: %v", i, errs[i])
			continue
		}
		if r.Status != http.StatusOK {
			t.Errorf("request %d via %s: status %d: %s", i, f.c.Pod(i%f.c.Len()).Name, r.Status, r.Body)
			continue
		}
		if r.ServedBy != want {
			t.Errorf("request %d via %s: served by %s (decision %q); want %s like the rest of the burst",
				i, f.c.Pod(i%f.c.Len()).Name, r.ServedBy, r.Decision, want)
		}
	}
}

// An SSE stream forwarded over one hop reaches the client byte for byte as
// the serving pod's vLLM writes it. The simulator is deterministic (the
// generated text is seeded by the prompt), so the reference is the same
// body sent straight to that simulator; only the request id and the created
// timestamp differ between the two runs and are normalised.
func TestStreamingAcrossHopIsByteForByte(t *testing.T) {
	f := shared(t)
	rng := seeded(t.Name())
	x, prefix := f.warm(t, rng, 8)
	y := (x + 1) % f.c.Len()
	const maxTokens = 24
	b := body(join(prefix, tokens(rng, 24)), maxTokens, true)

	hop := f.complete(t, y, b, nil)
	if hop.Status != http.StatusOK {
		t.Fatalf("stream via %s: status %d: %s", f.c.Pod(y).Name, hop.Status, hop.Body)
	}
	if hop.ServedBy != f.c.Pod(x).Name || hop.Decision != "affinity" {
		t.Fatalf("stream via %s: served by %q, decision %q; want %s by affinity (one hop)",
			f.c.Pod(y).Name, hop.ServedBy, hop.Decision, f.c.Pod(x).Name)
	}
	if hop.Type != "text/event-stream" {
		t.Errorf("stream via hop: Content-Type %q; want text/event-stream", hop.Type)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	direct, err := f.do(ctx, http.MethodPost, f.c.Pod(x).SimAddr, "/v1/completions", b, nil)
	if err != nil || direct.Status != http.StatusOK {
		t.Fatalf("stream direct to %s's simulator: %v (status %d)", f.c.Pod(x).Name, err, direct.Status)
	}
	// The comparison means something only for a full stream: one event per
	// generated token and the terminator.
	if n, done := sseEvents(direct.Body); n != maxTokens+1 || !done {
		t.Fatalf("direct stream has %d events (done %v); want %d and [DONE]", n, done, maxTokens+1)
	}
	got, want := normalizeSSE(hop.Body), normalizeSSE(direct.Body)
	if !bytes.Equal(got, want) {
		t.Errorf("stream through one hop differs from the simulator's own:\nhop:    %q\ndirect: %q", got, want)
	}
}
