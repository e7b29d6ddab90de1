//go:build integration

package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// overloadSubnet is this test's loopback subnet.
const overloadSubnet = "127.0.93"

// overloadOutcome is one request of the burst as its client saw it.
type overloadOutcome struct {
	status     int
	retryAfter string
	errShape   bool          // a refusal's body is its API's error
	headers    time.Duration // until the answer's headers
	err        error         // transport error, or a served body that did not end
}

// TestOverloadIsRefusedNotAmplified offers a 3-pod cluster (two sequences
// an engine, real-time simulation, --max-queue 3) several times what it
// can serve, through the Service, for 15 s. Every request must be served
// or refused at once with 429 or 503, Retry-After and the API's error
// shape; none may hang or fail otherwise; no sidecar may retry, refuse a
// hop or exclude a busy pod; every refusal is counted; the sidecars' RSS
// stays under 256 MiB; and within 10 s of the burst's end a streamed
// request's TTFT is back to what it was before.
func TestOverloadIsRefusedNotAmplified(t *testing.T) {
	if testing.Short() {
		t.Skip("overloads a 3-pod cluster for 15 s")
	}
	cfg := testConfig(t, true)
	cfg.Subnet = overloadSubnet
	cfg.Sim.TimeScale = 1 // the engine's own pace: it is the bottleneck
	cfg.Sim.MaxNumSeqs = 2
	cfg.Sim.MaxNumBatchedTokens = 512
	cfg.SidecarArgs = append(cfg.SidecarArgs, "--max-queue", "3", "--max-num-batched-tokens", "512")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	svc, err := ListenService(ServiceConfig{Addr: c.ServiceAddr(0), Backends: c.APIAddrs(), Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	sampler := StartSampler(c, 250*time.Millisecond)
	defer sampler.Stop()

	// A connection per request, so the Service spreads them (a kept-alive
	// client would stay on one pod); a generous client timeout turns a
	// hang into a failure instead of a stuck test.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 60 * time.Second}
	body := func(i int, stream bool) string {
		prompt := strings.Repeat(fmt.Sprintf("overload request %d asks about item %d. ", i, i*13), 60)
		return fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":160,"stream":%t}`, prompt, stream)
	}

	// Before the burst: TTFT and service time, one request at a time.
	var base []time.Duration
	var service time.Duration
	for i := range 4 {
		t0 := time.Now()
		ttft, err := streamTTFT(ctx, hc, svc.URL(), body(-1-i, true))
		if err != nil {
			t.Fatalf("request %d before the burst: %v", i, err)
		}
		base = append(base, ttft)
		service = max(service, time.Since(t0))
	}
	slices.Sort(base)
	baseTTFT := base[len(base)-1] // of 4, the p90 is the largest
	// Capacity: every pod's engine runs two sequences of `service` each.
	capacity := float64(c.Len()*cfg.Sim.MaxNumSeqs) / service.Seconds()
	rate := min(5*capacity, 30) // the 2-core machine's limit for the client side
	t.Logf("before the burst: TTFT p90 %v, a request %v alone; capacity ~%.1f req/s, offering %.1f req/s (%.1fx)",
		baseTTFT.Round(time.Millisecond), service.Round(time.Millisecond), capacity, rate, rate/capacity)

	// Exclusions while the cluster is busy: every sidecar's view of every
	// peer, read throughout the burst.
	var exMu sync.Mutex
	var exclusions []string
	pollCtx, stopPoll := context.WithCancel(ctx)
	var pollWG sync.WaitGroup
	pollWG.Go(func() {
		poll := &http.Client{Timeout: time.Second}
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			for j := range c.Len() {
				for k := range c.Len() {
					if k == j {
						continue
					}
					ex, err := exclusion(poll, c.Pod(j).Admin, c.Pod(k).Name)
					if err == nil && ex != "" {
						exMu.Lock()
						exclusions = append(exclusions, fmt.Sprintf("%s excluded %s: %s", c.Pod(j).Name, c.Pod(k).Name, ex))
						exMu.Unlock()
					}
				}
			}
			select {
			case <-pollCtx.Done():
				return
			case <-tick.C:
			}
		}
	})

	// The burst: open loop, a request every 1/rate, each on its own.
	const burst = 15 * time.Second
	var mu sync.Mutex
	var outcomes []overloadOutcome
	var wg sync.WaitGroup
	every := time.Duration(float64(time.Second) / rate)
	tick := time.NewTicker(every)
	start := time.Now()
	for i := 0; time.Since(start) < burst; i++ {
		wg.Go(func() {
			o := overloadRequest(ctx, hc, svc.URL(), body(i, i%2 == 0))
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		})
		<-tick.C
	}
	tick.Stop()
	ended := time.Now()

	// After it: probe every 100 ms until a streamed request's TTFT is back
	// within the noise of the one before (the larger of 2x and +250 ms). A
	// probe may be refused while the queues drain; it counts as one.
	var recovered time.Duration
	var probesLimited int
	probe := time.NewTicker(100 * time.Millisecond)
	for i := 0; ; i++ {
		ttft, err := streamTTFT(ctx, hc, svc.URL(), body(100000+i, true))
		since := time.Since(ended)
		if err != nil && strings.Contains(err.Error(), "status 429") {
			probesLimited++
		}
		if err == nil && ttft <= max(2*baseTTFT, baseTTFT+250*time.Millisecond) {
			recovered = since
			break
		}
		if since > 10*time.Second {
			t.Errorf("TTFT not back to its pre-burst p90 %v within 10 s of the burst: last %v (%v)", baseTTFT, ttft, err)
			break
		}
		<-probe.C // the probes' pace
	}
	probe.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }() // exits when every request has ended
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("requests of the burst still open 90 s after it; a hang")
	}
	stopPoll()
	pollWG.Wait()

	var served, limited, unavailable int
	var refusalMax time.Duration
	var bad []string
	for _, o := range outcomes {
		switch {
		case o.err != nil:
			bad = append(bad, fmt.Sprintf("status %d: %v", o.status, o.err))
		case o.status == http.StatusOK:
			served++
		case o.status == http.StatusTooManyRequests || o.status == http.StatusServiceUnavailable:
			if o.retryAfter == "" || !o.errShape {
				bad = append(bad, fmt.Sprintf("a %d without Retry-After (%q) or the error shape (%v)", o.status, o.retryAfter, o.errShape))
			}
			if o.status == http.StatusTooManyRequests {
				limited++
			} else {
				unavailable++
			}
			refusalMax = max(refusalMax, o.headers)
		default:
			bad = append(bad, fmt.Sprintf("status %d", o.status))
		}
	}
	var queueFull, retries, hopsRefused float64
	for i := range c.Len() {
		text, err := metricsText(ctx, &http.Client{Timeout: 2 * time.Second}, c.Pod(i).Admin)
		if err != nil {
			t.Fatalf("%s /metrics: %v", c.Pod(i).Name, err)
		}
		// A long backlog also refuses for the prefill share.
		queueFull += metricSumLabel(text, "kvroute_request_errors_total", `kind="queue_full"`) +
			metricSumLabel(text, "kvroute_request_errors_total", `kind="prefill_busy"`)
		retries += metricSum(text, "kvroute_forward_retries_total")
		hopsRefused += metricSumLabel(text, "kvroute_routing_decisions_total", `outcome="refused"`)
	}
	peak := sampler.Peak()
	t.Logf("burst of %d requests: %d served, %d refused 429, %d refused 503, %d otherwise; slowest refusal %v; TTFT recovered %v after the burst (%d probes refused); "+
		"counted queue_full %.0f, retries %.0f, hops refused %.0f; sidecar RSS peak %.1f MiB (%s)",
		len(outcomes), served, limited, unavailable, len(bad), refusalMax.Round(time.Millisecond), recovered.Round(time.Millisecond), probesLimited,
		queueFull, retries, hopsRefused, float64(peak.RSSBytes)/(1<<20), peak.RSSPod)
	if len(bad) > 0 {
		t.Errorf("%d requests neither served nor refused retryably, e.g. %s", len(bad), bad[0])
	}
	if served == 0 || limited == 0 {
		t.Errorf("%d served, %d refused: the burst did not overload the cluster, or nothing was served", served, limited)
	}
	if refusalMax >= time.Second {
		t.Errorf("a refusal took %v; want every one within 1 s", refusalMax)
	}
	if int(queueFull) != limited+probesLimited {
		t.Errorf("sidecars counted %.0f queue_full and prefill_busy refusals; clients saw %d 429s (%d of them probes after the burst)", queueFull, limited+probesLimited, probesLimited)
	}
	if retries != 0 || hopsRefused != 0 {
		t.Errorf("%.0f retries and %.0f refused hops under overload; want none (no storm, no ping-pong)", retries, hopsRefused)
	}
	if len(exclusions) > 0 {
		t.Errorf("a busy pod was excluded (%d reads), e.g. %s", len(exclusions), exclusions[0])
	}
	if peak.RSSBytes >= 256<<20 {
		t.Errorf("sidecar RSS peaked at %.1f MiB on %s; the bound is 256 MiB", float64(peak.RSSBytes)/(1<<20), peak.RSSPod)
	}
}

// overloadRequest sends one request and reads its answer whole.
func overloadRequest(ctx context.Context, hc *http.Client, url, body string) overloadOutcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return overloadOutcome{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return overloadOutcome{err: err}
	}
	defer resp.Body.Close()
	o := overloadOutcome{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), headers: time.Since(t0)}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		o.err = fmt.Errorf("reading the answer: %w", err)
		return o
	}
	if resp.StatusCode == http.StatusOK {
		if strings.Contains(body, `"stream":true`) && !strings.Contains(string(b), "data: [DONE]") {
			o.err = fmt.Errorf("stream ended without [DONE]")
		}
		return o
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	o.errShape = json.Unmarshal(b, &e) == nil && e.Error.Code == resp.StatusCode && e.Error.Message != ""
	return o
}

// streamTTFT sends a streamed request and returns the time until its
// first data line; the stream is read to its end.
func streamTTFT(ctx context.Context, hc *http.Client, url, body string) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	ttft := time.Duration(math.MaxInt64)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") && ttft == math.MaxInt64 {
			ttft = time.Since(t0)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return ttft, nil
}

// TestNoEngineAnswersRetryably hangs every pod's engine (SIGSTOP: they
// take connections and answer nothing) with requests in flight and more
// arriving through the Service. Every request must end in a 503 with
// Retry-After: those sent once every sidecar has declared its engine down
// within 1 s, those sent before within 1 s of their sidecar's verdict (the
// hang detection, about 2.2 s). None may hang. Then the engines resume and
// the cluster serves again.
func TestNoEngineAnswersRetryably(t *testing.T) {
	if testing.Short() {
		t.Skip("hangs every engine of a 3-pod cluster")
	}
	cfg := testConfig(t, true)
	cfg.Subnet = overloadSubnet
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	svc, err := ListenService(ServiceConfig{Addr: c.ServiceAddr(0), Backends: c.APIAddrs(), Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":8}`, strings.Repeat(fmt.Sprintf("no engine %d. ", i), 40))
	}
	if o := overloadRequest(ctx, hc, svc.URL(), body(0)); o.err != nil || o.status != http.StatusOK {
		t.Fatalf("before: status %d, %v", o.status, o.err)
	}
	for i := range c.Len() {
		if err := c.PauseSim(i); err != nil {
			t.Fatal(err)
		}
	}
	stopped := time.Now()
	t.Cleanup(func() {
		for i := range c.Len() {
			c.ResumeSim(i)
		}
	})

	type sent struct {
		at time.Time
		o  overloadOutcome
	}
	var mu sync.Mutex
	var all []sent
	var wg sync.WaitGroup
	var detected time.Time // every sidecar's /readyz is 503
	poll := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(100 * time.Millisecond)
	for i := 1; time.Since(stopped) < 8*time.Second; i++ {
		at := time.Now()
		wg.Go(func() {
			o := overloadRequest(ctx, hc, svc.URL(), body(i))
			mu.Lock()
			all = append(all, sent{at, o})
			mu.Unlock()
		})
		if detected.IsZero() {
			down := 0
			for j := range c.Len() {
				if readyz(poll, c.Pod(j).Admin) == http.StatusServiceUnavailable {
					down++
				}
			}
			if down == c.Len() {
				detected = time.Now()
			}
		}
		<-tick.C // the clients' pace
	}
	tick.Stop()
	wg.Wait()
	if detected.IsZero() {
		t.Fatal("no sidecar declared its hung engine down within 8 s")
	}
	var before, after int
	var worstBefore, worstAfter time.Duration
	for _, s := range all {
		o := s.o
		if o.err != nil || o.status != http.StatusServiceUnavailable || o.retryAfter == "" || !o.errShape {
			t.Errorf("sent %v after the hang: status %d Retry-After %q shape %v err %v; want a retryable 503",
				s.at.Sub(stopped).Round(time.Millisecond), o.status, o.retryAfter, o.errShape, o.err)
			continue
		}
		if s.at.After(detected) {
			after++
			worstAfter = max(worstAfter, o.headers)
			continue
		}
		before++
		// Answered within 1 s of the verdict, which came by detected.
		worstBefore = max(worstBefore, s.at.Add(o.headers).Sub(detected))
	}
	t.Logf("hung engines declared down by every sidecar %v after SIGSTOP; %d requests sent before: answered by %v after it; %d after: slowest %v",
		detected.Sub(stopped).Round(time.Millisecond), before, worstBefore.Round(time.Millisecond), after, worstAfter.Round(time.Millisecond))
	if after == 0 {
		t.Error("no request was sent after the engines were declared down")
	}
	if worstAfter >= time.Second || worstBefore >= time.Second {
		t.Errorf("a 503 took %v (sent after the verdict) / came %v after the verdict (sent before); want under 1 s", worstAfter, worstBefore)
	}

	for i := range c.Len() {
		if err := c.ResumeSim(i); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		o := overloadRequest(ctx, hc, svc.URL(), body(-1))
		if o.err == nil && o.status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not served 10 s after the engines resumed: status %d, %v", o.status, o.err)
		}
		time.Sleep(100 * time.Millisecond) // poll interval
	}
}
