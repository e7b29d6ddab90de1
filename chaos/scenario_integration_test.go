//go:build integration

package chaos

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The CI scenario (scenarios/ci-smoke.json): 4 pods in namespaces under
// load while an engine is killed and restarted, an engine hangs and
// resumes, a sidecar is killed and restarted and a pod is replaced. It
// asserts the invariants, not timings: no request a live pod could serve
// failed, no affinity to a restarted engine's old cache, every engine fault
// was detected, the egress guard never matched, and nothing is left.
// forwards_to_dead_after_detection is inferred from the sidecars'
// "-retried" decisions, which do not name the pod that failed, so it is
// reported, not asserted.
func TestScenarioCISmoke(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("runs a 30 s chaos scenario on 4 pods")
	}
	b, err := os.ReadFile("scenarios/ci-smoke.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScenario(b)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	cfg := RunConfig{
		Scenario: s, Dir: shortDir(t), Progress: progress{t},
		Netns: true, NetnsPrefix: netnsPrefix(), Subnet: netnsSubnet(),
		BlocksPerPod: 1024, Drain: 20 * time.Second,
	}
	res, err := RunScenario(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", res.Markdown())
	checks := []struct {
		name string
		ok   bool
	}{
		{"requests were sent and most succeeded", res.Requests > 50 && res.OK > res.Requests*3/4},
		{"failed_servable == 0", res.FailedServable == 0},
		{"stale_epoch_claims == 0", res.StaleEpochClaims == 0},
		{"engine faults detected (the sidecar answers for its engine)", engineDetected(res)},
		{"egress guard read and never matched", res.GuardChecked && res.GuardDrops == 0},
		{"every fault ran", len(res.Faults) == len(s.Faults)},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("invariant broken: %s", c.name)
		}
	}
	for _, f := range res.Failures {
		if f.Class == "failed_servable" {
			t.Logf("failed servable: %+v", f)
		}
	}
	for _, f := range res.Faults {
		if f.Err != "" {
			t.Errorf("fault %s on %s: %s", f.Fault, f.Pod, f.Err)
		}
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), cfg.NetnsPrefix+"-") {
		t.Errorf("namespaces left after the run:\n%s", out)
	}
	if exec.Command("iptables", "-w", "-n", "-L", guardChain(cfg.NetnsPrefix)).Run() == nil {
		t.Errorf("guard chain %s left after the run", guardChain(cfg.NetnsPrefix))
	}
}

// engineDetected: every engine kill and hang was excluded by the peers
// before it was undone. (A sidecar killed for a few seconds can come back
// before memberlist's suspicion timeout: not asserted.)
func engineDetected(res *Result) bool {
	for _, f := range res.Faults {
		if (f.Fault == FaultKillEngine || f.Fault == FaultHangEngine) && f.DetectionS == nil {
			return false
		}
	}
	return true
}
