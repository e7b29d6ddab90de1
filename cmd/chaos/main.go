// Command chaos breaks a local kvroute cluster on purpose, under load, and
// reports what the clients saw: N simulated pods (vllm-sim + sidecar), each
// in its own network namespace when run as root, a Service that behaves
// like Kubernetes' (readiness probes, random per connection), the kvbench
// workloads, and the faults of a scenario file or of --fault flags.
//
//	chaos --scenario chaos/scenarios/kill-every-20s.json --out out/chaos
//	chaos --pods 4 --duration 60s --rate 10 --fault at=20s,fault=kill-engine,pod=2,for=10s
//	chaos --cleanup
//
// It writes OUT/result.json (or --json), OUT/result.md, OUT/timeline.png
// and OUT/resources-{rss,goroutines,fds}.png (every sidecar's memory,
// goroutines and descriptors), and prints the tables. The exit status is 0
// when the run completed, whatever it measured; 1 when it could not run; 2
// for bad flags.
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/buildinfo"
	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/loadgen"
)

func main() {
	o, err := parseFlags(os.Args[1:], os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

// options is the parsed command line.
type options struct {
	cfg      chaos.RunConfig
	scenario string
	json     string
	out      string
	cleanup  bool
	version  bool
}

// faultFlags collects repeated --fault values.
type faultFlags []chaos.Fault

func (f *faultFlags) String() string { return fmt.Sprint(len(*f)) }

func (f *faultFlags) Set(v string) error {
	fl, err := parseFault(v)
	if err != nil {
		return err
	}
	*f = append(*f, fl)
	return nil
}

// parseFault reads "at=20s,fault=kill-pod,pod=3,for=5s" (the scenario
// file's keys) through the same JSON decoding as a file.
func parseFault(v string) (chaos.Fault, error) {
	var parts []string
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return chaos.Fault{}, fmt.Errorf("--fault %q: want key=value pairs, e.g. at=20s,fault=kill-pod,pod=3", v)
		}
		switch k {
		case "ms", "percent", "rate":
			if _, err := strconv.ParseFloat(val, 64); err != nil {
				return chaos.Fault{}, fmt.Errorf("--fault %q: %s wants a number", v, k)
			}
			parts = append(parts, strconv.Quote(k)+":"+val)
		case "pod":
			if _, err := strconv.Atoi(val); err == nil {
				parts = append(parts, `"pod":`+val)
			} else {
				parts = append(parts, `"pod":`+strconv.Quote(val))
			}
		default:
			parts = append(parts, strconv.Quote(k)+":"+strconv.Quote(val))
		}
	}
	s, err := chaos.ParseScenario([]byte(`{"faults":[{` + strings.Join(parts, ",") + `}]}`))
	if err != nil {
		return chaos.Fault{}, fmt.Errorf("--fault %q: %w", v, err)
	}
	return s.Faults[0], nil
}

func parseFlags(args []string, usage io.Writer) (options, error) {
	var o options
	c := &o.cfg
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(usage)
	var faults faultFlags
	var netns, loopback bool
	fs.IntVar(&c.Pods, "pods", 0, "simulated pods (default: the scenario's, else 8)")
	fs.StringVar(&o.scenario, "scenario", "", "scenario JSON file (see README: Chaos scenarios)")
	fs.Var(&faults, "fault", "a fault as key=value pairs, repeatable: at=20s,fault=kill-pod,pod=3[,for=5s] (faults: "+strings.Join(chaos.FaultNames, ", ")+")")
	fs.DurationVar(&c.Duration, "duration", 0, "arrivals are sent during this long (default: the scenario's, else 60s)")
	fs.Float64Var(&c.Rate, "rate", 0, "offered load, requests per second (default: the scenario's, else 10)")
	fs.StringVar(&c.Workload, "workload", "", "one of "+strings.Join(loadgen.Workloads, ", ")+" (default: the scenario's, else multi-turn-chat)")
	fs.StringVar(&o.json, "json", "", "write the result JSON here (default OUT/result.json)")
	fs.StringVar(&o.out, "out", "out/chaos", "directory for result.json, result.md, timeline.png and the pods' logs")
	fs.BoolVar(&netns, "netns", false, "pods in network namespaces on a bridge (default when root)")
	fs.BoolVar(&loopback, "loopback", false, "pods on loopback addresses (default when not root; no partition or gossip faults)")
	fs.BoolVar(&o.cleanup, "cleanup", false, "remove namespaces, bridge and guard rules an earlier run with --prefix left, then exit")
	fs.StringVar(&c.NetnsPrefix, "prefix", "kvc", "name prefix of the namespaces, bridge and iptables chain (2-6 of [a-z0-9])")
	fs.StringVar(&c.Subnet, "subnet", "", "the pods' /24 as a.b.c (netns default 10.253.0, only inside the harness's bridge; loopback default 127.0.95)")
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the workload, the Service's choices and \"random\" pods")
	fs.IntVar(&c.BlocksPerPod, "blocks-per-pod", 2048, "KV cache blocks of 16 tokens per pod")
	fs.BoolVar(&c.ClientRetry, "client-retry", false, "clients retry as the OpenAI SDKs do (2 retries with backoff on connection errors, 408, 409, 429, 5xx)")
	fs.DurationVar(&c.Probe.Period, "probe-period", time.Second, "the Service's readiness probe period")
	fs.IntVar(&c.Probe.FailureThreshold, "probe-failures", 3, "failed probes before the Service drops a pod")
	fs.Func("sidecar-args", "space-separated flags added to every sidecar's command line (e.g. '--max-queue-wait 2s'), after the harness's own", func(v string) error {
		c.SidecarArgs = append(c.SidecarArgs, strings.Fields(v)...)
		return nil
	})
	fs.StringVar(&c.BinDir, "bin", "bin", "where the vllm-sim and sidecar binaries are built and found")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.version {
		fmt.Fprintln(usage, buildinfo.String("chaos"))
		return o, flag.ErrHelp
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if netns && loopback {
		return o, errors.New("--netns and --loopback exclude each other")
	}
	c.Netns = netns || (!loopback && syscall.Geteuid() == 0)
	if o.scenario != "" {
		b, err := os.ReadFile(o.scenario)
		if err != nil {
			return o, err
		}
		s, err := chaos.ParseScenario(b)
		if err != nil {
			return o, fmt.Errorf("%s: %w", o.scenario, err)
		}
		if s.Name == "" {
			s.Name = strings.TrimSuffix(filepath.Base(o.scenario), ".json")
		}
		c.Scenario = s
	}
	c.Scenario.Faults = append(c.Scenario.Faults, faults...)
	if c.Scenario.Name == "" {
		c.Scenario.Name = "flags"
	}
	// Flags given explicitly win over the scenario file.
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "pods":
			c.Scenario.Pods = c.Pods
		case "duration":
			c.Scenario.Duration = chaos.Duration(c.Duration)
		case "rate":
			c.Scenario.Rate = c.Rate
		case "workload":
			c.Scenario.Workload = c.Workload
		case "blocks-per-pod":
			c.Scenario.BlocksPerPod = c.BlocksPerPod
		}
	})
	if c.Workload != "" && !contains(loadgen.Workloads, c.Workload) {
		return o, fmt.Errorf("--workload %q: want one of %s", c.Workload, strings.Join(loadgen.Workloads, ", "))
	}
	if !o.cleanup {
		d := c.Duration
		if d == 0 {
			d = 60 * time.Second
		}
		p := c.Pods
		if p == 0 {
			p = 8
		}
		if err := c.Scenario.Validate(p, d); err != nil {
			return o, err
		}
		if c.Scenario.NeedsNetns() && !c.Netns {
			return o, fmt.Errorf("scenario %s: partition and gossip faults %w", c.Scenario.Name, chaos.ErrNeedNetns)
		}
	}
	if o.json == "" {
		o.json = filepath.Join(o.out, "result.json")
	}
	return o, nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// run cleans up or runs the scenario and writes the report.
func run(ctx context.Context, o options, out, log io.Writer) error {
	if o.cleanup {
		removed, err := chaos.CleanupNetns(ctx, o.cfg.NetnsPrefix)
		for _, r := range removed {
			fmt.Fprintln(out, "removed", r)
		}
		if len(removed) == 0 && err == nil {
			fmt.Fprintf(out, "nothing left by prefix %q\n", o.cfg.NetnsPrefix)
		}
		return err
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	// Rebuild (cheap when nothing changed), so a run never measures stale
	// binaries.
	fmt.Fprintf(log, "chaos: go build -o %s/ %s %s\n", o.cfg.BinDir, chaos.SimBinary, chaos.SidecarBinary)
	if err := chaos.Build(ctx, o.cfg.BinDir, chaos.SimBinary, chaos.SidecarBinary); err != nil {
		return err
	}
	// The ipc:// socket paths must stay short: the cluster lives in a temp
	// dir, and its logs are copied to OUT/logs afterwards.
	dir, err := os.MkdirTemp("", "kvc")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	o.cfg.Dir = dir
	o.cfg.Progress = log
	begin := time.Now()
	res, err := chaos.RunScenario(ctx, o.cfg)
	copyLogs(filepath.Join(dir, "logs"), filepath.Join(o.out, "logs"))
	if err != nil {
		return err
	}
	res.Commit = buildinfo.String("chaos")
	f, err := os.Create(o.json)
	if err != nil {
		return err
	}
	if err := res.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	md := res.Markdown()
	png := filepath.Join(o.out, "timeline.png")
	if err := res.PlotTimeline(png); err != nil {
		return err
	}
	plots, err := res.PlotResources(o.out)
	if err != nil {
		return err
	}
	imgs := "\n![timeline](timeline.png)\n"
	for _, p := range plots {
		imgs += fmt.Sprintf("\n![%[1]s](%[1]s)\n", filepath.Base(p))
	}
	mdPath := filepath.Join(o.out, "result.md")
	if err := os.WriteFile(mdPath, []byte(md+imgs), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "\n%s\nwrote %s %s %s (%v in all)\n", md, o.json, mdPath, png, time.Since(begin).Round(time.Second))
	return nil
}

// copyLogs keeps the pods' logs after the temp dir goes; a failure only
// loses logs.
func copyLogs(from, to string) {
	entries, err := os.ReadDir(from)
	if err != nil {
		return
	}
	if os.MkdirAll(to, 0o755) != nil {
		return
	}
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join(from, e.Name())); err == nil {
			_ = os.WriteFile(filepath.Join(to, e.Name()), b, 0o644)
		}
	}
}
