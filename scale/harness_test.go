package scale

import (
	"context"
	"testing"
	"time"
)

// TestRunSmall runs three real nodes on loopback for a few seconds and
// checks that the harness measured what it claims to.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node mesh for several seconds")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := Run(ctx, Config{Nodes: 3, Addr: "127.0.96.9", BasePort: 27100, CapacityBlocks: 300,
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

// TestKeysMatchIndex checks the harness's request keys are the ones the
// real index derives from its events, so routing can match at all.
func TestKeysMatchIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := startNode(ctx, Config{Addr: "127.0.96.9", BasePort: 27200, CapacityBlocks: 100, FPRate: 0.01}.withDefaults(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.close()
	ids := []uint64{7, 8, 9, 10}
	n.serve(ids, keys(ids))
	if err := waitFor(ctx, 5*time.Second, func() bool { return n.ix.PrefixLen(keys(ids)) == len(ids) }); err != nil {
		t.Errorf("index PrefixLen(keys) = %d; want %d", n.ix.PrefixLen(keys(ids)), len(ids))
	}
}
