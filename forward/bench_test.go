package forward

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
)

// BenchmarkFront compares a completions request sent straight to a stub
// vLLM with the same request through a front that serves it locally (the
// common case: no hop), over real loopback HTTP with keep-alive, one
// request at a time, beside a bare ReverseProxy. front − direct is the
// front's added latency on an idle machine, front − bare the part that is
// its own work; -cpuprofile shows where it goes.
func BenchmarkFront(b *testing.B) {
	n := newNode(b, "a")
	n.h.cfg.MaxBodyBytes = DefaultConfig().MaxBodyBytes // the test nodes' 1 KiB is below 1032 ids
	n.peers.views = []route.PeerView{{ID: "a", Local: true, KeyScheme: blockkey.Version, Digest: keySet{}, LoadAt: time.Now()}}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	// bare is a plain ReverseProxy with the front's transport settings: what
	// any proxy hop costs here, so front − bare is the front's own work.
	u, _ := url.Parse(n.vllm.URL)
	bare := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport:  &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, WriteBufferSize: 32 << 10},
		BufferPool: &copyBuffers{},
	})
	b.Cleanup(bare.Close)
	// 136 tokens is 8 blocks and a bit; 1032 is e2e BenchmarkOverhead's.
	for _, size := range []int{136, 1032} {
		ids := make([]string, size)
		for i := range ids {
			ids[i] = fmt.Sprint(1000 + i*7)
		}
		body := `{"model":"m","max_tokens":4,"prompt":[` + strings.Join(ids, ",") + `]}`
		for _, bc := range []struct{ name, url string }{
			{"direct", n.vllm.URL}, {"bare", bare.URL}, {"front", n.srv.URL},
		} {
			b.Run(fmt.Sprintf("%s-%d", bc.name, size), func(b *testing.B) {
				for b.Loop() {
					resp, err := hc.Post(bc.url+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d", resp.StatusCode)
					}
				}
			})
		}
	}
}

// BenchmarkParsePrompt1032 is the request-side parse of a 1032-token
// prompt (the e2e overhead benchmark's): 200 us with encoding/json decoding
// the ids, 52 us with tokenids.Parse after encoding/json found the field,
// 25 us with scanObject finding it (half the scan, half the ids).
func BenchmarkParsePrompt1032(b *testing.B) {
	ids := make([]string, 1032)
	for i := range ids {
		ids[i] = fmt.Sprint(1000 + i*37)
	}
	body := []byte(`{"model":"m","max_tokens":4,"prompt":[` + strings.Join(ids, ",") + `]}`)
	for b.Loop() {
		if p, err := prompt.Parse(body, false); err != nil || len(p.Tokens) != 1032 {
			b.Fatal(err, len(p.Tokens))
		}
	}
}
