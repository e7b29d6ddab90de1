// Package scale runs N real sidecar cache-state nodes in one process, on
// loopback sockets, and measures what the mesh costs as N grows: traffic
// per node by kind, propagation of stored and evicted blocks, choice time,
// memory, a joining node's pull, and hit rate against a central exact index.
//
// Each node is the sidecar's own path from KV events to peers' views: a
// kvindex.Index fed vLLM events through cachestate.State, published by a
// gossip.Mesh (real memberlist over UDP and TCP), and route.DefaultChain
// choosing over the mesh's Snapshot. Only the engine is simulated: an LRU
// of blocks that emits vLLM's BlockStored and BlockRemoved events.
package scale

import (
	"container/list"
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/route"
)

// Config is one run at one N.
type Config struct {
	Nodes int
	// Addr is the loopback address every node binds; node i listens on
	// BasePort+i. Default 127.0.96.1:17000.
	Addr     string
	BasePort int
	// CapacityBlocks is each simulated engine's cache in vLLM blocks.
	// Default 20,000.
	CapacityBlocks int
	// BlocksPerSecond is each node's store rate in vLLM blocks (and, with
	// a full cache, eviction rate). Default 200, issue 25's target.
	BlocksPerSecond float64
	// RoutingStride is vLLM blocks per routing key, the sidecar's
	// --routing-stride: a trace id stands for that many blocks, and the
	// digests carry one key per id. Default blockkey.DefaultScheme's (4).
	RoutingStride int
	// CPUBlocks, above 0, puts a CPU offload tier of that many blocks
	// behind each engine's GPU cache, as vLLM's native offloading does:
	// each block the GPU evicts is stored there first (a hash-only
	// BlockStored with medium CPU), and the tier evicts its least recent
	// (BlockRemoved, CPU). The GPU's churn is unchanged: the tier's cost
	// in upkeep and memory, at the same churn, is the difference. 0: none.
	CPUBlocks int
	// TierStride is the index's lower-tier stride (kvindex.Config.
	// TierStride: one digest entry per that many routing keys); 0: the
	// index's default.
	TierStride int
	// Warmup fills caches before measuring; Window is the measured span.
	// Defaults 10 s and 20 s.
	Warmup, Window time.Duration
	// WarmCaches fills each engine's cache from the trace before its node
	// serves (and the central index's with the same requests): Warmup then
	// only has to settle the mesh, not fill caches at BlocksPerSecond
	// (120 s of the mesh's time for 20,000 blocks).
	WarmCaches bool
	// RebuildRemoved is cachestate.Config.RebuildRemoved: removals carried
	// in deltas before a digest is rebuilt and sent whole; 0 its default
	// (an eighth of the keys the digest is sized for).
	RebuildRemoved int
	// FPRate is the digests' false-positive rate. Default 0.01.
	FPRate float64
	// FullDigestInterval overrides gossip's default (gossip.DefaultConfig:
	// 60 s) when above 0.
	FullDigestInterval time.Duration
	// DigestInterval overrides how often a node sends its digest changes
	// (cachestate.Config.PublishInterval) when above 0.
	DigestInterval time.Duration
	// Requests is the trace replayed in a loop. Required.
	Requests []Request
	// LongPromptBlocks is the length in vLLM blocks of the prompt whose
	// choice is timed. Default 2048 (32k tokens).
	LongPromptBlocks int
	Seed             uint64
	Log              zerolog.Logger
	// Progress, when set, receives a line every few seconds.
	Progress func(string)
	// Slow runs the mesh in slow motion (slow.go): K times slower on the
	// wall clock, with the results in the mesh's own time. Below 1: 1.
	// Warmup, Window and every other duration here are the mesh's.
	Slow float64
	// NoShortlist makes every choice read every view, as a front does
	// with forward.Config.NoShortlist.
	NoShortlist bool
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = "127.0.96.1"
	}
	if c.BasePort == 0 {
		c.BasePort = 17000
	}
	if c.CapacityBlocks <= 0 {
		c.CapacityBlocks = 20000
	}
	if c.BlocksPerSecond <= 0 {
		c.BlocksPerSecond = 200
	}
	if c.RoutingStride <= 0 {
		c.RoutingStride = blockkey.DefaultScheme().Stride
	}
	if c.Warmup <= 0 {
		c.Warmup = 10 * time.Second
	}
	if c.Window <= 0 {
		c.Window = 20 * time.Second
	}
	if c.FPRate <= 0 {
		c.FPRate = 0.01
	}
	if c.LongPromptBlocks <= 0 {
		c.LongPromptBlocks = 2048
	}
	if c.Progress == nil {
		c.Progress = func(string) {}
	}
	return c
}

// Result is what one run measured. Times are in milliseconds or
// microseconds as named; bytes are our payload as gossip.Stats counts it.
type Result struct {
	N                   int                `json:"n"`
	Slow                float64            `json:"slow,omitempty"` // Config.Slow; the rest is in the mesh's time
	WindowSeconds       float64            `json:"window_seconds"`
	StoredPerNodePerSec float64            `json:"stored_blocks_per_node_per_second"`
	SentBytesPerNode    float64            `json:"sent_bytes_per_node_per_second"`
	RecvBytesPerNode    float64            `json:"received_bytes_per_node_per_second"`
	SentByKind          map[string]float64 `json:"sent_bytes_per_node_per_second_by_kind"`
	RecvByKind          map[string]float64 `json:"received_bytes_per_node_per_second_by_kind"`
	// SocketBytesPerNode is sent + received at the mesh's sockets
	// (gossip.Stats.SocketSent): memberlist's own traffic included, IP,
	// UDP and TCP headers not.
	SocketBytesPerNode float64 `json:"socket_bytes_per_node_per_second"`
	StoredP50Ms        float64 `json:"stored_propagation_p50_ms"`
	StoredP99Ms        float64 `json:"stored_propagation_p99_ms"`
	StoredSamples      int     `json:"stored_samples"`
	StoredMissed       int     `json:"stored_missed"`
	EvictedP50Ms       float64 `json:"evicted_propagation_p50_ms"`
	EvictedP99Ms       float64 `json:"evicted_propagation_p99_ms"`
	EvictedSamples     int     `json:"evicted_samples"`
	EvictedMissed      int     `json:"evicted_missed"`
	// ChoiceP50Us and ChoiceP99Us time a node's choice for a long prompt
	// as its front makes it: the views it reads (a shortlist's, or every
	// peer's snapshot), then the policy; ChoiceViews is how many views it
	// read on average.
	ChoiceP50Us float64 `json:"choice_p50_us"`
	ChoiceP99Us float64 `json:"choice_p99_us"`
	ChoiceViews float64 `json:"choice_views"`
	// QuietChoiceP50Us and QuietChoiceP99Us time the same choice at the
	// end of the run, every other node stopped: its own cost on the
	// table the run built, beside one node's mesh as in a sidecar, where
	// ChoiceP50Us's choices waited for the CPU N meshes under load hold.
	// 0 in runs before it was measured.
	QuietChoiceP50Us float64 `json:"quiet_choice_p50_us,omitempty"`
	QuietChoiceP99Us float64 `json:"quiet_choice_p99_us,omitempty"`
	// HeapPerNodeMiB is the process's in-use heap after a GC, less what
	// it held before the nodes started, over N: each node's index, digests,
	// mesh and route state, plus its simulated engine's LRU and its share
	// of the central index, so above a sidecar's own.
	HeapPerNodeMiB float64 `json:"heap_inuse_per_node_mib"`
	JoinBytes      float64 `json:"join_received_bytes"`
	JoinSeconds    float64 `json:"join_seconds"`
	// DetectSeconds is how long after a node dies (its mesh shut down
	// without leaving, as a killed pod's) every other node's choice
	// excludes it (route.Excluded: its load pushes silent for SilentFor,
	// or gone from the table).
	DetectSeconds    float64 `json:"detect_seconds"`
	HitRate          float64 `json:"hit_rate"`
	CentralHitRate   float64 `json:"central_hit_rate"`
	Requests         int     `json:"requests"`
	PollIntervalMs   float64 `json:"poll_interval_ms"`
	InboxDrops, Gaps uint64  `json:"-"`
	// OutboxDrops are messages a node dropped at a peer's full queue
	// (gossip.Stats.OutboxDrops): a lost delta, repaired by a full digest.
	OutboxDrops uint64 `json:"-"`
	// GapsNoCopy and GapsEpoch are the Gaps of deltas with no copy to
	// follow, and of another epoch (gossip.Stats); GapsWindow the Gaps
	// within the window (Gaps counts from the start, joins included).
	GapsNoCopy, GapsEpoch, GapsWindow uint64 `json:"-"`
}

// RequestsPerNode is the requests a node routed a second in the window,
// in the mesh's time: each one's claims are heard by every member, so the
// load kind's bytes grow with it (NaN without a window).
func (r Result) RequestsPerNode() float64 {
	if r.WindowSeconds <= 0 || r.N <= 0 {
		return math.NaN()
	}
	return float64(r.Requests) / r.WindowSeconds / float64(r.N)
}

// poll is how often sampled keys are looked up in every peer's view: the
// propagation times' resolution.
const poll = 10 * time.Millisecond

// sample is a key whose arrival at (or departure from) every peer is timed.
type sample struct {
	origin  int
	key     blockkey.Key
	id      uint64
	at      time.Time
	gone    bool         // evicted: wait for absence
	pending map[int]bool // peers not yet agreeing
	last    time.Time
}

// Run starts cfg.Nodes nodes, replays the trace at the configured block
// rate, measures over the window, then times a joining node, and shuts
// everything down. It blocks for about Warmup + Window + the join.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if len(cfg.Requests) == 0 {
		return Result{}, fmt.Errorf("scale run: no requests")
	}
	res := Result{N: cfg.Nodes, PollIntervalMs: float64(cfg.stretch(poll)) / 1e6} // on the wall clock, as the rest until inMeshTime
	nodes := make([]*node, 0, cfg.Nodes+1)
	defer func() {
		for _, n := range nodes {
			n.close()
		}
	}()
	// The heap before any node starts (the trace, the runtime) is not the
	// nodes'; it is left out of HeapPerNodeMiB.
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	central := newCentral(cfg.Nodes, cfg.idsOf(cfg.CapacityBlocks), cfg.routeConfig())
	next := 0 // the trace's next request
	var warm func(*node) blockkey.Key
	if cfg.WarmCaches {
		warm = func(n *node) blockkey.Key {
			var last blockkey.Key
			for k := 0; n.lru.Len() < n.cap && k < len(cfg.Requests); k++ {
				q := cfg.Requests[next%len(cfg.Requests)].HashIDs
				next++
				ks := cfg.keys(q)
				n.serve(q, ks)
				central.serve(q)
				last = ks[len(ks)-1]
			}
			return last
		}
	}
	join := cfg.stretch(5 * time.Second)
	if cfg.WarmCaches {
		join += cfg.stretch(30 * time.Second) // and its engine's fill indexed
	}
	var seeds []string
	for i := range cfg.Nodes {
		jctx, cancel := context.WithTimeout(ctx, join)
		n, err := startWarm(jctx, cfg, i, seeds, warm)
		cancel()
		if err != nil {
			return res, err
		}
		nodes = append(nodes, n)
		if i == 0 {
			seeds = []string{n.addr(cfg, 0)}
		}
	}
	// Memberlist converges in O(log N) gossip rounds, but on a small
	// shared machine N nodes' probes compete for the CPU: allow more.
	formWait := cfg.stretch(30*time.Second + time.Duration(cfg.Nodes)*500*time.Millisecond)
	if err := waitFor(ctx, formWait, func() bool {
		for _, n := range nodes {
			if n.mesh.Members() != cfg.Nodes {
				return false
			}
		}
		return true
	}); err != nil {
		return res, fmt.Errorf("mesh of %d never formed: %w", cfg.Nodes, err)
	}
	cfg.Progress(fmt.Sprintf("N=%d: mesh formed; warming up %s", cfg.Nodes, cfg.Warmup))

	rng := rand.New(rand.NewPCG(cfg.Seed, uint64(cfg.Nodes)))
	var (
		mu                     sync.Mutex
		samples                []*sample
		storedLat, evictLat    []float64
		storedMiss, evictMiss  int
		measuring              bool
		hits, centralHits, tot float64
		requests               int
	)
	deadline := cfg.stretch(2*max(cfg.FullDigestInterval, 10*time.Second) + 5*time.Second)

	// The poller looks up every pending sample in every peer's view.
	pctx, stopPoll := context.WithCancel(ctx)
	pollDone := make(chan struct{})
	go func() { // exits when stopPoll is called
		defer close(pollDone)
		t := time.NewTicker(cfg.stretch(poll))
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case now := <-t.C:
				mu.Lock()
				pend := slices.Clone(samples)
				mu.Unlock()
				if len(pend) == 0 {
					continue
				}
				for p, n := range nodes[:cfg.Nodes] {
					views := map[string]route.Matcher{}
					for _, v := range n.mesh.Snapshot(now) {
						if v.Digest != nil {
							views[v.ID] = v.Digest
						}
					}
					for _, s := range pend {
						if !s.pending[p] {
							continue
						}
						d := views[nodes[s.origin].name]
						has := d != nil && d.PrefixLen([]blockkey.Key{s.key}) == 1
						if has != s.gone {
							delete(s.pending, p)
						}
					}
				}
				done := time.Now()
				mu.Lock()
				keep := samples[:0]
				for _, s := range samples {
					switch {
					case len(s.pending) == 0:
						lat := float64(done.Sub(s.at)) / 1e6
						if s.gone {
							evictLat = append(evictLat, lat)
						} else {
							storedLat = append(storedLat, lat)
						}
					case done.Sub(s.at) > deadline:
						if s.gone {
							evictMiss++
						} else {
							storedMiss++
						}
					default:
						keep = append(keep, s)
					}
				}
				samples = keep
				mu.Unlock()
			}
		}
	}()

	// The load: requests enter a random node, which chooses by its real
	// view; the chosen node's engine stores what it lacks. Requests come
	// as fast as the cluster's block budget allows.
	start := time.Now()
	measureFrom := start.Add(cfg.stretch(cfg.Warmup))
	end := measureFrom.Add(cfg.stretch(cfg.Window))
	budget := 0.0
	last := start
	tick := time.NewTicker(20 * time.Millisecond)
	var before []statsSnap
	var storedBefore uint64
	var choice []float64
	viewsRead := 0 // by the timed choices
	long := longPrompt(cfg)
	rc := cfg.routeConfig() // the claims' depths, as a sidecar's front places them
	lastProgress := start
	lastSample := start
	for now := range tick.C {
		if ctx.Err() != nil {
			tick.Stop()
			stopPoll()
			<-pollDone
			return res, ctx.Err()
		}
		if now.After(end) {
			break
		}
		if !measuring && now.After(measureFrom) {
			measuring = true
			before = snapAll(nodes[:cfg.Nodes])
			for _, n := range nodes[:cfg.Nodes] {
				storedBefore += n.stored
			}
			cfg.Progress(fmt.Sprintf("N=%d: measuring for %s", cfg.Nodes, cfg.Window))
		}
		budget += cfg.BlocksPerSecond / cfg.slow() * float64(cfg.Nodes) * now.Sub(last).Seconds()
		last = now
		for k := 0; budget > 0 && k < 10*cfg.Nodes; k++ {
			q := cfg.Requests[next%len(cfg.Requests)].HashIDs
			next++
			entry := nodes[rng.IntN(cfg.Nodes)]
			ks := cfg.keys(q)
			d, _ := entry.choose(cfg.request(q, ks), now)
			t := indexOf(nodes[:cfg.Nodes], d.Target)
			if t < 0 {
				t = rng.IntN(cfg.Nodes)
			}
			// As forward does for a request it sent: its own recent
			// forwards, and claims that every member hears with the next
			// load push (counted in the load kind's bytes).
			entry.recent.Record(nodes[t].name, ks, now)
			entry.mesh.Claim(nodes[t].name, route.ClaimsFor(rc, ks, d.HeldAt(nodes[t].name)))
			h, added, removed := nodes[t].serve(q, ks)
			ch := central.serve(q)
			budget -= float64(max(len(added), 1) * cfg.RoutingStride)
			if measuring {
				requests++
				hits += float64(h)
				centralHits += float64(ch)
				tot += float64(len(q))
			}
			if measuring && now.Sub(lastSample) >= cfg.stretch(50*time.Millisecond) {
				lastSample = now
				mu.Lock()
				if len(added) > 0 {
					pos := len(q) - 1
					samples = append(samples, newSample(t, ks[pos], q[pos], now, false, cfg.Nodes))
				}
				if len(removed) > 0 {
					b := removed[0]
					samples = append(samples, newSample(t, b.key, b.id, now, true, cfg.Nodes))
				}
				mu.Unlock()
			}
		}
		if measuring && len(choice) < 5000 {
			t0 := time.Now()
			_, n := nodes[0].choose(long, now)
			choice = append(choice, float64(time.Since(t0))/1e3)
			viewsRead += n
		}
		if now.Sub(lastProgress) >= 5*time.Second {
			lastProgress = now
			mu.Lock()
			cfg.Progress(fmt.Sprintf("N=%d: %.0f s, %d requests, %d samples pending, %d stored / %d evicted timed",
				cfg.Nodes, now.Sub(start).Seconds(), next, len(samples), len(storedLat), len(evictLat)))
			mu.Unlock()
		}
	}
	tick.Stop()
	if !measuring {
		// One pass of the load took the whole window: the machine, not
		// the mesh, sets the pace, and there is nothing to measure.
		stopPoll()
		<-pollDone
		return res, fmt.Errorf("the harness fell behind: the window ended before it opened (%s of warmup took %s); the machine cannot run %d nodes at %g blocks/s each in slow motion ×%g (a larger Slow divides the work)",
			cfg.stretch(cfg.Warmup), time.Since(start).Round(time.Second), cfg.Nodes, cfg.BlocksPerSecond, cfg.slow())
	}
	after := snapAll(nodes[:cfg.Nodes])
	window := time.Since(measureFrom).Seconds()
	res.WindowSeconds = window
	var storedAfter uint64
	for _, n := range nodes[:cfg.Nodes] {
		storedAfter += n.stored
	}
	res.StoredPerNodePerSec = float64(storedAfter-storedBefore) / window / float64(cfg.Nodes)
	res.SentByKind, res.RecvByKind = map[string]float64{}, map[string]float64{}
	for i := range after {
		for k, v := range after[i].sent {
			d := float64(v-before[i].sent[k]) / window / float64(cfg.Nodes)
			res.SentByKind[k] += d
			res.SentBytesPerNode += d
		}
		for k, v := range after[i].recv {
			d := float64(v-before[i].recv[k]) / window / float64(cfg.Nodes)
			res.RecvByKind[k] += d
			res.RecvBytesPerNode += d
		}
		res.SocketBytesPerNode += float64(after[i].sockSent+after[i].sockRecv-before[i].sockSent-before[i].sockRecv) /
			window / float64(cfg.Nodes)
		res.InboxDrops += after[i].drops
		res.OutboxDrops += after[i].outDrops
		res.Gaps += after[i].gaps
		res.GapsNoCopy += after[i].gapsNoCopy // since the start, as Gaps
		res.GapsEpoch += after[i].gapsEp
		res.GapsWindow += after[i].gaps - before[i].gaps
	}
	res.Requests = requests
	if tot > 0 {
		res.HitRate, res.CentralHitRate = hits/tot, centralHits/tot
	}
	res.ChoiceP50Us, res.ChoiceP99Us = quantile(choice, 0.5), quantile(choice, 0.99)
	if len(choice) > 0 {
		res.ChoiceViews = float64(viewsRead) / float64(len(choice))
	}

	// Let the samples taken near the end finish, within their deadline.
	_ = waitFor(ctx, deadline, func() bool { mu.Lock(); defer mu.Unlock(); return len(samples) == 0 })
	stopPoll()
	<-pollDone
	mu.Lock()
	res.StoredP50Ms, res.StoredP99Ms = quantile(storedLat, 0.5), quantile(storedLat, 0.99)
	res.EvictedP50Ms, res.EvictedP99Ms = quantile(evictLat, 0.5), quantile(evictLat, 0.99)
	res.StoredSamples, res.EvictedSamples = len(storedLat), len(evictLat)
	res.StoredMissed, res.EvictedMissed = storedMiss+countGone(samples, false), evictMiss+countGone(samples, true)
	mu.Unlock()

	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapPerNodeMiB = float64(int64(ms.HeapInuse)-int64(base.HeapInuse)) / float64(cfg.Nodes) / (1 << 20)

	// A joining node: bytes it receives and time until it holds a digest
	// of every other node.
	cfg.Progress(fmt.Sprintf("N=%d: timing a joining node", cfg.Nodes))
	jctx, cancel := context.WithTimeout(ctx, cfg.stretch(5*time.Second))
	j, err := startNode(jctx, cfg, cfg.Nodes, seeds)
	cancel()
	if err != nil {
		return res, err
	}
	nodes = append(nodes, j)
	t0 := time.Now()
	names := map[string]bool{}
	for _, n := range nodes[:cfg.Nodes] {
		names[n.name] = true
	}
	err = waitFor(ctx, deadline, func() bool {
		got := 0
		for _, v := range j.mesh.Snapshot(time.Now()) {
			if names[v.ID] && v.Digest != nil {
				got++
			}
		}
		return got == cfg.Nodes
	})
	res.JoinSeconds = time.Since(t0).Seconds()
	if err != nil {
		res.JoinSeconds = math.NaN()
	}
	for _, v := range snapAll([]*node{j})[0].recv {
		res.JoinBytes += float64(v)
	}
	res.DetectSeconds = detect(ctx, nodes, cfg.Nodes-1, deadline, cfg.routeConfig())

	// The choice's own cost at N: every other node stopped as a killed
	// pod is (no leave), so node 0's table still holds them all for the
	// seconds its failure detection takes, and node 0 runs as a sidecar
	// does, beside its own mesh only.
	cfg.Progress(fmt.Sprintf("N=%d: timing the choice, every other node stopped", cfg.Nodes))
	for _, n := range nodes[1:] {
		n.close()
	}
	res.QuietChoiceP50Us, res.QuietChoiceP99Us = quietChoice(nodes[0], long)
	return res.inMeshTime(cfg.slow()), nil
}

// quietChoice times n's choice of req, quietChoices of them after
// quietWarm untimed ones (the first of a loop pay for caches the mesh's
// work left cold), and returns their p50 and p99 in µs.
func quietChoice(n *node, req route.Request) (p50, p99 float64) {
	// No collection during the loop: this process holds what N nodes
	// left (a GiB at 128), whose marking a sidecar, holding one node's,
	// does not do.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range quietWarm {
		n.choose(req, time.Now())
	}
	took := make([]float64, 0, quietChoices)
	for range quietChoices {
		t0 := time.Now()
		n.choose(req, t0)
		took = append(took, float64(time.Since(t0))/1e3)
	}
	return quantile(took, 0.5), quantile(took, 0.99)
}

// The quiet choice's loop: as BenchmarkChooseBloom's (route), 500
// untimed choices and 3,000 timed.
const quietWarm, quietChoices = 500, 3000

// detect kills nodes[dead] and returns the seconds until every other node
// excludes it from its choice, NaN when one still did not within deadline.
func detect(ctx context.Context, nodes []*node, dead int, deadline time.Duration, rc route.Config) float64 {
	name := nodes[dead].name
	nodes[dead].close()
	t0 := time.Now()
	err := waitFor(ctx, deadline, func() bool {
		now := time.Now()
		for i, n := range nodes {
			if i == dead {
				continue
			}
			for _, v := range n.mesh.Snapshot(now) {
				if v.ID == name && route.Excluded(rc, v, now) == "" {
					return false
				}
			}
		}
		return true
	})
	if err != nil {
		return math.NaN()
	}
	return time.Since(t0).Seconds()
}

func newSample(origin int, k blockkey.Key, id uint64, at time.Time, gone bool, n int) *sample {
	s := &sample{origin: origin, key: k, id: id, at: at, gone: gone, pending: map[int]bool{}}
	for p := range n {
		if p != origin {
			s.pending[p] = true
		}
	}
	return s
}

func countGone(ss []*sample, gone bool) int {
	c := 0
	for _, s := range ss {
		if s.gone == gone {
			c++
		}
	}
	return c
}

// longPrompt is a prompt of LongPromptBlocks blocks that starts with the
// trace's first request, so the choice walks real matches before misses.
func longPrompt(cfg Config) route.Request {
	n := cfg.idsOf(cfg.LongPromptBlocks)
	ids := slices.Clone(cfg.Requests[0].HashIDs)
	for id := uint64(1 << 58); len(ids) < n; id++ { // times 16 blocks still fits 64 bits
		ids = append(ids, id)
	}
	ids = ids[:n]
	return cfg.request(ids, cfg.keys(ids))
}

func indexOf(ns []*node, name string) int {
	for i, n := range ns {
		if n.name == name {
			return i
		}
	}
	return -1
}

type statsSnap struct {
	sent, recv         map[string]uint64
	sockSent, sockRecv uint64
	drops, gaps        uint64
	gapsNoCopy, gapsEp uint64
	outDrops           uint64
}

func snapAll(ns []*node) []statsSnap {
	out := make([]statsSnap, len(ns))
	for i, n := range ns {
		st := n.mesh.Stats()
		s := statsSnap{sent: map[string]uint64{}, recv: map[string]uint64{}, drops: st.InboxDrops, gaps: st.Gaps, outDrops: st.OutboxDrops,
			gapsNoCopy: st.GapsNoCopy, gapsEp: st.GapsEpoch,
			sockSent: st.SocketSent, sockRecv: st.SocketReceived}
		for k, v := range st.Sent.All {
			s.sent[k] = v.Bytes
		}
		for k, v := range st.Received.All {
			s.recv[k] = v.Bytes
		}
		out[i] = s
	}
	return out
}

// waitFor polls cond every 10 ms until it holds or within passes.
func waitFor(ctx context.Context, within time.Duration, cond func() bool) error {
	dl := time.Now().Add(within)
	for !cond() {
		if time.Now().After(dl) {
			return fmt.Errorf("not within %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// quantile is the q-quantile of xs by the nearest rank; NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// central is the comparison: the front's rule on one exact index of
// every engine, over engines that store and evict as the harness's do.
// The longest cached prefix wins when it is as long as Affinity asks
// (MinMatchKeys, MinMatchFraction of the prompt), ties broken by weight;
// shorter, the prompt is cold and goes where its rendezvous key is
// weighed highest (route.RendezvousDepth). The longest prefix alone,
// ties on the first id, sent a trace whose every request starts with one
// shared block (Mooncake's conversation trace) to one engine: 0.036 of
// hits against the mesh's 0.336 at 32 nodes.
type central struct {
	engines []*node
	rc      route.Config
}

func newCentral(n, capacity int, rc route.Config) *central {
	c := &central{rc: rc}
	for range n {
		c.engines = append(c.engines, &node{lru: list.New(), at: map[uint64]*list.Element{}, cap: capacity})
	}
	return c
}

// serve routes ids, runs them on the chosen engine, and returns the
// blocks it already held.
func (c *central) serve(ids []uint64) int {
	best, bestLen, bestW := 0, -1, uint64(0)
	home := ids[route.RendezvousDepth(c.rc, len(ids))-1]
	homeAt, homeW := 0, uint64(0)
	for i, e := range c.engines {
		l := e.held(ids)
		w := hrw(i, home)
		if l > bestLen || (l == bestLen && w > bestW) {
			best, bestLen, bestW = i, l, w
		}
		if w > homeW {
			homeAt, homeW = i, w
		}
	}
	if bestLen < max(c.rc.MinMatchKeys, 1) || float64(bestLen) < c.rc.MinMatchFraction*float64(len(ids)) {
		best = homeAt // cold
	}
	e := c.engines[best]
	h, _, _ := e.cache(ids, nil)
	return h
}

func hrw(i int, id uint64) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", i, id)
	return h.Sum64()
}
