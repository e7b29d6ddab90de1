package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// Result is a chaos run's figures; the JSON is the report's published
// shape. Times are seconds from the start of the load.
//
// Every failed request falls in exactly one class:
//   - failed_service: the Service's connection never reached a live pod (it
//     dialled an endpoint whose pod was gone before the readiness probe
//     noticed, no endpoint was ready, or a keep-alive connection was pinned
//     to a pod that was already dead when the request was sent). Kubernetes
//     behaves the same; only client retries absorb these.
//   - failed_midstream: a response had begun (status 200) and was cut
//     because a pod it passed through (its entry sidecar or the serving
//     pod) died while it was in flight.
//   - failed_inflight: no response yet, and its entry pod (the sidecar
//     holding the client's connection) died while it was in flight. (A
//     serving pod that dies before answering is the sender sidecar's to
//     retry elsewhere: that failure is servable.)
//   - unservable_store_lost: a follow-up of a stored response
//     (previous_response_id, or the prober's GET /v1/responses/{id}) whose
//     response went with the engine that stored it (kill-engine, kill-pod,
//     replace-pod, a rolling restart of its pod after it was made), answered
//     with the mesh's 404 that says the pod holding it is gone. vLLM keeps
//     stored responses in the engine's memory: nobody can serve these.
//     unservable_store_lost_unclear: the same, answered otherwise (a 503,
//     the restarted engine's own 404): unservable, but the client was not
//     told why.
//   - failed_servable: every other failure: a live pod could have served
//     it, and the mesh did not. The target is 0. A follow-up whose
//     stored response's engine lives (its sidecar killed or restarting, its
//     pod partitioned, its engine hung) is servable: the 503 with
//     Retry-After the mesh answers while that pod is unreachable is a
//     failure when the client's retries (ClientRetry) did not get through.
type Result struct {
	Scenario    string  `json:"scenario"`
	Mode        string  `json:"mode"`
	Pods        int     `json:"pods"`
	DurationS   float64 `json:"duration_s"`
	Rate        float64 `json:"rate"`
	Workload    string  `json:"workload"`
	ClientRetry bool    `json:"client_retry"`
	Commit      string  `json:"commit,omitempty"`

	Requests        int `json:"requests"`
	OK              int `json:"ok"`
	FailedServable  int `json:"failed_servable"`
	FailedMidstream int `json:"failed_midstream"`
	// FailedMidstreamEntry is the part of FailedMidstream whose serving
	// pod lived: the sidecar holding the client's connection died.
	FailedMidstreamEntry int `json:"failed_midstream_entry"`
	FailedInflight       int `json:"failed_inflight"`
	FailedService        int `json:"failed_service"`
	// ServableLost is FailedServable plus the prober's stored-response
	// reads that failed servable: what a run must keep at 0.
	ServableLost int `json:"servable_lost"`
	// StoreLost and StoreLostUnclear count the unservable follow-ups (the
	// prober's reads included) by their answer: the mesh's clear 404, or
	// another.
	StoreLost        int `json:"unservable_store_lost"`
	StoreLostUnclear int `json:"unservable_store_lost_unclear"`
	// FollowUps counts the requests about a stored response (continued
	// POSTs and the prober's GETs), FollowUpsServed those answered;
	// FollowUpsUnderFault those sent while a pod fault held the pod
	// storing their response, and FollowUpsServedUnderFault those of them
	// answered. FollowUpsUnknown named a response the harness never saw
	// made (classified as any request); StoreLostServed were answered
	// although their response's engine had ended before they were sent,
	// which cannot be (the harness's account would be wrong): both 0.
	FollowUps                 int `json:"follow_ups"`
	FollowUpsServed           int `json:"follow_ups_served"`
	FollowUpsUnderFault       int `json:"follow_ups_under_fault"`
	FollowUpsServedUnderFault int `json:"follow_ups_served_under_fault"`
	FollowUpsUnknown          int `json:"follow_ups_unknown"`
	StoreLostServed           int `json:"store_lost_served"`
	// APIs is one row per API (the prober's reads and continued requests
	// on rows of their own); RetryRule says how retryable answers count.
	APIs      []APIRow `json:"apis,omitempty"`
	RetryRule string   `json:"retry_rule"`
	// Retried counts requests a sidecar retried on another pod after the
	// first target failed before its first byte; ClientRetried those the
	// client sent more than once.
	Retried       int `json:"retried"`
	ClientRetried int `json:"client_retried"`

	// DetectionSMax is the longest time from a pod fault to the first poll
	// at which no other sidecar would choose the pod; Undetected counts pod
	// faults undone (or the run over) before that happened.
	DetectionSMax        float64 `json:"detection_s_max"`
	Undetected           int     `json:"undetected"`
	ServiceDetectionSMax float64 `json:"service_detection_s_max"`
	// ForwardsToDeadAfterDetection counts forward attempts to a broken pod
	// by any other sidecar for requests sent after detection and before
	// the pod was back, as the sidecars' debug logs list them ("tried",
	// joined to the requests by X-Request-Id).
	ForwardsToDeadAfterDetection int `json:"forwards_to_dead_after_detection"`
	// HitRateSteady is the token-weighted hit rate from half the time to
	// the first fault up to the first fault; HitRate is the whole run's.
	HitRateSteady float64 `json:"hit_rate_steady"`
	HitRate       float64 `json:"hit_rate"`
	// HitRateWindows are the hit rates of hitWindow-second windows from
	// the first fault to the end of the load, and HitRateLowRatio the
	// lowest of them over HitRateSteady (upgrade.go).
	HitRateWindows  []WindowHit `json:"hit_rate_windows,omitempty"`
	HitRateLowRatio float64     `json:"hit_rate_low_ratio"`
	// RecoverySMax is the longest time from a fault's undo (a replacement
	// ready, an engine back) until the hit rate of the next 10 s is back to
	// 90% of the 20 s before the fault; NotRecovered counts undos after
	// which it never was.
	RecoverySMax float64 `json:"recovery_s_max"`
	NotRecovered int     `json:"not_recovered"`
	// StaleEpochClaims counts requests routed by affinity to a pod whose
	// engine restarted before they were sent, that found less than one
	// routing key (64 tokens) cached there, and whose conversation's earlier
	// turns were served by that pod's old engine only: affinity to blocks
	// the current engine never computed. AffinityMisses counts every
	// affinity choice that found less than a key, whatever the cause (Bloom
	// false positives, claims of requests still in flight, evictions).
	StaleEpochClaims int     `json:"stale_epoch_claims"`
	AffinityMisses   int     `json:"affinity_misses"`
	TTFTP99          float64 `json:"ttft_p99_s"`

	// KVBatchesDropped and KVReplays are the simulators' counts at the end
	// (vllm_sim_kv_batches_dropped_total, vllm_sim_kv_replay_requests_total):
	// what drop-events dropped and how often the sidecars asked for replay.
	// KVEventGaps is kvroute_kv_event_gaps_total over the sidecars: holes
	// replay could not fill.
	KVBatchesDropped float64 `json:"kv_batches_dropped"`
	KVReplays        float64 `json:"kv_replays"`
	KVEventGaps      float64 `json:"kv_event_gaps"`

	// GuardDrops is the egress guard's count in netns mode (must be 0);
	// -1 in loopback mode.
	GuardDrops   int64 `json:"guard_drops"`
	GuardChecked bool  `json:"guard_checked"`

	Faults []FaultResult `json:"faults"`
	// Failures and StaleClaims are the first maxListed of each, with what
	// the harness knew about them, for reading the logs.
	Failures    []RequestRecord `json:"failures,omitempty"`
	StaleClaims []RequestRecord `json:"stale_claims,omitempty"`
	// ForwardsAfterDetection are the attempts ForwardsToDeadAfterDetection
	// counts.
	ForwardsAfterDetection []ForwardRecord `json:"forwards_after_detection,omitempty"`
	Notes                  []string        `json:"notes,omitempty"`
	// Resources is every sidecar process's memory, goroutines and open
	// descriptors through the run (Sampler), ResourcePeak their peaks,
	// and Flat each series judged (CheckFlat) by FlatRule.
	Resources    []ResourceSeries `json:"resources,omitempty"`
	ResourcePeak ResourcePeak     `json:"resource_peak"`
	Flat         []FlatCheck      `json:"flat,omitempty"`
	FlatRule     string           `json:"flat_rule,omitempty"`
	// Overload is the burst's figures and verdict (scenarios with a
	// burst only).
	Overload *OverloadResult `json:"overload,omitempty"`
	// Timeline is one entry per second of send time.
	Timeline []Second `json:"timeline"`
}

// FaultResult is a FaultRecord with its measured effects.
type FaultResult struct {
	FaultRecord
	DetectionS        *float64 `json:"detection_s,omitempty"`
	ServiceDetectionS *float64 `json:"service_detection_s,omitempty"`
	RecoveryS         *float64 `json:"recovery_s,omitempty"`
	// HitRateBefore is the hit rate of the baselineWindow before the
	// fault, the level recovery is measured against.
	HitRateBefore float64 `json:"hit_rate_before,omitempty"`
	// ServedEnteringDuring counts requests that entered through the pod
	// while the fault held and succeeded (a partitioned pod keeps serving
	// what reaches it); ForwardedToAfter those other sidecars sent it
	// after it was back and that it served (it is routed to again).
	ServedEnteringDuring int `json:"served_entering_during"`
	ForwardedToAfter     int `json:"forwarded_to_after"`
	// FollowUps are the requests about responses this pod stored, sent
	// while the fault held.
	FollowUps FollowUpCounts `json:"follow_ups"`
}

// baselineWindow is how much traffic before a fault sets its recovery
// target: the cluster's own hit rate drifts as conversations accumulate,
// so the target is local, not the run's first steady state.
const baselineWindow = 20

// RequestRecord is one request of interest.
type RequestRecord struct {
	Class    string  `json:"class"`
	SentS    float64 `json:"sent_s"`
	EndS     float64 `json:"end_s"`
	Session  string  `json:"session"`
	Turn     int     `json:"turn"`
	Entry    string  `json:"entry,omitempty"` // the pod the Service spliced its connection to
	Pod      string  `json:"pod,omitempty"`   // X-Kvroute-Served-By
	Decision string  `json:"decision,omitempty"`
	Status   int     `json:"status,omitempty"`
	Stream   bool    `json:"stream"`
	Cached   int     `json:"cached_tokens"`
	Err      string  `json:"error,omitempty"`
	// API is the request's row in Result.APIs. A follow-up names its
	// stored response (Response), the pod that made it (Owner) and when
	// its answer ended (MadeS), and, when that pod's engine ended after,
	// the fault (Cause).
	API      string  `json:"api,omitempty"`
	Response string  `json:"response,omitempty"`
	Owner    string  `json:"owner,omitempty"`
	MadeS    float64 `json:"made_s,omitempty"`
	Cause    string  `json:"cause,omitempty"`
}

// ForwardRecord is one forward attempt to a broken pod after detection.
type ForwardRecord struct {
	SentS  float64 `json:"sent_s"` // when the client sent the request
	Req    string  `json:"req"`
	Node   string  `json:"node"`
	Target string  `json:"target"`
	Fault  string  `json:"fault"`
}

// maxListed bounds Result.Failures and Result.StaleClaims.
const maxListed = 100

// Second is one second of the timeline, by send time.
type Second struct {
	T        int     `json:"t"`
	Requests int     `json:"requests"`
	OK       int     `json:"ok"`
	HitRate  float64 `json:"hit_rate"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	prompt   int
	cached   int
}

// routingKeyTokens is the sidecar's default routing granularity (4 blocks
// of 16 tokens): less than this cached means no routed key was there.
const routingKeyTokens = 64

// interval is when a pod was down; end is +Inf while it never came back.
// sidecar: the fault took the pod's sidecar away (a client connection
// into the pod had nobody to answer it); without it only the engine went,
// and the sidecar could still route elsewhere.
type interval struct {
	pod        string
	start, end float64
	sidecar    bool
}

// takesSidecar reports whether a fault stops the pod's sidecar.
func takesSidecar(fault string) bool { return fault != FaultKillEngine }

func summarize(r *runState, samples []loadgen.Sample, conns []ConnRecord, trans []Transition, attempts []Attempt, end float64) *Result {
	cfg := r.cfg
	res := &Result{
		Scenario: cfg.Scenario.Name, Mode: map[bool]string{true: "netns", false: "loopback"}[cfg.Netns],
		Pods: cfg.Pods, DurationS: cfg.Duration.Seconds(), Rate: cfg.Rate, Workload: cfg.Workload,
		ClientRetry: cfg.ClientRetry, Requests: len(samples),
	}
	r.mu.Lock()
	faults := make([]FaultRecord, len(r.faults))
	for k, f := range r.faults {
		faults[k] = *f
	}
	polls := slices.Clone(r.polls)
	r.mu.Unlock()
	slices.SortStableFunc(faults, func(a, b FaultRecord) int { return cmpFloat(a.AtS, b.AtS) })

	var down []interval
	for _, f := range faults {
		if !f.down {
			continue
		}
		e := math.Inf(1)
		if f.UndoneS > 0 && f.NewPod == "" {
			e = f.UndoneS // back under the same name
		}
		down = append(down, interval{f.Pod, f.AtS, e, takesSidecar(f.Fault)})
	}
	byClient := map[string][]ConnRecord{}
	for _, c := range conns {
		byClient[c.Client] = append(byClient[c.Client], c)
	}
	entryOf := func(s loadgen.Sample) (ConnRecord, bool) {
		endAbs := r.start.Add(s.Sent + s.WallE2E + 20*time.Millisecond)
		var best ConnRecord
		found := false
		for _, c := range byClient[s.LocalAddr] {
			if !c.At.After(endAbs) {
				best, found = c, true
			}
		}
		return best, found
	}
	// The entry pod counts as down only without its sidecar (which holds
	// the client's connection); a serving pod also when its engine went.
	downAt := func(pod string, t float64) bool {
		return slices.ContainsFunc(down, func(iv interval) bool {
			return iv.sidecar && iv.pod == pod && iv.start <= t && t < iv.end
		})
	}
	diedDuring := func(pod string, from, to float64, sidecarOnly bool) bool {
		return pod != "" && slices.ContainsFunc(down, func(iv interval) bool {
			return (iv.sidecar || !sidecarOnly) && iv.pod == pod && iv.start >= from && iv.start <= to
		})
	}

	// Engine restarts: a pod's engine is new from this time on.
	restarts := map[string][]float64{}
	for _, f := range faults {
		if (f.Fault == FaultKillEngine || f.Fault == FaultKillPod) && f.UndoneS > 0 {
			restarts[f.Pod] = append(restarts[f.Pod], f.UndoneS)
		}
	}

	byID := map[string]loadgen.Sample{}
	for _, s := range samples {
		byID[loadgen.RequestID(s.Session, s.Turn)] = s
	}
	turns := map[string][]loadgen.Sample{}
	for _, s := range samples {
		if s.OK() {
			turns[s.Session] = append(turns[s.Session], s)
		}
	}

	fu := newFollowUps(r.stored, faults)
	// classify is a failed request's class (see Result) and its entry pod.
	classify := func(s loadgen.Sample) (string, string) {
		sent := s.Sent.Seconds()
		fin := (s.Sent + s.WallE2E).Seconds()
		rec, ok := entryOf(s)
		switch {
		case !ok || rec.DialErr || downAt(rec.Name, sent):
			return "failed_service", rec.Name
		case diedDuring(rec.Name, sent, fin, true) || (s.Status == 200 && diedDuring(s.Pod, sent, fin, false)):
			// The client's own connection died with its entry pod, or the
			// answer had begun on a pod that died. A serving pod that died
			// before answering leaves the request to its sender sidecar,
			// which may retry it elsewhere: if it did not, it is servable.
			switch {
			case s.Status != 200:
				return "failed_inflight", rec.Name
			case !diedDuring(s.Pod, sent, fin, false):
				return "failed_midstream_entry", rec.Name
			}
			return "failed_midstream", rec.Name
		}
		// A follow-up whose stored response went with its engine: nobody
		// can serve it (it ought to be the mesh's 404 saying so).
		if lost, _ := fu.lost(s); lost {
			if goneAnswer(s) {
				return ClassStoreLost, rec.Name
			}
			return ClassStoreLostUnclear, rec.Name
		}
		return "failed_servable", rec.Name
	}

	secs := make([]Second, int(math.Ceil(end))+1)
	ttfts := make([][]float64, len(secs))
	var all []float64
	var prompt, cached int
	for _, s := range samples {
		sent := s.Sent.Seconds()
		k := min(int(sent), len(secs)-1)
		secs[k].Requests++
		if s.Attempts > 1 {
			res.ClientRetried++
		}
		if strings.HasSuffix(s.Decision, "-retried") {
			res.Retried++
		}
		if s.OK() {
			res.OK++
			secs[k].OK++
			secs[k].prompt += s.PromptTokens
			secs[k].cached += s.CachedTokens
			prompt += s.PromptTokens
			cached += s.CachedTokens
			ttfts[k] = append(ttfts[k], s.TTFT)
			all = append(all, s.TTFT)
			// A retried request was served by a fallback, not its affinity choice.
			if s.Decision == "affinity" && s.CachedTokens < routingKeyTokens {
				res.AffinityMisses++
				if staleClaim(s, restarts[s.Pod], turns[s.Session]) && !onClaim(attempts, s) {
					res.StaleEpochClaims++
					if len(res.StaleClaims) < maxListed {
						rec, _ := entryOf(s)
						res.StaleClaims = append(res.StaleClaims, record("stale_epoch_claim", s, rec.Name))
					}
				}
			}
			continue
		}
		class, entry := classify(s)
		switch class {
		case "failed_service":
			res.FailedService++
		case "failed_midstream", "failed_midstream_entry":
			res.FailedMidstream++
			if class == "failed_midstream_entry" {
				res.FailedMidstreamEntry++
			}
		case "failed_inflight":
			res.FailedInflight++
		case ClassStoreLost, ClassStoreLostUnclear:
			// Counted by the follow-ups' figures below.
		default:
			res.FailedServable++
		}
		if len(res.Failures) < maxListed {
			res.Failures = append(res.Failures, fu.record(class, s, entry))
		}
	}

	for k := range secs {
		secs[k].T = k
		if secs[k].prompt > 0 {
			secs[k].HitRate = float64(secs[k].cached) / float64(secs[k].prompt)
		}
		slices.Sort(ttfts[k])
		secs[k].TTFTP99 = loadgen.Percentile(ttfts[k], 99)
	}
	res.Timeline = secs
	if prompt > 0 {
		res.HitRate = float64(cached) / float64(prompt)
	}
	slices.Sort(all)
	res.TTFTP99 = loadgen.Percentile(all, 99)

	first := cfg.Duration.Seconds()
	if len(faults) > 0 {
		first = faults[0].AtS
	}
	res.HitRateSteady = windowHit(secs, first/2, first)
	res.HitRateWindows, res.HitRateLowRatio = hitWindows(secs, first, cfg.Duration.Seconds(), hitWindow, res.HitRateSteady)

	for _, f := range faults {
		fr := FaultResult{FaultRecord: f}
		if podFault(f.Fault) || f.Fault == FaultRollingRestart {
			until := end
			if f.UndoneS > 0 && f.NewPod == "" {
				until = f.UndoneS
			}
			if d, ok := detect(polls, f.Pod, f.AtS, until); ok {
				fr.DetectionS = &d
				res.DetectionSMax = max(res.DetectionSMax, d)
				for _, a := range attempts {
					// The routing decision is made as the request
					// arrives: its send time places the attempt.
					s, ok := byID[a.Req]
					if !ok || a.Target != f.Pod || a.Node == f.Pod {
						continue
					}
					if t := s.Sent.Seconds(); t < f.AtS+d || t >= until {
						continue
					}
					res.ForwardsToDeadAfterDetection++
					if len(res.ForwardsAfterDetection) < maxListed {
						res.ForwardsAfterDetection = append(res.ForwardsAfterDetection, ForwardRecord{
							SentS: s.Sent.Seconds(), Req: a.Req, Node: a.Node, Target: a.Target, Fault: f.Fault})
					}
				}
			} else if f.Err == "" {
				res.Undetected++
			}
			for _, t := range trans {
				at := t.At.Sub(r.start).Seconds()
				if t.Name == f.Pod && !t.Ready && at >= f.AtS-0.01 {
					d := max(0, at-f.AtS)
					fr.ServiceDetectionS = &d
					res.ServiceDetectionSMax = max(res.ServiceDetectionSMax, d)
					break
				}
			}
		}
		for _, s := range samples {
			if !s.OK() {
				continue
			}
			sent := s.Sent.Seconds()
			rec, _ := entryOf(s)
			switch {
			case rec.Name == f.Pod && sent >= f.AtS && (f.UndoneS == 0 || sent < f.UndoneS):
				fr.ServedEnteringDuring++
			case f.UndoneS > 0 && s.Pod == f.Pod && rec.Name != f.Pod && sent >= f.UndoneS:
				fr.ForwardedToAfter++
			}
		}
		base := windowHit(secs, f.AtS-baselineWindow, f.AtS)
		if f.UndoneS > 0 && base > 0 && f.Fault != FaultRollingRestart {
			fr.HitRateBefore = base
			if d, ok := recovery(secs, f.UndoneS, 0.9*base, end); ok {
				fr.RecoveryS = &d
				res.RecoverySMax = max(res.RecoverySMax, d)
			} else {
				res.NotRecovered++
			}
		}
		res.Faults = append(res.Faults, fr)
	}
	fu.summarize(res, samples, r.gets, classify, end)
	res.RetryRule = retryRule(cfg.ClientRetry)
	return res
}

// staleClaim reports whether s, an affinity choice that found nothing
// cached on its pod, was affinity to an engine's old cache: the pod's
// engine restarted (at one of restarts) before s was sent, and the
// session's earlier turns were served there before that restart and never
// after it: their blocks were computed by the old engine. A request with
// no such history (a first turn matching a shared system prompt) is not
// counted: nothing tells its routed blocks' origin apart from a claim or a
// Bloom false positive, and AffinityMisses counts it.
func staleClaim(s loadgen.Sample, restarts []float64, session []loadgen.Sample) bool {
	sent := s.Sent.Seconds()
	last := math.Inf(-1)
	for _, t := range restarts {
		if t <= sent {
			last = math.Max(last, t)
		}
	}
	if math.IsInf(last, -1) {
		return false
	}
	before, after, earlier := false, false, false
	for _, o := range session {
		if o.Turn >= s.Turn || o.Pod != s.Pod {
			earlier = earlier || o.Turn < s.Turn
			continue
		}
		earlier = true
		if o.Sent.Seconds() < last {
			before = true
		} else {
			after = true
		}
	}
	return earlier && before && !after
}

// onClaim reports whether a sidecar sent s to the pod that served it on a
// claim (its routed line's match_note). Claims are voided when a pod's
// engine restarts (gossip's table), so such a choice followed a request
// placed on the current engine, still in flight there (another session's
// shared system prompt): an affinity miss, not affinity to the old cache.
func onClaim(attempts []Attempt, s loadgen.Sample) bool {
	id := loadgen.RequestID(s.Session, s.Turn)
	return slices.ContainsFunc(attempts, func(a Attempt) bool {
		return a.Req == id && a.Target == s.Pod && strings.Contains(a.Note, "claim")
	})
}

func record(class string, s loadgen.Sample, entry string) RequestRecord {
	return RequestRecord{Class: class, SentS: s.Sent.Seconds(), EndS: (s.Sent + s.WallE2E).Seconds(),
		Session: s.Session, Turn: s.Turn, Entry: entry, Pod: s.Pod, Decision: s.Decision, Status: s.Status,
		Stream: s.Streamed, Cached: s.CachedTokens, Err: s.Err}
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// windowHit is the token-weighted hit rate of the seconds in [from, to).
func windowHit(secs []Second, from, to float64) float64 {
	var p, c int
	for _, s := range secs {
		if float64(s.T) >= from && float64(s.T) < to {
			p += s.prompt
			c += s.cached
		}
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

// recoveryWindow is how many seconds of traffic a recovered hit rate
// spans (about 150 requests at 15 req/s: a per-second rate is noise).
const recoveryWindow = 10

// recovery is the time from t until the hit rate of the following
// recoveryWindow seconds first reaches target.
func recovery(secs []Second, t, target, end float64) (float64, bool) {
	for s := math.Ceil(t); s+recoveryWindow <= end; s++ {
		if windowHit(secs, s, s+recoveryWindow) >= target {
			return s - t, true
		}
	}
	return 0, false
}

// detect finds the first poll round at or after from (and before until) in
// which sidecars other than pod answered and none would choose pod.
func detect(polls []Poll, pod string, from, until float64) (float64, bool) {
	rounds := map[float64][]Poll{}
	var ats []float64
	for _, p := range polls {
		if p.AtS < from || p.AtS > until || p.Observer == pod {
			continue
		}
		if _, ok := rounds[p.AtS]; !ok {
			ats = append(ats, p.AtS)
		}
		rounds[p.AtS] = append(rounds[p.AtS], p)
	}
	slices.Sort(ats)
	for _, at := range ats {
		if !slices.ContainsFunc(rounds[at], func(p Poll) bool { return slices.Contains(p.Choosable, pod) }) {
			return at - from, true
		}
	}
	return 0, false
}

// WriteJSON writes r indented.
func (r *Result) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// Markdown renders the figures and the faults as tables.
func (r *Result) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s: %d pods, %s mode, %.0f s at %.1f req/s of %s, client retries %v",
		r.Scenario, r.Pods, r.Mode, r.DurationS, r.Rate, r.Workload, r.ClientRetry)
	if r.Commit != "" {
		fmt.Fprintf(&b, ", commit %s", r.Commit)
	}
	b.WriteString("\n\n| requests | ok | failed servable | failed midstream (entry only) | failed in flight | failed at the Service | retried by a sidecar | retried by the client | detection max (s) | undetected | Service detection max (s) | forwards to dead after detection | hit rate steady | hit rate | recovery max (s) | not recovered | stale epoch claims | affinity misses | TTFT p99 (s) | egress guard drops |\n")
	b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	guard := "n/a"
	if r.GuardChecked {
		guard = fmt.Sprint(r.GuardDrops)
	}
	fmt.Fprintf(&b, "| %d | %d | %d | %d (%d) | %d | %d | %d | %d | %.2f | %d | %.2f | %d | %.1f%% | %.1f%% | %.0f | %d | %d | %d | %.3f | %s |\n",
		r.Requests, r.OK, r.FailedServable, r.FailedMidstream, r.FailedMidstreamEntry, r.FailedInflight, r.FailedService, r.Retried, r.ClientRetried,
		r.DetectionSMax, r.Undetected, r.ServiceDetectionSMax, r.ForwardsToDeadAfterDetection,
		100*r.HitRateSteady, 100*r.HitRate, r.RecoverySMax, r.NotRecovered, r.StaleEpochClaims, r.AffinityMisses, r.TTFTP99, guard)
	if len(r.Faults) > 0 {
		b.WriteString("\n| at (s) | fault | pod | undone (s) | new pod | detection (s) | Service detection (s) | recovery (s) | served entering during | forwarded to after | error |\n")
		b.WriteString("|--:|---|---|--:|---|--:|--:|--:|--:|--:|---|\n")
		opt := func(p *float64) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprintf("%.2f", *p)
		}
		for _, f := range r.Faults {
			undone := "-"
			if f.UndoneS > 0 {
				undone = fmt.Sprintf("%.1f", f.UndoneS)
			}
			fmt.Fprintf(&b, "| %.1f | %s | %s | %s | %s | %s | %s | %s | %d | %d | %s |\n", f.AtS, f.Fault, f.Pod, undone,
				orDash(f.NewPod), opt(f.DetectionS), opt(f.ServiceDetectionS), opt(f.RecoveryS),
				f.ServedEnteringDuring, f.ForwardedToAfter, orDash(f.Err))
		}
	}
	b.WriteString(r.Overload.markdown())
	b.WriteString(r.apiMarkdown())
	b.WriteString(r.windowMarkdown())
	b.WriteString(r.resourceMarkdown())
	fmt.Fprintf(&b, "\nKV-event batches the simulators dropped: %.0f; replays they served: %.0f; holes replay did not fill (sidecars): %.0f\n",
		r.KVBatchesDropped, r.KVReplays, r.KVEventGaps)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "\nnote: %s\n", n)
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return strings.ReplaceAll(s, "|", "/")
}
