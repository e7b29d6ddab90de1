package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/kvroute/kvroute/baseline"
	"github.com/kvroute/kvroute/chaos"
	"github.com/kvroute/kvroute/loadgen"
	"github.com/kvroute/kvroute/vllmsim"
)

// model is the served model name of the benchmark cluster.
const model = "sim-model"

// schedule builds the workload at one offered load. Every policy runs the
// schedule built here from the same seed, so they all see the same
// requests at the same offsets.
func schedule(o options, load float64, trace []loadgen.TraceRecord, log io.Writer) (loadgen.Schedule, error) {
	if o.Trace != "" {
		s, skipped := loadgen.Mooncake(trace, loadgen.MooncakeParams{
			TimeScale: load, Seed: o.Seed, Duration: o.Duration, MaxRequests: o.MaxRequests,
			MaxPromptTokens: o.maxPromptTokens(256), MaxOutputTokens: 256,
		})
		if skipped > 0 {
			fmt.Fprintf(log, "kvbench: skipped %d trace requests longer than %d tokens (one pod's cache is %d, the context %d)\n",
				skipped, o.maxPromptTokens(256), o.BlocksPerPod*blockSize, vllmsim.DefaultConfig().MaxModelLen)
		}
		if len(s.Sessions) == 0 {
			return s, fmt.Errorf("trace %s: no requests in the first %v at time scale %v", o.Trace, o.Duration, load)
		}
		return s, nil
	}
	return loadgen.Generate(o.Workload, o.workloadConfig(load), rand.New(rand.NewPCG(o.Seed, 0x6b7662)))
}

// offered is a schedule's mean arrival rate in requests per second.
func offered(s loadgen.Schedule, d time.Duration) float64 {
	if n := len(s.Sessions); n > 1 && s.Sessions[n-1].At > 0 {
		d = s.Sessions[n-1].At
	}
	return float64(s.Requests()) / d.Seconds()
}

// maxClusterDir is the longest cluster directory whose ipc:// socket
// paths fit in sun_path (chaos.ClusterConfig.Dir).
const maxClusterDir = 107 - len("/sock/pod253-replay")

// clusterDir is the directory of one cluster's sockets and logs,
// OUT/clusters/NAME, emptied first; the logs stay there after the run. When
// that path is too long for the ipc:// sockets, a new directory under the
// system's temp directory takes its place.
func clusterDir(o options, name string) (string, error) {
	dir, err := filepath.Abs(filepath.Join(o.Out, "clusters", name))
	if err != nil {
		return "", err
	}
	if len(dir) > maxClusterDir {
		return os.MkdirTemp("", "kvb-"+name+"-")
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	return dir, os.MkdirAll(dir, 0o755)
}

// runPolicy starts a fresh cluster for one policy (so no policy inherits
// another's cache), sends the schedule through it and summarises. The
// cluster's logs stay in clusterDir(o, label).
func runPolicy(ctx context.Context, o options, policy, label string, s loadgen.Schedule, out, progress io.Writer) (loadgen.PolicyResult, error) {
	dir, err := clusterDir(o, label)
	if err != nil {
		return loadgen.PolicyResult{}, err
	}
	cfg := chaos.LocalConfig()
	cfg.Pods = o.Pods
	cfg.Dir = dir
	cfg.BinDir = o.BinDir
	cfg.Model = model
	cfg.Subnet = o.Subnet
	extra, sidecars := kvrouteArgs[policy]
	cfg.Sidecars = sidecars
	dpSim, dpSidecar := o.dpArgs()
	cfg.SidecarArgs = slices.Concat(o.slowArgs(), o.SidecarArgs, dpSidecar, extra)
	cfg.Sim.NumGPUBlocks = o.BlocksPerPod
	cfg.Sim.BlockSize = blockSize
	cfg.Sim.ExtraArgs = append(append(simArgs(o.Workload), o.tierArgs()...), dpSim...)
	cfg.SimEnv = simEnv(o.Workload)
	cfg.StopGrace = 2 * time.Second
	cfg.Sim.TimeScale = o.simTimeScale()
	cfg.Progress = progress
	c, err := chaos.Start(ctx, cfg)
	if err != nil {
		return loadgen.PolicyResult{}, fmt.Errorf("%s: start cluster: %w", policy, err)
	}
	defer c.Stop()
	began := time.Now()

	var pods []string
	var eps []loadgen.Endpoint
	for _, p := range c.Pods() {
		pods = append(pods, p.Name)
		switch {
		case policy == policyService:
			eps = append(eps, loadgen.Endpoint{URL: p.SimURL, Pod: p.Name})
		case sidecars:
			eps = append(eps, loadgen.Endpoint{URL: "http://" + p.API})
		}
	}
	if eps == nil {
		url, stop, err := startProxy(ctx, c, policy, o.Seed)
		if err != nil {
			return loadgen.PolicyResult{}, fmt.Errorf("%s: %w", policy, err)
		}
		defer stop()
		eps = []loadgen.Endpoint{{URL: url}}
	}
	fmt.Fprintf(progress, "kvbench: %s: %d requests over %v\n", policy, s.Requests(), o.slowed(o.Duration))
	runCtx, cancel := context.WithTimeout(ctx, o.slowed(o.Duration+o.Drain))
	defer cancel()
	client := loadgen.NewClient(nil, model)
	if o.ClientRetry {
		client.Retry = loadgen.SDKRetry(loadgen.SeededJitter(o.Seed))
		client.Retry.Backoff = o.slowed(client.Retry.Backoff)
		client.Retry.MaxBackoff = o.slowed(client.Retry.MaxBackoff)
	}
	samples, err := loadgen.Run(runCtx, loadgen.RunConfig{
		Endpoints: eps, Client: client, Concurrency: o.Concurrency,
		Seed: o.Seed, Stop: o.slowed(o.Duration), Progress: progress, RequestIDs: o.RequestIDs,
	}, s.Stretched(o.Slow))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return loadgen.PolicyResult{}, fmt.Errorf("%s: %w", policy, err)
	}
	var cached cachedByAPI
	var cost *loadgen.SidecarCost
	if cfg.Sidecars {
		cached, cost = reportSidecars(ctx, c, time.Since(began), out) // a result, not progress: --quiet keeps it
	}
	if err := writeSamples(filepath.Join(dir, "samples.jsonl"), samples); err != nil {
		fmt.Fprintf(out, "kvbench: %s: %v\n", policy, err) // the summary still stands
	}
	res := loadgen.Summarize(policy, samples, pods, cfg.Sim.TimeScale)
	cached.fill(&res)
	res.Sidecars = cost
	if o.CPUTierGiB > 0 {
		var sims []string
		for _, p := range c.Pods() {
			sims = append(sims, p.SimURL)
		}
		res.Tiers = scrapeTiers(ctx, sims, out) // a result, as reportSidecars
	}
	return res, nil
}

// simEnv is the workload's simulator environment: agentic continues
// stored responses (vLLM keeps them only with
// VLLM_ENABLE_RESPONSES_API_STORE=1) and sends images, which the central
// baselines place with the render endpoints (vLLM v0.30 serves them only
// with VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 or --enable-scale-out).
func simEnv(workload string) []string {
	if workload != "agentic" {
		return nil
	}
	return []string{"VLLM_ENABLE_RESPONSES_API_STORE=1", "VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1"}
}

// simArgs are the workload's extra simulator flags: multi-lora needs its
// adapters served by every pod (--lora-modules, as vLLM takes them).
func simArgs(workload string) []string {
	if workload != "multi-lora" {
		return nil
	}
	args := []string{"--lora-modules"}
	for _, a := range loadgen.DefaultConfig().MultiLoRA.Adapters {
		args = append(args, a+"=/loras/"+a)
	}
	return args
}

// startProxy runs a baseline central proxy in this process on the
// cluster's Service address and returns its URL and a stop function that
// waits for it to exit.
func startProxy(ctx context.Context, c *chaos.Cluster, policy string, seed uint64) (string, func(), error) {
	pc := baseline.DefaultConfig()
	pc.Policy = policy
	pc.Model = model
	pc.BlockSize = blockSize
	pc.Seed = seed
	for _, p := range c.Pods() {
		pc.Backends = append(pc.Backends, baseline.Backend{Name: p.Name, URL: p.SimURL,
			Events: p.Events, Replay: p.Replay, Topic: p.Topic})
	}
	px, err := baseline.New(pc)
	if err != nil {
		return "", nil, fmt.Errorf("proxy: %w", err)
	}
	ln, err := net.Listen("tcp", c.ServiceAddr(0))
	if err != nil {
		return "", nil, fmt.Errorf("proxy listen: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- px.Run(ctx) }()
	hs := &http.Server{Handler: px, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); hs.Serve(ln) }()
	stop := func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		hs.Shutdown(sctx)
		cancel()
		<-runErr
		<-served
	}
	// central-precise subscribes before the first request; a failed
	// subscription surfaces here rather than as silent misses.
	select {
	case err := <-runErr:
		runErr <- err
		stop()
		return "", nil, fmt.Errorf("proxy: %w", err)
	case <-time.After(200 * time.Millisecond):
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// writeOutputs writes the JSON, the markdown table and the plots, and
// returns the paths written.
func writeOutputs(o options, points []loadgen.SweepPoint, workload string) ([]string, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	var written []string
	// report is point i as the JSON records it; points are in o.loads()'
	// order, which for a trace are its time scales.
	report := func(i int) loadgen.Report {
		pt := points[i]
		r := loadgen.Report{OfferedLoad: pt.Rate, Workload: workload, Pods: o.Pods, Seed: o.Seed, SidecarArgs: o.SidecarArgs,
			ClientRetry: o.ClientRetry, Policies: pt.Policies}
		if o.Trace != "" {
			r.Trace, r.TimeScale = filepath.Base(o.Trace), o.loads()[i]
		}
		return r
	}
	rep := report(len(points) - 1)
	if err := os.MkdirAll(filepath.Dir(o.JSON), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(o.JSON)
	if err != nil {
		return nil, err
	}
	err = loadgen.WriteJSON(f, rep)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	written = append(written, o.JSON)

	var md []byte
	for i, pt := range points {
		md = fmt.Appendf(md, "## offered load %.3g requests/s\n\n%s\n", pt.Rate, loadgen.Markdown(report(i)))
		name := "ttft-cdf.png"
		if len(points) > 1 {
			name = fmt.Sprintf("ttft-cdf-%.3g.png", pt.Rate)
		}
		path := filepath.Join(o.Out, name)
		title := fmt.Sprintf("%s, %d pods, %.3g req/s: TTFT CDF", workload, o.Pods, pt.Rate)
		if err := loadgen.PlotCDF(path, title, pt.Policies); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	mdPath := filepath.Join(o.Out, "results.md")
	if err := os.WriteFile(mdPath, md, 0o644); err != nil {
		return written, err
	}
	written = append(written, mdPath)
	if len(points) > 1 {
		paths, err := loadgen.PlotSweep(o.Out, fmt.Sprintf("%s, %d pods", workload, o.Pods), points)
		written = append(written, paths...)
		if err != nil {
			return written, err
		}
		sweep := make([]loadgen.Report, len(points))
		for i := range points {
			sweep[i] = report(i)
		}
		b, err := json.MarshalIndent(sweep, "", "  ")
		if err != nil {
			return written, err
		}
		path := filepath.Join(o.Out, "sweep.json")
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			return written, err
		}
		written = append(written, path)
	}
	return written, nil
}

// writeSamples writes one JSON line per request, in the order they ended:
// what a placement study compares between policies (pod, decision,
// prompt and cached tokens, TTFT) beyond the summary's percentiles.
func writeSamples(path string, samples []loadgen.Sample) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for i := range samples {
		if err := enc.Encode(&samples[i]); err != nil {
			f.Close()
			return fmt.Errorf("samples: %w", err)
		}
	}
	return f.Close()
}
