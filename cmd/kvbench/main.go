// Command kvbench benchmarks kvroute against the Kubernetes Service and the
// central-proxy baselines on a local cluster of simulated vLLM pods.
//
//	kvbench --pods 4 --workload shared-prefix --policies service,kvroute,central-precise \
//	  --rate 10 --duration 30s --out out
//	kvbench --trace conversation_trace.jsonl --time-scale 2 --policies service,kvroute
//	kvbench --workload shared-prefix --sweep 4,8,16 --policies service,kvroute
//	kvbench --workload agentic --pods 4 --policies service,kvroute,central-precise
//	kvbench --workload doc-qa --fill 3 --cpu-tier-gib 16 \
//	  --policies kvroute,kvroute-gpu-only,central-precise,central-precise-gpu-only
//
// With --cpu-tier-gib every pod offloads GPU evictions to a CPU tier of
// that size (vLLM's native offloading), the table adds the hits' split
// between GPU and CPU, and kvroute-gpu-only and central-precise-gpu-only
// are kvroute and central-precise crediting no lower tier (docs/tiers.md).
//
// Run from the repository root it needs no preparation: it builds the
// vllm-sim and sidecar binaries into --bin (go build skips what is up to
// date). Every policy gets a freshly started cluster, so none inherits
// another's KV cache, and the same schedule of requests (same seed). The
// results go to stdout as a markdown table and to --out as results.json
// (the last offered load), results.md, a TTFT CDF per load and, for a
// sweep, hit rate and TTFT p90 against offered load. A workload whose
// requests speak several APIs (agentic: Anthropic Messages and OpenAI
// Responses) gets a second table, and "by_api" in results.json: each API's
// hit rate, TTFT p90, failures and, for kvroute, the sidecars' predicted
// against actual cached tokens, then the overall row.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/cmd/internal/cli"
	"github.com/kvroute/kvroute/loadgen"
)

func main() {
	os.Exit(cmdMain(os.Args[1:], os.Stdout, os.Stderr))
}

// cmdMain is the program with its streams; it returns the exit status.
func cmdMain(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if err != nil {
		return cli.Fail("kvbench", err, stderr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kvbench:", err)
		return 1
	}
	return 0
}

// run builds, benchmarks every policy at every load, prints the table to
// out and progress to log, and writes the result files.
func run(ctx context.Context, o options, out, log io.Writer) error {
	if len(o.Grid) > 0 {
		cells, err := loadgen.ReadGrid(o.Grid)
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, loadgen.GridMarkdown(cells))
		return err
	}
	begin := time.Now()
	progress := log
	if o.Quiet {
		progress = io.Discard
	}
	if o.Build {
		if err := build(ctx, o.BinDir, log); err != nil {
			return err
		}
	}
	if o.Story {
		if _, err := playStory(ctx, o, out, progress); err != nil {
			return err
		}
	}
	var trace []loadgen.TraceRecord
	if o.Trace != "" {
		f, err := os.Open(o.Trace)
		if err != nil {
			return err
		}
		trace, err = loadgen.ParseMooncake(f)
		f.Close()
		if err != nil {
			return err
		}
	}
	var points []loadgen.SweepPoint
	for _, load := range o.loads() {
		s, err := schedule(o, load, trace, log)
		if err != nil {
			return err
		}
		rate := offered(s, o.Duration)
		tokens := fmt.Sprintf("%d prompt tokens", s.PromptTokens())
		if s.PromptTokens() == 0 {
			tokens = "prompts grown by the answers" // chat and agent sessions
		}
		tier := ""
		if n := o.tierBlocks(); n > 0 {
			tier = fmt.Sprintf(" on the GPUs and %d in %s CPU tiers", o.Pods*n*blockSize, o.OffloadBackend)
		}
		fmt.Fprintf(log, "kvbench: workload %s, %d pods, %d requests at %.2f req/s offered, %s, cluster KV %d tokens%s\n",
			s.Workload, o.Pods, s.Requests(), rate, tokens, o.Pods*o.BlocksPerPod*blockSize, tier)
		pt := loadgen.SweepPoint{Rate: rate}
		for _, p := range o.Policies {
			label := p
			if len(o.loads()) > 1 {
				label = fmt.Sprintf("%s-%g", p, load)
			}
			res, err := runPolicy(ctx, o, p, label, s, out, progress)
			if err != nil {
				return err
			}
			fmt.Fprintf(log, "kvbench: %s: hit rate %.1f%%, TTFT p90 %.3fs, success %.1f%%\n",
				p, 100*res.HitRate, res.TTFTP90, 100*res.SuccessRate)
			pt.Policies = append(pt.Policies, res)
		}
		points = append(points, pt)
		fmt.Fprintf(out, "\n%s", loadgen.Markdown(loadgen.Report{Workload: s.Workload, Pods: o.Pods, Policies: pt.Policies}))
	}
	workload := o.Workload
	paths, err := writeOutputs(o, points, workload)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nwrote:")
	for _, p := range paths {
		fmt.Fprintf(out, " %s", p)
	}
	fmt.Fprintf(out, "\n(%v in all)\n", time.Since(begin).Round(time.Second))
	return nil
}

// build brings the binaries in dir up to date with `go build` (cheap when
// nothing changed). Without a go tool or the source, binaries already in
// dir are used as they are.
func build(ctx context.Context, dir string, log io.Writer) error {
	names := []string{chaos.SimBinary, chaos.SidecarBinary}
	fmt.Fprintf(log, "kvbench: go build -o %s/ %v\n", dir, names)
	err := chaos.Build(ctx, dir, names...)
	if err == nil {
		return nil
	}
	for _, n := range names {
		if _, serr := os.Stat(dir + "/" + n); serr != nil {
			return fmt.Errorf("no %s binary in %s and cannot build it: %w", n, dir, err)
		}
	}
	fmt.Fprintf(log, "kvbench: build failed, using the binaries in %s: %v\n", dir, err)
	return nil
}
