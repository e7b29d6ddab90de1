// Command load sends one loadgen workload to one URL (a Kubernetes
// Service) and writes a JSON summary: requests, hit rate, latency, and,
// when faults were injected meanwhile, which failures each fault caused.
//
//	load --url http://10.215.0.10:8000 --name kvroute --out kvroute.json
//	load --url ... --faults faults.jsonl   # lines {"at_ms":..., "kind":..., "pod":...}
//
// Keep-alives are off: each request is a new connection, so kube-proxy
// balances requests, not a few long-lived connections.
//
// A failed request counts as "cut" when its response had begun on a pod
// that a fault took down (its stream broke: nothing could have saved it),
// and as "lost" otherwise (a live pod could have served it). Of the lost,
// "unrouted" never reached a pod: the connection to the Service failed
// (kube-proxy still sent it to a pod that was gone).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

var version = "dev"

type options struct {
	url, name, workload, model, out, faults string
	rate                                    float64
	duration, drain                         time.Duration
	pods, blocksPerPod, maxTokens           int
	seed                                    uint64
	stream, showVersion                     bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(os.Stdout)
	fs.StringVar(&o.url, "url", "", "base URL of the Service (required)")
	fs.StringVar(&o.name, "name", "service", "name of this run in the summary")
	fs.StringVar(&o.workload, "workload", "shared-prefix", "loadgen workload")
	fs.StringVar(&o.model, "model", "Qwen/Qwen3-0.6B", "model name sent in requests")
	fs.StringVar(&o.out, "out", "", "write the JSON summary here (default stdout)")
	fs.StringVar(&o.faults, "faults", "", "JSON lines of the faults injected during the run (read at the end)")
	fs.Float64Var(&o.rate, "rate", 4, "requests per second")
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long requests are started")
	fs.DurationVar(&o.drain, "drain", 60*time.Second, "how long to wait for the last requests")
	fs.IntVar(&o.pods, "pods", 4, "pods behind the Service (sizes the workload to their caches)")
	fs.IntVar(&o.blocksPerPod, "blocks-per-pod", 2048, "KV blocks of 16 tokens per pod")
	fs.IntVar(&o.maxTokens, "max-prompt-tokens", 8000, "cap on prompt length")
	fs.Uint64Var(&o.seed, "seed", 1, "workload seed")
	fs.BoolVar(&o.stream, "stream", true, "stream responses (SSE)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if o.showVersion {
		return o, nil
	}
	switch {
	case o.url == "":
		return o, errors.New("--url is required")
	case o.rate <= 0 || o.duration <= 0:
		return o, fmt.Errorf("--rate %v and --duration %v must be positive", o.rate, o.duration)
	case o.pods <= 0 || o.blocksPerPod <= 0:
		return o, fmt.Errorf("--pods %d and --blocks-per-pod %d must be positive", o.pods, o.blocksPerPod)
	}
	return o, nil
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	if o.showVersion {
		fmt.Println("load", version)
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
}

// Fault is one line of the --faults file, as k8s/fault.sh prints it.
type Fault struct {
	AtMS int64  `json:"at_ms"` // Unix milliseconds
	Kind string `json:"kind"`
	Pod  string `json:"pod"`
}

// FaultResult counts the requests sent from a fault until the next one.
type FaultResult struct {
	Fault
	AtS      float64        `json:"at_s"` // from the start of the run
	Requests int            `json:"requests"`
	Lost     int            `json:"lost"`
	Unrouted int            `json:"unrouted"`
	Cut      int            `json:"cut"`
	Errors   map[string]int `json:"errors,omitempty"`
}

// Summary is the JSON the command writes.
type Summary struct {
	loadgen.PolicyResult
	URL      string         `json:"url"`
	Seed     uint64         `json:"seed"`
	Failed   int            `json:"failed"`
	Lost     int            `json:"lost"`
	Unrouted int            `json:"unrouted"`
	Cut      int            `json:"cut"`
	PerPod   map[string]int `json:"per_pod"`
	Errors   map[string]int `json:"errors,omitempty"`
	Faults   []FaultResult  `json:"faults,omitempty"`
	WallSecs float64        `json:"wall_s"`
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := loadgen.DefaultConfig()
	cfg.Rate, cfg.Duration = o.rate, o.duration
	cfg.CacheTokens = o.pods * o.blocksPerPod * 16
	cfg.MaxPromptTokens = o.maxTokens
	s, err := loadgen.Generate(o.workload, cfg, rand.New(rand.NewPCG(o.seed, 0)))
	if err != nil {
		return err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	client := loadgen.NewClient(&http.Client{Transport: tr}, o.model)
	client.Stream = o.stream
	fmt.Fprintf(os.Stderr, "load %s: %d requests over %v to %s\n", o.name, s.Requests(), o.duration, o.url)
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, o.duration+o.drain)
	defer cancel()
	samples, err := loadgen.Run(runCtx, loadgen.RunConfig{
		Endpoints: []loadgen.Endpoint{{URL: o.url}}, Client: client, Seed: o.seed, Stop: o.duration,
		RequestTimeout: 30 * time.Second, Progress: os.Stderr,
	}, s)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	faults, err := readFaults(o.faults)
	if err != nil {
		return err
	}
	sum := summarize(o, samples, faults, start)
	sum.WallSecs = time.Since(start).Seconds()
	w := os.Stdout
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(sum)
}

func readFaults(path string) ([]Fault, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Fault
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var ft Fault
		if err := json.Unmarshal(sc.Bytes(), &ft); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, ft)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].AtMS < out[j].AtMS })
	return out, sc.Err()
}

// summarize classifies every failure; a request sent before the first
// fault belongs to no fault and counts as lost when it fails.
func summarize(o options, samples []loadgen.Sample, faults []Fault, start time.Time) Summary {
	sum := Summary{PolicyResult: loadgen.Summarize(o.name, samples, nil, 1), URL: o.url, Seed: o.seed,
		PerPod: map[string]int{}, Errors: map[string]int{}}
	for _, f := range faults {
		sum.Faults = append(sum.Faults, FaultResult{Fault: f, AtS: time.UnixMilli(f.AtMS).Sub(start).Seconds()})
	}
	for _, s := range samples {
		at := start.Add(s.Sent)
		i := sort.Search(len(faults), func(i int) bool { return time.UnixMilli(faults[i].AtMS).After(at) }) - 1
		if i >= 0 {
			sum.Faults[i].Requests++
		}
		if s.OK() {
			sum.PerPod[s.Pod]++
			continue
		}
		sum.Failed++
		sum.Errors[short(s.Err)]++
		cut, unrouted := brokenOn(s, faults, start), s.Pod == "" && dialFailed(s.Err)
		switch {
		case cut:
			sum.Cut++
		case unrouted:
			sum.Lost++
			sum.Unrouted++
		default:
			sum.Lost++
		}
		if i < 0 {
			continue
		}
		f := &sum.Faults[i]
		if f.Errors == nil {
			f.Errors = map[string]int{}
		}
		f.Errors[short(s.Err)]++
		switch {
		case cut:
			f.Cut++
		case unrouted:
			f.Lost++
			f.Unrouted++
		default:
			f.Lost++
		}
	}
	return sum
}

// brokenOn reports whether a failed request's response had begun (a 2xx
// with the serving pod's header) on a pod that a fault hit before the
// request ended. A 5xx is never cut: the sender could have tried another pod.
func brokenOn(s loadgen.Sample, faults []Fault, start time.Time) bool {
	if s.Pod == "" || strings.HasPrefix(s.Err, "status ") {
		return false
	}
	end := start.Add(s.Sent + s.WallE2E + 2*time.Second)
	for _, f := range faults {
		if f.Pod == s.Pod && !time.UnixMilli(f.AtMS).After(end) {
			return true
		}
	}
	return false
}

// dialFailed: the error of a connection that was never established.
func dialFailed(err string) bool {
	return strings.Contains(err, "dial tcp") || strings.Contains(err, "connection refused")
}

func short(s string) string {
	if len(s) > 120 {
		return s[:120]
	}
	return s
}
