package chaos

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseScenarioIssueExample(t *testing.T) {
	in := `{"pods": 8, "duration": "180s", "rate": 20, "workload": "multi-turn-chat", "faults": [
		{"at": "20s", "fault": "kill-pod", "pod": 3},
		{"at": "30s", "fault": "kill-engine", "pod": 1, "for": "15s"},
		{"at": "50s", "fault": "partition", "pod": 2, "for": "20s"},
		{"at": "60s", "fault": "gossip-delay", "pod": "all", "ms": 200, "for": "10s"},
		{"at": "70s", "fault": "gossip-loss", "pod": "random", "percent": 5},
		{"at": "80s", "fault": "drop-events", "pod": "4", "rate": 0.5},
		{"at": "90s", "fault": "rolling-restart"}]}`
	s, err := ParseScenario([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := Scenario{Pods: 8, Duration: Duration(180 * time.Second), Rate: 20, Workload: "multi-turn-chat",
		Faults: []Fault{
			{At: Duration(20 * time.Second), Fault: "kill-pod", Pod: PodRef{N: 3}},
			{At: Duration(30 * time.Second), Fault: "kill-engine", Pod: PodRef{N: 1}, For: Duration(15 * time.Second)},
			{At: Duration(50 * time.Second), Fault: "partition", Pod: PodRef{N: 2}, For: Duration(20 * time.Second)},
			{At: Duration(60 * time.Second), Fault: "gossip-delay", Pod: PodRef{All: true}, MS: 200, For: Duration(10 * time.Second)},
			{At: Duration(70 * time.Second), Fault: "gossip-loss", Pod: PodRef{Random: true}, Percent: 5},
			{At: Duration(80 * time.Second), Fault: "drop-events", Pod: PodRef{N: 4}, Rate: 0.5},
			{At: Duration(90 * time.Second), Fault: "rolling-restart"},
		}}
	if d := cmp.Diff(want, s); d != "" {
		t.Fatalf("ParseScenario mismatch (-want +got):\n%s", d)
	}
	if err := s.Validate(0, 0); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if !s.NeedsNetns() {
		t.Error("NeedsNetns = false for a scenario with a partition")
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseScenario(b)
	if err != nil {
		t.Fatalf("re-parse %s: %v", b, err)
	}
	if d := cmp.Diff(s, back); d != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", d)
	}
}

func TestScenarioErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"unknown field", `{"faults":[{"at":"1s","fault":"kill-pod","pod":1,"fro":"5s"}]}`, `unknown field "fro"`},
		{"unknown fault", `{"faults":[{"at":"1s","fault":"melt","pod":1}]}`, "unknown fault"},
		{"bad duration", `{"faults":[{"at":"soon","fault":"kill-pod","pod":1}]}`, "duration"},
		{"numeric duration", `{"faults":[{"at":20,"fault":"kill-pod","pod":1}]}`, "want a string"},
		{"pod out of range", `{"pods":4,"faults":[{"at":"1s","fault":"kill-pod","pod":5}]}`, "pod 5 not in 1..4"},
		{"pod missing", `{"faults":[{"at":"1s","fault":"kill-pod"}]}`, "pod is required"},
		{"pod word", `{"faults":[{"at":"1s","fault":"kill-pod","pod":"some"}]}`, `got "some"`},
		{"all on a pod fault", `{"faults":[{"at":"1s","fault":"kill-pod","pod":"all"}]}`, `"all" only`},
		{"rolling with pod", `{"faults":[{"at":"1s","fault":"rolling-restart","pod":1}]}`, "leave pod out"},
		{"after the end", `{"duration":"10s","faults":[{"at":"10s","fault":"kill-pod","pod":1}]}`, "at must be in"},
		{"delay without ms", `{"faults":[{"at":"1s","fault":"gossip-delay","pod":1}]}`, "ms must be"},
		{"loss over 100", `{"faults":[{"at":"1s","fault":"gossip-loss","pod":1,"percent":150}]}`, "percent must be"},
		{"drop rate over 1", `{"faults":[{"at":"1s","fault":"drop-events","pod":1,"rate":5}]}`, "rate must be"},
		{"trailing", `{"faults":[]} {}`, "trailing data"},
	}
	for _, tc := range tests {
		s, err := ParseScenario([]byte(tc.in))
		if err == nil {
			err = s.Validate(8, time.Minute)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v; want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestParseGuardHits(t *testing.T) {
	listing := `Chain KVC-GUARD (2 references)
    pkts      bytes target     prot opt in     out     source               destination
     120    10080 RETURN     all  --  *      kvcbr   0.0.0.0/0            0.0.0.0/0
      33     2000 RETURN     all  --  *      lo      0.0.0.0/0            0.0.0.0/0
       2      120 DROP       all  --  *      *       10.253.0.0/24        0.0.0.0/0
       1       60 DROP       all  --  *      *       0.0.0.0/0            10.253.0.0/24
`
	got, err := parseGuardHits(listing)
	if err != nil || got != 3 {
		t.Errorf("parseGuardHits = %d, %v; want 3 (the DROP rules only), nil", got, err)
	}
}

func TestChoosable(t *testing.T) {
	body := `[{"id":"pod1","local":true},
		{"id":"pod2","engine":"serving"},
		{"id":"pod3","engine":"down","excluded":"engine down"},
		{"id":"pod4","excluded":"silent 3.2s"},
		{"id":"pod5","draining":true,"excluded":"draining"},
		{"id":"pod6"}]`
	got, err := choosable([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"pod2", "pod6"}, got); d != "" {
		t.Errorf("choosable mismatch (-want +got):\n%s", d)
	}
	if _, err := choosable([]byte(`{"not":"a list"}`)); err == nil {
		t.Error("choosable accepted an object")
	}
}

func TestMetricSum(t *testing.T) {
	text := `# HELP kvroute_kv_event_gaps_total gaps
# TYPE kvroute_kv_event_gaps_total counter
kvroute_kv_event_gaps_total 3
kvroute_kv_event_gaps_total_extra 100
kvroute_kv_event_gaps_total{topic="a"} 2.5
kvroute_other 7
`
	if got := metricSum(text, "kvroute_kv_event_gaps_total"); got != 5.5 {
		t.Errorf("metricSum = %v; want 5.5 (the two samples of that metric only)", got)
	}
}

// TestShippedScenarios parses every scenario in scenarios/: make chaos,
// make soak and the tests name them, and a typo would surface only when
// one of those ran.
func TestShippedScenarios(t *testing.T) {
	paths, err := filepath.Glob("scenarios/*.json")
	if err != nil || len(paths) == 0 {
		t.Fatalf("scenarios/*.json: %v, %d files", err, len(paths))
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ParseScenario(b)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if want := strings.TrimSuffix(filepath.Base(p), ".json"); s.Name != want {
			t.Errorf("%s: name %q; want the file's, %q", p, s.Name, want)
		}
	}
}
