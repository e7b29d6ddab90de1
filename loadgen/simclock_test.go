package loadgen

import (
	"math"
	"strings"
	"testing"
	"time"
)

// paced returns n samples of pod sent one every step from start, whose
// simulator's clock reads offset + rate × the wall time sent.
func paced(pod string, n int, start, step time.Duration, offset, rate float64) []Sample {
	var out []Sample
	for i := range n {
		sent := start + time.Duration(i)*step
		out = append(out, Sample{Pod: pod, Sent: sent, Sim: true, SimArrival: offset + rate*sent.Seconds()})
	}
	return out
}

func TestSimClock(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	var s []Sample
	s = append(s, paced("pod1", 40, 0, 500*time.Millisecond, 3, 1.0)...)      // kept pace, clock started 3 s apart
	s = append(s, paced("pod2", 40, 0, 500*time.Millisecond, 0, 0.8)...)      // fell behind
	s = append(s, paced("pod3", 40, 0, 500*time.Millisecond, 1, 0.9)...)      // the median
	s = append(s, paced("pod4", 10, 0, 100*time.Millisecond, 0, 0.1)...)      // 0.9 s of samples: too short to say
	s = append(s, Sample{Pod: "pod2", Sent: 3 * time.Second, Err: "refused"}) // failures carry no timing
	c := simClock(s, 1)
	if c == nil || c.Pods != 3 || !near(c.Min, 0.8) || !near(c.Median, 0.9) {
		t.Fatalf("simClock = %+v, want min 0.8, median 0.9 over 3 pods", c)
	}
	// At --sim-time-scale 2 a clock that keeps pace reads twice the wall time.
	if c := simClock(paced("pod1", 40, 0, 500*time.Millisecond, 0, 2), 2); c == nil || !near(c.Min, 1) {
		t.Errorf("time scale 2: %+v, want 1", c)
	}
	if c := simClock(paced("pod1", 40, 0, 100*time.Millisecond, 0, 1), 1); c != nil {
		t.Errorf("4 s of samples: %+v, want nil", c)
	}
	if c := simClock([]Sample{{Pod: "pod1", Sent: time.Second}, {Pod: "pod1", Sent: 9 * time.Second}}, 1); c != nil {
		t.Errorf("wall-clock samples: %+v, want nil", c)
	}
}

func TestSimClockInResults(t *testing.T) {
	behind := Summarize("kvroute", paced("pod1", 40, 0, 500*time.Millisecond, 0, 0.9), []string{"pod1"}, 1)
	kept := Summarize("lmetric", paced("pod1", 40, 0, 500*time.Millisecond, 0, 1), []string{"pod1"}, 1)
	md := Markdown(Report{Workload: "agentic", Pods: 1, Policies: []PolicyResult{behind, kept}})
	for _, want := range []string{
		"kvroute simulated clocks: 0.900 of wall time (median of 1 pods), slowest 0.900 — CPU-bound",
		"lmetric simulated clocks: 1.000 of wall time (median of 1 pods), slowest 1.000\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
}
