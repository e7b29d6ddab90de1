package chaos

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/loadgen"
	"github.com/kvroute/kvroute/vllmsim"
)

// TestBurstCostModel pins burstCapacity's constants to the simulator's
// cost model, which the chaos pods run.
func TestBurstCostModel(t *testing.T) {
	tm, c := vllmsim.DefaultTiming(), vllmsim.DefaultConfig()
	if tm.PrefillPerToken != simPrefillPerToken || tm.StepOverhead != simStepOverhead || c.MaxNumBatchedTokens != simBatchedTokens {
		t.Fatalf("simulator: prefill %v/token, step %v, %d tokens a step; burstCapacity assumes %v, %v, %d",
			tm.PrefillPerToken, tm.StepOverhead, c.MaxNumBatchedTokens, simPrefillPerToken, simStepOverhead, simBatchedTokens)
	}
	// 32000 tokens: 1.92 s of prefill in 4 steps of 6 ms overhead.
	if got, want := burstCapacity(6, 32000), 6/1.944; got < want*0.999 || got > want*1.001 {
		t.Errorf("burstCapacity(6, 32000) = %.4f; want %.4f", got, want)
	}
}

func TestErrorShape(t *testing.T) {
	for body, want := range map[string]bool{
		`{"error":{"message":"all pods are full","type":"RateLimitError","code":429}}`:       true,
		`{"type":"error","error":{"type":"rate_limit_error","message":"all pods are full"}}`: true,
		`{"error":{"message":"","type":"RateLimitError"}}`:                                   false,
		`{"detail":"Too Many Requests"}`:                                                     false,
		`Too Many Requests`:                                                                  false,
		`{"object":"error","message":"x","type":"BadRequestError","code":400}`:               false,
	} {
		if got := errorShape([]byte(body)); got != want {
			t.Errorf("errorShape(%s) = %v; want %v", body, got, want)
		}
	}
}

func TestBurstValidate(t *testing.T) {
	ok := Burst{At: Duration(60 * time.Second), For: Duration(60 * time.Second), Factor: 5, PromptTokens: 32000}
	if err := ok.validate(150 * time.Second); err != nil {
		t.Fatalf("valid burst: %v", err)
	}
	for name, b := range map[string]Burst{
		"no room to recover": ok,
		"no warm-up":         {At: Duration(10 * time.Second), For: ok.For, Factor: 5, PromptTokens: 32000},
		"no factor":          {At: ok.At, For: ok.For, PromptTokens: 32000},
		"no prompt":          {At: ok.At, For: ok.For, Factor: 5},
	} {
		d := 150 * time.Second
		if name == "no room to recover" {
			d = 125 * time.Second
		}
		if err := b.validate(d); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
}

// sampleAt is a served workload request sent at sent seconds with a TTFT
// of ttft seconds.
func sampleAt(session string, sent, ttft float64) loadgen.Sample {
	return loadgen.Sample{Session: session, Sent: secs(sent), WallTTFT: secs(ttft), Status: http.StatusOK, Attempts: 1}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func TestSummarizeOverload(t *testing.T) {
	b := Burst{At: Duration(60 * time.Second), For: Duration(60 * time.Second), Factor: 5, PromptTokens: 32000}
	var samples []loadgen.Sample
	for i := range 60 { // before: 0.2 s, one 0.24 s a second
		samples = append(samples, sampleAt("pre", float64(i)+0.1, 0.2), sampleAt("pre", float64(i)+0.5, 0.24))
	}
	samples = append(samples, sampleAt("during", 90, 3))
	failed := loadgen.Sample{Session: "during", Turn: 2, Sent: secs(95), Status: http.StatusTooManyRequests, Err: "status 429", Attempts: 3}
	samples = append(samples, failed)
	// After the burst (ends at 120 s): slow for 2 s, one good second, one
	// slow, then good: back from 4 s on.
	for k, ttft := range []float64{2, 1, 0.2, 0.9, 0.21, 0.2, 0.25, 0.2} {
		samples = append(samples, sampleAt("post", 120+float64(k)+0.3, ttft))
	}
	outcomes := []burstOutcome{
		{id: "burst.0", status: http.StatusOK, ttftS: 2.5},
		{id: "burst.1", status: http.StatusTooManyRequests, retryAfter: "1", shape: true, headersS: 0.004},
		{id: "burst.2", status: http.StatusServiceUnavailable, retryAfter: "1", shape: true, headersS: 0.002},
	}
	in := overloadInput{burst: b, pods: 6, offered: 15.4, outcomes: outcomes, samples: samples,
		refusals:  []refusal{{status: 429, retryAfter: "1", shape: true, headersS: 0.003}},
		attempts:  []Attempt{{Req: "burst.0", Target: "pod2"}},
		resources: []ResourceSeries{{Pod: "pod1", PID: 7, Samples: []ResourceSample{{RSSBytes: 40 << 20}, {RSSBytes: 60 << 20}}}},
		counters:  map[string]float64{}}
	o := summarizeOverload(in)
	if o.TTFTP90Before != 0.24 {
		t.Errorf("pre-burst p90 %v; want 0.24", o.TTFTP90Before)
	}
	if o.RecoveryS == nil || *o.RecoveryS != 4 {
		t.Errorf("recovery %v; want 4 s (the slow second at 3 s restarts the run)", o.RecoveryS)
	}
	if r := o.Outcomes[0]; r.Served != 1 || r.Refused429 != 1 || r.Refused503 != 1 || r.RefusedBad != 0 || r.Failed != 0 {
		t.Errorf("burst row %+v", r)
	}
	if r := o.Outcomes[1]; r.Requests != 2 || r.Served != 1 || r.Refused429 != 1 || r.ClientRetried != 1 {
		t.Errorf("during row %+v", r)
	}
	if o.Hops[0].Requests != len(outcomes)+len(samples)-1 || o.Hops[1].Requests != 1 {
		t.Errorf("hops %+v", o.Hops)
	}
	if len(o.RSS) != 1 || o.RSS[0].MaxMiB != 60 {
		t.Errorf("rss %+v", o.RSS)
	}
	if !o.Pass {
		t.Errorf("verdict failed: %+v", o.Verdict)
	}
	md := o.markdown()
	for _, want := range []string{"Verdict: **pass**", "| pod1 | 7 | 60.0 |", "| 3 | 1 | 0.900 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}

	// A refusal without Retry-After, a cut stream, a sidecar retry, RSS
	// over the bound and no recovery each fail the verdict.
	in.outcomes = append(in.outcomes, burstOutcome{id: "burst.3", status: 429, shape: true}, burstOutcome{id: "burst.4", status: 200, err: "stream ended without [DONE]"})
	in.counters["retries"] = 1
	in.resources[0].Samples = append(in.resources[0].Samples, ResourceSample{RSSBytes: 300 << 20})
	in.samples = append(in.samples[:len(in.samples)-8:len(in.samples)-8], sampleAt("post", 121, 2), sampleAt("post", 140, 2))
	o = summarizeOverload(in)
	if o.Pass {
		t.Fatal("verdict passed")
	}
	failedChecks := map[string]bool{}
	for _, c := range o.Verdict {
		if !c.Pass {
			failedChecks[c.Check] = true
		}
	}
	for _, want := range []string{"sidecar RSS", "every request served or refused retryably", "no retry storm, no hop ping-pong", "TTFT back to its pre-burst p90"} {
		if !failedChecks[want] {
			t.Errorf("check %q passed; failed: %v", want, failedChecks)
		}
	}
}

// TestRefusalTap: the tap notes a refusal and hands its body on whole.
func TestRefusalTap(t *testing.T) {
	body := `{"error":{"message":"full","type":"RateLimitError","code":429}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ok" {
			w.Write([]byte("fine"))
			return
		}
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(body))
	}))
	defer srv.Close()
	tap := &refusalTap{base: http.DefaultTransport}
	hc := &http.Client{Transport: tap}
	for _, p := range []string{"/ok", "/full"} {
		resp, err := hc.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if p == "/full" && string(b) != body {
			t.Errorf("body handed on %q; want %q", b, body)
		}
	}
	got := tap.refusals()
	if len(got) != 1 || got[0].status != 429 || got[0].retryAfter != "1" || !got[0].shape {
		t.Errorf("refusals %+v", got)
	}
}

// TestBurstRequest: a stream's TTFT is its first text, not the role chunk
// before it; a plain answer's is the whole answer; a refusal is read for
// its Retry-After and shape; a stream without [DONE] is a failure.
func TestBurstRequest(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Request-Id") {
		case "stream", "cut":
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte(`data: {"choices":[{"delta":{"role":"assistant","content":""}}]}` + "\n\n"))
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond) // the prefill the TTFT must include
			w.Write([]byte(`data: {"choices":[{"delta":{"content":"hi"}}]}` + "\n\n"))
			if r.Header.Get("X-Request-Id") == "stream" {
				w.Write([]byte("data: [DONE]\n\n"))
			}
		case "plain":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"choices":[]}`))
		default:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write([]byte(`{"error":{"message":"full","type":"RateLimitError","code":429}}`))
		}
	}))
	defer srv.Close()
	hc := srv.Client()
	ctx := t.Context()
	if o := burstRequest(ctx, hc, srv.URL, "stream", []byte("{}")); o.err != "" || o.status != 200 || o.ttftS < 0.05 {
		t.Errorf("stream: %+v; want a TTFT of 50 ms or more, after the role chunk", o)
	}
	if o := burstRequest(ctx, hc, srv.URL, "cut", []byte("{}")); o.err == "" {
		t.Errorf("a stream without [DONE]: %+v; want a failure", o)
	}
	if o := burstRequest(ctx, hc, srv.URL, "plain", []byte("{}")); o.err != "" || o.status != 200 || o.ttftS <= 0 {
		t.Errorf("plain: %+v", o)
	}
	if o := burstRequest(ctx, hc, srv.URL, "full", []byte("{}")); o.status != 429 || o.retryAfter != "1" || !o.shape {
		t.Errorf("refusal: %+v", o)
	}
}
