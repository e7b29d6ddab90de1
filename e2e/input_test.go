//go:build integration

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/forward"
)

// A client cannot make a sidecar serve locally by sending its own hop
// header: an untrusted header is counted in kvroute_hop_rejected_total and
// the request is routed as if it had none. The prefix is cached on pod X and
// the header goes to another pod Y, so "routed normally" is visible: the
// request still ends on X by affinity. A header signed with the real key is
// the positive control: Y trusts it and serves locally.
func TestForgedHopHeaderDoesNotBypassRouting(t *testing.T) {
	f := shared(t)
	rng := seeded(t.Name())
	x, prefix := f.warm(t, rng, 8)
	y := (x + 1) % f.c.Len()
	xName, yName := f.c.Pod(x).Name, f.c.Pod(y).Name
	otherKey := make([]byte, 32)
	rand.Read(otherKey)
	now := time.Now()
	real := forward.NewHop(f.hopKey(t), time.Minute)
	tests := []struct {
		name   string
		header string
		reason string // hop_rejected_total label; "" means trusted
	}{
		{"garbage", "let me in", "malformed"},
		{"made-up mac", fmt.Sprintf("v1;pod9;%s;%d;%s", yName, now.UnixMilli(), strings.Repeat("A", 43)), "bad_mac"},
		{"signed with another key", forward.NewHop(otherKey, time.Minute).Sign("pod9", yName, now), "bad_mac"},
		// The key a sidecar without a cluster secret uses is public; with a
		// secret configured it must not be accepted.
		{"signed with the unauthenticated key", forward.NewHop([]byte("kvroute unauthenticated hop key"), time.Minute).Sign(xName, yName, now), "bad_mac"},
		{"real key, an hour old", real.Sign(xName, yName, now.Add(-time.Hour)), "stale"},
		{"real key, addressed to another pod", real.Sign(yName, xName, now), "other_node"},
		{"real key (positive control)", real.Sign(xName, yName, now), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			series := fmt.Sprintf(`kvroute_hop_rejected_total{reason=%q}`, tt.reason)
			before := metricValue(f.metrics(t, y), series)
			hdr := http.Header{forward.HopHeader: {tt.header}}
			r := f.complete(t, y, body(join(prefix, tokens(rng, 24)), 4, false), hdr)
			if r.Status != http.StatusOK {
				t.Fatalf("status %d: %s", r.Status, r.Body)
			}
			if tt.reason == "" {
				if r.Decision != "hop" || r.ServedBy != yName {
					t.Errorf("served by %s, decision %q; want a trusted hop served by %s", r.ServedBy, r.Decision, yName)
				}
				return
			}
			if r.Decision == "hop" || r.ServedBy != xName {
				t.Errorf("served by %s, decision %q; want routing to the holder %s, not a trusted hop", r.ServedBy, r.Decision, xName)
			}
			if got := metricValue(f.metrics(t, y), series) - before; got != 1 {
				t.Errorf("%s rose by %v; want 1", series, got)
			}
		})
	}
}

// Bad input gets the right status and an OpenAI error body from the
// sidecar; what the sidecar does not route passes through to vLLM, whose
// answer (good or bad) reaches the client unchanged.
func TestBadInput(t *testing.T) {
	f := shared(t)
	sidecar, sim := f.c.Pod(0).API, f.c.Pod(0).SimAddr
	big := []byte(`{"model":"sim-model","prompt":"` + strings.Repeat("a", maxBody) + `"}`)
	tests := []struct {
		name, method, path string
		body               []byte
		status             int
		errType            string // the OpenAI error type; "" means compare with the simulator's own answer
	}{
		{"malformed completions", "POST", "/v1/completions", []byte(`{"model":"sim-model","prompt":`), 400, "BadRequestError"},
		{"malformed chat", "POST", "/v1/chat/completions", []byte(`{"messages":[{"role":"user","content":"hi"}`), 400, "BadRequestError"},
		{"not an object", "POST", "/v1/completions", []byte(`[1,2,3]`), 400, "BadRequestError"},
		{"trailing data", "POST", "/v1/completions", []byte(`{"prompt":"hi"} {}`), 400, "BadRequestError"},
		{"body over --max-body-bytes", "POST", "/v1/completions", big, 413, "RequestEntityTooLargeError"},
		// Valid JSON the router cannot route on is served, not refused
		// (docs/design.md D6): vLLM's own 400 comes back.
		{"no prompt", "POST", "/v1/completions", []byte(`{"model":"sim-model"}`), 400, ""},
		{"unknown model", "POST", "/v1/completions", []byte(`{"model":"nope","prompt":"hi"}`), 404, ""},
		{"models list passes through", "GET", "/v1/models", nil, 200, ""},
		{"unknown path passes through", "GET", "/v1/nothing-here", nil, 404, ""},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := f.do(ctx, tt.method, sidecar, tt.path, tt.body, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tt.status {
				t.Fatalf("%s %s: status %d (%s); want %d", tt.method, tt.path, got.Status, got.Body, tt.status)
			}
			if tt.errType == "" {
				want, err := f.do(ctx, tt.method, sim, tt.path, tt.body, nil)
				if err != nil {
					t.Fatal(err)
				}
				if want.Status != got.Status || !sameJSON(want.Body, got.Body) {
					t.Errorf("%s %s through the sidecar: %d %s; the simulator answers %d %s",
						tt.method, tt.path, got.Status, got.Body, want.Status, want.Body)
				}
				return
			}
			typ, code, msg, ok := got.apiError()
			if !ok || typ != tt.errType || code != tt.status || msg == "" {
				t.Errorf("%s %s: body %s; want an OpenAI error of type %s, code %d, with a message",
					tt.method, tt.path, got.Body, tt.errType, tt.status)
			}
		})
	}
	// Nothing above may have hurt the sidecar.
	r, err := f.do(ctx, http.MethodGet, f.c.Pod(0).Admin, "/livez", nil, nil)
	if err != nil || r.Status != http.StatusOK {
		t.Errorf("livez after bad input: %v (status %d)", err, r.Status)
	}
}

// sameJSON compares two JSON documents ignoring "created" timestamps, which
// the simulator stamps per request; non-JSON bodies compare as bytes.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	ja, _ := json.Marshal(dropCreated(va))
	jb, _ := json.Marshal(dropCreated(vb))
	return bytes.Equal(ja, jb)
}

func dropCreated(v any) any {
	switch x := v.(type) {
	case map[string]any:
		delete(x, "created")
		for k, e := range x {
			x[k] = dropCreated(e)
		}
	case []any:
		for i, e := range x {
			x[i] = dropCreated(e)
		}
	}
	return v
}
