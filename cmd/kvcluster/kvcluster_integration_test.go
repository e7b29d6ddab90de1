//go:build integration

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/chaos"
)

// TestDetachedCluster is `make cluster` and `make cluster-down` as the
// README uses them: a detached 3-pod mesh answers through its Service with
// x-kvroute-served-by, survives a killed pod, stops on `down`, and leaves
// its logs.
func TestDetachedCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := t.TempDir()
	if err := chaos.Build(ctx, bin, "kvcluster", chaos.SimBinary, chaos.SidecarBinary); err != nil {
		t.Skipf("cannot build the binaries: %v", err)
	}
	dir := t.TempDir()
	subnet := fmt.Sprintf("127.%d.242", 100+os.Getpid()%100)
	kv := filepath.Join(bin, "kvcluster")
	var out bytes.Buffer
	up := exec.CommandContext(ctx, kv, "--detach", "--bin", bin, "--dir", dir, "--subnet", subnet)
	up.Stdout, up.Stderr = &out, &out
	if err := up.Run(); err != nil {
		t.Fatalf("kvcluster --detach: %v\n%s", err, out.String())
	}
	t.Cleanup(func() { exec.Command(kv, "down", "--dir", dir).Run() }) // after a failure too
	service := "http://" + subnet + ".1:8000"
	for _, want := range []string{service, "http://" + subnet + ".4:9090", filepath.Join(dir, "logs"), "make cluster-down"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("kvcluster --detach printed\n%s\nwant %q in it", out.String(), want)
		}
	}

	// A connection per request, so the Service picks a pod for each.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	chatTo := func(base string) (int, string) {
		body := `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("content-type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("x-kvroute-served-by")
	}
	chat := func() (int, string) { return chatTo(service) }
	if code, pod := chat(); code != 200 || !strings.HasPrefix(pod, "pod") {
		t.Fatalf("chat through the Service: %d, served by %q; want 200 from a pod", code, pod)
	}
	resp, err := http.Post("http://"+subnet+".1:9000/pods/pod2/kill", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("kill pod2: %v %v", resp, err)
	}
	resp.Body.Close()
	// The killed pod leaves the Service's endpoints: every request succeeds
	// on the others.
	for range 10 {
		if code, pod := chat(); code != 200 || pod == "pod2" || pod == "" {
			t.Errorf("after pod2 was killed: %d, served by %q; want 200 from pod1 or pod3", code, pod)
		}
	}
	resp, err = http.Post("http://"+subnet+".1:9000/pods/pod2/restart", "", nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("restart pod2: %v %v", resp, err)
	}
	resp.Body.Close()
	if code, pod := chatTo("http://" + subnet + ".3:8000"); code != 200 || pod == "" {
		t.Errorf("pod2's sidecar after the restart: %d, served by %q; want 200", code, pod)
	}
	for range 10 {
		if code, _ := chat(); code != 200 {
			t.Errorf("after pod2's restart: status %d through the Service; want 200", code)
		}
	}

	var down bytes.Buffer
	stop := exec.CommandContext(ctx, kv, "down", "--dir", dir)
	stop.Stdout, stop.Stderr = &down, &down
	if err := stop.Run(); err != nil || !strings.Contains(down.String(), "stopped") {
		t.Fatalf("kvcluster down: %v\n%s", err, down.String())
	}
	if _, ok := running(dir); ok {
		t.Error("the cluster still runs after down")
	}
	for _, f := range []string{"pod1-sim.log", "pod3-sidecar.log"} {
		if st, err := os.Stat(filepath.Join(dir, "logs", f)); err != nil || st.Size() == 0 {
			t.Errorf("log %s after down: %v", f, err)
		}
	}
}
