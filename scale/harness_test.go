package scale

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/route"
)

// meshContext skips a test that starts a mesh in -short mode (why) and
// bounds the test's run otherwise.
func meshContext(t *testing.T, why string) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip(why)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestRunSmall runs three real nodes on loopback for a few seconds and
// checks that the harness measured what it claims to.
func TestRunSmall(t *testing.T) {
	r, err := Run(meshContext(t, "runs a 3-node mesh for several seconds"), Config{Nodes: 3, Addr: "127.0.96.9", BasePort: 27100, CapacityBlocks: 300,
		BlocksPerSecond: 200, Warmup: 2 * time.Second, Window: 3 * time.Second,
		FullDigestInterval: 2 * time.Second, Requests: Synthetic(2000, 1), LongPromptBlocks: 256, Seed: 1})
	if err != nil {
		t.Fatalf("Run = %v", err)
	}
	t.Logf("%+v", r)
	if r.SocketBytesPerNode <= r.SentBytesPerNode+r.RecvBytesPerNode {
		t.Errorf("socket traffic %v B/s per node; want more than our messages' %v (memberlist's own too)",
			r.SocketBytesPerNode, r.SentBytesPerNode+r.RecvBytesPerNode)
	}
	if r.SentBytesPerNode <= 0 || r.RecvBytesPerNode <= 0 || r.SentByKind["delta"] <= 0 {
		t.Errorf("traffic sent %v received %v by kind %v; want > 0", r.SentBytesPerNode, r.RecvBytesPerNode, r.SentByKind)
	}
	if r.StoredSamples == 0 || !(r.StoredP99Ms > 0) {
		t.Errorf("stored propagation %d samples p99 %v ms; want samples and a time", r.StoredSamples, r.StoredP99Ms)
	}
	if r.EvictedSamples == 0 {
		t.Errorf("evicted propagation: no sample completed (missed %d)", r.EvictedMissed)
	}
	if r.StoredPerNodePerSec < 100 {
		t.Errorf("stored %v blocks/s per node; want about 200", r.StoredPerNodePerSec)
	}
	if !(r.JoinSeconds >= 0) || r.JoinBytes <= 0 {
		t.Errorf("join %v s, %v bytes; want the joiner to hold every digest", r.JoinSeconds, r.JoinBytes)
	}
	// A dead node is out once its pushes are silent for SilentFor (1.5 s),
	// counted from its last push (which a loaded machine delays), so no
	// bound below but that it was detected.
	if !(r.DetectSeconds > 0) {
		t.Errorf("dead node out of every choice after %v s; want detected", r.DetectSeconds)
	}
	if r.HitRate <= 0 || r.CentralHitRate <= 0 || !(r.ChoiceP99Us > 0) {
		t.Errorf("hit rate %v central %v choice p99 %v µs; want > 0", r.HitRate, r.CentralHitRate, r.ChoiceP99Us)
	}
}

// TestRunBehind: a load pass that outlasts the window (a 1 ns window, past
// by the first 20 ms tick; at 256 nodes on two cores, one pass took 42 s)
// leaves nothing measured: an error that says so, not a crash.
func TestRunBehind(t *testing.T) {
	_, err := Run(meshContext(t, "starts a 2-node mesh"), Config{Nodes: 2, Addr: "127.0.96.9", BasePort: 27200, CapacityBlocks: 300,
		Warmup: time.Millisecond, Window: time.Nanosecond, Requests: Synthetic(100, 1), LongPromptBlocks: 16, Seed: 1})
	if err == nil || !strings.Contains(err.Error(), "fell behind") {
		t.Fatalf("Run = %v; want the harness fell behind", err)
	}
}

// TestKeysMatchIndex checks the harness's request keys are the ones the
// real index derives from its events, so routing can match at all.
func TestKeysMatchIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i, stride := range []int{1, 4, 16} {
		cfg := Config{Addr: "127.0.96.9", BasePort: 27200 + i, CapacityBlocks: 100 * stride, FPRate: 0.01, RoutingStride: stride}.withDefaults()
		n, err := startNode(ctx, cfg, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids, more := []uint64{7, 8, 9, 10}, []uint64{7, 8, 9, 10, 11, 12}
		n.serve(ids, cfg.keys(ids))
		n.serve(more, cfg.keys(more)) // continues the first: a parent, no tokens of it
		if err := waitFor(ctx, 5*time.Second, func() bool { return n.ix.PrefixLen(cfg.keys(more)) == len(more) }); err != nil {
			t.Errorf("stride %d: index PrefixLen(keys) = %d; want %d", stride, n.ix.PrefixLen(cfg.keys(more)), len(more))
		}
		if got := n.stored; got != uint64(len(more)*stride) {
			t.Errorf("stride %d: stored %d vLLM blocks; want %d", stride, got, len(more)*stride)
		}
		n.close()
	}
}

// With a CPU tier the simulated engine sends vLLM's native offload events:
// the blocks the GPU evicts reach the index's CPU tier, and the tier's own
// evictions leave it.
func TestTierEventsIndexed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := Config{Addr: "127.0.96.9", BasePort: 27300, CapacityBlocks: 4, CPUBlocks: 6, FPRate: 0.01, RoutingStride: 1}.withDefaults()
	keys := cfg.keys
	n, err := startNode(ctx, cfg, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	first, second, third := []uint64{1, 2, 3, 4}, []uint64{11, 12, 13, 14}, []uint64{21, 22, 23, 24}
	n.serve(first, keys(first))
	n.serve(second, keys(second)) // first goes to the CPU
	tiers := func(ids []uint64) (gpu, cpu int) {
		g, c, _ := n.ix.TierPrefix(keys(ids), 0)
		return g, c
	}
	if err := waitFor(ctx, 5*time.Second, func() bool { g, c := tiers(first); return g == 0 && c == 4 }); err != nil {
		g, c := tiers(first)
		t.Fatalf("evicted from the GPU: gpu %d cpu %d; want 0 and 4 (%v)", g, c, n.ix.Stats().TierBlocks)
	}
	n.serve(third, keys(third)) // second to the CPU, which keeps 6: 1 and 2 leave it
	if err := waitFor(ctx, 5*time.Second, func() bool {
		s := n.ix.Stats().TierBlocks
		return s[kvindex.GPU] == 4 && s[kvindex.CPU] == 6
	}); err != nil {
		t.Errorf("tier blocks %v; want 4 on the GPU, 6 on the CPU", n.ix.Stats().TierBlocks)
	}
	if g, c := tiers(second); g != 0 || c != 4 {
		t.Errorf("second: gpu %d cpu %d; want 0 and 4", g, c)
	}
}

// TestWarmStart: a node started warm has its engine's cache indexed before
// it serves, so its first digest, full, carries it: a peer that joins
// holds every warm key in its view of the node, and the node sent no
// delta for them.
func TestWarmStart(t *testing.T) {
	ctx := meshContext(t, "starts a 2-node mesh")
	cfg := Config{Addr: "127.0.96.9", BasePort: 27400, CapacityBlocks: 400, FPRate: 0.01}.withDefaults()
	reqs := Synthetic(200, 1)
	var warmed [][]blockkey.Key
	a, err := startWarm(ctx, cfg, 0, nil, func(n *node) blockkey.Key {
		var last blockkey.Key
		for _, q := range reqs {
			if n.lru.Len() >= n.cap {
				break
			}
			ks := cfg.keys(q.HashIDs)
			n.serve(q.HashIDs, ks)
			warmed, last = append(warmed, ks), ks[len(ks)-1]
		}
		return last
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if a.lru.Len() != a.cap || a.ix.Len() == 0 {
		t.Fatalf("warm engine holds %d of %d ids, index %d keys; want full", a.lru.Len(), a.cap, a.ix.Len())
	}
	b, err := startNode(ctx, cfg, 1, []string{a.addr(cfg, 0)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	last := warmed[len(warmed)-1]
	if err := waitFor(ctx, 10*time.Second, func() bool {
		for _, v := range b.mesh.Snapshot(time.Now()) {
			if v.ID == a.name && v.Digest != nil {
				return v.Digest.PrefixLen(last) == len(last)
			}
		}
		return false
	}); err != nil {
		t.Fatalf("the joiner's view of the warm node never held its last prompt: %v", err)
	}
	if d := a.mesh.Stats().Sent.All["delta"].Bytes; d != 0 {
		t.Errorf("the warm node sent %d bytes of deltas; want its cache in its first, full digest", d)
	}
}

// TestCentral: the comparison applies a front's rule to exact knowledge.
// Prompts that share only a first block spread (the longest prefix alone
// sent them all to the engine that held it first); a conversation's next
// turn goes where its earlier turns are, with their blocks as hits.
func TestCentral(t *testing.T) {
	rc := route.DefaultConfig()
	c := newCentral(4, 1000, rc)
	used := map[int]bool{}
	for i := range 64 {
		ids := []uint64{0}
		for j := range 15 {
			ids = append(ids, uint64(1000+100*i+j))
		}
		if h := c.serve(ids); i > 0 && h > 1 {
			t.Fatalf("prompt %d: %d blocks held; want at most the shared first", i, h)
		}
	}
	for i, e := range c.engines {
		if e.lru.Len() > 0 {
			used[i] = true
		}
	}
	if len(used) < 3 {
		t.Errorf("64 prompts sharing a first block went to %d of 4 engines; want spread", len(used))
	}
	turn := []uint64{0}
	for j := range 15 {
		turn = append(turn, uint64(1000+100*7+j))
	}
	turn = append(turn, 5000, 5001)
	if h := c.serve(turn); h != 16 {
		t.Errorf("the next turn of prompt 7 found %d blocks held; want its 16", h)
	}
}
