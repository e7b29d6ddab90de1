package chaos

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// One pod killed at 10 s and restarted at 15 s; each failed request below
// belongs to exactly one class, and the detection, stale-claim and
// forwards-after-detection figures come from the polls and decisions.
func TestSummarizeClassifies(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	r := &runState{
		cfg:    RunConfig{Scenario: Scenario{Name: "t"}, Pods: 3, Duration: 20 * time.Second, Netns: true}.withDefaults(),
		start:  t0,
		faults: []*FaultRecord{{Fault: FaultKillPod, Pod: "pod2", AtS: 10, UndoneS: 15, slot: 1, down: true}},
		polls: []Poll{
			{AtS: 10.25, Observer: "pod1", Choosable: []string{"pod2", "pod3"}},
			{AtS: 10.25, Observer: "pod3", Choosable: []string{"pod1"}},
			{AtS: 12, Observer: "pod1", Choosable: []string{"pod3"}},
			{AtS: 12, Observer: "pod3", Choosable: []string{"pod1"}},
		},
	}
	conns := []ConnRecord{
		{Client: "c1", At: at(1), Name: "pod1"},
		{Client: "c2", At: at(9), Name: "pod2"},
		{Client: "c3", At: at(11), Name: "pod2", DialErr: true},
		{Client: "c4", At: at(12), Name: "pod1"},
		{Client: "c7", At: at(9.8), Name: "pod2"},
	}
	ok := func(sent float64, pod, decision string, cached int) loadgen.Sample {
		return loadgen.Sample{Sent: sec(sent), WallE2E: sec(0.5), Pod: pod, Decision: decision, LocalAddr: "c1",
			PromptTokens: 200, CachedTokens: cached, Status: 200, Attempts: 1}
	}
	failed := func(sent float64, client, pod string, status int) loadgen.Sample {
		return loadgen.Sample{Sent: sec(sent), WallE2E: sec(1), Pod: pod, LocalAddr: client, Status: status, Err: "x", Attempts: 1}
	}
	samples := []loadgen.Sample{
		ok(6, "pod1", "affinity", 200),
		ok(7, "pod3", "least-load", 0),
		failed(9.5, "c2", "pod2", 200), // stream cut by the kill: midstream
		failed(11, "c3", "", 0),        // Service dialled the dead pod: service
		failed(12, "c4", "pod1", 502),  // nothing died: servable
		failed(11, "c2", "", 0),        // keep-alive pinned to the dead pod: service
		failed(12, "nowhere", "", 0),   // no connection at all: service
		failed(9.9, "c7", "", 0),       // entry killed before any answer: in flight
		ok(13, "pod1", "least-load-retried", 100),
		turnOf(ok(3, "pod2", "least-load", 300), "x", 0),
		turnOf(ok(16, "pod2", "affinity", 0), "x", 1), // turn 0 was on the old engine
		turnOf(ok(3, "pod2", "least-load", 300), "y", 0),
		turnOf(ok(17, "pod2", "affinity", 0), "y", 1), // the same, but sent on a claim: a miss only
	}
	attempts := []Attempt{
		{Req: "fwd.11", Node: "pod1", Target: "pod2"}, // sent before detection
		{Req: "fwd.13", Node: "pod3", Target: "pod2"}, // after: counts
		{Req: "fwd.13", Node: "pod3", Target: "pod1"}, // another pod
		{Req: "pod2own.0", Node: "pod2", Target: "pod1"},
		{Req: "unknown.0", Node: "pod1", Target: "pod2"}, // no such request
		{Req: "y.1", Node: "pod1", Target: "pod2", Note: "claim"},
	}
	samples = append(samples, turnOf(ok(11, "pod1", "least-load-retried", 0), "fwd", 11),
		turnOf(ok(13, "pod1", "least-load-retried", 0), "fwd", 13))
	res := summarize(r, samples, conns, nil, attempts, 20)
	checks := []struct {
		name      string
		got, want int
	}{
		{"requests", res.Requests, 15}, {"ok", res.OK, 9},
		{"failed_servable", res.FailedServable, 1}, {"failed_midstream", res.FailedMidstream, 1},
		{"failed_inflight", res.FailedInflight, 1}, {"failed_service", res.FailedService, 3},
		{"retried", res.Retried, 3}, {"forwards_to_dead_after_detection", res.ForwardsToDeadAfterDetection, 1},
		{"stale_epoch_claims", res.StaleEpochClaims, 1}, {"affinity_misses", res.AffinityMisses, 2},
		{"undetected", res.Undetected, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d; want %d", c.name, c.got, c.want)
		}
	}
	if got := res.Faults[0].ForwardedToAfter; got != 2 {
		t.Errorf("forwarded_to_after = %d; want 2 (the 16 and 17 s requests pod1 sent to the restarted pod2)", got)
	}
	if res.DetectionSMax != 2 {
		t.Errorf("detection_s_max = %v; want 2 (the 12 s poll)", res.DetectionSMax)
	}
	if len(res.Faults) != 1 || res.Faults[0].DetectionS == nil || *res.Faults[0].DetectionS != 2 {
		t.Errorf("faults = %+v; want the kill detected after 2 s", res.Faults)
	}
	if err := res.PlotTimeline(filepath.Join(t.TempDir(), "timeline.png")); err != nil {
		t.Errorf("PlotTimeline: %v", err)
	}
	if md := res.Markdown(); len(md) == 0 {
		t.Error("empty markdown")
	}
}

func turnOf(s loadgen.Sample, session string, turn int) loadgen.Sample {
	s.Session, s.Turn = session, turn
	return s
}

func TestRecovery(t *testing.T) {
	secs := make([]Second, 30)
	for k := range secs {
		secs[k].T, secs[k].prompt = k, 100
		secs[k].cached = 80
		if k >= 10 && k < 16 {
			secs[k].cached = 10 // the cache is gone for a while
		}
	}
	// 90% of 0.8 allows one bad second in the 10 s window: from 15 s.
	if d, ok := recovery(secs, 10.5, 0.9*0.8, 30); !ok || d != 4.5 {
		t.Errorf("recovery = %v, %v; want 4.5 s, true", d, ok)
	}
	if _, ok := recovery(secs, 10.5, 0.95, 30); ok {
		t.Error("recovery to a hit rate never reached reported success")
	}
}

func TestStaleClaim(t *testing.T) {
	turn := func(k int, sent float64, pod string) loadgen.Sample {
		return loadgen.Sample{Session: "s", Turn: k, Sent: time.Duration(sent * float64(time.Second)), Pod: pod}
	}
	restarts := []float64{20}
	tests := []struct {
		name    string
		s       loadgen.Sample
		session []loadgen.Sample
		want    bool
	}{
		{"history on the old engine only", turn(2, 25, "pod2"),
			[]loadgen.Sample{turn(0, 5, "pod2"), turn(1, 12, "pod2")}, true},
		{"a turn already served by the new engine", turn(2, 30, "pod2"),
			[]loadgen.Sample{turn(0, 5, "pod2"), turn(1, 22, "pod2")}, false},
		{"history elsewhere: not this pod's old cache", turn(1, 25, "pod2"),
			[]loadgen.Sample{turn(0, 5, "pod3")}, false},
		{"before the restart", turn(1, 15, "pod2"),
			[]loadgen.Sample{turn(0, 5, "pod2")}, false},
		{"no history: no evidence", turn(0, 25, "pod2"), nil, false},
	}
	for _, tc := range tests {
		if got := staleClaim(tc.s, restarts, append(tc.session, tc.s)); got != tc.want {
			t.Errorf("%s: staleClaim = %v; want %v", tc.name, got, tc.want)
		}
	}
}
