//go:build integration

package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var subnets atomic.Int32

// testSubnet gives each cluster its own 127.x.y so that clusters of
// parallel test binaries (other packages, other engineers) do not share
// ports.
func testSubnet() string {
	return fmt.Sprintf("127.%d.%d", 100+os.Getpid()%100, 10+subnets.Add(1))
}

// shortDir is a temp dir with a path short enough for ipc:// sockets
// (t.TempDir embeds the test name).
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "chaos")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// progress writes the harness's lines to the test log.
type progress struct{ t *testing.T }

func (p progress) Write(b []byte) (int, error) {
	p.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// testConfig is the tests' 3-pod cluster: fast simulated time, a short
// stop grace, its own subnet and directory.
func testConfig(t *testing.T, sidecars bool) ClusterConfig {
	cfg := LocalConfig()
	cfg.Dir = shortDir(t)
	cfg.Subnet = testSubnet()
	cfg.Sidecars = sidecars
	cfg.StopGrace = 2 * time.Second
	cfg.Sim.NumGPUBlocks = 2000
	cfg.Sim.TimeScale = 50
	cfg.Progress = progress{t}
	return cfg
}

func startCluster(t *testing.T, sidecars bool) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, testConfig(t, sidecars))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func complete(ctx context.Context, c *http.Client, url, prompt string) (string, error) {
	body := fmt.Sprintf(`{"model":"sim-model","prompt":%q,"max_tokens":4}`, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	return string(b), nil
}

// cachedPods returns which pods' simulators hold any block.
func cachedPods(t *testing.T, c *Cluster) []int {
	t.Helper()
	var out []int
	for i := range c.Len() {
		sc, err := c.SimCache(context.Background(), i)
		if err != nil {
			t.Fatal(err)
		}
		if len(sc.Blocks) > 0 {
			out = append(out, i)
		}
	}
	return out
}

func TestClusterSimsThroughService(t *testing.T) {
	c := startCluster(t, false)
	svc, err := ListenService(ServiceConfig{Addr: c.ServiceAddr(0), Backends: c.SimAddrs(), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 30 {
		// Long enough for a few full blocks, distinct per request.
		prompt := strings.Repeat(fmt.Sprintf("request %d says hello. ", i), 20)
		if _, err := complete(ctx, hc, svc.URL(), prompt); err != nil {
			t.Fatal(err)
		}
	}
	counts, failed := svc.Counts()
	if failed != 0 || len(counts) != 3 {
		t.Fatalf("Service counts %v, %d failed; want all 3 pods, none failed", counts, failed)
	}
	if got := cachedPods(t, c); len(got) != 3 {
		t.Errorf("pods with cached blocks = %v; want all 3", got)
	}
}

func TestClusterKillPauseRestartStop(t *testing.T) {
	c := startCluster(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 5 * time.Second}
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	if sim, _ := c.Running(1); sim {
		t.Fatal("pod 1 sim still running after Kill")
	}
	if _, err := complete(ctx, hc, c.Pod(1).SimURL, "hello"); err == nil {
		t.Fatal("killed pod answered")
	}
	if _, err := complete(ctx, hc, c.Pod(0).SimURL, "hello"); err != nil {
		t.Fatalf("pod 0 after killing pod 1: %v", err)
	}

	if err := c.PauseSim(2); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := complete(short, hc, c.Pod(2).SimURL, "hello")
	cancelShort()
	if err == nil {
		t.Fatal("paused pod answered")
	}
	if err := c.ResumeSim(2); err != nil {
		t.Fatal(err)
	}
	if _, err := complete(ctx, hc, c.Pod(2).SimURL, "hello"); err != nil {
		t.Fatalf("resumed pod: %v", err)
	}

	if err := c.Restart(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := complete(ctx, hc, c.Pod(1).SimURL, "hello"); err != nil {
		t.Fatalf("restarted pod: %v", err)
	}
	log, err := os.ReadFile(c.LogPath(1, "sim"))
	if err != nil || bytes.Count(log, []byte("# chaos: ")) < 3 {
		t.Errorf("pod 1 log lacks start/exit/start markers: %q", log)
	}

	// Pause again so Stop has to wake a stopped process.
	if err := c.PauseSim(0); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { c.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("Stop did not return")
	}
	for i := range c.Len() {
		if sim, sc := c.Running(i); sim || sc {
			t.Errorf("pod %d still running after Stop", i)
		}
		for _, e := range []string{c.Pod(i).Events, c.Pod(i).Replay} {
			if _, err := os.Stat(strings.TrimPrefix(e, "ipc://")); err == nil {
				t.Errorf("socket %s left after Stop", e)
			}
		}
	}
	if err := c.Kill(0); err != ErrStopped {
		t.Errorf("Kill after Stop = %v; want ErrStopped", err)
	}
}

func TestClusterStartProxy(t *testing.T) {
	c := startCluster(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	px, err := c.StartProxy(ctx, "chwbl", c.ServiceAddr(18000), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	hc := &http.Client{Timeout: 5 * time.Second}
	served := map[string]int{}
	for i := range 12 {
		for range 2 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL()+"/v1/completions",
				strings.NewReader(fmt.Sprintf(`{"model":"sim-model","prompt":"conversation %d","max_tokens":2}`, i)))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			served[fmt.Sprint(i, resp.Header.Get("X-Kvroute-Served-By"))]++
		}
	}
	// chwbl on an idle cluster: both requests of a conversation on one pod.
	if len(served) != 12 {
		t.Errorf("12 conversations x 2 requests landed as %v; want each conversation on one pod", served)
	}
}

func TestClusterWithSidecars(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 processes and waits for a mesh")
	}
	c := startCluster(t, true)
	svc, err := ListenService(ServiceConfig{Addr: c.ServiceAddr(0), Backends: c.APIAddrs(), Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 30 {
		prompt := strings.Repeat(fmt.Sprintf("conversation %d says hello. ", i), 20)
		if _, err := complete(ctx, hc, svc.URL(), prompt); err != nil {
			t.Fatal(err)
		}
	}
	if counts, failed := svc.Counts(); failed != 0 || len(counts) != 3 {
		t.Errorf("Service counts %v, %d failed; want all 3 sidecars", counts, failed)
	}
	// Distinct prefixes spread by rendezvous: every simulator served some.
	if got := cachedPods(t, c); len(got) != 3 {
		t.Errorf("pods with cached blocks = %v; want all 3", got)
	}
	if err := c.Kill(2); err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(c.APIAddrs()[:2])
	if _, err := complete(ctx, hc, svc.URL(), "after the kill"); err != nil {
		t.Errorf("request after killing a pod: %v", err)
	}
	// Restart waits until every sidecar sees the returning pod again.
	if err := c.Restart(ctx, 2); err != nil {
		t.Fatal(err)
	}
	svc.SetBackends(c.APIAddrs())
	if _, err := complete(ctx, hc, "http://"+c.Pod(2).API, "after the restart"); err != nil {
		t.Errorf("request to the restarted pod: %v", err)
	}
}
