package main

import (
	"strconv"
	"time"

	"github.com/kvroute/kvroute/forward"
	"github.com/kvroute/kvroute/gossip"
	"github.com/kvroute/kvroute/route"
)

// Slow motion (--slow K): the simulators' clocks run at 1/K of the wall
// clock, the schedule's arrivals and think times are K times apart, and
// the sidecars' rates and push intervals are scaled to match, so that in
// simulated time the run is the one --slow 1 would be, with a K-th of the
// CPU a wall second. Why: vllm-sim steps back to back in simulated time,
// and a machine too small for the cluster lets its clocks fall behind the
// wall clock while requests keep arriving (loadgen.SimClock): a policy
// that runs a sidecar per pod is then measured at a higher load than one
// central proxy. Not scaled: the digests' delta interval and the
// sidecars' TTLs (load, claims, recent forwards: 5 s), which come K times
// sooner in simulated time, and the metrics scrape (--load-interval),
// which the choice reads only for KV usage.

// slowed is d on a wall clock K times slower.
func (o options) slowed(d time.Duration) time.Duration {
	if o.Slow <= 1 {
		return d
	}
	return time.Duration(float64(d) * o.Slow)
}

// simTimeScale is the simulators' --sim-time-scale.
func (o options) simTimeScale() float64 {
	if o.Slow <= 1 {
		return 1
	}
	return 1 / o.Slow
}

// slowArgs are the sidecar flags --slow scales, from their defaults; a
// flag in --sidecar-args comes after them and wins, unscaled.
func (o options) slowArgs() []string {
	if o.Slow <= 1 {
		return nil
	}
	rc, gc, fc := route.DefaultConfig(), gossip.DefaultConfig(), forward.DefaultConfig()
	rate := func(r float64) string { return strconv.FormatFloat(r/o.Slow, 'g', 6, 64) }
	return []string{
		"--prefill-rate", rate(rc.PrefillTokensPerSecond),
		"--cpu-load-rate", rate(rc.CPULoadTokensPerSecond),
		"--disk-load-rate", rate(rc.DiskLoadTokensPerSecond),
		"--max-queue-wait", o.slowed(fc.MaxQueueWait).String(),
		"--load-push-interval", o.slowed(gc.LoadPushInterval).String(),
		"--claim-push-interval", o.slowed(max(gc.ClaimPushInterval, 0)).String(), // the sidecar's default (0: at once)
		"--load-push-delay", o.slowed(gc.LoadPushDelay).String(),
	}
}
