//go:build integration

package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/loadgen"
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
	// A stale epoch claim's record, and each sidecar's routed line for it
	// (its decision and match_note), say where the affinity came from: the
	// one seen on 2026-12-06 was a claim (report.go's onClaim).
	for _, r := range res.StaleClaims {
		t.Logf("stale epoch claim: %+v", r)
		for _, l := range routedLines(t, filepath.Join(cfg.Dir, "logs"), loadgen.RequestID(r.Session, r.Turn)) {
			t.Logf("  %s", l)
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

// The agents' APIs under every fault (scenarios/agentic-faults.json, 4
// pods, 60 s of the agentic workload with stored Responses continued by
// previous_response_id, and the harness's GETs of stored responses):
// no request a live pod could serve is lost; follow-ups of stored
// responses were sent and served while faults held their pods; the
// unservable ones are exactly those whose response's engine died. The
// clients retry as the SDKs do (the scenario's client_retry): a 503 with
// Retry-After is the mesh's "try again", and a follow-up is lost only if
// the retries did not get through. Loopback mode: no root needed.
func TestScenarioAgenticFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 60 s chaos scenario on 4 pods")
	}
	runAgentic(t, "scenarios/agentic-faults.json", false)
}

// TestScenarioAgenticFaultsNetns is the same with a partition of a pod
// holding stored responses (netns mode, root).
func TestScenarioAgenticFaultsNetns(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("runs a 60 s chaos scenario on 4 pods in namespaces")
	}
	runAgentic(t, "scenarios/agentic-faults-netns.json", true)
}

func runAgentic(t *testing.T, path string, netns bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseScenario(b)
	if err != nil {
		t.Fatal(err)
	}
	// The binaries are built first, into the test's own directory, so the
	// bound below is the run's and no other build can swap them.
	bin := shortDir(t)
	bctx, bcancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer bcancel()
	if err := Build(bctx, bin, SimBinary, SidecarBinary); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cfg := RunConfig{Scenario: s, Dir: shortDir(t), BinDir: bin, Progress: progress{t}, Drain: 15 * time.Second}
	if netns {
		cfg.Netns, cfg.NetnsPrefix, cfg.Subnet = true, netnsPrefix(), netnsSubnet()
	} else {
		cfg.Subnet = testSubnet()
	}
	begin := time.Now()
	res, err := RunScenario(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("run took %v\n%s", time.Since(begin).Round(time.Second), res.Markdown())
	checkAgentic(t, s, res, netns)
	if netns && !(res.GuardChecked && res.GuardDrops == 0) {
		t.Errorf("egress guard: checked %v, drops %d; want read and 0", res.GuardChecked, res.GuardDrops)
	}
}

// liveEngine are the faults after which a pod's stored responses still
// exist: their follow-ups are servable.
var liveEngine = []string{FaultHangEngine, FaultKillSidecar, FaultRestartSidecar, FaultPartition}

// knownStoredBug reports whether a failure is one of the mesh's known
// failures on stored responses (issue 24's chaos report), which this
// test marks rather than asserts. What remains after forward/stored.go's
// rule (docs/design.md "Stored responses"):
//   - an unservable follow-up of a pod whose address vanished with it
//     (replace-pod in netns mode, as a deleted pod's IP in Kubernetes)
//     answered with a retryable 503 rather than the 404 "which is gone":
//     where the pod's address still exists its vLLM is asked itself, and
//     a refusal is the 404 at once (forward/direct.go), but an address
//     that no longer answers looks like a partition, so the mesh answers
//     "gone" only respown.DefaultGrace (10 s) after the pod left it;
//   - netns only: a servable follow-up lost while its pod was partitioned
//     away longer than the clients' retries;
//   - a servable follow-up whose stream is cut while its pod's sidecar
//     restarts: the harness kills a sidecar whose drain outlasts its 3 s
//     grace (Kubernetes gives 30 s), and a stream through that sidecar
//     dies with it. Entries send a draining pod's stored requests to its
//     vLLM directly, also those a probe located (the map had not heard
//     of the response: made a moment ago, or past a sidecar that could
//     not announce it), which went through the sidecar and made most of
//     these. What is left is a hop sent before the entry heard of the
//     drain (a gossip round) whose stream outlives the grace.
func knownStoredBug(f RequestRecord, faults []FaultResult, end float64, netns bool) bool {
	const grace, detect, retries = 10, 3, 6 // s: respown.DefaultGrace, memberlist's, three held attempts
	for _, fr := range faults {
		if fr.Pod != f.Owner {
			continue
		}
		switch {
		case f.Class == ClassStoreLostUnclear && fr.Fault == FaultReplacePod && netns:
			// From a second before the fault: a request sent in the same
			// instant the fault starts (its AtS is stamped after it acts)
			// meets the pod going.
			if fr.AtS-1 <= f.SentS && f.SentS <= fr.AtS+detect+grace+retries &&
				(f.Status == 503 || strings.Contains(f.Err, "context canceled")) {
				return true
			}
		case f.Class == "failed_servable" && fr.Fault == FaultRestartSidecar && strings.Contains(f.Err, "unexpected EOF"):
			until := end
			if fr.UndoneS > 0 {
				until = fr.UndoneS
			}
			if fr.AtS <= f.SentS && f.SentS <= until {
				return true
			}
		case f.Class == "failed_servable" && fr.Fault == FaultPartition:
			until := end
			if fr.UndoneS > 0 {
				until = fr.UndoneS
			}
			if fr.AtS <= f.SentS && f.SentS <= until+3 {
				return true
			}
		}
	}
	return false
}

func checkAgentic(t *testing.T, s Scenario, res *Result, netns bool) {
	t.Helper()
	checks := []struct {
		name string
		ok   bool
	}{
		{"requests were sent and most succeeded", res.Requests > 200 && res.OK > res.Requests*9/10},
		{"every fault ran", len(res.Faults) == len(s.Faults)},
		{"the clients retried as the SDKs do", res.ClientRetry},
		{"follow-ups of stored responses were sent (> 100) and most served",
			res.FollowUps > 100 && res.FollowUpsServed > res.FollowUps/2},
		{"every follow-up named a response the harness saw made", res.FollowUpsUnknown == 0},
		{"no follow-up served after its response's engine ended", res.StoreLostServed == 0},
		{"the faulted engines took stored responses with them (unservable > 0)", res.StoreLost+res.StoreLostUnclear > 0},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("invariant broken: %s", c.name)
		}
	}
	for _, f := range res.Faults {
		if f.Err != "" {
			t.Errorf("fault %s on %s: %s", f.Fault, f.Pod, f.Err)
		}
	}
	// Follow-ups were sent, and served, while faults held their pods and
	// the responses still existed; none the unservable way.
	served := 0
	for _, f := range res.Faults {
		if !slices.Contains(liveEngine, f.Fault) {
			continue
		}
		if f.FollowUps.Sent == 0 {
			t.Errorf("fault %s on %s: no follow-up of its stored responses was sent during it", f.Fault, f.Pod)
		}
		if f.FollowUps.StoreLost != 0 {
			t.Errorf("fault %s on %s: %d follow-ups counted unservable, but its engine lived", f.Fault, f.Pod, f.FollowUps.StoreLost)
		}
		served += f.FollowUps.Served
	}
	if served == 0 {
		t.Error("no follow-up was served while a fault held the pod storing its response")
	}
	// The unservable class holds only follow-ups whose response's engine
	// ended after it was made.
	ended := map[string]bool{}
	for _, f := range res.Faults {
		if engineEnds(f.Fault) {
			ended[f.Pod] = true
		}
	}
	var listedLost, listedUnclear int
	var known []string
	for _, f := range res.Failures {
		switch f.Class {
		case ClassStoreLost, ClassStoreLostUnclear:
			if f.Cause == "" || !ended[f.Owner] || f.MadeS > f.EndS {
				t.Errorf("unservable %s.%d: owner %q made at %.1f s, cause %q: not a response whose engine ended", f.Session, f.Turn, f.Owner, f.MadeS, f.Cause)
			}
			if f.Class == ClassStoreLostUnclear {
				listedUnclear++
			}
		case "failed_servable":
			listedLost++
		}
		if f.Class == "failed_servable" || f.Class == ClassStoreLostUnclear {
			if !knownStoredBug(f, res.Faults, res.DurationS, netns) {
				t.Errorf("%s: %+v", f.Class, f)
				continue
			}
			known = append(known, fmt.Sprintf("%s %s %s.%d sent %.1f s (owner %s): %s", f.Class, f.API, f.Session, f.Turn, f.SentS, f.Owner, f.Err))
		}
	}
	if listedLost != res.ServableLost || listedUnclear != res.StoreLostUnclear {
		t.Errorf("servable lost %d, unclear %d, of which listed %d and %d: the list is cut, so the rest cannot be told known",
			res.ServableLost, res.StoreLostUnclear, listedLost, listedUnclear)
	}
	if t.Failed() || len(known) == 0 {
		return
	}
	for _, k := range known {
		t.Log("known: " + k)
	}
	t.Skipf("KNOWN BUG (issue 24, chaos report): %d servable follow-ups lost and %d unservable ones without the 404 that says the pod is gone; every other invariant holds",
		res.ServableLost, res.StoreLostUnclear)
}

// routedLines returns the sidecars' "routed" log lines of request id:
// where each front sent it and why (forward's match_note).
func routedLines(t *testing.T, dir, id string) []string {
	paths, _ := filepath.Glob(filepath.Join(dir, "*-sidecar.log"))
	var out []string
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Logf("read %s: %v", p, err)
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `"req":"`+id+`"`) && strings.Contains(l, `"routed"`) {
				out = append(out, filepath.Base(p)+": "+l)
			}
		}
	}
	return out
}

func TestRoutedLines(t *testing.T) {
	dir := t.TempDir()
	logs := map[string]string{
		"pod1-sidecar.log": `{"level":"debug","node":"pod1","req":"s1.2","decision":"affinity","match_note":"claim","message":"routed"}
{"level":"debug","node":"pod1","req":"s1.20","message":"routed"}
{"level":"debug","node":"pod1","req":"s1.2","message":"other"}
`,
		"pod2-sidecar.log": `{"level":"debug","node":"pod2","req":"s1.2","decision":"local","message":"routed"}`,
		"pod2-sim.log":     `{"req":"s1.2","message":"routed"}`,
	}
	for name, body := range logs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := routedLines(t, dir, "s1.2")
	if len(got) != 2 || !strings.Contains(got[0], `"match_note":"claim"`) || !strings.HasPrefix(got[1], "pod2-sidecar.log: ") {
		t.Errorf("routedLines = %q; want pod1's routed line with its note, then pod2's", got)
	}
}
