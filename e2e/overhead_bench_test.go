//go:build integration

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvroute/kvroute/chaos"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkOverhead measures the sidecar's added latency over calling the
// simulator directly, side by side in one open-loop run: at a steady rate
// (-e2e.rate, all series together, for -e2e.duration) it sends small
// completions requests in turn
//
//   - direct: to pod A's simulator;
//   - local:  through pod A's sidecar, which serves them on A (no hop);
//   - hop:    through pod B's sidecar, which forwards them once to A;
//
// plain and streaming, with a token-id prompt (no /tokenize call), and
// plain with a text prompt (the sidecar calls A's /tokenize first). Every
// series hits the same simulator with the same cached prompt, at
// --sim-time-scale 1000, so the simulator's own time is small and equal for
// all; the differences of the percentiles are the sidecar's cost. It is a
// measurement: it asserts only that the requests went where the series
// says. Beside them, "bare" series go through a bare reverse proxy process
// (cmd/bareproxy), so what any proxy hop costs on this machine can be told
// from what the sidecar adds to it. Run it once: go test -tags integration
// -run '^$' -bench Overhead -benchtime 1x ./e2e -args -e2e.rounds 5
// -e2e.duration 30s (the table gives medians over rounds). To give the sidecars a core of their own, as a pod's
// CPU request would: taskset -c 0 go test ... -args -e2e.sidecar-cpus 1.
func BenchmarkOverhead(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute+time.Duration(*rounds)*(*duration+30*time.Second))
	defer cancel()
	f, err := startCluster(ctx, clusterSpec{pods: 2, subnet: 2, secret: true, timeScale: 1000, cpus: *pinCPUs, env: strings.Fields(*sidecarEnv), progress: testProgress{b}}, b.Cleanup)
	if err != nil {
		b.Fatal(err)
	}
	a, other := f.c.Pod(0), f.c.Pod(1)
	rng := seeded(b.Name())
	// Prompts that pod A's sidecar places on A and keeps there under this
	// load: 64 full blocks and a bit (1032 tokens). Affinity scores a peer
	// by matched tokens minus 64 per request of load, and every series
	// loads A, so a short prompt (8 blocks: 136 tokens) rightly moved to
	// the idle pod B once A had three requests in flight, and the series
	// stopped measuring one thing.
	// The text prompt is as long, for the same reason: at ~250 tokens a few
	// in a thousand moved to B whenever A's queue grew (issue 26's choice by
	// work), and the series failed.
	tokPlain := f.pickLocal(b, 0, func() []byte { return body(tokens(rng, 64*blockSize+8), 4, false) })
	var tok completion
	json.Unmarshal(tokPlain, &tok)
	tokStream := body(tok.Prompt, 4, true)
	textPlain := f.pickLocal(b, 0, func() []byte {
		b, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 4,
			"prompt": fmt.Sprintf("Overhead probe %d: ", rng.IntN(1<<30)) +
				strings.Repeat("the quick brown fox jumps over the lazy dog, twice over, and then once more for luck. ", 48)})
		return b
	})
	for _, p := range [][]byte{tokPlain, textPlain} {
		r, err := f.do(ctx, http.MethodPost, a.API, "/v1/completions", p, nil)
		if err != nil || r.Status != http.StatusOK || r.ServedBy != a.Name {
			b.Fatalf("warm-up: %v, status %d, served by %q; want %s", err, r.Status, r.ServedBy, a.Name)
		}
	}
	f.waitRoute(b, 1, tokPlain, a.Name, 8)

	ss := []series{
		{name: "direct plain", addr: a.SimAddr, body: tokPlain},
		{name: "local plain", addr: a.API, body: tokPlain, servedBy: a.Name},
		{name: "hop plain", addr: other.API, body: tokPlain, servedBy: a.Name},
		{name: "direct stream", addr: a.SimAddr, body: tokStream},
		{name: "local stream", addr: a.API, body: tokStream, servedBy: a.Name},
		{name: "hop stream", addr: other.API, body: tokStream, servedBy: a.Name},
		{name: "direct text", addr: a.SimAddr, body: textPlain},
		{name: "local text", addr: a.API, body: textPlain, servedBy: a.Name},
	}
	bare := startBareProxy(ctx, b, a.API, a.SimAddr, "")
	ss = append(ss, series{name: "bare plain", addr: bare, body: tokPlain}, series{name: "bare stream", addr: bare, body: tokStream})
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}
	// One second unrecorded opens the connections and warms the caches.
	openLoop(ctx, hc, ss, *rate, time.Second, rng)
	// Rounds, not one long run: the machine's noise drifts over tens of
	// seconds, so the median of per-round differences is steadier than the
	// difference of pooled percentiles.
	deltas := make([][2][]time.Duration, len(ss)) // per series: Δp50s, Δp99s by round
	pooled := make([][]time.Duration, len(ss))
	b.ResetTimer()
	for round := range *rounds {
		for i := range ss {
			ss[i].reset()
		}
		ctx, cancel := context.WithTimeout(context.Background(), *duration+30*time.Second)
		openLoop(ctx, hc, ss, *rate, *duration, rng)
		cancel()
		base := map[string]*series{}
		for i := range ss {
			s := &ss[i]
			kind := s.name[strings.IndexByte(s.name, ' ')+1:]
			if strings.HasPrefix(s.name, "direct") {
				base[kind] = s
			}
			d := base[kind]
			deltas[i][0] = append(deltas[i][0], percentile(s.ttlb, 50)-percentile(d.ttlb, 50))
			deltas[i][1] = append(deltas[i][1], percentile(s.ttlb, 99)-percentile(d.ttlb, 99))
			pooled[i] = append(pooled[i], s.ttlb...)
			if s.errs > 0 {
				b.Errorf("round %d: %s: %d of %d requests failed or went elsewhere; first: %v", round+1, s.name, s.errs, s.errs+len(s.ttlb), s.firstErr)
			}
		}
		b.Logf("round %d of %d: local plain Δp50 %s, bare plain Δp50 %s", round+1, *rounds,
			us(deltas[find(ss, "local plain")][0][round]), us(deltas[find(ss, "bare plain")][0][round]))
	}
	b.StopTimer()

	var tab strings.Builder
	fmt.Fprintf(&tab, "\nopen loop, %.0f req/s, %d round(s) of %v, %d series, sim time scale 1000\n", *rate, *rounds, *duration, len(ss))
	fmt.Fprintf(&tab, "%-14s %6s  %9s %9s  %11s %11s  %-19s  %s\n", "series", "n",
		"ttlb p50", "ttlb p99", "Δp50 median", "Δp99 median", "Δp50 min..max", "decisions (last round)")
	for i := range ss {
		s := &ss[i]
		dp50, dp99 := percentile(deltas[i][0], 50), percentile(deltas[i][1], 50)
		fmt.Fprintf(&tab, "%-14s %6d  %9s %9s  %11s %11s  %-19s  %v\n", s.name, len(pooled[i]),
			us(percentile(pooled[i], 50)), us(percentile(pooled[i], 99)), us(dp50), us(dp99),
			us(slices.Min(deltas[i][0]))+".."+us(slices.Max(deltas[i][0])), s.decisions)
		if !strings.HasPrefix(s.name, "direct") {
			unit := strings.ReplaceAll(s.name, " ", "-")
			b.ReportMetric(float64(dp50.Microseconds()), unit+"-Δp50-µs")
			b.ReportMetric(float64(dp99.Microseconds()), unit+"-Δp99-µs")
		}
	}
	for _, kind := range []string{"plain", "stream"} {
		local, ref := find(ss, "local "+kind), find(ss, "bare "+kind)
		var own50, own99 []time.Duration
		for r := range *rounds {
			own50 = append(own50, deltas[local][0][r]-deltas[ref][0][r])
			own99 = append(own99, deltas[local][1][r]-deltas[ref][1][r])
		}
		fmt.Fprintf(&tab, "kvroute's own share, %s: local − bare = %s p50, %s p99 (medians over rounds)\n", kind, us(percentile(own50, 50)), us(percentile(own99, 50)))
	}
	fmt.Fprintf(&tab, "Δ = a round's percentile minus the direct series' (same prompt kind) in that round; ttlb = last body byte;\n"+
		"bare = a bare httputil.ReverseProxy process (cmd/bareproxy) in front of the same simulator, with the sidecars' environment\n")
	// Printed, not logged: go test cuts a benchmark's log to a few lines.
	fmt.Print(tab.String())
}

// startBareProxy builds and starts cmd/bareproxy on the host of api (port
// 8100) in front of upstream (host:port), pinned to cpus when set (a
// taskset list), with the sidecars' GOMAXPROCS (--procs 1 unless
// -e2e.sidecar-env says otherwise), and returns its address once it
// accepts connections. args go on its command line.
func startBareProxy(ctx context.Context, b *testing.B, api, upstream, cpus string, args ...string) string {
	b.Helper()
	if err := chaos.Build(ctx, env.binDir, chaos.BareProxyBinary); err != nil {
		b.Fatal(err)
	}
	host, _, _ := strings.Cut(api, ":")
	addr := host + ":8100"
	bin, args := chaos.Pinned(cpus, filepath.Join(env.binDir, chaos.BareProxyBinary), append([]string{"--listen", addr, "--upstream", "http://" + upstream}, args...))
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "GOMAXPROCS=1"), strings.Fields(*sidecarEnv)...) // the last of a name wins
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(b, 5*time.Second, "bareproxy on "+addr, func(ctx context.Context) (bool, string) {
		c, err := (&net.Dialer{Timeout: 100 * time.Millisecond}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return false, err.Error()
		}
		c.Close()
		return true, ""
	})
	return addr
}

// find returns the index of the series named name.
func find(ss []series, name string) int {
	for i := range ss {
		if ss[i].name == name {
			return i
		}
	}
	panic("no series " + name)
}

// pickLocal draws request bodies until pod i's sidecar would serve one on
// its own pod, and returns it.
func (f *fixture) pickLocal(t testing.TB, i int, draw func() []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 64 {
		b := draw()
		d, err := f.explain(ctx, i, b)
		if err != nil {
			t.Fatal(err)
		}
		if d.Local {
			return b
		}
	}
	t.Fatalf("64 prompts, none placed on %s by its own sidecar", f.c.Pod(i).Name)
	return nil
}

// series is one kind of request in the open loop and its measurements.
type series struct {
	name     string
	addr     string
	body     []byte
	servedBy string // the X-Kvroute-Served-By every answer must carry; "" for direct

	mu         sync.Mutex
	ttfb, ttlb []time.Duration
	errs       int
	firstErr   error
	decisions  map[string]int
}

func (s *series) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ttfb, s.ttlb, s.errs, s.firstErr, s.decisions = nil, nil, 0, nil, nil
}

func (s *series) countDecision(d string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.decisions == nil {
		s.decisions = map[string]int{}
	}
	s.decisions[d]++
}

func (s *series) record(ttfb, ttlb time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++
		if s.firstErr == nil {
			s.firstErr = err
		}
		return
	}
	s.ttfb = append(s.ttfb, ttfb)
	s.ttlb = append(s.ttlb, ttlb)
}

// openLoop sends requests at a fixed rate for d, each of a series drawn at
// random, whether or not earlier requests have finished (an open loop, so
// a slow answer cannot hide the latency of the ones queued behind it). The
// draw matters: cycling in a fixed order gave every series the same
// predecessor and phase against the simulator's step loop, and the p50
// differences swung by ±0.5 ms between runs. It returns when every request
// has finished.
func openLoop(ctx context.Context, hc *http.Client, ss []series, rate float64, d time.Duration, rng *rand.Rand) {
	paced(ctx, rate, d, nil, func() func() {
		s := &ss[rng.IntN(len(ss))]
		return func() { s.record(measure(ctx, hc, s)) }
	})
}

// paced is the open loop's pacing: for d (or until ctx ends) it calls
// next on its own goroutine, so next may draw from an unlocked source, and
// runs the request next returns on a goroutine of its own; gap gives the
// time to the next request (nil: 1/rate every time). It returns when every
// request has finished.
func paced(ctx context.Context, rate float64, d time.Duration, gap func() time.Duration, next func() func()) {
	if gap == nil {
		gap = func() time.Duration { return time.Duration(float64(time.Second) / rate) }
	}
	t := time.NewTimer(0)
	defer t.Stop()
	end := time.After(d)
	var wg sync.WaitGroup
	defer wg.Wait()
	at := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-end:
			return
		case <-t.C:
		}
		wg.Go(next())
		// Scheduled from the last arrival, not from now, so the rate holds
		// however late the timer fires.
		at = at.Add(gap())
		t.Reset(time.Until(at))
	}
}

// poisson returns the gaps of Poisson arrivals at rate per second from a
// source of its own (not safe for concurrent use). At fixed gaps, series
// launched on the ticks never met each other in the engines, while a
// request sent between ticks (a follow-up, after its first turn and a
// think time) met their CPU bursts, so its tail was the machine's and not
// the path's; with random gaps every series meets them as often.
func poisson(rate float64, seed uint64) func() time.Duration {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	return func() time.Duration { return time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) }
}

// measure sends one request of s and times its first and last body byte.
func measure(ctx context.Context, hc *http.Client, s *series) (ttfb, ttlb time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.addr+"/v1/completions", strings.NewReader(string(s.body)))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	var buf [4096]byte
	for ttfb == 0 {
		n, err := resp.Body.Read(buf[:])
		if n > 0 {
			ttfb = time.Since(start)
		}
		if err != nil {
			if ttfb == 0 {
				return 0, 0, fmt.Errorf("%s: empty body: %w", s.name, err)
			}
			break
		}
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, 0, err
	}
	ttlb = time.Since(start)
	switch {
	case resp.StatusCode != http.StatusOK:
		return 0, 0, fmt.Errorf("%s: status %d", s.name, resp.StatusCode)
	case resp.Header.Get("X-Kvroute-Served-By") != s.servedBy:
		return 0, 0, fmt.Errorf("%s: served by %q (decision %q); want %q", s.name,
			resp.Header.Get("X-Kvroute-Served-By"), resp.Header.Get("X-Kvroute-Decision"), s.servedBy)
	}
	if s.servedBy != "" {
		s.countDecision(resp.Header.Get("X-Kvroute-Decision"))
	}
	return ttfb, ttlb, nil
}

// us formats d in microseconds, signed, as the table shows it.
func us(d time.Duration) string {
	return fmt.Sprintf("%.0fµs", float64(d)/float64(time.Microsecond))
}
