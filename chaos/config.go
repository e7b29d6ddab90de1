package chaos

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// ClusterConfig describes a local cluster. Start from LocalConfig; zero
// fields take the defaults their comments name.
type ClusterConfig struct {
	// Pods is the number of simulated pods (default 3). The subnet limits it
	// to 253.
	Pods int
	// Dir holds the event sockets (Dir/sock) and the logs (Dir/logs). It is
	// required: a test passes t.TempDir(). The ipc:// socket paths must fit
	// in 107 bytes, so keep it short.
	Dir string
	// BinDir holds the vllm-sim, sidecar and kvproxy binaries. A binary
	// missing there is built into it from the module source; "" means
	// DefaultBinDir(), rebuilt once per process (the Go build cache makes
	// that cheap), so a benchmark never runs stale code.
	BinDir string
	// Model is the served model name (default "sim-model").
	Model string
	// Subnet is the first three octets of the pods' loopback addresses
	// (default "127.0.0"): pod i listens on Subnet.(i+2), the Service on
	// Subnet.1. Linux routes all of 127.0.0.0/8 to lo, so a test can take
	// its own subnet and not collide with a cluster another test runs.
	Subnet string
	// Ports are the per-pod ports, as in the Kubernetes manifests.
	Ports Ports
	// Sim sizes every simulated vLLM.
	Sim SimConfig
	// Sidecars starts a kvroute sidecar in every pod and waits for the full
	// mesh. Without it only the simulators run (the baseline policies need
	// nothing else).
	Sidecars bool
	// SidecarArgs are appended to every sidecar's command line.
	SidecarArgs []string
	// PodSidecarArgs, when set, are appended to pod i's sidecar command
	// line after SidecarArgs (a flag given twice takes the later value) as
	// PodSidecarArgs[i % len]: a mesh whose pods are configured apart, as
	// during a rolling change of a flag. Empty: none.
	PodSidecarArgs [][]string
	// SidecarBins, when set, names pod i's sidecar binary as
	// SidecarBins[i % len] ("" there: BinDir's), for a mesh of mixed
	// versions (BuildSidecarAt builds an earlier one); UpgradeSidecar
	// moves a pod to BinDir's. Empty: every pod runs BinDir's.
	SidecarBins []string
	// SidecarCPUs, when set, pins every sidecar to these CPUs (a taskset
	// list such as "1"), as a pod's own CPU request would keep it off the
	// cores vLLM and the clients use. Empty: no pinning.
	SidecarCPUs string
	// PodCPUs, when set, pins pod i's simulator and sidecar to
	// PodCPUs[i % len] (taskset lists), as if each pod had a node of its
	// own: a pod's sidecar beside its engine, another pod's elsewhere.
	// SidecarCPUs, if also set, wins for the sidecars. Empty: no pinning.
	PodCPUs []string
	// SidecarEnv is added to every sidecar's environment ("GOMAXPROCS=1"),
	// as a container's env would be; the simulators don't get it.
	SidecarEnv []string
	// SimEnv is added to every simulator's environment, as vLLM's
	// container env ("VLLM_ENABLE_RESPONSES_API_STORE=1"); the sidecars
	// don't get it.
	SimEnv []string
	// Progress receives one line per step (build, pod ready, mesh formed).
	// nil means io.Discard.
	Progress io.Writer
	// ReadyTimeout bounds Start and Restart: every process healthy and the
	// mesh complete. Default 30s; the simulator starts in milliseconds, the
	// mesh needs a few gossip rounds.
	ReadyTimeout time.Duration
	// StopGrace is how long a SIGTERMed process may take to exit before it
	// is SIGKILLed. Default 5s: the simulator drains open requests, the
	// sidecar leaves the mesh. Shorter makes test teardown faster.
	StopGrace time.Duration
	// PollInterval is how often readiness is polled (default 50ms).
	PollInterval time.Duration
	// Netns runs every pod in its own network namespace (see Netns) with
	// Subnet as the bridge's /24 (default "10.253.0"): killing a pod
	// removes a real address, partitions and gossip faults become
	// possible. Needs root. NetnsPrefix names everything it creates
	// (default "kvc"); two clusters at once need two prefixes and subnets.
	Netns       bool
	NetnsPrefix string
}

// Ports are a pod's ports. Zero fields take the Kubernetes values.
type Ports struct {
	API    int // sidecar OpenAI API (default 8000)
	Admin  int // sidecar admin: /readyz, /debug/peers, /metrics (default 9090)
	Gossip int // memberlist, UDP and TCP (default 7946)
	VLLM   int // the simulator (default 8001)
}

// SimConfig sizes the simulated vLLM of every pod. Zero fields are left to
// the simulator's defaults (an H100 running Llama-3.1-8B), except where noted.
type SimConfig struct {
	// BlockSize is tokens per KV block (default 16, vLLM's).
	BlockSize int
	// NumGPUBlocks is the KV capacity per pod (--num-gpu-blocks-override).
	NumGPUBlocks int
	// MaxNumSeqs, MaxNumBatchedTokens and MaxModelLen are vLLM's scheduler
	// limits.
	MaxNumSeqs          int
	MaxNumBatchedTokens int
	MaxModelLen         int
	// TimeScale runs simulated time faster than wall time (default 1).
	TimeScale float64
	// Encoding is the KV-event wire encoding, "map" (vLLM >= 0.26, default)
	// or "array".
	Encoding string
	// ExtraArgs are appended to the simulator's command line.
	ExtraArgs []string
}

// LocalConfig returns a 3-pod, simulator-only configuration with short
// timeouts for tests on one machine. Dir must still be set.
func LocalConfig() ClusterConfig {
	return ClusterConfig{
		Pods:         3,
		Model:        "sim-model",
		Subnet:       "127.0.0",
		Ports:        Ports{API: 8000, Admin: 9090, Gossip: 7946, VLLM: 8001},
		Sim:          SimConfig{BlockSize: 16, TimeScale: 1, Encoding: "map"},
		ReadyTimeout: 30 * time.Second,
		StopGrace:    5 * time.Second,
		PollInterval: 50 * time.Millisecond,
	}
}

// ErrConfig reports a ClusterConfig that cannot describe a cluster.
var ErrConfig = errors.New("invalid cluster config")

// withDefaults fills zero fields from LocalConfig and validates the rest.
func (c ClusterConfig) withDefaults() (ClusterConfig, error) {
	d := LocalConfig()
	if c.Pods == 0 {
		c.Pods = d.Pods
	}
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Subnet == "" {
		c.Subnet = d.Subnet
		if c.Netns {
			c.Subnet = "10.253.0"
		}
	}
	if c.NetnsPrefix == "" {
		c.NetnsPrefix = "kvc"
	}
	if c.Ports.API == 0 {
		c.Ports.API = d.Ports.API
	}
	if c.Ports.Admin == 0 {
		c.Ports.Admin = d.Ports.Admin
	}
	if c.Ports.Gossip == 0 {
		c.Ports.Gossip = d.Ports.Gossip
	}
	if c.Ports.VLLM == 0 {
		c.Ports.VLLM = d.Ports.VLLM
	}
	if c.Sim.BlockSize == 0 {
		c.Sim.BlockSize = d.Sim.BlockSize
	}
	if c.Sim.TimeScale == 0 {
		c.Sim.TimeScale = d.Sim.TimeScale
	}
	if c.Sim.Encoding == "" {
		c.Sim.Encoding = d.Sim.Encoding
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.ReadyTimeout <= 0 {
		c.ReadyTimeout = d.ReadyTimeout
	}
	if c.StopGrace <= 0 {
		c.StopGrace = d.StopGrace
	}
	if c.PollInterval <= 0 {
		c.PollInterval = d.PollInterval
	}
	switch {
	case c.Pods < 1 || c.Pods > 253:
		return c, fmt.Errorf("%w: pods %d not in 1..253", ErrConfig, c.Pods)
	case c.Dir == "":
		return c, fmt.Errorf("%w: dir is required", ErrConfig)
	case !c.Netns && !validSubnet(c.Subnet):
		return c, fmt.Errorf("%w: subnet %q is not 127.x.y", ErrConfig, c.Subnet)
	case c.Netns && (!validOctets(c.Subnet) || strings.HasPrefix(c.Subnet, "127.")):
		return c, fmt.Errorf("%w: netns subnet %q is not a.b.c outside 127/8", ErrConfig, c.Subnet)
	case c.Netns && !validPrefix(c.NetnsPrefix):
		return c, fmt.Errorf("%w: netns prefix %q: want 2-6 of [a-z0-9]", ErrConfig, c.NetnsPrefix)
	case c.Sim.Encoding != "map" && c.Sim.Encoding != "array":
		return c, fmt.Errorf("%w: encoding %q", ErrConfig, c.Sim.Encoding)
	}
	// sun_path is 108 bytes with the terminating NUL; the longest socket
	// name is "<dir>/sock/pod253-replay".
	if n := len(c.Dir) + len("/sock/pod253-replay"); n > 107 {
		return c, fmt.Errorf("%w: dir %q too long for ipc socket paths (%d > 107 bytes)", ErrConfig, c.Dir, n)
	}
	return c, nil
}

func validSubnet(s string) bool { return strings.HasPrefix(s, "127.") && validOctets(s) }

// PodInfo is where pod i's processes listen.
type PodInfo struct {
	Index int
	Name  string // "pod<i+1>": the sidecar's node name
	Host  string // its loopback address
	// API is the sidecar's OpenAI address host:port (what the Service
	// targets), Admin its admin address, Gossip its memberlist address.
	API, Admin, Gossip string
	// SimAddr is the simulator's host:port and SimURL its base URL.
	SimAddr, SimURL string
	// Events and Replay are the simulator's KV-event PUB and replay ROUTER
	// endpoints (ipc://), Topic the topic it publishes under.
	Events, Replay, Topic string
}

// pod computes pod i's addresses at start; it has no side effects.
func (c ClusterConfig) pod(i int) PodInfo {
	return c.podAt(i, i+2, fmt.Sprintf("pod%d", i+1))
}

// podAt is pod i's addresses on host Subnet.hostNum under name: a replaced
// pod gets a new name and a new address, as a Deployment's new pod does.
func (c ClusterConfig) podAt(i, hostNum int, name string) PodInfo {
	host := fmt.Sprintf("%s.%d", c.Subnet, hostNum)
	hp := func(p int) string { return net.JoinHostPort(host, strconv.Itoa(p)) }
	sim := hp(c.Ports.VLLM)
	return PodInfo{
		Index:   i,
		Name:    name,
		Host:    host,
		API:     hp(c.Ports.API),
		Admin:   hp(c.Ports.Admin),
		Gossip:  hp(c.Ports.Gossip),
		SimAddr: sim,
		SimURL:  "http://" + sim,
		Events:  "ipc://" + c.Dir + "/sock/" + name + "-events",
		Replay:  "ipc://" + c.Dir + "/sock/" + name + "-replay",
		Topic:   "kv@" + name + "@" + c.Model,
	}
}

// simArgs is pod p's vllm-sim command line (vLLM's flag names).
func (c ClusterConfig) simArgs(p PodInfo) []string {
	events := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":%q,"replay_endpoint":%q,"topic":%q}`,
		p.Events, p.Replay, p.Topic)
	args := []string{
		"--host", p.Host,
		"--port", strconv.Itoa(c.Ports.VLLM),
		"--served-model-name", c.Model,
		"--block-size", strconv.Itoa(c.Sim.BlockSize),
		"--prefix-caching-hash-algo", "fast",
		"--kv-events-config", events,
		"--kv-events-encoding", c.Sim.Encoding,
		"--sim-time-scale", strconv.FormatFloat(c.Sim.TimeScale, 'g', -1, 64),
	}
	opt := func(flag string, v int) {
		if v > 0 {
			args = append(args, flag, strconv.Itoa(v))
		}
	}
	opt("--num-gpu-blocks-override", c.Sim.NumGPUBlocks)
	opt("--max-num-seqs", c.Sim.MaxNumSeqs)
	opt("--max-num-batched-tokens", c.Sim.MaxNumBatchedTokens)
	opt("--max-model-len", c.Sim.MaxModelLen)
	return append(args, c.Sim.ExtraArgs...)
}

// sidecarArgs is pod p's `sidecar serve` command line. Every sidecar joins
// through the first two pods, as a headless Service's first addresses would.
func (c ClusterConfig) sidecarArgs(p PodInfo) []string {
	var seeds []string
	for i := 0; i < c.Pods && i < 2; i++ {
		seeds = append(seeds, c.pod(i).Gossip)
	}
	return c.sidecarArgsJoin(p, seeds)
}

// sidecarArgsJoin is sidecarArgs with the given seeds.
func (c ClusterConfig) sidecarArgsJoin(p PodInfo, seeds []string) []string {
	args := []string{
		"serve",
		"--listen", p.API,
		"--admin-listen", p.Admin,
		"--vllm-url", p.SimURL,
		"--model", c.Model,
		"--kv-events-endpoint", p.Events,
		"--kv-events-replay-endpoint", p.Replay,
		"--kv-events-topic", p.Topic,
		"--node-name", p.Name,
		"--advertise-addr", p.Host,
		"--gossip-port", strconv.Itoa(c.Ports.Gossip),
		"--join", strings.Join(seeds, ","),
		"--block-size", strconv.Itoa(c.Sim.BlockSize),
		"--log-format", "json",
	}
	args = append(args, c.SidecarArgs...)
	if len(c.PodSidecarArgs) > 0 {
		args = append(args, c.PodSidecarArgs[p.Index%len(c.PodSidecarArgs)]...)
	}
	return args
}

// podCPUs is the taskset list pod i runs on (PodCPUs), "" for none.
func (c ClusterConfig) podCPUs(i int) string {
	if len(c.PodCPUs) == 0 {
		return ""
	}
	return c.PodCPUs[i%len(c.PodCPUs)]
}

// SidecarCPUsOf is the taskset list pod i's sidecar is pinned to ("": not
// pinned): SidecarCPUs when set, else the pod's PodCPUs.
func (c ClusterConfig) SidecarCPUsOf(i int) string {
	if c.SidecarCPUs != "" {
		return c.SidecarCPUs
	}
	return c.podCPUs(i)
}

// Pinned is bin's command line run on cpus (a taskset list; "": as it is).
// taskset execs bin in its own process, so signals still reach it.
func Pinned(cpus, bin string, args []string) (string, []string) {
	if cpus == "" {
		return bin, args
	}
	return "taskset", append([]string{"-c", cpus, bin}, args...)
}
