package forward

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/textprefix"
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
	// 136 tokens is 8 blocks and a bit; 1032 is e2e BenchmarkOverhead's;
	// 32768 is BenchmarkTextPrefix's largest token prompt, where parsing the
	// ids is half the front's own time (tokenids BenchmarkParse32k).
	for _, size := range []int{136, 1032, 32768} {
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

// fixedText routes every chat on fixed keys, as a learned prefix would.
type fixedText []blockkey.Key

func (k fixedText) Keys(context.Context, prompt.Prompt, []textprefix.Message, blockkey.Key) ([]blockkey.Key, int, func([]uint32)) {
	return k, 32768, func([]uint32) {}
}

// BenchmarkHopChat sends a 32k-token text chat (~160 KB: what a follow-up
// routed on a learned prefix is) straight to a stub vLLM, and through a
// front that forwards it to the front of the pod holding its prefix, one
// request at a time over loopback: hop − direct is what the two sidecars
// add to such a request on an idle machine, hop − bare what of it is their
// own work; -cpuprofile shows where.
func BenchmarkHopChat(b *testing.B) {
	a, holder := holderPair(b)
	for _, n := range []*node{a, holder} {
		n.h.cfg.MaxBodyBytes, n.h.cfg.Scheme = DefaultConfig().MaxBodyBytes, blockkey.DefaultScheme()
	}
	// The holder holds the whole 32k-token prefix the chat is keyed on.
	toks := make([]uint32, 32768)
	for i := range toks {
		toks[i] = uint32(i)
	}
	keys := blockkey.DefaultScheme().Request(blockkey.Root("m", "", ""), toks)
	held := keySet{}
	for _, k := range keys {
		held[k] = true
	}
	a.peers.views[1].Digest = held
	a.h.SetTextPrefixes(fixedText(keys), false)
	words := strings.Fields("the of and to in is was for that on as with by he at from his it an were are which this be or has had first")
	var doc strings.Builder
	for i := range 32700 {
		doc.WriteString(words[(i*7+i/3)%len(words)])
		doc.WriteByte(' ')
	}
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": doc.String()}, {"role": "user", "content": "What is it about?"}}})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	// bare is two plain ReverseProxies in the fronts' places, the first
	// reading each body whole as a router must, the second passing it on
	// as it arrives: hop − bare is the fronts' own work.
	bare := bareProxy(b, bareProxy(b, holder.vllm.URL, false), true)
	for _, bc := range []struct{ name, url, pod string }{
		{"direct", holder.vllm.URL, "b"}, {"bare", bare, "b"}, {"hop", a.srv.URL, "b"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				resp, err := hc.Post(bc.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Pod") != bc.pod {
					b.Fatalf("status %d from %q", resp.StatusCode, resp.Header.Get("X-Pod"))
				}
			}
		})
	}
}

// bareProxy serves a plain ReverseProxy to upstream with the fronts'
// transport settings, reading each body whole first if whole; it returns
// its URL.
func bareProxy(b *testing.B, upstream string, whole bool) string {
	u, _ := url.Parse(upstream)
	rp := &httputil.ReverseProxy{
		Rewrite:    func(r *httputil.ProxyRequest) { r.SetURL(u) },
		Transport:  &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true, WriteBufferSize: 32 << 10},
		BufferPool: &copyBuffers{},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !whole {
			rp.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		rp.ServeHTTP(w, r)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// BenchmarkParseChat160KB is the front's parse of a 32k-token text chat:
// prompt.Parse (validating the JSON, finding the fields) and the split of
// its messages.
func BenchmarkParseChat160KB(b *testing.B) {
	content := strings.Repeat("the quick brown fox jumps over the lazy dog ", 160<<10/44)
	body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": content}, {"role": "user", "content": "What is it about?"}}})
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		p, err := prompt.Parse(body, true)
		if err != nil {
			b.Fatal(err)
		}
		if msgs, err := splitMessages(p.Messages); err != nil || len(msgs) != 2 {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoutePath is what the front does per request between its keys
// and its first send, for a 32k-token prompt at 8, 64 and 1000 peers with
// real Bloom digests (100k keys at 1%; every peer holds a shared system
// prompt, one holds three quarters of the prompt): the snapshot copy and
// the front's own counts, the choice, the failover order, admission and
// steering by queue, and the targets. The peer table's own cost of the
// snapshot is gossip's BenchmarkViews.
func BenchmarkRoutePath(b *testing.B) {
	scheme := blockkey.Scheme{BlockSize: 16, Stride: 4}
	tokens := make([]uint32, 32768)
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 32000
	}
	keys := scheme.Request(blockkey.Root("m", "", ""), tokens)
	params := bloom.ParamsFor(100_000/4, 0.01)
	for _, c := range []struct {
		npeers         int
		grouped, short bool
	}{{8, false, false}, {64, false, false}, {1000, false, false}, {1000, true, false}, {1000, true, true}} {
		npeers := c.npeers
		name := fmt.Sprintf("peers=%d", npeers)
		if c.grouped {
			name += "-grouped" // the digests as the peer table hands them out
		}
		if c.short {
			name += "-shortlist" // and their briefs, as it keeps them (gossip.Mesh.Shortlist)
		}
		b.Run(name, func(b *testing.B) {
			n := newNode(b, "pod-000")
			n.h.cfg.Scheme = scheme
			now := n.h.now()
			views := make([]route.PeerView, npeers)
			for i := range views {
				held := slices.Clone(keys[:4])
				if i == npeers/2 {
					held = keys[:len(keys)*3/4]
				}
				for j := range 5000 {
					held = append(held, blockkey.Key(uint64(i)<<32|uint64(j)))
				}
				id := fmt.Sprintf("pod-%03d", i)
				views[i] = route.PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
					Digest: bloom.Build(bloom.Header{Node: id, Params: params}, held), DigestAt: now,
					Load: route.Load{Running: i % 3}, LoadAt: now}
			}
			g := bloom.NewTransposed()
			if c.grouped {
				for i := range views {
					d := views[i].Digest.(*bloom.Digest)
					slot, stamp := g.Put(-1, d)
					views[i].Digest = &route.Member{TierMatcher: d, G: g, Slot: slot, Stamp: stamp}
				}
			}
			n.peers.views = views
			if c.short {
				n.h.peers = &shortPeers{fakePeers: n.peers, g: g}
			} else {
				n.h.cfg.NoShortlist = true
			}
			k := keyed{keys: keys, tokens: len(tokens)}
			gc, _ := gin.CreateTestContext(httptest.NewRecorder())
			b.ReportAllocs()
			for b.Loop() {
				d, ts, _, ok := n.h.routed(gc, "", k)
				if !ok {
					b.Fatal("not admitted")
				}
				withPrefill(ts, d, k.tokens, false, n.h.cfg.Route)
				if d.Target != views[npeers/2].ID {
					b.Fatalf("chose %s (%s); want %s", d.Target, d.Reason, views[npeers/2].ID)
				}
			}
		})
	}
}

// BenchmarkAdmittedAny is admission before the choice (admittedAny) at 8
// and 1000 peers with room: it reads the peers up to the first with room.
func BenchmarkAdmittedAny(b *testing.B) {
	for _, npeers := range []int{8, 1000} {
		b.Run(fmt.Sprintf("peers=%d", npeers), func(b *testing.B) {
			n := newNode(b, "pod-000")
			now := n.h.now()
			views := make([]route.PeerView, npeers)
			for i := range views {
				id := fmt.Sprintf("pod-%03d", i)
				views[i] = route.PeerView{ID: id, Addr: id + ":8000", Local: i == 0, KeyScheme: blockkey.Version,
					Load: route.Load{Running: i % 3}, LoadAt: now}
			}
			n.peers.views = views
			gc, _ := gin.CreateTestContext(httptest.NewRecorder())
			b.ReportAllocs()
			for b.Loop() {
				if !n.h.admittedAny(gc) {
					b.Fatal("not admitted")
				}
			}
		})
	}
}

// BenchmarkUsageTapStream is the usage tap over a 100-event stream read
// event by event, as ReverseProxy reads an SSE answer.
func BenchmarkUsageTapStream(b *testing.B) {
	event := []byte(`data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" word"}]}` + "\n\n")
	last := []byte(`data: {"usage":{"prompt_tokens_details":{"cached_tokens":1234}}}` + "\n\n")
	b.ReportAllocs()
	for b.Loop() {
		got := 0
		u := &usageTap{field: cachedField, found: func(v int) { got = v }}
		for range 100 {
			u.scan(event)
		}
		u.scan(last)
		if got != 1234 {
			b.Fatalf("found %d", got)
		}
	}
}
