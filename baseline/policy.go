package baseline

import (
	"fmt"
	"time"
)

// Pod is one backend as a policy sees it at the moment of a choice.
type Pod struct {
	Name string
	// InFlight counts requests this proxy sent to the pod that have not
	// finished: the only load signal with no delay.
	InFlight int
	// Load is the pod's last scraped /metrics; LoadAt is zero until the
	// first scrape succeeds (only approx-prefix and central-precise scrape).
	Load   Load
	LoadAt time.Time
}

// Load is what a scrape of vLLM's /metrics reports.
type Load struct {
	Running, Waiting float64
	KVUsage          float64 // 0..1
	NumGPUBlocks     int     // 0 when not reported
}

// Policy picks the pod that serves a request. pods is never empty and is
// always in the same order (the order the policy was built for). Pick may
// update the policy's state (a turn counter, routing history); callers
// serialise calls.
type Policy interface {
	Pick(req Request, pods []Pod, now time.Time) int
}

// Policy names, as cmd/kvproxy's --policy takes them.
const (
	NameRoundRobin     = "round-robin"
	NameLeastLoaded    = "least-loaded"
	NameCHWBL          = "chwbl"
	NameApproxPrefix   = "approx-prefix"
	NameCentralPrecise = "central-precise"
	// NameCentralPreciseGPU is central-precise reading its exact indexes
	// for GPU copies alone: the router as it was before lower tiers were
	// indexed (a pod's CPU and disk copies count for nothing), against
	// which a tier-aware choice is measured.
	NameCentralPreciseGPU = "central-precise-gpu-only"
	NameCentralExact      = "central-exact"
	NameLMetric           = "lmetric"
	NameUncoordinated     = "uncoordinated"
)

// Names lists the proxy policies.
var Names = []string{NameRoundRobin, NameLeastLoaded, NameCHWBL, NameApproxPrefix, NameCentralPrecise, NameCentralPreciseGPU,
	NameCentralExact, NameLMetric, NameUncoordinated}

// ErrPolicy reports an unknown policy name.
var ErrPolicy = fmt.Errorf("unknown policy (want one of %v)", Names)

// RoundRobin sends each request to the next pod in turn.
type RoundRobin struct{ next int }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ Request, pods []Pod, _ time.Time) int {
	i := p.next % len(pods)
	p.next = i + 1
	return i
}

// LeastLoaded sends a request to the pod with the fewest requests in flight
// from this proxy (KubeAI's LeastLoad); ties go to the lowest index.
type LeastLoaded struct{}

// Pick implements Policy.
func (LeastLoaded) Pick(_ Request, pods []Pod, _ time.Time) int {
	best := 0
	for i, p := range pods {
		if p.InFlight < pods[best].InFlight {
			best = i
		}
	}
	return best
}
