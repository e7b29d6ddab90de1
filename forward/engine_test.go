package forward

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// threeNodes returns a (the receiving sidecar) whose table says b holds the
// prompt and c is an idle third pod; b's and c's tables know only
// themselves, so a forwarded request can only be served or refused.
func threeNodes(t *testing.T) (a, b, c *node) {
	a, b = holderPair(t)
	c = newNode(t, "c")
	now := time.Now()
	a.peers.views = append(a.peers.views, route.PeerView{ID: "c", Addr: hostOf(c.srv), KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: now})
	b.peers.views = []route.PeerView{{ID: "b", Local: true, KeyScheme: blockkey.Version, LoadAt: now}}
	c.peers.views = []route.PeerView{{ID: "c", Local: true, KeyScheme: blockkey.Version, LoadAt: now}}
	return a, b, c
}

func apiError503(t *testing.T, resp *http.Response) string {
	t.Helper()
	var e apiError
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Code != 503 || e.Error.Type != "ServiceUnavailableError" {
		t.Fatalf("body %s: not an OpenAI 503 error (%v)", b, err)
	}
	return e.Error.Message
}

// TestHopToDownEngineIsRefused checks both ways a holder whose engine
// cannot serve refuses a forwarded request: it knows (SetLocalReady false)
// or finds out (its vLLM refuses the connection). Either way the sender
// tries the next pod and the client gets a 200.
func TestHopToDownEngineIsRefused(t *testing.T) {
	for _, knows := range []bool{true, false} {
		name := "holder finds out"
		if knows {
			name = "holder knows"
		}
		t.Run(name, func(t *testing.T) {
			a, b, _ := threeNodes(t)
			var mu sync.Mutex
			var reported []error
			b.h.proxy.Transport.(*attempts).localFailed = func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }
			if knows {
				b.h.SetLocalReady(false)
			} else {
				b.vllm.Close() // the engine died; its sidecar has not noticed yet
			}
			// The hop itself is refused with the header...
			valid := NewHop([]byte("k"), time.Minute).Sign("a", "b", time.Now())
			hop := post(t, b.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, map[string]string{HopHeader: valid})
			if hop.StatusCode != 503 || hop.Header.Get(RefusedHeader) == "" {
				t.Fatalf("hop to b: status %d refused %q; want 503 with %s", hop.StatusCode, hop.Header.Get(RefusedHeader), RefusedHeader)
			}
			apiError503(t, hop)
			// ...and a client request through a is served by the next pod.
			resp := post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, nil)
			if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "c" {
				t.Fatalf("client: status %d pod %q; want 200 from c (b refused, c is next)", resp.StatusCode, resp.Header.Get("X-Pod"))
			}
			if got := resp.Header.Get(DecisionHeader); got != "affinity-retried" {
				t.Errorf("decision %q; want affinity-retried", got)
			}
			if len(a.peers.failed) != 1 || a.peers.failed[0] != "b" {
				t.Errorf("a marked failed %v; want [b]", a.peers.failed)
			}
			mu.Lock()
			defer mu.Unlock()
			if !knows {
				var op *net.OpError
				if len(reported) != 2 || !errors.As(reported[0], &op) || op.Op != "dial" {
					t.Errorf("b reported local failures %v; want two dial errors", reported)
				}
			} else if len(reported) != 0 {
				t.Errorf("b reported %v without trying its engine", reported)
			}
		})
	}
}

// TestLocalEngineDownRoutesToPeers checks that a sidecar whose own engine
// is down serves its clients through peers, the local attempt dropped.
func TestLocalEngineDownRoutesToPeers(t *testing.T) {
	a, b, _ := threeNodes(t)
	a.h.SetLocalReady(false)
	a.vllm.Close()
	b.h.SetLocalReady(false) // the holder too: only c can serve
	resp := post(t, a.srv.URL+"/v1/completions", `{"prompt":"`+testPrompt+`"}`, nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Pod") != "c" {
		t.Fatalf("status %d pod %q; want 200 from c", resp.StatusCode, resp.Header.Get("X-Pod"))
	}
	d, _, err := a.h.Explain(t.Context(), []byte(`{"prompt":"x"}`), prompt.APICompletions)
	if err != nil {
		t.Fatal(err)
	}
	for _, cd := range d.Candidates {
		if cd.Local && cd.Excluded != "engine down" {
			t.Errorf("local candidate excluded %q; want engine down", cd.Excluded)
		}
	}
}
