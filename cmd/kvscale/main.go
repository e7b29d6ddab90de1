// Command kvscale measures what kvroute's cache-state mesh costs as the
// number of pods grows, and extrapolates it to 256 and 1000 pods.
//
//	kvscale --sizes 16,32,64 --out out/scale
//
// For every N in --sizes it runs scale.Run: N real nodes in this process
// on loopback (kvindex, cachestate, gossip.Mesh over real memberlist,
// route.DefaultChain), each fed by a simulated LRU engine that stores and
// evicts --blocks-per-second blocks. It prints a table per N to stdout,
// progress to stderr, and writes results.json, results.md and
// traffic.png to --out. The results.md "model" section fits every measure
// against N with scale.FitLinear, extrapolates it to 256 and 1000 pods,
// and compares it to its target (PASS/FAIL), with the N where the fitted
// line crosses the target.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/scale"
)

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// options is the parsed command line.
type options struct {
	Sizes              []int
	Warmup, Window     time.Duration
	CapacityBlocks     int
	RoutingStride      int
	CPUBlocks          int
	TierStride         int
	BlocksPerSecond    float64
	Slow               float64
	NoShortlist        bool
	WarmCaches         bool
	RebuildRemoved     int
	FullDigestInterval time.Duration
	DigestInterval     time.Duration
	FPRate             float64
	Requests           int
	// Trace is a Mooncake JSON-lines trace to replay instead of the
	// synthetic one; TraceBlockTokens its tokens per hash id.
	Trace            string
	TraceBlockTokens int
	Repeats          int
	Seed             uint64
	Addr             string
	BasePort         int
	Out              string
	Plot             bool
	// From re-renders an earlier results.json instead of running.
	From string
	// CPUProfile, if set, is where the whole run's CPU profile goes: what
	// the mesh's upkeep costs where the machine runs out of cores.
	CPUProfile string
}

// envName is a flag's environment twin: KVSCALE_<NAME>.
func envName(flagName string) string {
	return "KVSCALE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args; --help and --version print to stdout and return
// cli.ErrDone, a flag error is printed to stderr with the usage. A flag not
// on the command line takes its KVSCALE_<NAME> twin from getenv when set.
func parseFlags(args []string, getenv func(string) string, stdout, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("kvscale", flag.ContinueOnError)
	cli.Usage(fs, "kvscale [flags]",
		"Measures kvroute's cache-state mesh at several cluster sizes: N real sidecar nodes\n"+
			"(kvindex, cachestate, gossip over real memberlist, the default route chain) in one\n"+
			"process on loopback, each with a simulated engine storing and evicting blocks.\n"+
			"Per N: traffic per node by kind, stored and evicted block propagation, choice time\n"+
			"for a 32k-token prompt, heap per node, a joining node's pull, and hit rate against a\n"+
			"central exact index. Fits each measure against N, extrapolates to 256 and 1000 pods\n"+
			"and judges it against its target. Writes results.json, results.md and traffic.png\n"+
			"to --out; the table goes to stdout, progress to stderr.\n"+
			"Every flag has an environment twin KVSCALE_<NAME> (e.g. --sizes: KVSCALE_SIZES);\n"+
			"a flag on the command line wins over its twin.\n\n"+
			"  kvscale --sizes 16,32,64 --out out/scale")
	sizes := "16,32,64"
	fs.Func("sizes", "comma-separated cluster sizes N to run, in order (default 16,32,64)", func(s string) error {
		sizes = s
		return nil
	})
	fs.DurationVar(&o.Warmup, "warmup", 0, "load before measuring; 0: long enough for every engine's cache to fill (1.15 × capacity-blocks / blocks-per-second + 5s), so the window stores and evicts")
	fs.DurationVar(&o.Window, "window", 20*time.Second, "measured span per N")
	fs.IntVar(&o.CapacityBlocks, "capacity-blocks", 20000, "each simulated engine's KV cache in vLLM blocks (also the digests' sizing, over the routing stride)")
	fs.IntVar(&o.RoutingStride, "routing-stride", blockkey.DefaultScheme().Stride, "vLLM blocks per routing key, the sidecar's --routing-stride: the digests carry one key per this many blocks stored (runs before this flag routed by every block: 1)")
	fs.IntVar(&o.CPUBlocks, "cpu-blocks", 0, "a CPU offload tier of this many blocks behind each engine's GPU cache, sending vLLM's native offload events (GPU evictions stored there, its own evictions removed); the GPU's churn is the same, so the difference is the tier's upkeep and memory; 0: none")
	fs.IntVar(&o.TierStride, "tier-stride", 0, "with --cpu-blocks, one lower-tier digest entry per this many routing keys (the sidecar's --tier-stride: 1, 2, 4, 8 or 16); 0: the index's default (kvindex.DefaultTierStride)")
	fs.Float64Var(&o.BlocksPerSecond, "blocks-per-second", 200, "vLLM blocks each node stores (and, with a full cache, evicts) per second")
	fs.Float64Var(&o.Slow, "slow", 1, "slow motion: each node's mesh runs K times slower on the wall clock (a K-th of the blocks a second, every interval, timeout and TTL of the mesh, memberlist and the choice K times longer), for a K-th of the CPU a wall second, and results are reported in the mesh's own time; for sizes the machine cannot run at 1 (a run then takes K times as long)")
	fs.DurationVar(&o.FullDigestInterval, "full-digest-interval", 0, "gossip's full-digest interval; 0 keeps gossip's default (gossip.DefaultConfig: 1m)")
	fs.DurationVar(&o.DigestInterval, "digest-interval", 0, "how often each node sends its digest changes (the sidecar's --digest-interval); 0 keeps its default (cachestate.DefaultConfig: 100ms)")
	fs.Float64Var(&o.FPRate, "fp-rate", 0.01, "the digests' Bloom false-positive rate")
	fs.IntVar(&o.RebuildRemoved, "rebuild-removed", 0, "removals a node's deltas carry before its digest is rebuilt and sent whole (cachestate.Config.RebuildRemoved); more: fewer full digests, more removed keys each peer holds beside the bits and more false positives between rebuilds; 0: its default, an eighth of the keys a digest is sized for")
	fs.IntVar(&o.Requests, "requests", 0, "requests in the synthetic trace, replayed in a loop; 0: 3/4 × largest size × capacity-blocks / routing-stride (about 1.8× the cluster's cache in distinct blocks, so a replay misses and engines keep storing); with --trace, its first this many (0: all)")
	fs.StringVar(&o.Trace, "trace", "", "replay this Mooncake JSON-lines trace (hash_ids per line, e.g. FAST'25's conversation_trace.jsonl) in a loop instead of the synthetic one: its requests' sizes then set how many requests a node routes for its blocks a second")
	fs.IntVar(&o.TraceBlockTokens, "trace-block-tokens", 512, "tokens per hash id of --trace (Mooncake's: 512); a multiple of 16 × --routing-stride")
	fs.IntVar(&o.Repeats, "repeats", 1, "runs per N; the table and model use each measure's median over them")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the trace and of the request placement")
	fs.StringVar(&o.Addr, "addr", "127.0.96.1", "loopback address every node binds")
	fs.IntVar(&o.BasePort, "base-port", 17000, "node i's memberlist listens on this plus i (its API address on +10000); runs rotate it by 1000")
	fs.StringVar(&o.Out, "out", "out/scale", "directory for results.json, results.md and traffic.png")
	fs.BoolVar(&o.Plot, "plot", true, "write traffic.png")
	fs.BoolVar(&o.WarmCaches, "warm-caches", false, "fill each engine's cache from the trace before its node serves (its first digest, full, carries it), so the warm-up settles the mesh instead of filling caches at --blocks-per-second: for large caches in slow motion")
	fs.BoolVar(&o.NoShortlist, "no-shortlist", false, "every choice reads every peer's view, where a sidecar's front (--route-shortlist) reads a shortlist of them among many peers")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write the run's CPU profile (go tool pprof) to this file")
	fs.StringVar(&o.From, "from", "", "run nothing: read this earlier results.json and write its tables, model and plot (with this version's model) to --out")
	if err := cli.Parse(fs, args, stdout, stderr); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "version" || set[f.Name] || envErr != nil {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return o, envErr
	}
	for _, s := range strings.Split(sizes, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			return o, fmt.Errorf("--sizes: %q is not a size of at least 2", s)
		}
		o.Sizes = append(o.Sizes, n)
	}
	switch {
	case len(o.Sizes) == 0:
		return o, errors.New("--sizes: none given")
	case o.Warmup < 0 || o.Window <= 0:
		return o, errors.New("--warmup must not be negative, --window must be positive")
	case o.CapacityBlocks < 1:
		return o, errors.New("--capacity-blocks must be at least 1")
	case o.RoutingStride < 1 || o.RoutingStride > 64:
		return o, fmt.Errorf("--routing-stride %d: want 1 to 64", o.RoutingStride)
	case o.CapacityBlocks < o.RoutingStride:
		return o, errors.New("--capacity-blocks must hold at least one routing key (--routing-stride blocks)")
	case o.BlocksPerSecond <= 0:
		return o, errors.New("--blocks-per-second must be positive")
	case !(o.Slow >= 1):
		return o, errors.New("--slow must be at least 1 (1: real time)")
	case o.FullDigestInterval < 0 || o.DigestInterval < 0:
		return o, errors.New("--full-digest-interval and --digest-interval must not be negative")
	case o.FPRate <= 0 || o.FPRate >= 1:
		return o, errors.New("--fp-rate must be in (0, 1)")
	case o.CPUBlocks < 0:
		return o, errors.New("--cpu-blocks must not be negative")
	case o.TierStride != 0 && !bloom.TierStrideOK(o.TierStride):
		return o, fmt.Errorf("--tier-stride %d: want 1, 2, 4, 8 or 16", o.TierStride)
	case o.Trace != "" && (o.TraceBlockTokens < 1 || o.TraceBlockTokens%(scale.BlockTokens*o.RoutingStride) != 0):
		return o, fmt.Errorf("--trace-block-tokens %d: want a multiple of a routing key's %d tokens", o.TraceBlockTokens, scale.BlockTokens*o.RoutingStride)
	case o.RebuildRemoved < 0:
		return o, errors.New("--rebuild-removed must not be negative")
	case o.Requests < 0 || o.Repeats < 1:
		return o, errors.New("--requests must not be negative, --repeats must be at least 1")
	case o.BasePort < 1024 || o.BasePort+4000+10000+maxInt(o.Sizes) > 65535:
		return o, fmt.Errorf("--base-port %d: the ports of the largest run do not fit", o.BasePort)
	}
	switch {
	case o.Warmup == 0 && o.WarmCaches && o.CPUBlocks == 0:
		// Caches full from the start: long enough for a digest's first
		// rebuild (RebuildRemoved's removals, by default an eighth of the
		// cache) and the placement to settle.
		rebuild := float64(o.CapacityBlocks) / 8
		if o.RebuildRemoved > 0 {
			rebuild = float64(o.RebuildRemoved * o.RoutingStride)
		}
		o.Warmup = (time.Duration(1.15*rebuild/o.BlocksPerSecond*float64(time.Second)) + 10*time.Second).Round(time.Second)
	case o.Warmup == 0:
		// Long enough for the CPU tier, which the GPU's evictions fill, to
		// fill and evict too.
		o.Warmup = (time.Duration(1.15*float64(o.CapacityBlocks+o.CPUBlocks)/o.BlocksPerSecond*float64(time.Second)) + 5*time.Second).Round(time.Second)
	}
	if o.Requests == 0 && o.Trace == "" {
		o.Requests = max(20000, 3*maxInt(o.Sizes)*o.CapacityBlocks/o.RoutingStride/4)
	}
	return o, nil
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// cmdMain is the program with its environment and streams; it returns the
// exit status.
func cmdMain(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, getenv, stdout, stderr)
	if err != nil {
		return cli.Fail("kvscale", err, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kvscale:", err)
		return 1
	}
	return 0
}

// run measures every size, then writes and prints the report.
func run(ctx context.Context, o options, out, log io.Writer) error {
	begin := time.Now()
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return err
	}
	if o.From != "" {
		rep, err := readReport(o.From)
		if err != nil {
			return err
		}
		rep.Model = model(rep.Results, rep.Options.BlocksPerSecond)
		rep.Options.Out, rep.Options.Plot, rep.Options.From = o.Out, o.Plot, o.From
		return writeReport(rep, out, log)
	}
	if o.CPUProfile != "" {
		f, err := os.Create(o.CPUProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	trace, err := requests(o)
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "kvscale: sizes %v, %d trace requests, warmup %s, window %s", o.Sizes, len(trace), o.Warmup, o.Window)
	if o.Slow > 1 {
		fmt.Fprintf(log, " of the mesh's time, in slow motion ×%g (each run %g times as long)", o.Slow, o.Slow)
	}
	fmt.Fprintln(log)
	rep := report{Command: "kvscale " + strings.Join(os.Args[1:], " "), Started: begin.UTC().Format(time.RFC3339),
		Options: o}
	k := 0
	for _, n := range o.Sizes {
		var runs []scale.Result
		for r := range o.Repeats {
			t0 := time.Now()
			cfg := scale.Config{Nodes: n, Addr: o.Addr, BasePort: o.BasePort + 1000*(k%4),
				CapacityBlocks: o.CapacityBlocks, RoutingStride: o.RoutingStride, CPUBlocks: o.CPUBlocks, TierStride: o.TierStride, BlocksPerSecond: o.BlocksPerSecond,
				Warmup: o.Warmup, Window: o.Window, FPRate: o.FPRate, FullDigestInterval: o.FullDigestInterval,
				DigestInterval: o.DigestInterval, Slow: o.Slow, NoShortlist: o.NoShortlist, WarmCaches: o.WarmCaches, RebuildRemoved: o.RebuildRemoved,
				Requests: trace, Seed: o.Seed + uint64(r),
				Progress: func(s string) { fmt.Fprintf(log, "kvscale: %s\n", s) }}
			k++
			fmt.Fprintf(log, "kvscale: N=%d run %d/%d: starting %d nodes\n", n, r+1, o.Repeats, n)
			res, err := scale.Run(ctx, cfg)
			if err != nil {
				return fmt.Errorf("N=%d: %w", n, err)
			}
			fmt.Fprintf(log, "kvscale: N=%d run %d/%d done in %.0f s: %.1f KiB/s per node, stored p99 %.0f ms, evicted p99 %.0f ms\n",
				n, r+1, o.Repeats, time.Since(t0).Seconds(), (res.SentBytesPerNode+res.RecvBytesPerNode)/1024,
				res.StoredP99Ms, res.EvictedP99Ms)
			runs = append(runs, res)
		}
		rep.Runs = append(rep.Runs, runs)
		rep.Results = append(rep.Results, medianResult(runs))
	}
	rep.Model = model(rep.Results, o.BlocksPerSecond)
	rep.Seconds = time.Since(begin).Seconds()
	return writeReport(rep, out, log)
}

// requests is the trace the runs replay: --trace's, each hash id cut into
// routing keys, or the synthetic one.
func requests(o options) ([]scale.Request, error) {
	if o.Trace == "" {
		return scale.Synthetic(o.Requests, o.Seed), nil
	}
	f, err := os.Open(o.Trace)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	reqs, err := scale.ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("--trace %s: %w", o.Trace, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("--trace %s: no requests with hash_ids", o.Trace)
	}
	if o.Requests > 0 && o.Requests < len(reqs) {
		reqs = reqs[:o.Requests]
	}
	return scale.Subdivide(reqs, o.TraceBlockTokens/(scale.BlockTokens*o.RoutingStride)), nil
}

// writeReport writes results.json, results.md and the plot to the
// report's --out and prints the markdown to out.
func writeReport(rep report, out, log io.Writer) error {
	o := rep.Options
	md := markdown(rep)
	if o.Plot {
		p := filepath.Join(o.Out, "traffic.png")
		if err := plotTraffic(rep.Results, rep.Model, o.BlocksPerSecond, p); err != nil {
			return err
		}
		rep.Plots = append(rep.Plots, p)
	}
	if err := writeJSON(filepath.Join(o.Out, "results.json"), rep); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.Out, "results.md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Fprint(out, md)
	fmt.Fprintf(log, "kvscale: wrote %s (the runs took %.0f s)\n", o.Out, rep.Seconds)
	return nil
}
