package chaos

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWithDefaults(t *testing.T) {
	long := "/" + strings.Repeat("d", 100)
	tests := []struct {
		name    string
		cfg     ClusterConfig
		wantErr bool
	}{
		{"zero but dir", ClusterConfig{Dir: "/tmp/x"}, false},
		{"no dir", ClusterConfig{}, true},
		{"too many pods", ClusterConfig{Dir: "/tmp/x", Pods: 254}, true},
		{"negative pods", ClusterConfig{Dir: "/tmp/x", Pods: -1}, true},
		{"subnet not loopback", ClusterConfig{Dir: "/tmp/x", Subnet: "10.0.0"}, true},
		{"subnet four octets", ClusterConfig{Dir: "/tmp/x", Subnet: "127.0.0.1"}, true},
		{"subnet octet range", ClusterConfig{Dir: "/tmp/x", Subnet: "127.0.300"}, true},
		{"other subnet", ClusterConfig{Dir: "/tmp/x", Subnet: "127.0.77"}, false},
		{"encoding", ClusterConfig{Dir: "/tmp/x", Sim: SimConfig{Encoding: "json"}}, true},
		{"dir too long for ipc", ClusterConfig{Dir: long}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.withDefaults()
			if (err != nil) != tt.wantErr {
				t.Fatalf("withDefaults() error = %v; want error %v", err, tt.wantErr)
			}
			if err != nil {
				if !errors.Is(err, ErrConfig) {
					t.Errorf("error %v is not ErrConfig", err)
				}
				return
			}
			if got.Pods != 3 || got.Ports.API != 8000 || got.Ports.VLLM != 8001 || got.Progress == nil {
				t.Errorf("withDefaults() = %+v; defaults not filled", got)
			}
		})
	}
}

func TestPodAddresses(t *testing.T) {
	cfg, err := ClusterConfig{Dir: "/w", Pods: 3, Model: "m"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.pod(1)
	want := PodInfo{
		Index: 1, Name: "pod2", Host: "127.0.0.3",
		API: "127.0.0.3:8000", Admin: "127.0.0.3:9090", Gossip: "127.0.0.3:7946",
		SimAddr: "127.0.0.3:8001", SimURL: "http://127.0.0.3:8001",
		Events: "ipc:///w/sock/pod2-events", Replay: "ipc:///w/sock/pod2-replay", Topic: "kv@pod2@m",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("pod(1) mismatch (-want +got):\n%s", d)
	}
}

func TestSimArgs(t *testing.T) {
	cfg, err := ClusterConfig{Dir: "/w", Model: "m", Sim: SimConfig{NumGPUBlocks: 500, TimeScale: 4, ExtraArgs: []string{"--sim-echo"}}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.simArgs(cfg.pod(0))
	want := []string{
		"--host", "127.0.0.2", "--port", "8001", "--served-model-name", "m", "--block-size", "16",
		"--prefix-caching-hash-algo", "fast",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"ipc:///w/sock/pod1-events","replay_endpoint":"ipc:///w/sock/pod1-replay","topic":"kv@pod1@m"}`,
		"--kv-events-encoding", "map", "--sim-time-scale", "4",
		"--num-gpu-blocks-override", "500", "--sim-echo",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("simArgs mismatch (-want +got):\n%s", d)
	}
}

func TestSidecarArgsJoinFirstTwo(t *testing.T) {
	cfg, err := ClusterConfig{Dir: "/w", Pods: 4, Model: "m", Sidecars: true}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	args := cfg.sidecarArgs(cfg.pod(3))
	i := slices.Index(args, "--join")
	if i < 0 || args[i+1] != "127.0.0.2:7946,127.0.0.3:7946" {
		t.Errorf("sidecarArgs --join = %v; want the first two pods' gossip addresses", args)
	}
	if args[0] != "serve" || !slices.Contains(args, "pod4") || !slices.Contains(args, "http://127.0.0.5:8001") {
		t.Errorf("sidecarArgs = %v", args)
	}
}

func TestPodSidecarArgs(t *testing.T) {
	cfg, err := ClusterConfig{Dir: "/w", Pods: 3, Model: "m", Sidecars: true, SidecarArgs: []string{"--routing-stride", "4"},
		PodSidecarArgs: [][]string{{"--routing-stride", "16"}, nil}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"16", "4", "16"} {
		args := cfg.sidecarArgs(cfg.pod(i))
		if got := args[len(args)-1]; got != want {
			t.Errorf("pod %d's sidecar ends with %v; want the stride %s last", i, args[len(args)-4:], want)
		}
	}
}

func TestChildEnvDropsSeedAndTwins(t *testing.T) {
	got := childEnv([]string{"PATH=/bin", "PYTHONHASHSEED=0", "KVROUTE_MODEL=x", "HOME=/h"})
	if d := cmp.Diff([]string{"PATH=/bin", "HOME=/h"}, got); d != "" {
		t.Errorf("childEnv mismatch (-want +got):\n%s", d)
	}
}

func TestPeerIDsAndMissing(t *testing.T) {
	body := []byte(`[{"id":"pod1","local":true},{"id":"pod3"},{"id":"","local":false}]`)
	ids, err := peerIDs(body, "pod2")
	if err != nil {
		t.Fatal(err)
	}
	// The local entry counts as self, whatever id it carries.
	if d := cmp.Diff([]string{"pod2", "pod3", ""}, ids); d != "" {
		t.Errorf("peerIDs mismatch (-want +got):\n%s", d)
	}
	if got := missingPeers([]string{"pod1", "pod2", "pod3"}, ids); !slices.Equal(got, []string{"pod1"}) {
		t.Errorf("missingPeers = %v; want [pod1]", got)
	}
	if _, err := peerIDs([]byte(`{"not":"an array"}`), "pod1"); err == nil {
		t.Error("peerIDs accepted an object")
	}
}

func TestPodCPUs(t *testing.T) {
	c := ClusterConfig{PodCPUs: []string{"0", "1"}}
	for i, want := range []string{"0", "1", "0"} {
		if got := c.podCPUs(i); got != want {
			t.Errorf("podCPUs(%d) = %q; want %q", i, got, want)
		}
	}
	if got := (ClusterConfig{}).podCPUs(3); got != "" {
		t.Errorf("no PodCPUs: podCPUs = %q; want none", got)
	}
}

// A sidecar's CPUs are SidecarCPUs when set, else its pod's; Pinned runs a
// command under taskset only when there are CPUs to pin to.
func TestSidecarCPUsAndPinned(t *testing.T) {
	c := ClusterConfig{PodCPUs: []string{"0", "1"}}
	if got := c.SidecarCPUsOf(1); got != "1" {
		t.Errorf("SidecarCPUsOf(1) = %q; want the pod's 1", got)
	}
	c.SidecarCPUs = "1"
	if got := c.SidecarCPUsOf(0); got != "1" {
		t.Errorf("SidecarCPUsOf(0) with SidecarCPUs = %q; want 1", got)
	}
	if bin, args := Pinned("", "x", []string{"-a"}); bin != "x" || !slices.Equal(args, []string{"-a"}) {
		t.Errorf("Pinned unpinned = %s %q", bin, args)
	}
	if bin, args := Pinned("0,1", "x", []string{"-a"}); bin != "taskset" || !slices.Equal(args, []string{"-c", "0,1", "x", "-a"}) {
		t.Errorf("Pinned = %s %q", bin, args)
	}
}
