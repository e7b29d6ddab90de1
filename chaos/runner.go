package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/loadgen"
)

// RunConfig configures RunScenario. The scenario's own pods, duration,
// rate and workload win over the fields here, which are the defaults (and
// the command's flags).
type RunConfig struct {
	Scenario Scenario
	Pods     int           // default 8
	Duration time.Duration // default 60s
	Rate     float64       // requests per second, default 10
	Workload string        // a loadgen workload, default "multi-turn-chat"
	Seed     uint64        // workload, Service and "random" pods (default 1)
	// BlocksPerPod is every simulator's KV capacity (default 2048 blocks).
	BlocksPerPod int
	// TimeScale is the simulators' --sim-time-scale (default 1: real time).
	TimeScale float64
	// ClientRetry gives the clients the OpenAI SDKs' retries (off: the
	// report shows what the mesh absorbs on its own).
	ClientRetry bool
	// PlainEvery sends every n-th session without streaming (default 3).
	PlainEvery int
	// Netns runs the pods in network namespaces (see ClusterConfig).
	Netns       bool
	NetnsPrefix string
	Subnet      string
	Dir         string // cluster sockets and logs; required
	BinDir      string
	SidecarArgs []string
	// Probe is the Service's readiness probe (default period 1s, failure
	// threshold 3).
	Probe ProbeConfig
	// PollEvery is how often every sidecar's /debug/peers is read for
	// detection (default 250ms).
	PollEvery time.Duration
	// Drain bounds how long answers are awaited after the last arrival
	// (default 30s).
	Drain time.Duration
	// RequestTimeout bounds one request (default 60s; a hung engine holds
	// requests until it resumes).
	RequestTimeout time.Duration
	// ResourceEvery is how often every sidecar's memory, goroutines and
	// descriptors are read (Sampler; default 5s), and Flat how the report
	// judges them (CheckFlat).
	ResourceEvery time.Duration
	Flat          FlatConfig
	Progress      io.Writer
}

func (c RunConfig) withDefaults() RunConfig {
	s := c.Scenario
	pick := func(a, b, d int) int {
		switch {
		case a > 0:
			return a
		case b > 0:
			return b
		}
		return d
	}
	c.Pods = pick(s.Pods, c.Pods, 8)
	if s.Duration > 0 {
		c.Duration = s.Duration.D()
	} else if c.Duration <= 0 {
		c.Duration = 60 * time.Second
	}
	if s.Rate > 0 {
		c.Rate = s.Rate
	} else if c.Rate <= 0 {
		c.Rate = 10
	}
	if s.Workload != "" {
		c.Workload = s.Workload
	} else if c.Workload == "" {
		c.Workload = "multi-turn-chat"
	}
	if c.Scenario.Name == "" {
		c.Scenario.Name = "unnamed"
	}
	c.ClientRetry = c.ClientRetry || s.ClientRetry
	if c.Seed == 0 {
		c.Seed = 1
	}
	c.BlocksPerPod = pick(s.BlocksPerPod, c.BlocksPerPod, 2048)
	if c.TimeScale <= 0 {
		c.TimeScale = 1
	}
	c.PlainEvery = pick(c.PlainEvery, 0, 3)
	if c.PollEvery <= 0 {
		c.PollEvery = 250 * time.Millisecond
	}
	if c.Drain <= 0 {
		c.Drain = 30 * time.Second
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 60 * time.Second
	}
	if c.ResourceEvery <= 0 {
		c.ResourceEvery = 5 * time.Second
		if s.Burst != nil {
			c.ResourceEvery = time.Second // a burst's RSS peak lasts seconds
		}
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// FaultRecord is one fault as it happened, in seconds from the start of
// the load.
type FaultRecord struct {
	Fault string  `json:"fault"`
	Pod   string  `json:"pod,omitempty"` // the pod's name when the fault hit it
	AtS   float64 `json:"at_s"`
	// UndoneS is when the pod was back (restarted and ready, resumed,
	// healed; for a replacement, the new pod ready); 0 while never undone.
	UndoneS float64 `json:"undone_s,omitempty"`
	// Undo names the new pod of a replacement.
	NewPod string `json:"new_pod,omitempty"`
	Err    string `json:"error,omitempty"`
	// slot is the pod index; down marks faults that took the pod's
	// processes away (a request in flight there is lost, not failed).
	slot int
	down bool
}

// Poll is one read of one sidecar's peer table.
type Poll struct {
	AtS      float64
	Observer string
	// Choosable are the peers the observer may route to: listed in its
	// /debug/peers and not excluded there.
	Choosable []string
}

// peerEntry is the part of /debug/peers the detection reads.
type peerEntry struct {
	ID       string `json:"id"`
	Local    bool   `json:"local"`
	Excluded string `json:"excluded"`
}

// choosable reads a /debug/peers body: the remote peers the observer may
// choose, those its sidecar does not exclude (route's rules, which the
// sidecar applies and reports: engine down, draining, silent, a failed
// forward).
func choosable(body []byte) ([]string, error) {
	var ps []peerEntry
	if err := json.Unmarshal(body, &ps); err != nil {
		return nil, fmt.Errorf("debug/peers: %w", err)
	}
	var out []string
	for _, p := range ps {
		if !p.Local && p.Excluded == "" {
			out = append(out, p.ID)
		}
	}
	return out, nil
}

// runState is one RunScenario's shared state.
type runState struct {
	cfg   RunConfig
	c     *Cluster
	svc   *Service
	start time.Time
	rng   *rand.Rand

	mu     sync.Mutex
	faults []*FaultRecord
	polls  []Poll
	busy   map[int]bool // slots a pod fault holds
	// held counts the faults holding each pod (by name) now, for the
	// prober: a pod's store is read while a fault holds it even when
	// the workload's sessions moved away from it.
	held  map[string]int
	locks []sync.Mutex // serialise faults per slot

	// stored is what the clients saw of stored responses (nil when the
	// workload stores none); gets are the prober's reads of them.
	stored *storeLog
	gets   []loadgen.Sample
}

func (r *runState) since() float64 { return time.Since(r.start).Seconds() }

// heldPods are the pods a fault holds now.
func (r *runState) heldPods() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Collect(maps.Keys(r.held))
}

func (r *runState) logf(format string, args ...any) {
	fmt.Fprintf(r.cfg.Progress, "  [%5.1fs] "+format+"\n", append([]any{r.since()}, args...)...)
}

// RunScenario starts a cluster, puts a Kubernetes-like Service in front,
// sends the workload through it while the scenario's faults happen, reads
// every sidecar's peer table throughout, and returns the figures. The
// cluster (namespaces, bridge, guard) is gone when it returns, also on
// error or when ctx ends.
func RunScenario(ctx context.Context, cfg RunConfig) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Scenario.Validate(cfg.Pods, cfg.Duration); err != nil {
		return nil, err
	}
	if cfg.Scenario.NeedsNetns() && !cfg.Netns {
		return nil, fmt.Errorf("scenario %s: partition and gossip faults %w", cfg.Scenario.Name, ErrNeedNetns)
	}
	sched, err := schedule(cfg)
	if err != nil {
		return nil, err
	}
	cc := LocalConfig()
	cc.Pods, cc.Dir, cc.BinDir = cfg.Pods, cfg.Dir, cfg.BinDir
	// Debug logs list every routed request's tried targets: the exact
	// count of forwards to a broken pod (readAttempts). The run's own
	// SidecarArgs come later and win.
	cc.Sidecars, cc.SidecarArgs = true, append([]string{"--log-level", "debug"}, cfg.SidecarArgs...)
	cc.Netns, cc.NetnsPrefix, cc.Subnet = cfg.Netns, cfg.NetnsPrefix, cfg.Subnet
	if cc.Subnet == "" && !cc.Netns {
		cc.Subnet = "127.0.95"
	}
	if from := cfg.Scenario.SidecarFrom; from != "" {
		old, err := BuildSidecarAt(ctx, from, versionOf(from), func(string) {
			fmt.Fprintf(cfg.Progress, "chaos: building the sidecar of %s\n", from)
		})
		if err != nil {
			return nil, err
		}
		cc.SidecarBins = []string{old}
	}
	cc.Sim.NumGPUBlocks = cfg.BlocksPerPod
	cc.SimEnv, cc.Sim.ExtraArgs = simSetup(cfg.Workload)
	cc.Sim.TimeScale = cfg.TimeScale
	cc.StopGrace = 3 * time.Second
	cc.ReadyTimeout = 45 * time.Second
	cc.Progress = cfg.Progress
	fmt.Fprintf(cfg.Progress, "chaos: scenario %s: %d pods, %v at %.1f req/s of %s (%d requests), %d faults, %s mode, client retries %v\n",
		cfg.Scenario.Name, cfg.Pods, cfg.Duration, cfg.Rate, cfg.Workload, sched.Requests(), len(cfg.Scenario.Faults),
		map[bool]string{true: "netns", false: "loopback"}[cfg.Netns], cfg.ClientRetry)
	c, err := Start(ctx, cc)
	if err != nil {
		return nil, err
	}
	defer c.Stop()
	svc, err := ListenService(ServiceConfig{
		Addr: c.ServiceAddr(c.Config().Ports.API), Endpoints: endpoints(c), Seed: cfg.Seed,
		Probe: cfg.Probe, Progress: progressf{cfg.Progress},
	})
	if err != nil {
		return nil, err
	}
	defer svc.Close()

	r := &runState{cfg: cfg, c: c, svc: svc, rng: rand.New(rand.NewPCG(cfg.Seed, 0xc4a05)),
		busy: map[int]bool{}, held: map[string]int{}, locks: make([]sync.Mutex, cfg.Pods)}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost, tr.MaxIdleConns = 512, 2048 // as loadgen's own client
	var rt http.RoundTripper = tr
	if storesResponses(cfg.Workload) {
		r.stored = newStoreLog(time.Now())
		rt = storeTap{base: tr, log: r.stored}
	}
	var refused *refusalTap
	if cfg.Scenario.Burst != nil {
		refused = &refusalTap{base: rt}
		rt = refused
	}
	client := loadgen.NewClient(&http.Client{Transport: rt}, c.Config().Model)
	if cfg.ClientRetry {
		client.Retry = loadgen.SDKRetry(loadgen.SeededJitter(cfg.Seed))
	}
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.Drain)
	defer cancel()
	faultCtx, stopFaults := context.WithCancel(runCtx)
	var bg sync.WaitGroup
	r.start = time.Now()
	smp := startSampler(c.sidecarTargets, cfg.ResourceEvery, r.start)
	defer smp.Stop()
	bg.Go(func() { r.observe(faultCtx) })
	bg.Go(func() { r.inject(faultCtx) })
	if r.stored != nil {
		r.stored.start = r.start
		pc := probeConfig{URL: svc.URL(), Every: probeEvery, Window: probeWindow, Retry: cfg.ClientRetry,
			Timeout: cfg.RequestTimeout, Rng: rand.New(rand.NewPCG(cfg.Seed, 0x9e7)), Held: r.heldPods}
		bg.Go(func() { r.gets = probeStored(runCtx, faultCtx, r.stored, pc) })
	}
	var burst []burstOutcome
	var burstRate float64
	var burstWG sync.WaitGroup
	if b := cfg.Scenario.Burst; b != nil {
		burstRate = b.Factor * burstCapacity(cfg.Pods, b.PromptTokens)
		fmt.Fprintf(cfg.Progress, "chaos: burst at %v for %v: %d-token chats at %.1f req/s (%.1fx the %.2f req/s the pods can prefill)\n",
			b.At.D(), b.For.D(), b.PromptTokens, burstRate, b.Factor, burstCapacity(cfg.Pods, b.PromptTokens))
		burstWG.Go(func() {
			burst = runBurst(runCtx, b.withDefaults(), svc.URL(), c.Config().Model, burstRate, r.start, cfg.RequestTimeout, cfg.Seed)
		})
	}
	samples, err := loadgen.Run(runCtx, loadgen.RunConfig{
		Endpoints: []loadgen.Endpoint{{URL: svc.URL()}}, Client: client, Seed: cfg.Seed,
		Stop: cfg.Duration, RequestTimeout: cfg.RequestTimeout, PlainEvery: cfg.PlainEvery, RequestIDs: true,
		Progress: cfg.Progress, ProgressEvery: 5 * time.Second,
		// The faults' clock: a request that ended as its entry's sidecar
		// was killed counted as before the kill when the run's clock
		// started a few milliseconds later (a servable loss that was not).
		Start: r.start,
	}, sched)
	end := r.since()
	burstWG.Wait()
	stopFaults()
	bg.Wait()
	smp.Stop()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	sidecar := func(p PodInfo) string { return "http://" + p.Admin + "/metrics" }
	sim := func(p PodInfo) string { return p.SimURL + "/metrics" }
	gaps := r.scrape(ctx, sidecar, "kvroute_kv_event_gaps_total")
	var counters map[string]float64
	if cfg.Scenario.Burst != nil {
		counters = map[string]float64{
			"retries":      r.scrape(ctx, sidecar, "kvroute_forward_retries_total"),
			"hops_refused": r.scrapeLabel(ctx, sidecar, "kvroute_routing_decisions_total", `outcome="refused"`),
			"queue_full":   r.scrapeLabel(ctx, sidecar, "kvroute_request_errors_total", `kind="queue_full"`),
			"prefill_busy": r.scrapeLabel(ctx, sidecar, "kvroute_request_errors_total", `kind="prefill_busy"`),
		}
	}
	dropped := r.scrape(ctx, sim, "vllm_sim_kv_batches_dropped_total")
	replays := r.scrape(ctx, sim, "vllm_sim_kv_replay_requests_total")
	conns := svc.Conns()
	trans := svc.Transitions()
	svc.Close()
	c.Stop()
	attempts, aerr := readAttempts(filepath.Join(cfg.Dir, "logs"))
	res := summarize(r, samples, conns, trans, attempts, end)
	res.Resources, res.ResourcePeak = smp.Series(), smp.Peak()
	res.Flat, res.FlatRule = CheckFlat(res.Resources, cfg.Flat), flatRule(cfg.Flat)
	res.KVEventGaps, res.KVBatchesDropped, res.KVReplays = gaps, dropped, replays
	if b := cfg.Scenario.Burst; b != nil {
		res.Overload = summarizeOverload(overloadInput{burst: *b, pods: cfg.Pods, offered: burstRate, outcomes: burst,
			samples: samples, refusals: refused.refusals(), attempts: attempts, resources: res.Resources, counters: counters})
	}
	if aerr != nil || len(attempts) == 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("no forward attempts in the sidecars' debug logs (%v): forwards_to_dead_after_detection is 0 for want of evidence", aerr))
	}
	res.GuardDrops, res.GuardChecked = -1, false
	if c.Netns() {
		drops, gerr := c.GuardDrops()
		res.GuardDrops, res.GuardChecked = drops, gerr == nil
		if gerr != nil {
			res.Notes = append(res.Notes, "egress guard: "+gerr.Error())
		}
	}
	return res, nil
}

// scrape sums a counter over every pod's metrics page (url) at the end of
// the load; a process restarted during the run counts from its start.
func (r *runState) scrape(ctx context.Context, url func(PodInfo) string, name string) float64 {
	return r.scrapeLabel(ctx, url, name, "")
}

// scrapeLabel is scrape over the series whose labels include label
// (k="v"; "" for every series).
func (r *runState) scrapeLabel(ctx context.Context, url func(PodInfo) string, name, label string) float64 {
	hc := &http.Client{Timeout: 2 * time.Second}
	var total float64
	for _, p := range r.c.Pods() {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url(p), nil)
		if err != nil {
			continue
		}
		resp, err := hc.Do(req)
		if err != nil {
			continue // a pod the scenario left dead
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		resp.Body.Close()
		total += metricSumLabel(string(b), name, label)
	}
	return total
}

// metricSum adds up every sample of the named metric in a Prometheus text
// exposition.
func metricSum(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric with this prefix
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// metricSumLabel is metricSum over the series of name whose labels
// include label (k="v"; "" for every series).
func metricSumLabel(text, name, label string) float64 {
	return metricSum(withLabel(text, name, label), name)
}

// withLabel keeps the lines of text whose series of name carry label
// (k="v"); all of text when label is "".
func withLabel(text, name, label string) string {
	if label == "" {
		return text
	}
	var keep []string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") && strings.Contains(line[:strings.LastIndex(line, "}")+1], label) {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// progressf adapts the Service's lines to the run's progress.
type progressf struct{ w io.Writer }

func (p progressf) Write(b []byte) (int, error) { return p.w.Write(append([]byte("  "), b...)) }

// endpoints are the cluster's pods as the Service's probed endpoints.
func endpoints(c *Cluster) []Endpoint {
	var out []Endpoint
	for _, p := range c.Pods() {
		out = append(out, Endpoint{Name: p.Name, Addr: p.API, ReadyURL: "http://" + p.Admin + "/readyz"})
	}
	return out
}

// schedule is the run's workload, sized to the cluster as kvbench does.
func schedule(cfg RunConfig) (loadgen.Schedule, error) {
	lc := loadgen.DefaultConfig()
	lc.Rate, lc.Duration = cfg.Rate, cfg.Duration
	lc.CacheTokens = cfg.Pods * cfg.BlocksPerPod * 16
	lc.MaxPromptTokens = min(cfg.BlocksPerPod*16*3/4, 32768) - int(lc.Chat.OutputTokens.Max)
	lc.DocQA.DocTokens.Max = min(lc.DocQA.DocTokens.Max, float64(cfg.BlocksPerPod*16/4))
	lc.DocQA.DocTokens.Mean = min(lc.DocQA.DocTokens.Mean, (lc.DocQA.DocTokens.Min+lc.DocQA.DocTokens.Max)/2)
	return loadgen.Generate(cfg.Workload, lc, rand.New(rand.NewPCG(cfg.Seed, 0x6b7662)))
}

// storesResponses reports whether workload continues stored responses
// (agentic's Responses sessions): then the simulators keep them and the
// harness follows them (storeTap, probeStored).
func storesResponses(workload string) bool { return workload == "agentic" }

// simSetup is the simulators' environment and extra flags for workload,
// as cmd/kvbench and kvcluster start them: agentic continues stored
// responses, which vLLM keeps only with VLLM_ENABLE_RESPONSES_API_STORE=1,
// and sends images, whose keys the sidecars take from the render
// endpoints that vLLM v0.30 serves only with --enable-scale-out.
func simSetup(workload string) (env, args []string) {
	if !storesResponses(workload) {
		return nil, nil
	}
	return []string{"VLLM_ENABLE_RESPONSES_API_STORE=1"}, []string{"--enable-scale-out"}
}

// probeEvery and probeWindow pace the reads of stored responses: four a
// second, of responses made in the last 20 s (about 40 follow-ups more
// in a 10 s fault, a quarter of them on the faulted pod's store).
const (
	probeEvery  = 250 * time.Millisecond
	probeWindow = 20.0
)

// observe reads every pod's /debug/peers each PollEvery until ctx ends.
func (r *runState) observe(ctx context.Context) {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	t := time.NewTicker(r.cfg.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		at := r.since()
		var wg sync.WaitGroup
		for _, p := range r.c.Pods() {
			wg.Go(func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Admin+"/debug/peers", nil)
				if err != nil {
					return
				}
				resp, err := hc.Do(req)
				if err != nil {
					return // a dead or restarting sidecar observes nothing
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				if err != nil || resp.StatusCode != http.StatusOK {
					return
				}
				ids, err := choosable(body)
				if err != nil {
					return
				}
				r.mu.Lock()
				r.polls = append(r.polls, Poll{AtS: at, Observer: p.Name, Choosable: ids})
				r.mu.Unlock()
			})
		}
		wg.Wait()
	}
}

// inject runs the scenario's faults at their times, each in its own
// goroutine (a fault on one pod waits for the previous fault on that pod),
// and returns when every fault and undo has run or ctx ended.
func (r *runState) inject(ctx context.Context) {
	faults := slices.Clone(r.cfg.Scenario.Faults)
	slices.SortStableFunc(faults, func(a, b Fault) int { return int(a.At - b.At) })
	var wg sync.WaitGroup
	for _, f := range faults {
		if !sleepUntil(ctx, r.start.Add(f.At.D())) {
			break
		}
		slots := r.targets(f)
		for _, i := range slots {
			wg.Go(func() { r.apply(ctx, f, i) })
		}
		if f.Fault == FaultRollingRestart {
			wg.Go(func() { r.roll(ctx) })
		}
	}
	wg.Wait()
}

// targets resolves a fault's pod reference to slots.
func (r *runState) targets(f Fault) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case f.Fault == FaultRollingRestart:
		return nil
	case f.Pod.All:
		out := make([]int, r.cfg.Pods)
		for i := range out {
			out[i] = i
		}
		return out
	case f.Pod.Random:
		var free []int
		for i := range r.cfg.Pods {
			if !r.busy[i] {
				free = append(free, i)
			}
		}
		if len(free) == 0 {
			r.logf("fault %s: no pod free of other faults; skipped", f.Fault)
			return nil
		}
		i := free[r.rng.IntN(len(free))]
		if podFault(f.Fault) {
			r.busy[i] = true
		}
		return []int{i}
	}
	if podFault(f.Fault) {
		r.busy[f.Pod.N-1] = true
	}
	return []int{f.Pod.N - 1}
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// apply injects f on slot i, waits For and undoes it.
func (r *runState) apply(ctx context.Context, f Fault, i int) {
	r.locks[i].Lock()
	defer r.locks[i].Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.busy, i)
		r.mu.Unlock()
	}()
	c := r.c
	rec := &FaultRecord{Fault: f.Fault, Pod: c.Pod(i).Name, AtS: r.since(), slot: i}
	r.mu.Lock()
	r.faults = append(r.faults, rec)
	r.held[rec.Pod]++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		if r.held[rec.Pod]--; r.held[rec.Pod] <= 0 {
			delete(r.held, rec.Pod)
		}
		r.mu.Unlock()
	}()
	var do, undo func() error
	switch f.Fault {
	case FaultKillPod:
		rec.down = true
		do = func() error { return c.Kill(i) }
		undo = func() error { return c.Restart(ctx, i) }
	case FaultReplacePod:
		rec.down = true
		do = func() error { return c.Kill(i) }
		undo = func() error {
			if err := c.Renew(ctx, i); err != nil {
				return err
			}
			rec.NewPod = c.Pod(i).Name
			r.svc.SetEndpoints(endpoints(c))
			return nil
		}
	case FaultKillEngine:
		rec.down = true
		do = func() error { return c.KillSim(i) }
		undo = func() error { return c.StartSim(ctx, i) }
	case FaultHangEngine:
		do = func() error { return c.PauseSim(i) }
		undo = func() error { return c.ResumeSim(i) }
	case FaultKillSidecar:
		rec.down = true
		do = func() error { return c.KillSidecar(i) }
		undo = func() error { return c.RestartSidecar(ctx, i) }
	case FaultRestartSidecar:
		rec.down = true
		do = func() error { return c.StopSidecar(i) }
		undo = func() error { return c.RestartSidecar(ctx, i) }
	case FaultPartition:
		do = func() error { return c.Partition(ctx, i, true) }
		undo = func() error { return c.Partition(ctx, i, false) }
	case FaultGossipDelay:
		d := time.Duration(f.MS) * time.Millisecond
		do = func() error { return c.GossipDelay(ctx, i, d) }
		undo = func() error { return c.GossipDelay(ctx, i, 0) }
	case FaultGossipLoss:
		do = func() error { return c.GossipLoss(ctx, i, f.Percent) }
		undo = func() error { return c.GossipLoss(ctx, i, 0) }
	case FaultDropEvents:
		do = func() error { return c.SetDropRate(ctx, i, f.Rate) }
		undo = func() error { return c.SetDropRate(ctx, i, 0) }
	case FaultUpgradeSidecar:
		rec.down = true
		do = func() error { return r.upgrade(ctx, i, rec) } // undone when it returns
	}
	r.logf("fault %s on %s%s", f.Fault, rec.Pod, forText(f))
	if err := do(); err != nil {
		rec.Err = err.Error()
		r.logf("fault %s on %s failed: %v", f.Fault, rec.Pod, err)
		return
	}
	if f.For <= 0 && f.Fault != FaultReplacePod && f.Fault != FaultRestartSidecar {
		return
	}
	if !sleepUntil(ctx, time.Now().Add(f.For.D())) {
		return
	}
	if err := undo(); err != nil {
		rec.Err = "undo: " + err.Error()
		r.logf("undo %s on %s failed: %v", f.Fault, rec.Pod, err)
		return
	}
	rec.UndoneS = r.since()
	r.logf("undone %s on %s%s", f.Fault, rec.Pod, map[bool]string{true: " (now " + rec.NewPod + ")", false: ""}[rec.NewPod != ""])
}

func forText(f Fault) string {
	if f.For > 0 {
		return " for " + f.For.D().String()
	}
	return ""
}

// roll restarts every pod in turn as a Deployment rollout with maxSurge 0
// and maxUnavailable 1 does: the pod leaves the Service at once
// (terminating), its preStop hook drains the sidecar, the processes get
// SIGTERM, a new pod (new name and address) starts, and the rollout waits
// until the Service sees the new pod ready before taking the next.
func (r *runState) roll(ctx context.Context) {
	c := r.c
	for i := range r.cfg.Pods {
		r.locks[i].Lock()
		old := c.Pod(i)
		rec := &FaultRecord{Fault: FaultRollingRestart, Pod: old.Name, AtS: r.since(), slot: i, down: true}
		r.mu.Lock()
		r.faults = append(r.faults, rec)
		r.mu.Unlock()
		r.logf("rolling restart: %s terminating", old.Name)
		r.svc.Terminate(old.Name)
		err := c.Drain(ctx, i)
		if err == nil {
			err = c.Renew(ctx, i)
		}
		if err == nil {
			rec.NewPod = c.Pod(i).Name
			r.svc.SetEndpoints(endpoints(c))
			err = r.waitReady(ctx, rec.NewPod)
		}
		r.locks[i].Unlock()
		if err != nil {
			rec.Err = err.Error()
			r.logf("rolling restart of %s failed: %v", old.Name, err)
			return
		}
		rec.UndoneS = r.since()
		r.logf("rolling restart: %s replaced by %s", old.Name, rec.NewPod)
	}
}

// waitReady waits until the Service lists name as ready.
func (r *runState) waitReady(ctx context.Context, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if slices.Contains(r.svc.Ready(), name) {
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return fmt.Errorf("service never saw %s ready: %w", name, ctx.Err())
		}
	}
}
