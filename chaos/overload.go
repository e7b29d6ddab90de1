package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// Burst is a scenario's overload phase: on top of the workload, from At for
// For, an open loop of chats (streamed unless Plain) of PromptTokens tokens each, sent
// through the Service on a connection each (as many clients would), at
// Factor times what the pods can prefill of them. Every chat starts
// differently, so none has a cached prefix anywhere: the engines' prefill
// is the bottleneck, and the capacity is computed from the simulator's
// cost model (burstCapacity). The burst's clients do not retry: the
// offered load stays what it was set to.
type Burst struct {
	At           Duration `json:"at"`
	For          Duration `json:"for"`
	Factor       float64  `json:"factor"`
	PromptTokens int      `json:"prompt_tokens"`
	// MaxTokens is each chat's max_tokens (default 16).
	MaxTokens int `json:"max_tokens,omitempty"`
	// Plain sends the chats without streaming (their TTFT is then the
	// whole answer's time).
	Plain bool `json:"plain,omitempty"`
	// MaxRSSMiB bounds every sidecar's RSS (default 256) and RecoverWithin
	// the time from the burst's end until the workload's TTFT p90 is back
	// (default 10s): the report's verdict asserts both.
	MaxRSSMiB     float64  `json:"max_rss_mib,omitempty"`
	RecoverWithin Duration `json:"recover_within,omitempty"`
}

func (b Burst) withDefaults() Burst {
	if b.MaxTokens <= 0 {
		b.MaxTokens = 16
	}
	if b.MaxRSSMiB <= 0 {
		b.MaxRSSMiB = 256
	}
	if b.RecoverWithin <= 0 {
		b.RecoverWithin = Duration(10 * time.Second)
	}
	return b
}

// validate checks b within a run of d.
func (b Burst) validate(d time.Duration) error {
	b = b.withDefaults()
	switch {
	case b.At < 0 || b.For <= 0:
		return fmt.Errorf("scenario: burst: at must not be negative and for must be positive")
	case b.At.D()+b.For.D()+b.RecoverWithin.D() > d:
		return fmt.Errorf("scenario: burst: at + for + recover_within (%v) must fit in the duration %v: recovery is measured on the workload sent after the burst",
			b.At.D()+b.For.D()+b.RecoverWithin.D(), d)
	case b.At.D() < 2*preBurstWindow:
		return fmt.Errorf("scenario: burst: at must be %v or later (a warm-up, then the pre-burst TTFT window of %v)", 2*preBurstWindow, preBurstWindow)
	case b.Factor <= 0 || b.Factor > 50:
		return fmt.Errorf("scenario: burst: factor %v not in (0, 50]", b.Factor)
	case b.PromptTokens < 16 || b.PromptTokens > 1<<17:
		return fmt.Errorf("scenario: burst: prompt_tokens %d not in 16..131072", b.PromptTokens)
	}
	return nil
}

// The simulator's cost model (vllmsim.DefaultTiming and DefaultConfig,
// which the chaos pods run; TestBurstCostModel pins these to it): a step
// prefills at most simBatchedTokens tokens at simPrefillPerToken each, and
// costs simStepOverhead besides.
const (
	simPrefillPerToken = 60 * time.Microsecond
	simStepOverhead    = 6 * time.Millisecond
	simBatchedTokens   = 8192
)

// burstCapacity is how many of the burst's chats per second pods engines
// can prefill, none cached: the engines are prefill-bound, a step carrying
// at most simBatchedTokens.
func burstCapacity(pods, promptTokens int) float64 {
	steps := (promptTokens + simBatchedTokens - 1) / simBatchedTokens
	each := time.Duration(promptTokens)*simPrefillPerToken + time.Duration(steps)*simStepOverhead
	return float64(pods) / each.Seconds()
}

// preBurstWindow is the workload before the burst whose TTFT p90 the
// recovery returns to; recoverTolerance and recoverRun what "back" means:
// the p90 of each of recoverRun consecutive seconds of sends at most
// recoverTolerance times the pre-burst p90 (a second's p90 is of a few
// requests, and moves by that much without any burst; the report shows
// how often it did before the burst).
const (
	preBurstWindow   = 30 * time.Second
	recoverTolerance = 1.25
	recoverRun       = 3
)

// burstOutcome is one burst request as its client saw it.
type burstOutcome struct {
	id         string
	sentS      float64
	status     int
	retryAfter string
	shape      bool    // a refusal's body is its API's error
	headersS   float64 // until the answer's headers
	ttftS      float64 // until the first data line of a served stream
	err        string  // transport error, or a served stream that did not end
}

// runBurst sends b's open loop to url from start+b.At and returns every
// request's outcome once all have ended.
func runBurst(ctx context.Context, b Burst, url, model string, rate float64, start time.Time, timeout time.Duration, seed uint64) []burstOutcome {
	if !sleepUntil(ctx, start.Add(b.At.D())) {
		return nil
	}
	// One filler for every chat, each made unique by its first words: a
	// different first block makes every later block's key different too.
	filler := fillerWords(b.PromptTokens - 8)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: timeout}
	var mu sync.Mutex
	var out []burstOutcome
	var wg sync.WaitGroup
	every := time.Duration(float64(time.Second) / rate)
	tick := time.NewTicker(every)
	defer tick.Stop()
	end := start.Add(b.At.D() + b.For.D())
	for i := 0; time.Now().Before(end); i++ {
		content := fmt.Sprintf("burst chat %d of seed %d asks: %s", i, seed, filler)
		body, _ := json.Marshal(map[string]any{
			"model": model, "max_tokens": b.MaxTokens, "stream": !b.Plain,
			"messages": []map[string]string{{"role": "user", "content": content}},
		})
		id := "burst." + strconv.Itoa(i)
		sent := time.Since(start).Seconds()
		wg.Go(func() {
			o := burstRequest(ctx, hc, url, id, body)
			o.id, o.sentS = id, sent
			mu.Lock()
			out = append(out, o)
			mu.Unlock()
		})
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b burstOutcome) int { return cmpFloat(a.sentS, b.sentS) })
	return out
}

// fillerWords is about n tokens of the simulator's tokenizer: n
// four-letter words (one token each with its leading space), spelt from
// the word's number, so that no two blocks of a chat repeat.
func fillerWords(n int) string {
	b := make([]byte, 0, 5*n)
	for i := range n {
		if i > 0 {
			b = append(b, ' ')
		}
		for k, v := 0, i; k < 4; k, v = k+1, v/26 {
			b = append(b, byte('a'+v%26))
		}
	}
	return string(b)
}

// burstRequest sends one chat and reads its answer to the end.
func burstRequest(ctx context.Context, hc *http.Client, url, id string, body []byte) burstOutcome {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return burstOutcome{err: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	t0 := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return burstOutcome{err: err.Error()}
	}
	defer resp.Body.Close()
	o := burstOutcome{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), headersS: time.Since(t0).Seconds()}
	if resp.StatusCode == http.StatusOK && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			o.err = "reading the answer: " + err.Error()
		}
		o.ttftS = time.Since(t0).Seconds()
		return o
	}
	if resp.StatusCode != http.StatusOK {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			o.err = "reading the answer: " + err.Error()
		}
		o.shape = errorShape(b)
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if o.ttftS == 0 && strings.HasPrefix(line, "data: {") && firstText(line[len("data: "):]) {
			o.ttftS = time.Since(t0).Seconds()
		}
		done = done || line == "data: [DONE]"
	}
	switch {
	case sc.Err() != nil:
		o.err = "reading the stream: " + sc.Err().Error()
	case !done:
		o.err = "stream ended without [DONE]"
	}
	return o
}

// firstText reports whether a chat stream's chunk carries answer text:
// the first chunk, the role's, comes before any token.
func firstText(data string) bool {
	var c struct {
		Choices []struct {
			Delta struct {
				Content string `json:"content"`
			} `json:"delta"`
		} `json:"choices"`
	}
	return json.Unmarshal([]byte(data), &c) == nil && len(c.Choices) > 0 && c.Choices[0].Delta.Content != ""
}

// errorShape reports whether b is an API error body: OpenAI's
// {"error":{"message","type",...}} or Anthropic's
// {"type":"error","error":{"type","message"}}.
func errorShape(b []byte) bool {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &e) == nil && e.Error.Message != "" && e.Error.Type != ""
}

// refusal is one answer of 400 or more the workload's clients got (each
// attempt, retries included).
type refusal struct {
	status     int
	retryAfter string
	shape      bool
	headersS   float64
}

// refusalTap is the workload clients' transport: it notes every answer of
// 400 or more (its status, Retry-After, whether its body is the API's
// error, and how soon it came) and hands the body on unread.
type refusalTap struct {
	base http.RoundTripper
	mu   sync.Mutex
	seen []refusal
}

func (t *refusalTap) RoundTrip(req *http.Request) (*http.Response, error) {
	t0 := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil || resp.StatusCode < 400 {
		return resp, err
	}
	r := refusal{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), headersS: time.Since(t0).Seconds()}
	b, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	r.shape = errorShape(b)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if rerr != nil {
		resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), errReader{rerr}))
	}
	t.mu.Lock()
	t.seen = append(t.seen, r)
	t.mu.Unlock()
	return resp, nil
}

func (t *refusalTap) refusals() []refusal {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.seen)
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// OverloadResult is the burst's figures. Seconds are from the start of
// the load.
type OverloadResult struct {
	AtS          float64 `json:"at_s"`
	EndS         float64 `json:"end_s"`
	PromptTokens int     `json:"prompt_tokens"`
	// CapacityRPS is what the pods can prefill of the burst's chats
	// (burstCapacity), OfferedRPS what was sent, ServedRPS what was
	// served of it over the burst.
	CapacityRPS float64 `json:"capacity_rps"`
	OfferedRPS  float64 `json:"offered_rps"`
	ServedRPS   float64 `json:"served_rps"`
	// Outcomes is one row per traffic: the burst, the workload sent during
	// it, the workload at other times.
	Outcomes []OutcomeRow `json:"outcomes"`
	// WorkloadRefusals counts every refusal answer (429 or 503) the
	// workload's clients got, retries included, and WorkloadRefusalsBad
	// those of them without Retry-After or the API's error shape.
	WorkloadRefusals    int `json:"workload_refusals"`
	WorkloadRefusalsBad int `json:"workload_refusals_bad"`
	// RefusalSMax is the slowest refusal's time to its headers.
	RefusalSMax float64 `json:"refusal_s_max"`
	// Hops counts the requests (burst and workload, by X-Request-Id) by how
	// many peers a sidecar tried for them (the debug logs' "tried"); the
	// counters are the sidecars' own at the end.
	Hops           []HopCount `json:"hops"`
	SidecarRetries float64    `json:"sidecar_retries"`
	HopsRefused    float64    `json:"hops_refused"`
	QueueFull      float64    `json:"queue_full"`
	// PrefillBusy counts the refusals for the prefill share alone.
	PrefillBusy float64 `json:"prefill_busy"`
	// RSS is every sidecar process's largest RSS; MaxRSSMiB the bound.
	RSS       []PodRSS `json:"rss"`
	MaxRSSMiB float64  `json:"max_rss_mib"`
	// TTFTP90Before is the workload's TTFT p90 (wall, served requests)
	// over the preBurstWindow before the burst, and BeforeOver how many
	// of its seconds had a p90 over the recovery threshold. After is each
	// second's p90 from the burst's end; RecoveryS when it was back
	// (nil: not within the run), RecoverWithinS the bound.
	TTFTP90Before  float64       `json:"ttft_p90_before_s"`
	BeforeSeconds  int           `json:"before_seconds"`
	BeforeOver     int           `json:"before_over"`
	Threshold      float64       `json:"threshold_s"`
	DuringP90      float64       `json:"ttft_p90_during_s"`
	After          []SecondP90   `json:"after"`
	RecoveryS      *float64      `json:"recovery_s,omitempty"`
	RecoverWithinS float64       `json:"recover_within_s"`
	RecoveryRule   string        `json:"recovery_rule"`
	BurstTTFTP90   float64       `json:"burst_ttft_p90_s"`
	Verdict        []CheckResult `json:"verdict"`
	Pass           bool          `json:"pass"`
	FailuresListed []string      `json:"failures,omitempty"`
}

// OutcomeRow counts one traffic's requests by how they ended.
type OutcomeRow struct {
	Traffic  string `json:"traffic"`
	Requests int    `json:"requests"`
	Served   int    `json:"served"`
	// Refused429 and Refused503 ended refused retryably (Retry-After and
	// the API's error shape; for the workload, after the client's
	// retries); RefusedBad were refused without one of those.
	Refused429 int `json:"refused_429"`
	Refused503 int `json:"refused_503"`
	RefusedBad int `json:"refused_bad"`
	// Failed ended any other way: another status, a transport error, a
	// stream cut.
	Failed int `json:"failed"`
	// ClientRetried were sent more than once (the workload's SDK retries).
	ClientRetried int `json:"client_retried"`
}

// HopCount is how many requests had Peers peers tried ("3+" for more).
type HopCount struct {
	Peers    string `json:"peers"`
	Requests int    `json:"requests"`
}

// PodRSS is one sidecar process's largest RSS.
type PodRSS struct {
	Pod    string  `json:"pod"`
	PID    int     `json:"pid"`
	MaxMiB float64 `json:"max_mib"`
}

// SecondP90 is the TTFT p90 of one second of sends.
type SecondP90 struct {
	FromEndS int     `json:"from_end_s"`
	Requests int     `json:"requests"`
	P90      float64 `json:"p90_s"`
}

// CheckResult is one line of the verdict.
type CheckResult struct {
	Check string `json:"check"`
	Want  string `json:"want"`
	Got   string `json:"got"`
	Pass  bool   `json:"pass"`
}

// overloadInput is what summarizeOverload reads.
type overloadInput struct {
	burst     Burst
	pods      int
	offered   float64
	outcomes  []burstOutcome
	samples   []loadgen.Sample
	refusals  []refusal
	attempts  []Attempt
	resources []ResourceSeries
	counters  map[string]float64 // kvroute_forward_retries_total, hops refused, queue_full
}

// summarizeOverload computes the burst's figures and verdict.
func summarizeOverload(in overloadInput) *OverloadResult {
	b := in.burst.withDefaults()
	at, end := b.At.D().Seconds(), (b.At.D() + b.For.D()).Seconds()
	o := &OverloadResult{AtS: at, EndS: end, PromptTokens: b.PromptTokens,
		CapacityRPS: burstCapacity(in.pods, b.PromptTokens), OfferedRPS: in.offered,
		MaxRSSMiB: b.MaxRSSMiB, RecoverWithinS: b.RecoverWithin.D().Seconds(),
		SidecarRetries: in.counters["retries"], HopsRefused: in.counters["hops_refused"], QueueFull: in.counters["queue_full"], PrefillBusy: in.counters["prefill_busy"],
		RecoveryRule: fmt.Sprintf("the workload's TTFT p90 (wall clock, served requests, by send time) over the %v before the burst; "+
			"back when %d consecutive seconds of sends after the burst each have a p90 of at most %.2fx it (the recovery is the first of them)",
			preBurstWindow, recoverRun, recoverTolerance)}

	// The burst's own requests.
	row := OutcomeRow{Traffic: fmt.Sprintf("burst (%d-token chats, no client retries)", b.PromptTokens)}
	var burstTTFT []float64
	for _, x := range in.outcomes {
		row.Requests++
		switch {
		case x.err != "":
			row.Failed++
			o.listFailure(fmt.Sprintf("%s sent %.1f s: status %d: %s", x.id, x.sentS, x.status, x.err))
		case x.status == http.StatusOK:
			row.Served++
			burstTTFT = append(burstTTFT, x.ttftS)
		case x.status == http.StatusTooManyRequests || x.status == http.StatusServiceUnavailable:
			o.RefusalSMax = max(o.RefusalSMax, x.headersS)
			if x.retryAfter == "" || !x.shape {
				row.RefusedBad++
				o.listFailure(fmt.Sprintf("%s: a %d with Retry-After %q, error shape %v", x.id, x.status, x.retryAfter, x.shape))
			} else if x.status == http.StatusTooManyRequests {
				row.Refused429++
			} else {
				row.Refused503++
			}
		default:
			row.Failed++
			o.listFailure(fmt.Sprintf("%s sent %.1f s: status %d", x.id, x.sentS, x.status))
		}
	}
	o.Outcomes = append(o.Outcomes, row)
	if b.For > 0 {
		o.ServedRPS = float64(row.Served) / b.For.D().Seconds()
	}
	slices.Sort(burstTTFT)
	o.BurstTTFTP90 = loadgen.Percentile(burstTTFT, 90)

	// The workload: during the burst, and at other times.
	during := OutcomeRow{Traffic: "workload sent during the burst"}
	other := OutcomeRow{Traffic: "workload sent before or after it"}
	for _, s := range in.samples {
		t := s.Sent.Seconds()
		r := &other
		if t >= at && t < end {
			r = &during
		}
		r.Requests++
		if s.Attempts > 1 {
			r.ClientRetried++
		}
		switch {
		case s.OK():
			r.Served++
		case s.Status == http.StatusTooManyRequests:
			r.Refused429++
		case s.Status == http.StatusServiceUnavailable:
			r.Refused503++
		default:
			r.Failed++
			o.listFailure(fmt.Sprintf("%s sent %.1f s: status %d, %d text chunks in %.1f s: %s", loadgen.RequestID(s.Session, s.Turn), t, s.Status, s.Chunks, s.WallE2E.Seconds(), s.Err))
		}
	}
	o.Outcomes = append(o.Outcomes, during, other)
	for _, r := range in.refusals {
		if r.status != http.StatusTooManyRequests && r.status != http.StatusServiceUnavailable {
			continue // counted by the row of its request
		}
		o.WorkloadRefusals++
		o.RefusalSMax = max(o.RefusalSMax, r.headersS)
		if r.retryAfter == "" || !r.shape {
			o.WorkloadRefusalsBad++
		}
	}

	// Hops: peers tried per request.
	peers := map[string]int{}
	for _, a := range in.attempts {
		peers[a.Req]++
	}
	ids := make([]string, 0, len(in.outcomes)+len(in.samples))
	for _, x := range in.outcomes {
		ids = append(ids, x.id)
	}
	for _, s := range in.samples {
		ids = append(ids, loadgen.RequestID(s.Session, s.Turn))
	}
	hops := make([]int, 4)
	for _, id := range ids {
		hops[min(peers[id], 3)]++
	}
	for k, n := range hops {
		label := strconv.Itoa(k)
		if k == 3 {
			label = "3+"
		}
		o.Hops = append(o.Hops, HopCount{Peers: label, Requests: n})
	}

	// RSS per sidecar process.
	var rssMax float64
	for _, s := range in.resources {
		var m int64
		for _, x := range s.Samples {
			m = max(m, x.RSSBytes)
		}
		mib := float64(m) / (1 << 20)
		rssMax = max(rssMax, mib)
		o.RSS = append(o.RSS, PodRSS{Pod: s.Pod, PID: s.PID, MaxMiB: mib})
	}

	// TTFT: before, during, and each second after.
	var before, duringT []float64
	perSec := map[int][]float64{}
	beforeSec := map[int][]float64{}
	for _, s := range in.samples {
		if !s.OK() {
			continue
		}
		t, ttft := s.Sent.Seconds(), s.WallTTFT.Seconds()
		switch {
		case t >= at-preBurstWindow.Seconds() && t < at:
			before = append(before, ttft)
			beforeSec[int(t)] = append(beforeSec[int(t)], ttft)
		case t >= at && t < end:
			duringT = append(duringT, ttft)
		case t >= end:
			k := int(t - end)
			perSec[k] = append(perSec[k], ttft)
		}
	}
	slices.Sort(before)
	slices.Sort(duringT)
	o.TTFTP90Before = loadgen.Percentile(before, 90)
	o.DuringP90 = loadgen.Percentile(duringT, 90)
	o.Threshold = recoverTolerance * o.TTFTP90Before
	for _, v := range beforeSec {
		slices.Sort(v)
		o.BeforeSeconds++
		if loadgen.Percentile(v, 90) > o.Threshold {
			o.BeforeOver++
		}
	}
	last := -1
	for k := range perSec {
		last = max(last, k)
	}
	runStart, run := 0, 0 // the current run of seconds back under the threshold
	for k := 0; k <= last; k++ {
		v := perSec[k]
		slices.Sort(v)
		sp := SecondP90{FromEndS: k, Requests: len(v), P90: loadgen.Percentile(v, 90)}
		o.After = append(o.After, sp)
		switch {
		case len(v) == 0: // no evidence either way: the run goes on
		case sp.P90 > o.Threshold:
			run = 0
		default:
			if run == 0 {
				runStart = k
			}
			run++
		}
		if run == recoverRun && o.RecoveryS == nil && len(before) > 0 {
			rec := float64(runStart)
			o.RecoveryS = &rec
		}
	}

	// The verdict.
	check := func(name, want, got string, pass bool) {
		o.Verdict = append(o.Verdict, CheckResult{Check: name, Want: want, Got: got, Pass: pass})
	}
	failed, bad := 0, o.WorkloadRefusalsBad
	for _, r := range o.Outcomes {
		failed += r.Failed
		bad += r.RefusedBad
	}
	burstRow := o.Outcomes[0]
	check("the burst overloaded the pods", "some burst chats served and some refused",
		fmt.Sprintf("%d served, %d refused", burstRow.Served, burstRow.Refused429+burstRow.Refused503+burstRow.RefusedBad),
		burstRow.Served > 0 && burstRow.Refused429+burstRow.Refused503 > 0)
	check("sidecar RSS", fmt.Sprintf("every sidecar at most %.0f MiB", b.MaxRSSMiB), fmt.Sprintf("max %.1f MiB", rssMax),
		len(o.RSS) > 0 && rssMax <= b.MaxRSSMiB)
	check("every request served or refused retryably", "0 failed otherwise, 0 refusals without Retry-After or the error shape",
		fmt.Sprintf("%d failed otherwise, %d bad refusals", failed, bad), failed == 0 && bad == 0)
	check("refused early", "every refusal's headers within 1 s", fmt.Sprintf("slowest %.3f s", o.RefusalSMax), o.RefusalSMax < 1)
	check("no retry storm, no hop ping-pong", "0 sidecar retries, 0 refused hops, no request tried on more than one peer",
		fmt.Sprintf("%.0f retries, %.0f refused hops, %d requests on 2+ peers", o.SidecarRetries, o.HopsRefused, hops[2]+hops[3]),
		o.SidecarRetries == 0 && o.HopsRefused == 0 && hops[2]+hops[3] == 0)
	rec := "not recovered"
	if o.RecoveryS != nil {
		rec = fmt.Sprintf("%.0f s", *o.RecoveryS)
	}
	check("TTFT back to its pre-burst p90", fmt.Sprintf("within %.0f s of the burst's end", o.RecoverWithinS),
		fmt.Sprintf("%s (pre-burst p90 %.3f s)", rec, o.TTFTP90Before), o.RecoveryS != nil && *o.RecoveryS <= o.RecoverWithinS)
	o.Pass = true
	for _, c := range o.Verdict {
		o.Pass = o.Pass && c.Pass
	}
	return o
}

func (o *OverloadResult) listFailure(s string) {
	if len(o.FailuresListed) < maxListed {
		o.FailuresListed = append(o.FailuresListed, s)
	}
}

// markdown is the burst's section of the report.
func (o *OverloadResult) markdown() string {
	if o == nil {
		return ""
	}
	var b strings.Builder
	verdict := "**pass**"
	if !o.Pass {
		verdict = "**FAIL**"
	}
	fmt.Fprintf(&b, "\nBurst from %.0f s to %.0f s: %d-token chats at %.1f req/s, %.1fx the %.2f req/s the pods can prefill of them; %.2f req/s of it served. Verdict: %s\n",
		o.AtS, o.EndS, o.PromptTokens, o.OfferedRPS, o.OfferedRPS/math.Max(o.CapacityRPS, 1e-9), o.CapacityRPS, o.ServedRPS, verdict)
	b.WriteString("\n| check | want | got | pass |\n|---|---|---|---|\n")
	for _, c := range o.Verdict {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", c.Check, c.Want, c.Got, map[bool]string{true: "yes", false: "**no**"}[c.Pass])
	}
	b.WriteString("\n| traffic | requests | served | refused 429 | refused 503 | refused without Retry-After or error shape | failed otherwise | retried by the client |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range o.Outcomes {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d |\n", r.Traffic, r.Requests, r.Served, r.Refused429, r.Refused503, r.RefusedBad, r.Failed, r.ClientRetried)
	}
	fmt.Fprintf(&b, "\nrefusals the workload's clients got (every attempt): %d, %d of them without Retry-After or the error shape; slowest refusal %.3f s; "+
		"sidecars counted %.0f queue_full and %.0f prefill_busy refusals, %.0f retries, %.0f refused hops\n",
		o.WorkloadRefusals, o.WorkloadRefusalsBad, o.RefusalSMax, o.QueueFull, o.PrefillBusy, o.SidecarRetries, o.HopsRefused)
	b.WriteString("\n| peers tried for a request | requests |\n|--:|--:|\n")
	for _, h := range o.Hops {
		fmt.Fprintf(&b, "| %s | %d |\n", h.Peers, h.Requests)
	}
	b.WriteString("\n| sidecar | pid | RSS max (MiB) |\n|---|--:|--:|\n")
	for _, r := range o.RSS {
		fmt.Fprintf(&b, "| %s | %d | %.1f |\n", r.Pod, r.PID, r.MaxMiB)
	}
	rec := "not recovered within the run"
	if o.RecoveryS != nil {
		rec = fmt.Sprintf("%.0f s after the burst", *o.RecoveryS)
	}
	fmt.Fprintf(&b, "\nTTFT (workload): pre-burst p90 %.3f s (%d of its %d seconds over the threshold %.3f s), during the burst p90 %.3f s, the burst's own served chats p90 %.3f s; back %s. Rule: %s.\n",
		o.TTFTP90Before, o.BeforeOver, o.BeforeSeconds, o.Threshold, o.DuringP90, o.BurstTTFTP90, rec, o.RecoveryRule)
	b.WriteString("\n| s after the burst | requests | TTFT p90 (s) |\n|--:|--:|--:|\n")
	for _, s := range o.After {
		if s.FromEndS > int(o.RecoverWithinS)+10 {
			break
		}
		fmt.Fprintf(&b, "| %d | %d | %.3f |\n", s.FromEndS, s.Requests, s.P90)
	}
	for i, f := range o.FailuresListed {
		if i == 10 {
			fmt.Fprintf(&b, "\n(and %d more in result.json)\n", len(o.FailuresListed)-10)
			break
		}
		fmt.Fprintf(&b, "\nfailure: %s\n", f)
	}
	return b.String()
}
