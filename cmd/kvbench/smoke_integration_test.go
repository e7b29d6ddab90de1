//go:build integration

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/loadgen"
)

// testBinaries builds vllm-sim and the sidecar for a test's cluster, and
// skips the test when they cannot be built: there is no cluster then.
func testBinaries(t *testing.T, ctx context.Context) string {
	t.Helper()
	bin := t.TempDir()
	if err := chaos.Build(ctx, bin, chaos.SimBinary, chaos.SidecarBinary); err != nil {
		t.Skipf("cannot build vllm-sim and sidecar, so no cluster to run: %v", err)
	}
	return bin
}

// testSubnet is a test's own /24 for its cluster: third names the test, and
// the second octet this process, so that clusters of tests running at
// once never share addresses.
func testSubnet(third int) string { return fmt.Sprintf("127.%d.%d", 100+os.Getpid()%100, third) }

// benchReport runs kvbench with args on 3 pods on testSubnet(third),
// logs its table, and returns its report and its output directory.
func benchReport(t *testing.T, ctx context.Context, third int, args ...string) (loadgen.Report, string) {
	t.Helper()
	out := t.TempDir()
	o, err := parseFlags(append([]string{"--pods", "3", "--bin", testBinaries(t, ctx), "--out", out, "--subnet", testSubnet(third), "--quiet"}, args...),
		io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var table, log bytes.Buffer
	if err := run(ctx, o, &table, &log); err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	t.Logf("\n%s", table.String())
	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep loadgen.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, out
}

// TestSmokeKVRouteBeatsService is the CI-sized benchmark: 3 pods, the
// prefix-heavy shared-prefix workload, the plain Service against kvroute.
// It asserts the ordering that must hold, not absolute times: kvroute's
// token-weighted hit rate above the Service's.
func TestSmokeKVRouteBeatsService(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, out := benchReport(t, ctx, 240, "--workload", "shared-prefix", "--policies", "service,kvroute",
		"--rate", "6", "--duration", "15s", "--drain", "30s", "--seed", "7")
	if rep.Workload != "shared-prefix" || rep.Pods != 3 || len(rep.Policies) != 2 {
		t.Fatalf("report %+v", rep)
	}
	svc, kv := rep.Policies[0], rep.Policies[1]
	if svc.Name != "service" || kv.Name != "kvroute" {
		t.Fatalf("policies %q, %q", svc.Name, kv.Name)
	}
	for _, p := range rep.Policies {
		if p.Requests < 50 || p.SuccessRate < 0.99 {
			t.Errorf("%s: %d requests, success %.3f; want >= 50 and >= 99%%", p.Name, p.Requests, p.SuccessRate)
		}
	}
	if kv.HitRate <= svc.HitRate {
		t.Errorf("kvroute hit rate %.3f <= service %.3f; want kvroute above", kv.HitRate, svc.HitRate)
	}
	for _, f := range []string{"ttft-cdf.png", "results.md"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("missing output: %v", err)
		}
	}
}

// TestStory plays the demo's scene on a real 3-pod cluster: through the
// plain Service the calls reach more than one pod and prefill the system
// prompt more than once; through kvroute only the first call prefills it
// and every call is served by the pod that did.
func TestStory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o, err := parseFlags([]string{"--bin", testBinaries(t, ctx), "--out", t.TempDir(), "--subnet", testSubnet(241), "--seed", "1"}, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rounds, err := playStory(ctx, o, &out, io.Discard)
	if err != nil {
		t.Fatalf("playStory: %v\n%s", err, out.String())
	}
	t.Logf("\n%s", out.String())
	recomputed := func(res []storyResult) (n int, pods map[string]bool) {
		pods = map[string]bool{}
		for _, r := range res {
			pods[r.served] = true
			if r.cached < storySystemTokens/2 {
				n++
			}
		}
		return n, pods
	}
	plainN, plainPods := recomputed(rounds[0])
	kvN, kvPods := recomputed(rounds[1])
	if len(rounds[0]) != storyRequests || len(rounds[1]) != storyRequests {
		t.Fatalf("rounds of %d and %d calls; want %d each", len(rounds[0]), len(rounds[1]), storyRequests)
	}
	if plainN < 2 || len(plainPods) < 2 {
		t.Errorf("plain Service: %d prefills on %d pods; want the scatter (seed 1 picks several pods)", plainN, len(plainPods))
	}
	if kvN != 1 || len(kvPods) != 1 {
		t.Errorf("kvroute: %d prefills on %d pods; want 1 on 1", kvN, len(kvPods))
	}
}

// TestSmokeAgentic runs the agentic workload (Messages and Responses agent
// loops, sub-agents, images, stored responses) on 3 pods through the plain
// Service and central-precise. Through the Service a stored response's
// follow-up reaches another pod as often as not, which answers 404; the
// central proxy sends every one to the pod that holds it. central-precise
// must also reuse more of the cache.
func TestSmokeAgentic(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, _ := benchReport(t, ctx, 242, "--workload", "agentic", "--policies", "service,central-precise",
		"--rate", "8", "--duration", "15s", "--drain", "30s", "--seed", "3")
	if len(rep.Policies) != 2 {
		t.Fatalf("report %+v", rep)
	}
	svc, cp := rep.Policies[0], rep.Policies[1]
	for _, p := range rep.Policies {
		for _, api := range []string{"messages", "responses", loadgen.APIAll} {
			if p.ByAPI[api].Requests < 10 {
				t.Errorf("%s: %d %s requests; want a per-API breakdown with >= 10", p.Name, p.ByAPI[api].Requests, api)
			}
		}
	}
	if got := cp.ByAPI[loadgen.APIAll]; got.Failures != 0 || got.Continued == 0 {
		t.Errorf("central-precise: %d failures, %d continued; want none failed and some continued", got.Failures, got.Continued)
	}
	if got := svc.ByAPI["responses"]; got.ContinuedFailures == 0 || got.ContinuedFailures != got.Failures {
		t.Errorf("service: %d of %d continued failed, %d failures; want the follow-ups on other pods to fail, and only them",
			got.ContinuedFailures, got.Continued, got.Failures)
	}
	if cp.HitRate <= svc.HitRate {
		t.Errorf("central-precise hit rate %.3f <= service %.3f", cp.HitRate, svc.HitRate)
	}
}
