package loadgen

import (
	"fmt"
	"slices"
	"strings"
)

// SimClock is how fast the simulators' clocks ran against the wall clock
// during a run, per pod: the slope of a pod's simulated arrival times
// (Sample.SimArrival) over the wall times the requests were sent, divided
// by the time scale, so 1 is "kept pace".
//
// Why it is worth a line in the results: vllm-sim steps back to back in
// simulated time, so when the machine cannot give a simulator the CPU its
// steps take, its clock falls behind the wall clock while requests keep
// arriving at the wall clock's pace. The simulated load is then higher
// than the offered load, queues and TTFTs grow, and a policy whose own
// processes use more of a shared machine's CPU (a sidecar per pod against
// one central proxy) is measured at a higher load than the other. Runs
// whose slowest clock is under 0.95 compare the machine, not the routers.
type SimClock struct {
	Min    float64 `json:"min"`    // the slowest pod's
	Median float64 `json:"median"` // over the pods with enough samples
	Pods   int     `json:"pods"`
}

// Behind is the slowest clock below which a run is called CPU-bound.
const Behind = 0.95

// simClockMinSpan is the least wall span of a pod's arrivals, in seconds,
// over which its clock rate is estimated: shorter spans are all noise.
const simClockMinSpan = 5

// simClock estimates each pod's clock rate by least squares over its
// successful simulated samples; nil when no pod has simClockMinSpan of
// them.
func simClock(samples []Sample, timeScale float64) *SimClock {
	type pts struct{ x, y []float64 }
	byPod := map[string]*pts{}
	for _, s := range samples {
		if !s.OK() || !s.Sim || s.Pod == "" {
			continue
		}
		p := byPod[s.Pod]
		if p == nil {
			p = &pts{}
			byPod[s.Pod] = p
		}
		p.x = append(p.x, s.Sent.Seconds())
		p.y = append(p.y, s.SimArrival)
	}
	var rates []float64
	for _, p := range byPod {
		if r, ok := slope(p.x, p.y); ok {
			rates = append(rates, r/timeScale)
		}
	}
	if len(rates) == 0 {
		return nil
	}
	slices.Sort(rates)
	return &SimClock{Min: rates[0], Median: Percentile(rates, 50), Pods: len(rates)}
}

// slope is the least-squares slope of y over x; false when x spans less
// than simClockMinSpan.
func slope(x, y []float64) (float64, bool) {
	if len(x) < 2 || slices.Max(x)-slices.Min(x) < simClockMinSpan {
		return 0, false
	}
	var mx, my float64
	for i := range x {
		mx += x[i]
		my += y[i]
	}
	mx /= float64(len(x))
	my /= float64(len(y))
	var sxy, sxx float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
	}
	return sxy / sxx, true
}

// simClockLines renders each policy's simulated clocks, with a warning
// for a run whose slowest clock fell behind; "" when no policy has them.
func simClockLines(policies []PolicyResult) string {
	var b strings.Builder
	for _, p := range policies {
		c := p.SimClock
		if c == nil {
			continue
		}
		fmt.Fprintf(&b, "\n%s simulated clocks: %.3f of wall time (median of %d pods), slowest %.3f", p.Name, c.Median, c.Pods, c.Min)
		if c.Min < Behind {
			b.WriteString(" — CPU-bound: the simulators fell behind, so their load was higher than offered")
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return b.String() + "\n"
}
