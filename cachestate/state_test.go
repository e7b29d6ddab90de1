package cachestate

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/bloom"
	"github.com/kvroute/kvroute/engine"
	"github.com/kvroute/kvroute/kvevent"
	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/route"
	"github.com/kvroute/kvroute/vllmclient"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

// mesh records what the state advertises, in order, and holds the digest
// as the real mesh would (deltas must follow it).
type mesh struct {
	log      []string
	digest   *bloom.Digest
	failNext bool
	wire     uint8 // the mesh's oldest wire version; 0 is 2
}

func (m *mesh) OldestWire() uint8 {
	if m.wire == 0 {
		return 2
	}
	return m.wire
}

func (m *mesh) PublishDigest(d *bloom.Digest) error {
	m.digest = d
	h := d.Header()
	m.log = append(m.log, fmt.Sprintf("full e%d v%d n%d", h.Epoch, h.Version, h.Count))
	return nil
}

func (m *mesh) PublishDelta(x bloom.Delta) error {
	if m.failNext || m.digest == nil {
		m.failNext = false
		return errors.New("refused")
	}
	d, err := m.digest.Apply(x)
	if err != nil {
		return err
	}
	m.digest = d
	m.log = append(m.log, fmt.Sprintf("delta v%d+%d-%d", x.To, len(x.Keys), len(x.Removed)))
	return nil
}

func (m *mesh) WithdrawDigest() {
	m.digest = nil
	m.log = append(m.log, "withdraw")
}

func (m *mesh) SetEngine(e route.Engine) { m.log = append(m.log, "engine "+e.String()) }

type front struct{ ready bool }

func (f *front) SetLocalReady(ok bool) { f.ready = ok }

const bs = 4

func newState(t *testing.T, replay bool) (*State, *mesh, *front, *kvindex.Index) {
	t.Helper()
	scheme := blockkey.Scheme{BlockSize: bs, Stride: 1}
	ix := kvindex.New(kvindex.Config{Model: "m", Scheme: scheme, Epoch: 100})
	m, f := &mesh{}, &front{}
	cfg := Config{Node: "n", Params: bloom.ParamsFor(1000, 0.01), Replay: replay, SilenceWindow: 10 * time.Second,
		SilenceTokens: bs, Now: func() time.Time { return t0 }}
	return New(cfg, ix, m, f, nil, zerolog.Nop()), m, f, ix
}

// stored is a batch storing one block (hash h, tokens from first), a child
// of parent when parent is set.
func stored(seq, h uint64, parent *uint64, first uint32) vllmclient.Item {
	toks := make([]uint32, bs)
	for i := range toks {
		toks[i] = first + uint32(i)
	}
	return vllmclient.Item{Kind: vllmclient.KindBatch, Stream: vllmclient.Stream{Topic: "kv"},
		Batch: kvevent.Batch{Topic: "kv", Seq: seq, Events: []kvevent.Event{{Kind: kvevent.BlockStored,
			BlockHashes: []uint64{h}, Parent: parent, TokenIDs: toks, BlockSize: bs}}}}
}

func serving(s *State, restarted bool, at time.Duration) {
	from := route.EngineStarting
	if restarted {
		from = route.EngineDown
	}
	s.transition(engine.Transition{From: from, To: route.EngineServing, Restarted: restarted, At: t0.Add(at)})
}

func wantLog(t *testing.T, m *mesh, want ...string) {
	t.Helper()
	if fmt.Sprint(m.log) != fmt.Sprint(want) {
		t.Fatalf("advertised %q; want %q", m.log, want)
	}
	m.log = nil
}

// TestNothingAdvertisedUntilServing: while the engine starts, events apply
// but no digest leaves; the first healthy probe publishes it, then the
// engine, then readiness.
func TestNothingAdvertisedUntilServing(t *testing.T) {
	s, m, f, _ := newState(t, true)
	s.apply(stored(0, 1, nil, 10))
	s.publish(t0)
	wantLog(t, m)
	if st, _ := s.Engine(); st != route.EngineStarting || f.ready {
		t.Fatalf("engine %v ready %v before any probe; want starting, not ready", st, f.ready)
	}
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n1", "engine serving")
	if st, _ := s.Engine(); st != route.EngineServing || !f.ready {
		t.Errorf("engine %v ready %v; want serving and ready", st, f.ready)
	}
}

// removed is a batch removing the blocks of hashes.
func removed(seq uint64, hashes ...uint64) vllmclient.Item {
	return vllmclient.Item{Kind: vllmclient.KindBatch, Stream: vllmclient.Stream{Topic: "kv"}, Batch: kvevent.Batch{Topic: "kv", Seq: seq,
		Events: []kvevent.Event{{Kind: kvevent.BlockRemoved, BlockHashes: hashes}}}}
}

// TestRemovalsTravelAsDeltas: a removal goes to peers in the next delta,
// and peers' copies stop matching it; once the removals since the last
// full digest reach RebuildRemoved, the digest is rebuilt from the index;
// a key stored and evicted within one interval travels once, as removed.
func TestRemovalsTravelAsDeltas(t *testing.T) {
	s, m, _, ix := newState(t, true)
	s.cfg.RebuildRemoved = 3
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n0", "engine serving")
	p1, p2 := uint64(1), uint64(2)
	s.apply(stored(0, 1, nil, 10))
	s.apply(stored(1, 2, &p1, 20))
	s.apply(stored(2, 3, &p2, 30))
	s.publish(t0.Add(100 * time.Millisecond))
	wantLog(t, m, "delta v2+3-0")
	chain := make([]blockkey.Key, 3)
	for _, r := range ix.Resident() {
		chain[r.Pos] = r.Key
	}
	s.apply(removed(3, 3))
	s.publish(t0.Add(200 * time.Millisecond))
	wantLog(t, m, "delta v3+0-1")
	if n := m.digest.Removed(); n != 1 {
		t.Fatalf("the mesh's digest carries %d removals; want 1", n)
	}
	if got := m.digest.PrefixLen(chain); got != 2 {
		t.Fatalf("after evicting the chain's last block a peer matches %d keys; want 2", got)
	}
	s.apply(stored(4, 3, &p2, 30)) // stored again ...
	s.apply(removed(5, 3))         // ... and evicted within one interval
	s.publish(t0.Add(300 * time.Millisecond))
	wantLog(t, m, "delta v4+0-1")
	s.apply(removed(6, 2))
	s.publish(t0.Add(400 * time.Millisecond))
	wantLog(t, m, "full e100 v5 n1") // the third removal since the full rebuilds
	if m.digest.Removed() != 0 {
		t.Fatalf("a rebuilt digest carries %d removals; want 0", m.digest.Removed())
	}
}

// TestDeltasAndRebuilds: added keys go as deltas; a refused delta, and
// removals older than RebuildEvery while a member of wire 1 reads no
// removals, go as a full digest.
func TestDeltasAndRebuilds(t *testing.T) {
	s, m, _, _ := newState(t, true)
	m.wire = 1
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n0", "engine serving")
	p := uint64(1)
	s.apply(stored(0, 1, nil, 10))
	s.apply(stored(1, 2, &p, 20))
	s.publish(t0.Add(100 * time.Millisecond))
	wantLog(t, m, "delta v2+2-0")
	s.publish(t0.Add(200 * time.Millisecond))
	wantLog(t, m) // nothing new
	s.apply(vllmclient.Item{Kind: vllmclient.KindBatch, Batch: kvevent.Batch{Seq: 2,
		Events: []kvevent.Event{{Kind: kvevent.BlockRemoved, BlockHashes: []uint64{2}}}}})
	s.publish(t0.Add(time.Second))
	wantLog(t, m, "delta v3+0-1") // what peers of wire 1 drop; they wait for the rebuild
	s.publish(t0.Add(2 * time.Second))
	wantLog(t, m, "full e100 v4 n1")
	m.failNext = true
	s.apply(stored(3, 3, &p, 30))
	s.publish(t0.Add(3 * time.Second))
	wantLog(t, m, "full e100 v5 n2")
}

// TestEngineDownAndBack: down withdraws at once and clears the index;
// back publishes an empty digest of a new epoch before the engine is
// advertised serving, so no peer can match the old engine's blocks.
func TestEngineDownAndBack(t *testing.T) {
	s, m, f, ix := newState(t, true)
	s.apply(stored(0, 1, nil, 10))
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n1", "engine serving")
	s.transition(engine.Transition{From: route.EngineServing, To: route.EngineDown, Reason: "refused", At: t0.Add(time.Second)})
	wantLog(t, m, "engine down", "withdraw")
	if f.ready || ix.Len() != 0 {
		t.Fatalf("after down: ready %v, %d keys; want not ready, empty", f.ready, ix.Len())
	}
	if st, why := s.Engine(); st != route.EngineDown || why != "refused" {
		t.Errorf("Engine() = %v, %q; want down, refused", st, why)
	}
	s.publish(t0.Add(2 * time.Second))
	wantLog(t, m) // nothing while down
	serving(s, true, 3*time.Second)
	// Two restarts (down, back) make two epochs; the digest is empty.
	wantLog(t, m, "full e102 v2 n0", "engine serving")
	if !f.ready {
		t.Errorf("not ready after the engine came back")
	}
	if !s.Partial() {
		t.Errorf("a resumed engine may hold chains we no longer know: want the index partial")
	}
}

// TestEngineHungAndResumed: a hang withdraws the digest but keeps the
// index; when the same process answers again (Resumed) the index goes out
// whole in its epoch, not partial. A new process seen meanwhile (its event
// sequence going back) clears it as any restart does.
func TestEngineHungAndResumed(t *testing.T) {
	s, m, f, ix := newState(t, true)
	s.apply(stored(0, 1, nil, 10))
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n1", "engine serving")
	s.transition(engine.Transition{From: route.EngineServing, To: route.EngineDown, Hung: true, Reason: "hung", At: t0.Add(time.Second)})
	wantLog(t, m, "engine down", "withdraw")
	if f.ready || ix.Len() != 1 {
		t.Fatalf("after a hang: ready %v, %d keys; want not ready, the index kept", f.ready, ix.Len())
	}
	s.publish(t0.Add(2 * time.Second))
	wantLog(t, m) // nothing while down
	s.transition(engine.Transition{From: route.EngineDown, To: route.EngineServing, Restarted: true, Resumed: true, At: t0.Add(3 * time.Second)})
	wantLog(t, m, "full e100 v2 n1", "engine serving")
	if !f.ready || s.Partial() {
		t.Errorf("resumed: ready %v partial %v; want ready, not partial", f.ready, s.Partial())
	}

	// Hung again, and meanwhile a new process starts numbering its events
	// from 0: its cache is not the index's.
	s.transition(engine.Transition{From: route.EngineServing, To: route.EngineDown, Hung: true, Reason: "hung", At: t0.Add(4 * time.Second)})
	wantLog(t, m, "engine down", "withdraw")
	s.apply(vllmclient.Item{Kind: vllmclient.KindRestart, Stream: vllmclient.Stream{Topic: "kv"}, Seq: 0})
	s.transition(engine.Transition{From: route.EngineDown, To: route.EngineServing, Restarted: true, Resumed: true, At: t0.Add(5 * time.Second)})
	if ix.Len() != 0 || m.log[0] == "full e100 v3 n1" {
		t.Errorf("after a new process: %d keys, advertised %q; want the index cleared, a new epoch", ix.Len(), m.log)
	}
}

// TestRestartItemAndCounterReset: the subscriber's restart, and a /metrics
// scrape whose process start time changed, each start a new epoch.
func TestRestartItemAndCounterReset(t *testing.T) {
	s, m, _, ix := newState(t, true)
	serving(s, false, 0)
	s.apply(stored(5, 1, nil, 10))
	s.publish(t0)
	m.log = nil
	s.apply(vllmclient.Item{Kind: vllmclient.KindRestart, Stream: vllmclient.Stream{Topic: "kv"}})
	s.publish(t0.Add(time.Second))
	wantLog(t, m, "full e101 v3 n0")
	s.apply(stored(0, 7, nil, 70))
	s.scraped(vllmclient.Load{PromptTokens: 500, StartTime: 1000}, t0)
	s.scraped(vllmclient.Load{PromptTokens: 600, StartTime: 1000}, t0)
	if ix.Len() != 1 {
		t.Fatalf("a steady counter restarted the index")
	}
	s.scraped(vllmclient.Load{PromptTokens: 700, StartTime: 2000}, t0)
	s.publish(t0.Add(2 * time.Second))
	wantLog(t, m, "full e102 v4 n0") // the pending key went with the old epoch
	s.scraped(vllmclient.Load{PromptTokens: 10, StartTime: 2000}, t0)
	if ix.Epoch() != 103 {
		t.Errorf("a counter that went down: epoch %d; want 103", ix.Epoch())
	}
}

// TestPartialIndex: a sidecar that joins the stream mid-way without replay
// says its index is partial, with replay it does not.
func TestPartialIndex(t *testing.T) {
	for _, replay := range []bool{false, true} {
		s, _, _, _ := newState(t, replay)
		serving(s, false, 0)
		s.apply(stored(41, 1, nil, 10))
		if s.Partial() == replay {
			t.Errorf("replay %v: Partial() = %v", replay, s.Partial())
		}
		index, _ := s.Health()
		if !replay && index[:7] != "partial" {
			t.Errorf("Health() index %q; want partial", index)
		}
	}
	// A scrape shows the engine served before we came: partial too.
	s, _, _, _ := newState(t, false)
	s.scraped(vllmclient.Load{PromptTokens: 5000}, t0)
	if !s.Partial() {
		t.Errorf("engine served before the sidecar, no replay: want partial")
	}
}

// TestSilentEventPath: an engine that prefills with no KV event for the
// window is reported, in Health and Degraded, until an event arrives.
func TestSilentEventPath(t *testing.T) {
	s, _, _, _ := newState(t, true)
	serving(s, false, 0)
	s.scraped(vllmclient.Load{PromptTokens: 0}, t0)
	s.scraped(vllmclient.Load{PromptTokens: 100}, t0.Add(time.Second))
	s.scraped(vllmclient.Load{PromptTokens: 200}, t0.Add(5*time.Second))
	if _, ev := s.Health(); ev != "ok" {
		t.Fatalf("silent within the window: %q", ev)
	}
	s.scraped(vllmclient.Load{PromptTokens: 300}, t0.Add(12*time.Second))
	if _, ev := s.Health(); ev[:6] != "silent" || len(s.Degraded()) != 1 {
		t.Fatalf("after the window: events %q, degraded %q; want silent", ev, s.Degraded())
	}
	s.apply(stored(0, 1, nil, 10))
	if _, ev := s.Health(); ev != "ok" || len(s.Degraded()) != 0 {
		t.Errorf("after an event: events %q, degraded %q; want ok", ev, s.Degraded())
	}
}

// TestGPUOnlyDigestUnchanged: a pod with one rank and no lower tier
// publishes exactly the digest of its GPU keys, as before tiers existed.
func TestGPUOnlyDigestUnchanged(t *testing.T) {
	s, m, _, ix := newState(t, true)
	p := uint64(1)
	s.apply(stored(0, 1, nil, 10))
	s.apply(stored(1, 2, &p, 20))
	serving(s, false, 0)
	got, err := m.digest.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := bloom.Build(bloom.Header{Node: "n", Epoch: 100, Version: 1, Params: s.cfg.Params}, ix.Keys()).MarshalBinary()
	if string(got) != string(want) {
		t.Fatal("a GPU-only single-rank pod's digest differs from the digest of its GPU keys")
	}
}

// onRank is it with the batch from data-parallel rank r and, when medium
// is set, every event's medium.
func onRank(it vllmclient.Item, r int64, medium string) vllmclient.Item {
	it.Batch.DPRank = &r
	if medium != "" {
		for i := range it.Batch.Events {
			it.Batch.Events[i].Medium = &medium
		}
	}
	return it
}

// TestRanksAndTiersAdvertised: a block on rank 1's GPU travels tagged
// with its rank, with the rank's marker, and a block moved to the CPU
// travels as its GPU entry removed and its CPU entry added, with the tier
// marker; peers' copies see both where they are.
func TestRanksAndTiersAdvertised(t *testing.T) {
	scheme := blockkey.Scheme{BlockSize: bs, Stride: 1}
	ix := kvindex.New(kvindex.Config{Model: "m", Scheme: scheme, Epoch: 100, TierStride: 1})
	m := &mesh{}
	s := New(Config{Node: "n", Params: bloom.ParamsFor(1000, 0.01), Replay: true, Now: func() time.Time { return t0 }},
		ix, m, &front{}, nil, zerolog.Nop())
	serving(s, false, 0)
	wantLog(t, m, "full e100 v1 n0", "engine serving")

	s.apply(onRank(stored(0, 7, nil, 70), 1, ""))
	s.publish(t0.Add(100 * time.Millisecond))
	wantLog(t, m, "delta v2+2-0") // the rank-1 entry and RankMarker(1)
	k := ix.Held(kvindex.GPU)[0].Key
	if m.digest.Ranks() != 2 || m.digest.Test(k) || !m.digest.Test(bloom.Tag(k, bloom.TierGPU, 1)) {
		t.Fatalf("rank 1's block: Ranks %d, rank-0 entry %v, rank-1 entry %v; want 2, false, true",
			m.digest.Ranks(), m.digest.Test(k), m.digest.Test(bloom.Tag(k, bloom.TierGPU, 1)))
	}

	p1 := uint64(1)
	s.apply(stored(1, 1, nil, 10))
	s.apply(stored(2, 2, &p1, 20))
	s.publish(t0.Add(200 * time.Millisecond))
	wantLog(t, m, "delta v3+2-0")
	var chain []blockkey.Key
	for _, r := range ix.Held(kvindex.GPU) {
		if r.Rank == 0 {
			chain = append(chain, r.Key)
		}
	}
	if len(chain) != 2 {
		t.Fatalf("rank 0 holds %d blocks; want 2", len(chain))
	}
	// Offload both to the CPU (hash-only stores, as native offloading
	// sends), then evict them from the GPU.
	off := vllmclient.Item{Kind: vllmclient.KindBatch, Stream: vllmclient.Stream{Topic: "kv"}, Batch: kvevent.Batch{Topic: "kv", Seq: 3,
		Events: []kvevent.Event{{Kind: kvevent.BlockStored, BlockHashes: []uint64{1, 2}, BlockSize: bs}}}}
	s.apply(onRank(off, 0, "CPU"))
	s.apply(onRank(removed(4, 1, 2), 0, "GPU"))
	s.publish(t0.Add(300 * time.Millisecond))
	wantLog(t, m, "delta v4+3-2") // two CPU entries and the tier marker; two GPU entries gone
	if m.digest.TierStride() != 1 {
		t.Fatalf("TierStride = %d after an offload; want 1", m.digest.TierStride())
	}
	ordered := make([]blockkey.Key, 2)
	for _, r := range ix.Held(kvindex.CPU) {
		ordered[r.Pos] = r.Key
	}
	if g, c, d := m.digest.TierPrefix(ordered, 0); g != 0 || c != 2 || d != 0 {
		t.Fatalf("a peer sees gpu %d cpu %d disk %d of the offloaded chain; want 0 2 0", g, c, d)
	}
	// The rebuilt digest says the same.
	s.needFull = true
	s.publish(t0.Add(400 * time.Millisecond))
	wantLog(t, m, "full e100 v5 n5")
	if g, c, _ := m.digest.TierPrefix(ordered, 0); g != 0 || c != 2 || m.digest.Ranks() != 2 {
		t.Fatalf("rebuilt: gpu %d cpu %d ranks %d; want 0 2 2", g, c, m.digest.Ranks())
	}
}

// TestStoreOnlyTierAges: the CPU copies of a producer that never removes
// (LMCache announces stores only) leave peers' views once they age past
// the index's StoreOnlyTTL, by delta, like any removal; a GPU block does
// not age.
func TestStoreOnlyTierAges(t *testing.T) {
	const ttl = time.Minute
	scheme := blockkey.Scheme{BlockSize: bs, Stride: 1}
	ix := kvindex.New(kvindex.Config{Model: "m", Scheme: scheme, Epoch: 100, TierStride: 1, StoreOnlyTTL: ttl})
	m := &mesh{}
	s := New(Config{Node: "n", Params: bloom.ParamsFor(1000, 0.01), Replay: true, Now: func() time.Time { return t0 }},
		ix, m, &front{}, nil, zerolog.Nop())
	serving(s, false, 0)
	p1 := uint64(1)
	s.apply(stored(0, 1, nil, 10))
	s.apply(stored(1, 2, &p1, 20))
	s.apply(stored(2, 3, nil, 30)) // stays on the GPU
	off := vllmclient.Item{Kind: vllmclient.KindBatch, Stream: vllmclient.Stream{Topic: "kv"}, Batch: kvevent.Batch{Topic: "kv", Seq: 3,
		Events: []kvevent.Event{{Kind: kvevent.BlockStored, BlockHashes: []uint64{1, 2}, BlockSize: bs}}}}
	s.apply(onRank(off, 0, "CPU"))
	s.apply(onRank(removed(4, 1, 2), 0, "GPU"))
	s.publish(t0)
	m.log = nil
	chain := make([]blockkey.Key, 2)
	for _, r := range ix.Held(kvindex.CPU) {
		chain[r.Pos] = r.Key
	}
	gpu := ix.Held(kvindex.GPU)[0].Key
	if _, c, _ := m.digest.TierPrefix(chain, 0); c != 2 {
		t.Fatalf("before the TTL a peer sees %d CPU keys; want 2", c)
	}
	s.publish(t0.Add(ttl / 2))
	wantLog(t, m) // nothing aged yet
	s.publish(t0.Add(ttl + ttl/8))
	wantLog(t, m, "delta v3+0-2")
	if _, c, _ := m.digest.TierPrefix(chain, 0); c != 0 || !m.digest.Test(gpu) {
		t.Fatalf("after the TTL a peer sees %d CPU keys, GPU block %v; want 0, true", c, m.digest.Test(gpu))
	}
}

// TestDigestGrowsWithItsEntries: a digest is sized for the GPU cache, but
// lower tiers add entries vLLM does not announce a size for; past its
// design load by an eighth it is rebuilt at a size for what it holds, so
// its false-positive rate stays near the target.
func TestDigestGrowsWithItsEntries(t *testing.T) {
	s, m, _, _ := newState(t, true)
	s.cfg.Params = bloom.ParamsFor(64, 0.01)
	serving(s, false, 0)
	design := m.digest.Header().Params
	var parent *uint64
	for i := range uint64(300) {
		s.apply(stored(i, i+1, parent, uint32(10*i)))
		h := i + 1
		parent = &h
		s.publish(t0.Add(time.Duration(i+1) * 100 * time.Millisecond))
	}
	got := m.digest.Header()
	if got.Params.M <= design.M || got.Params.Keys() < 300 {
		t.Fatalf("after 300 entries the digest is M=%d bits for %d keys; want grown past M=%d to hold them", got.Params.M, got.Params.Keys(), design.M)
	}
	fp := 0
	for _, k := range uniformKeys(1, 20000) {
		if m.digest.Test(k) {
			fp++
		}
	}
	if rate := float64(fp) / 20000; rate > 0.03 {
		t.Errorf("false-positive rate %.3f with 300 entries; want near the 1%% target", rate)
	}
}

func uniformKeys(seed uint64, n int) []blockkey.Key {
	ks := make([]blockkey.Key, n)
	x := seed
	for i := range ks {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		ks[i] = blockkey.Key(z ^ z>>31)
	}
	return ks
}

// The engine's process start time moves with the wall clock with no new
// process (the kernel's boot time is derived from it): a second either way,
// or a clock step shorter than the process has been watched, keeps the
// index; a later start that the watched lifetime cannot explain is a new
// process.
func TestStartTimeJitterIsNoRestart(t *testing.T) {
	s, _, _, ix := newState(t, true)
	serving(s, false, 0)
	s.apply(stored(0, 7, nil, 70))
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	// The prompt counter stands still: a rising one with no events would
	// be a silent event path, another rule.
	for i, st := range []float64{1000, 1001, 999, 1001, 1000} {
		s.scraped(vllmclient.Load{PromptTokens: 100, StartTime: st}, at(i))
	}
	s.scraped(vllmclient.Load{PromptTokens: 100, StartTime: 1000}, at(59))
	s.scraped(vllmclient.Load{PromptTokens: 100, StartTime: 1030}, at(60)) // the clock stepped 30 s ahead
	if ix.Len() != 1 || ix.Epoch() != 100 {
		t.Fatalf("start-time jitter and a clock step restarted the index: %d keys, epoch %d", ix.Len(), ix.Epoch())
	}
	// A new process that started after the last scrape: later by at least
	// the minute the old one was watched.
	s.scraped(vllmclient.Load{PromptTokens: 100, StartTime: 1095}, at(61))
	if ix.Epoch() != 101 {
		t.Errorf("a new process: epoch %d; want 101", ix.Epoch())
	}
	// And its own jitter after that is no restart either.
	s.scraped(vllmclient.Load{PromptTokens: 100, StartTime: 1096}, at(62))
	if ix.Epoch() != 101 {
		t.Errorf("the new process's jitter: epoch %d; want 101", ix.Epoch())
	}
}

func TestNewProcess(t *testing.T) {
	for _, tt := range []struct {
		old, cur float64
		watched  time.Duration
		want     bool
	}{
		{1000, 1001, 0, false},              // jitter
		{1000, 999, time.Hour, false},       // earlier: a clock stepped back
		{1000, 1010, time.Minute, false},    // a 10 s step while watched a minute
		{1000, 1010, 5 * time.Second, true}, // a restart right after we met it
		{1000, 1300, 4 * time.Minute, true}, // a restart after 4 minutes
		{1000, 1003, 3 * time.Second, true}, // a fast crash loop
		{1000, 1002, 0, false},              // within the jitter
	} {
		if got := newProcess(tt.old, tt.cur, tt.watched); got != tt.want {
			t.Errorf("newProcess(%v, %v, %v) = %v; want %v", tt.old, tt.cur, tt.watched, got, tt.want)
		}
	}
}
