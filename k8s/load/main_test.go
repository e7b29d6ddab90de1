package main

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// A failure is cut only when its stream had begun on a pod a fault hit
// before it ended; a 5xx, a refused connection or a pod no fault touched
// is a request lost although another pod could have served it.
func TestSummarizeClassifiesFailures(t *testing.T) {
	start := time.Unix(1000, 0)
	ms := func(d time.Duration) int64 { return start.Add(d).UnixMilli() }
	faults := []Fault{
		{AtMS: ms(10 * time.Second), Kind: "delete-pod", Pod: "a"},
		{AtMS: ms(20 * time.Second), Kind: "kill-engine", Pod: "b"},
	}
	s := func(sent time.Duration, pod, err string) loadgen.Sample {
		return loadgen.Sample{Sent: sent, Pod: pod, Err: err, WallE2E: time.Second, PromptTokens: 10}
	}
	samples := []loadgen.Sample{
		s(1*time.Second, "a", ""),                    // before any fault, fine
		s(2*time.Second, "", "connection refused"),   // before any fault: lost
		s(11*time.Second, "a", "stream ended early"), // on the deleted pod after the fault: cut
		s(12*time.Second, "c", "stream ended early"), // on a pod no fault hit: lost
		s(13*time.Second, "a", "status 502: bad"),    // a 5xx is never cut
		s(15*time.Second, "b", "stream ended early"), // b is hit at 20 s, after this ended (16 s + 2 s): lost
		s(21*time.Second, "b", "stream ended early"), // cut
		s(22*time.Second, "c", ""),
	}
	sum := summarize(options{name: "x", url: "u"}, samples, faults, start)
	if sum.Failed != 6 || sum.Cut != 2 || sum.Lost != 4 || sum.Unrouted != 1 {
		t.Errorf("failed %d cut %d lost %d unrouted %d; want 6, 2, 4, 1", sum.Failed, sum.Cut, sum.Lost, sum.Unrouted)
	}
	if len(sum.Faults) != 2 {
		t.Fatalf("%d fault results; want 2", len(sum.Faults))
	}
	if f := sum.Faults[0]; f.Requests != 4 || f.Cut != 1 || f.Lost != 3 || f.Unrouted != 0 || f.AtS != 10 || f.Errors["status 502: bad"] != 1 {
		t.Errorf("delete-pod: %+v; want 4 requests, 1 cut, 3 lost at 10 s", f)
	}
	if f := sum.Faults[1]; f.Requests != 2 || f.Cut != 1 || f.Lost != 0 {
		t.Errorf("kill-engine: %+v; want 2 requests, 1 cut, 0 lost", f)
	}
	if sum.PerPod["a"] != 1 || sum.PerPod["c"] != 1 {
		t.Errorf("per pod %v", sum.PerPod)
	}
}

func TestParseFlags(t *testing.T) {
	if _, err := parseFlags([]string{"--rate", "1"}); err == nil {
		t.Error("no --url accepted")
	}
	if _, err := parseFlags([]string{"--url", "http://x", "--rate", "0"}); err == nil {
		t.Error("rate 0 accepted")
	}
	o, err := parseFlags([]string{"--url", "http://x"})
	if err != nil || o.rate != 4 || o.pods != 4 || !o.stream {
		t.Errorf("defaults %+v, %v", o, err)
	}
}
