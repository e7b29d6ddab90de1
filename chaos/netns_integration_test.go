//go:build integration

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// needRoot skips a netns test on a machine where it cannot run, saying why.
func needRoot(t *testing.T) {
	t.Helper()
	if syscall.Geteuid() != 0 {
		t.Skip("netns mode needs root (CAP_NET_ADMIN): run as root, as CI does, to test namespaces, partitions and the egress guard")
	}
	for _, tool := range []string{"ip", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("netns mode needs %s: %v", tool, err)
		}
	}
}

// netnsPrefix and netnsSubnet keep parallel test binaries apart.
func netnsPrefix() string { return fmt.Sprintf("kt%d", os.Getpid()%1000) }
func netnsSubnet() string { return fmt.Sprintf("10.253.%d", 100+os.Getpid()%150) }

func TestNetnsClusterPartitionAndCleanup(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("starts a 3-pod cluster in namespaces")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t, true)
	cfg.Netns, cfg.NetnsPrefix, cfg.Subnet = true, netnsPrefix(), netnsSubnet()
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	hc := &http.Client{Timeout: 5 * time.Second}
	for i := range c.Len() {
		if _, err := complete(ctx, hc, "http://"+c.Pod(i).API, fmt.Sprintf("hello %d", i)); err != nil {
			t.Fatalf("via %s: %v", c.Pod(i).Name, err)
		}
	}
	// Cut pod 3 off: the others lose it from their mesh, the harness (the
	// Service's side of the bridge) still reaches it.
	if err := c.Partition(ctx, 2, true); err != nil {
		t.Fatal(err)
	}
	cut := c.Pod(2).Name
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, body, err := c.get(ctx, "http://"+c.Pod(0).Admin+"/debug/peers")
		if err == nil && st == 200 {
			ids, _ := peerIDs(body, c.Pod(0).Name)
			if len(missingPeers([]string{cut}, ids)) == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still in pod1's mesh 30s after the partition", cut)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := complete(ctx, hc, "http://"+c.Pod(2).API, "still served"); err != nil {
		t.Errorf("partitioned pod does not serve what reaches it: %v", err)
	}
	if err := c.Partition(ctx, 2, false); err != nil {
		t.Fatal(err)
	}
	if err := c.waitSidecar(ctx, 0); err != nil {
		t.Errorf("healed pod did not rejoin: %v", err)
	}
	c.Stop()
	drops, err := c.GuardDrops()
	if err != nil || drops != 0 {
		t.Errorf("egress guard: %d drops, %v; want 0, nil", drops, err)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	if strings.Contains(string(out), cfg.NetnsPrefix+"-") {
		t.Errorf("namespaces left after Stop:\n%s", out)
	}
	if exec.Command("iptables", "-w", "-n", "-L", guardChain(cfg.NetnsPrefix)).Run() == nil {
		t.Errorf("guard chain %s left after Stop", guardChain(cfg.NetnsPrefix))
	}
}

// A delay on a port slows exactly that port's packets: the simulator's
// answers take the delay longer, with netem or with the NFQUEUE delayer.
func TestNetnsPortDelay(t *testing.T) {
	needRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := testConfig(t, false)
	cfg.Netns, cfg.NetnsPrefix = true, netnsPrefix()+"d"
	cfg.Subnet = fmt.Sprintf("10.253.%d", 46+os.Getpid()%45) // apart from netnsSubnet and cmd/chaos tests
	cfg.Pods, cfg.StopGrace = 1, time.Second
	c, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	health := func() time.Duration {
		start := time.Now()
		st, _, err := c.get(ctx, c.Pod(0).SimURL+"/health")
		if err != nil || st != 200 {
			log, _ := os.ReadFile(c.LogPath(0, "sim"))
			t.Fatalf("health: %d, %v; sim log:\n%s", st, err, log)
		}
		return time.Since(start)
	}
	if err := c.net.GossipDelay(ctx, c.Pod(0).Name, c.Config().Ports.VLLM, 150*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The harness's keep-alive connection: the answer waits 150ms.
	if d := health(); d < 145*time.Millisecond {
		t.Errorf("delayed health check took %v; want >= 150ms", d)
	}
	if err := c.net.GossipDelay(ctx, c.Pod(0).Name, c.Config().Ports.VLLM, 0); err != nil {
		t.Fatal(err)
	}
	if d := health(); d > 140*time.Millisecond {
		t.Errorf("health check after clearing the delay took %v; want well under 150ms", d)
	}
	c.Stop()
	if _, err := c.GuardDrops(); err != nil {
		t.Errorf("teardown: %v", err)
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), cfg.NetnsPrefix+"-") {
		t.Errorf("namespaces left after Stop:\n%s", out)
	}
}
