package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/baseline"
	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/loadgen"
	"github.com/kvroute/kvroute/vllmsim"
)

// Policy names besides the baseline proxy's (baseline.Names).
const (
	// policyService: a Kubernetes Service straight to the simulators. The
	// load generator picks the pod at random per request itself: that is
	// chaos.Service (kube-proxy, random per connection) with one connection
	// per request, the many-clients case, minus a TCP splice, and it tells
	// us the serving pod, which the simulators do not report.
	policyService = "service"
	// policyKVRoute: the same Service in front of the kvroute sidecars; the
	// sidecars' x-kvroute-served-by header names the serving pod.
	policyKVRoute = "kvroute"
	// policyKVRouteRequests: kvroute weighing load by request count alone
	// (sidecar --route-load requests), the choice before load as prefill
	// work, for side-by-side runs.
	policyKVRouteRequests = "kvroute-requests"
	// policyKVRouteGPUOnly: kvroute crediting no lower-tier copy (sidecar
	// --cpu-load-rate 0 --disk-load-rate 0): the choice before tiers, on
	// pods that offload all the same.
	policyKVRouteGPUOnly = "kvroute-gpu-only"
	// policyKVRoutePinOnly: kvroute on pods of several data-parallel
	// ranks (--dp-ranks) without the pod's sidecar placing requests on
	// ranks by work (sidecar --dp-place-ranks=false): the mesh's pin to
	// the rank holding the prefix, and vLLM's own balancing of the rest.
	policyKVRoutePinOnly = "kvroute-pin-only"
)

// kvrouteArgs are the sidecar flags each kvroute policy adds to
// --sidecar-args; a policy not listed runs no sidecars.
var kvrouteArgs = map[string][]string{
	policyKVRoute:         nil,
	policyKVRouteRequests: {"--route-load", "requests"},
	policyKVRouteGPUOnly:  {"--cpu-load-rate", "0", "--disk-load-rate", "0"},
	policyKVRoutePinOnly:  {"--dp-place-ranks=false"},
}

// options is the parsed command line.
type options struct {
	Pods         int
	Workload     string
	Trace        string
	Policies     []string
	Rate         float64
	TimeScale    float64 // trace time compression
	Duration     time.Duration
	JSON         string
	Out          string
	Sweep        []float64 // rates, or time scales for a trace
	Seed         uint64
	BlocksPerPod int
	MaxRequests  int
	Concurrency  int
	// ClientRetry gives the load's clients the OpenAI SDKs' retries.
	ClientRetry bool
	// Slow runs the cluster in slow motion (slow.go); 1: real time.
	Slow float64
	// RequestIDs sends every request with X-Request-Id session.turn
	// (loadgen.RequestID), which the sidecars' logs name it by.
	RequestIDs bool
	Fill       float64
	BinDir     string
	Subnet     string
	// Drain bounds how long a run waits for answers after the last arrival.
	Drain time.Duration
	Quiet bool
	// Story plays the five-request scene on a 3-pod cluster before the
	// benchmark (story.go).
	Story bool
	// Grid, when set, lists directories of earlier runs to tabulate
	// instead of running (loadgen.ReadGrid).
	Grid []string
	// Build runs go build for the binaries in BinDir first.
	Build bool
	// SidecarArgs are added to every sidecar's command line.
	SidecarArgs []string
	// CPUTierGiB sizes each pod's CPU offload tier (vllm-sim
	// --kv-offloading-size; 0: none), OffloadBackend its producer
	// (--kv-offloading-backend: native or lmcache) and KVBytesPerBlock
	// the bytes of one block (--sim-kv-bytes-per-block; 0: the simulated
	// model's, 128 KiB per token).
	CPUTierGiB float64
	// DPRanks is each pod's data-parallel ranks (vllm-sim
	// --data-parallel-size, sidecar --kv-events-dp-ranks); 1: none.
	DPRanks         int
	OffloadBackend  string
	KVBytesPerBlock int
}

func allPolicies() []string {
	return append([]string{policyService, policyKVRoute, policyKVRouteRequests, policyKVRouteGPUOnly, policyKVRoutePinOnly}, baseline.Names...)
}

// parseFlags parses args; --help and --version print to stdout and return
// cli.ErrDone, a flag error is printed to stderr with the usage.
func parseFlags(args []string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	cli.Usage(fs, "kvbench [flags]",
		"Benchmarks kvroute against a plain Kubernetes Service and central routers on a local cluster\n"+
			"of simulated vLLM pods (vllm-sim, with a sidecar each for kvroute) on loopback addresses.\n"+
			"Every policy gets a fresh cluster and the same seeded schedule of requests. Prints a table\n"+
			"(prefix-cache hit rate, TTFT percentiles, balance) and writes results.json, results.md and\n"+
			"TTFT plots to --out; each cluster's logs stay in OUT/clusters/. Unless --build=false, it\n"+
			"first builds vllm-sim and sidecar into --bin (run it from the repository).\n\n"+
			"  kvbench --story --pods 4 --workload shared-prefix --policies service,kvroute --duration 20s\n"+
			"  kvbench --workload doc-qa --sweep 5,10,20 --policies service,least-loaded,kvroute\n"+
			"  kvbench --trace conversation_trace.jsonl --time-scale 2 --policies service,kvroute\n"+
			"  kvbench --grid out/grid   # tabulate the runs under out/grid, one cell per load, medians of seeds")
	var policies, sweep, grid string
	fs.IntVar(&o.Pods, "pods", 4, "simulated vLLM pods")
	fs.StringVar(&o.Workload, "workload", "shared-prefix", "one of "+strings.Join(loadgen.Workloads, ", ")+", or mooncake (with --trace)")
	fs.StringVar(&o.Trace, "trace", "", "Mooncake JSONL trace to replay (implies --workload mooncake)")
	fs.StringVar(&policies, "policies", "service,kvroute", "comma-separated, from: "+strings.Join(allPolicies(), ", "))
	fs.Float64Var(&o.Rate, "rate", 8, "offered load, requests per second (synthetic workloads)")
	fs.Float64Var(&o.TimeScale, "time-scale", 1, "trace time compression: 2 replays a trace twice as fast")
	fs.DurationVar(&o.Duration, "duration", 30*time.Second, "arrivals are sent during this long (a trace is cut there)")
	fs.StringVar(&o.JSON, "json", "", "write the results JSON here (default OUT/results.json)")
	fs.StringVar(&o.Out, "out", "out", "directory for results.json, results.md and the PNG plots")
	fs.StringVar(&grid, "grid", "", "comma-separated directories of earlier runs: print their results as one table (a row per workload, pods and load, medians over the seeds found; kvroute against central-precise, lmetric and its request-count self) and run nothing")
	fs.StringVar(&sweep, "sweep", "", "comma-separated offered loads to sweep (requests/s; time scales with --trace)")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the workload and of the Service's pod choice")
	fs.IntVar(&o.BlocksPerPod, "blocks-per-pod", 2048, "KV cache blocks of 16 tokens per pod (--num-gpu-blocks-override)")
	fs.IntVar(&o.MaxRequests, "max-requests", 0, "cap on requests per run (0: none)")
	fs.IntVar(&o.Concurrency, "concurrency", 256, "max requests in flight")
	fs.Float64Var(&o.Slow, "slow", 1, "slow motion: the simulators' clocks run at 1/K of the wall clock, arrivals and think times are K times apart and the sidecars' rates and push intervals scaled to match, so a run needs a K-th of the CPU a wall second and means the same in simulated time (results stay in simulated seconds); for a machine too small for the cluster, whose results.md calls the run CPU-bound")
	fs.BoolVar(&o.RequestIDs, "request-ids", false, "send every request with X-Request-Id SESSION.TURN, the id the sidecars' logs (--sidecar-args \"--log-level debug\": every decision with its candidates) and samples.jsonl name it by")
	fs.BoolVar(&o.ClientRetry, "client-retry", false, "clients retry as the OpenAI SDKs do: twice, after 0.5 s then 1 s (less up to 25% jitter), on 408, 409, 429, 5xx or a connection error before any answer; a request fails only when its retries did, and its times span every attempt (off: every refusal is a failure)")
	fs.Float64Var(&o.Fill, "fill", 0.73, "fraction of the cluster's KV cache the distinct prefixes occupy")
	fs.StringVar(&o.BinDir, "bin", "bin", "where the vllm-sim and sidecar binaries are built and found")
	fs.StringVar(&o.Subnet, "subnet", "127.0.90", "loopback /24 of the cluster (127.x.y): pods on .2.., the Service on .1")
	fs.DurationVar(&o.Drain, "drain", 60*time.Second, "how long to wait for answers after the last arrival")
	fs.BoolVar(&o.Quiet, "quiet", false, "no progress lines")
	fs.Func("sidecar-args", "space-separated flags added to every kvroute sidecar (e.g. '--text-prefix-keys 0')", func(s string) error {
		o.SidecarArgs = append(o.SidecarArgs, strings.Fields(s)...)
		return nil
	})
	fs.Float64Var(&o.CPUTierGiB, "cpu-tier-gib", 0, "CPU offload tier per pod in GiB (vllm-sim --kv-offloading-size; 0: none); at the simulated model's 2 MiB per 16-token block, 4 GiB per 2048 GPU blocks is a tier the size of the GPU cache")
	fs.StringVar(&o.OffloadBackend, "offload-backend", vllmsim.OffloadNative, "the CPU tier's producer with --cpu-tier-gib: native (stores and removals) or lmcache (stores only)")
	fs.IntVar(&o.KVBytesPerBlock, "kv-bytes-per-block", 0, "KV bytes per block for the tier's size and load time (vllm-sim --sim-kv-bytes-per-block; 0: the simulated model's)")
	fs.IntVar(&o.DPRanks, "dp-ranks", 1, "data-parallel ranks per pod, each with its own KV cache (vllm-sim --data-parallel-size, sidecar --kv-events-dp-ranks); the central baselines index one rank a pod, so above 1 only service and the kvroute policies run")
	fs.BoolVar(&o.Build, "build", true, "go build vllm-sim and sidecar into --bin first (cheap when they are up to date); false uses the binaries there as they are")
	fs.BoolVar(&o.Story, "story", false, "first play the scene: five requests sharing one long system prompt on 3 pods, through the plain Service, then through kvroute")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, d := range strings.Split(grid, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.Grid = append(o.Grid, d)
		}
	}
	if o.Trace != "" {
		o.Workload = "mooncake"
	}
	known := allPolicies()
	for _, p := range strings.Split(policies, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !slices.Contains(known, p) {
			return o, fmt.Errorf("--policies: unknown policy %q (have %s)", p, strings.Join(known, ", "))
		}
		if slices.Contains(o.Policies, p) {
			return o, fmt.Errorf("--policies: %q twice", p)
		}
		o.Policies = append(o.Policies, p)
	}
	for _, s := range strings.Split(sweep, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || v <= 0 {
			return o, fmt.Errorf("--sweep: %q is not a positive number", s)
		}
		o.Sweep = append(o.Sweep, v)
	}
	switch {
	case len(o.Policies) == 0:
		return o, errors.New("--policies: none given")
	case o.Pods < 1:
		return o, fmt.Errorf("--pods %d: want at least 1", o.Pods)
	case o.Workload == "mooncake" && o.Trace == "":
		return o, errors.New("--workload mooncake needs --trace FILE")
	case o.Workload != "mooncake" && !slices.Contains(loadgen.Workloads, o.Workload):
		return o, fmt.Errorf("--workload %q: want one of %s, or mooncake", o.Workload, strings.Join(loadgen.Workloads, ", "))
	case o.Rate <= 0 || o.TimeScale <= 0:
		return o, errors.New("--rate and --time-scale must be positive")
	case !(o.Slow >= 1):
		return o, errors.New("--slow must be at least 1 (1: real time)")
	case o.Duration <= 0:
		return o, errors.New("--duration must be positive")
	case o.BlocksPerPod < 64:
		return o, fmt.Errorf("--blocks-per-pod %d: want at least 64", o.BlocksPerPod)
	case o.Fill <= 0 || o.Fill > 4:
		return o, fmt.Errorf("--fill %v: want (0, 4]", o.Fill)
	case o.MaxRequests < 0 || o.Concurrency < 1:
		return o, errors.New("--max-requests must be >= 0 and --concurrency >= 1")
	case o.CPUTierGiB < 0 || o.CPUTierGiB != o.CPUTierGiB || o.KVBytesPerBlock < 0:
		return o, errors.New("--cpu-tier-gib and --kv-bytes-per-block must not be negative")
	case o.OffloadBackend != vllmsim.OffloadNative && o.OffloadBackend != vllmsim.OffloadLMCache:
		return o, fmt.Errorf("--offload-backend %q: want native or lmcache", o.OffloadBackend)
	case o.DPRanks < 1 || o.DPRanks > 8:
		return o, fmt.Errorf("--dp-ranks %d: want 1..8", o.DPRanks)
	}
	for _, p := range o.Policies {
		if _, kv := kvrouteArgs[p]; o.DPRanks > 1 && !kv && p != policyService {
			return o, fmt.Errorf("--dp-ranks %d: policy %s indexes one rank a pod; use service and the kvroute policies", o.DPRanks, p)
		}
	}
	if o.JSON == "" {
		o.JSON = o.Out + "/results.json"
	}
	return o, nil
}

// loads are the offered loads to run: the sweep, or the single --rate /
// --time-scale.
func (o options) loads() []float64 {
	if len(o.Sweep) > 0 {
		return o.Sweep
	}
	if o.Trace != "" {
		return []float64{o.TimeScale}
	}
	return []float64{o.Rate}
}

// blockSize is vLLM's default block size, which the simulators run with.
const blockSize = 16

// maxPromptTokens keeps every prompt, with its output, well inside one
// pod's KV cache (a request larger than the cache could never be
// scheduled) and within the simulator's context length (vLLM answers a
// longer one with 400: a property of the trace, not of routing).
func (o options) maxPromptTokens(maxOutput int) int {
	return min(o.BlocksPerPod*blockSize*3/4, vllmsim.DefaultConfig().MaxModelLen) - maxOutput
}

// dpArgs are the simulator's and the sidecars' flags of --dp-ranks.
func (o options) dpArgs() (sim, sidecar []string) {
	if o.DPRanks <= 1 {
		return nil, nil
	}
	n := strconv.Itoa(o.DPRanks)
	return []string{"--data-parallel-size", n}, []string{"--kv-events-dp-ranks", n}
}

// tierArgs are the simulator flags of the CPU tier (none without one).
func (o options) tierArgs() []string {
	if o.CPUTierGiB <= 0 {
		return nil
	}
	args := []string{"--kv-offloading-backend", o.OffloadBackend,
		"--kv-offloading-size", strconv.FormatFloat(o.CPUTierGiB, 'g', -1, 64)}
	if o.KVBytesPerBlock > 0 {
		args = append(args, "--sim-kv-bytes-per-block", strconv.Itoa(o.KVBytesPerBlock))
	}
	return args
}

// tierBlocks is each pod's CPU tier in blocks, as vllm-sim sizes it.
func (o options) tierBlocks() int {
	if o.CPUTierGiB <= 0 {
		return 0
	}
	bpb := o.KVBytesPerBlock
	if bpb <= 0 {
		bpb = vllmsim.KVBytesPerToken * blockSize
	}
	return int(o.CPUTierGiB * (1 << 30) / float64(bpb))
}

// workloadConfig is the synthetic workload sized to this cluster at rate.
func (o options) workloadConfig(rate float64) loadgen.Config {
	c := loadgen.DefaultConfig()
	c.Rate = rate
	c.Duration = o.Duration
	c.MaxRequests = o.MaxRequests
	c.CacheTokens = o.Pods * o.BlocksPerPod * blockSize
	c.Fill = o.Fill
	c.MaxPromptTokens = o.maxPromptTokens(int(c.Chat.OutputTokens.Max))
	// A document longer than a quarter of a pod's cache leaves too little
	// room for the others routed there.
	c.DocQA.DocTokens.Max = min(c.DocQA.DocTokens.Max, float64(o.BlocksPerPod*blockSize/4))
	c.DocQA.DocTokens.Mean = min(c.DocQA.DocTokens.Mean, (c.DocQA.DocTokens.Min+c.DocQA.DocTokens.Max)/2)
	return c
}
