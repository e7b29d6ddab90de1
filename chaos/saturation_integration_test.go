//go:build integration

package chaos

import (
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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/clusterkey"
	"github.com/kvroute/kvroute/forward"
)

// slowHealth is a vLLM whose API server answers /health late, as a
// saturated one does, while everything else passes straight through.
type slowHealth struct {
	proxy   *httputil.ReverseProxy
	delay   time.Duration
	on      atomic.Bool
	late    atomic.Int64 // /health probes the client gave up on before the delay ended
	healthy atomic.Int64 // /health probes answered
}

func (s *slowHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" && s.on.Load() {
		select {
		case <-r.Context().Done():
			s.late.Add(1)
			return
		case <-time.After(s.delay):
		}
	}
	if r.URL.Path == "/health" {
		s.healthy.Add(1)
	}
	s.proxy.ServeHTTP(w, r)
}

// TestSaturatedPodIsNotExcluded fills pod1's engine (two sequences at a
// time, real-time simulation) with requests its sidecar serves locally,
// while its /health answers 1.2 s late, past the probe timeout: the
// engine keeps computing and publishing KV events, so neither its own
// sidecar nor any peer may take it for hung or silent. Then the engine is
// stopped for real (SIGSTOP) with /health still slow, and every peer must
// exclude it within 2 s: the rule that keeps a busy pod in still finds a
// dead one.
func TestSaturatedPodIsNotExcluded(t *testing.T) {
	if testing.Short() {
		t.Skip("saturates a pod of a 3-pod cluster for 10 s")
	}
	cfg := testConfig(t, true)
	cfg.Sim.TimeScale = 1 // the engine's own pace: it is the bottleneck
	cfg.Sim.MaxNumSeqs = 2
	cfg.Sim.MaxNumBatchedTokens = 512 // many short prefill steps, as chunked prefill
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	// pod1's sidecar talks to its vLLM through slowHealth.
	sim, _ := url.Parse(c.Pod(0).SimURL)
	rp := httputil.NewSingleHostReverseProxy(sim)
	rp.FlushInterval = -1
	slow := &slowHealth{proxy: rp, delay: 1200 * time.Millisecond}
	front := httptest.NewServer(slow)
	t.Cleanup(front.Close)
	args := c.cfg.SidecarArgs
	c.cfg.SidecarArgs = append(slices.Clip(args), "--vllm-url", front.URL) // the last --vllm-url wins
	err = c.RestartSidecar(ctx, 0)
	c.cfg.SidecarArgs = args
	if err != nil {
		t.Fatal(err)
	}
	pod1 := c.Pod(0).Name

	// Queue far more than two sequences' worth at pod1, each served there
	// (a hop header), with distinct prompts so every one computes blocks.
	keys, err := clusterkey.Load("")
	if err != nil {
		t.Fatal(err)
	}
	hop := forward.NewHop(keys.Hop, time.Minute)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var served, refused, failed atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLoad() // runs before wg.Wait: the stopped engine holds requests
	hc := &http.Client{}
	for i := range 24 {
		wg.Go(func() {
			prompt := strings.Repeat(fmt.Sprintf("saturating request %d asks about item %d. ", i, i*7), 250)
			body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":200}`, prompt)
			req, err := http.NewRequestWithContext(loadCtx, http.MethodPost, "http://"+c.Pod(0).API+"/v1/completions", strings.NewReader(body))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(forward.HopHeader, hop.Sign("saturator", pod1, time.Now()))
			resp, err := hc.Do(req)
			if err != nil {
				failed.Add(1)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusOK:
				served.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
				refused.Add(1)
			default:
				failed.Add(1)
			}
		})
	}
	waitSaturated(t, c, 0, 10*time.Second)
	slow.on.Store(true)
	eventsBefore := metricOf(t, c, 0, "kvroute_kv_event_batches_total")

	// 10 s of late /health under a full engine: pod1 in every peer's
	// choice and its own /readyz, at every read.
	hcPoll := &http.Client{Timeout: time.Second}
	until := time.Now().Add(10 * time.Second)
	var reads int
	for time.Now().Before(until) {
		for j := 1; j < c.Len(); j++ {
			ex, err := exclusion(hcPoll, c.Pod(j).Admin, pod1)
			if err != nil {
				t.Fatalf("%s /debug/peers: %v", c.Pod(j).Name, err)
			}
			if ex != "" {
				t.Fatalf("%s excluded the saturated %s: %q (late probes %d, events since %.0f)",
					c.Pod(j).Name, pod1, ex, slow.late.Load(), metricOf(t, c, 0, "kvroute_kv_event_batches_total")-eventsBefore)
			}
		}
		if st := readyz(hcPoll, c.Pod(0).Admin); st != http.StatusOK {
			t.Fatalf("%s /readyz %d while saturated: its sidecar took its engine for down", pod1, st)
		}
		reads++
		time.Sleep(100 * time.Millisecond) // poll interval
	}
	events := metricOf(t, c, 0, "kvroute_kv_event_batches_total") - eventsBefore
	t.Logf("saturated 10 s: %d reads of every peer, %d late /health probes, %.0f KV-event messages, queued requests: %.0f served so far",
		reads, slow.late.Load(), events, float64(served.Load()))
	if slow.late.Load() < 8 {
		t.Fatalf("only %d /health probes were late; the test did not hold the probes past their timeout", slow.late.Load())
	}
	if events == 0 {
		t.Fatal("no KV events during saturation: the engine was not working")
	}

	// Now a real hang, /health still late: every peer excludes pod1 soon.
	if err := c.PauseSim(0); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for {
		all := true
		for j := 1; j < c.Len(); j++ {
			if ex, err := exclusion(hcPoll, c.Pod(j).Admin, pod1); err == nil && ex == "" {
				all = false // listed and choosable
			}
		}
		d := time.Since(stopped)
		if all {
			t.Logf("hung engine excluded by every peer %v after SIGSTOP", d.Round(time.Millisecond))
			break
		}
		if d > 2*time.Second {
			t.Fatalf("hung engine of %s still chosen %v after SIGSTOP; want excluded within 2 s", pod1, d)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	if err := c.ResumeSim(0); err != nil {
		t.Fatal(err)
	}
	t.Logf("queued requests: %d served, %d refused, %d failed", served.Load(), refused.Load(), failed.Load())
}

// waitSaturated waits until pod i's engine has a queue: requests waiting
// beyond the ones running.
func waitSaturated(t *testing.T, c *Cluster, i int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if metricURL(t, c.Pod(i).SimURL+"/metrics", "vllm:num_requests_waiting") >= 4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's engine never had 4 requests waiting within %v", c.Pod(i).Name, limit)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// exclusion is why the sidecar at admin excludes pod ("" when it would
// choose it), as its /debug/peers says; an error when it does not list
// the pod at all.
func exclusion(hc *http.Client, admin, pod string) (string, error) {
	resp, err := hc.Get("http://" + admin + "/debug/peers")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var ps []peerEntry
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ps); err != nil {
		return "", err
	}
	for _, p := range ps {
		if p.ID == pod {
			return p.Excluded, nil
		}
	}
	return "", fmt.Errorf("%s not listed", pod)
}

func readyz(hc *http.Client, admin string) int {
	resp, err := hc.Get("http://" + admin + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func metricOf(t *testing.T, c *Cluster, i int, name string) float64 {
	t.Helper()
	return metricURL(t, "http://"+c.Pod(i).Admin+"/metrics", name)
}

func metricURL(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		t.Fatalf("metrics %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return metricSum(string(b), name)
}
