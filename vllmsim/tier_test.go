package vllmsim

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvevent"
)

func offloadConfig(backend string, blocks int) Config {
	c := smallConfig()
	c.Offload = Offload{Backend: backend, Blocks: blocks}
	c.Timing.LoadPerToken = 3 * time.Microsecond
	return c
}

// cpuEvents splits the CPU-medium events of log into stored and removed
// hashes, checking the native connector's shape on the way.
func cpuEvents(t *testing.T, log []kvevent.Event) (stored, removed []uint64) {
	t.Helper()
	for _, e := range log {
		if e.Medium == nil || *e.Medium != "CPU" {
			continue
		}
		switch e.Kind {
		case kvevent.BlockStored:
			if e.Parent != nil || len(e.TokenIDs) != 0 || e.BlockSize != 0 || e.LoRAName != nil || e.ExtraKeys != nil {
				t.Fatalf("CPU BlockStored %+v: want hashes only", e)
			}
			stored = append(stored, e.BlockHashes...)
		case kvevent.BlockRemoved:
			removed = append(removed, e.BlockHashes...)
		default:
			t.Fatalf("CPU event of kind %v", e.Kind)
		}
	}
	return stored, removed
}

// gpuOnly keeps the GPU events, which the recorder replays as today.
func gpuOnly(evs []kvevent.Event) []kvevent.Event {
	return slices.DeleteFunc(slices.Clone(evs), func(e kvevent.Event) bool {
		return e.Medium != nil && *e.Medium == "CPU"
	})
}

func stepTier(t *testing.T, c *core, r *recorder, log *[]kvevent.Event) *batch {
	t.Helper()
	b := c.schedule()
	evs := c.takeEvents()
	*log = append(*log, evs...)
	r.apply(t, gpuOnly(evs))
	if b != nil {
		c.complete(b)
	}
	return b
}

func drainTier(t *testing.T, c *core, r *recorder, log *[]kvevent.Event) []*batch {
	t.Helper()
	var bs []*batch
	for range 100000 {
		b := stepTier(t, c, r, log)
		if b == nil {
			return bs
		}
		bs = append(bs, b)
	}
	t.Fatal("no progress")
	return nil
}

// TestOffloadStoreLoad: a GPU eviction stores the block's hash to the tier
// (a hash-only CPU BlockStored announced before the GPU BlockRemoved); a
// later request loads it back, is charged the copy, and counts it in
// cached_tokens.
func TestOffloadStoreLoad(t *testing.T) {
	c, r := newTestCore(t, offloadConfig(OffloadNative, 64)), newRecorder()
	var log []kvevent.Event
	a := newSeq(toks(100, 17), 1, 0) // 4 full blocks
	c.add(a)
	drainTier(t, c, r, &log)
	ah := wires(a.hashes)
	log = nil
	c.add(newSeq(toks(500, 56), 1, 0)) // evicts a's blocks 3 and 2
	drainTier(t, c, r, &log)
	stored, removed := cpuEvents(t, log)
	if want := []uint64{ah[3], ah[2]}; !slices.Equal(stored, want) {
		t.Errorf("CPU stored %v; want %v", stored, want)
	}
	if len(removed) != 0 {
		t.Errorf("CPU removed %v; want none (tier not full)", removed)
	}
	// Each CPU store comes right before the GPU removal of the same hash.
	for i, e := range log {
		if e.Medium != nil && *e.Medium == "CPU" && e.Kind == kvevent.BlockStored {
			n := log[i+1]
			if n.Kind != kvevent.BlockRemoved || *n.Medium != "GPU" || n.BlockHashes[0] != e.BlockHashes[0] {
				t.Errorf("after CPU store of %d: %+v; want its GPU removal", e.BlockHashes[0], n)
			}
		}
	}
	checkConsistent(t, c, r)

	log = nil
	q := newSeq(toks(100, 17), 1, 0)
	c.add(q)
	bs := drainTier(t, c, r, &log)
	if q.cachedTokens != 16 {
		t.Errorf("cached tokens = %d; want 16 (8 on GPU + 8 loaded)", q.cachedTokens)
	}
	first := bs[0]
	if first.loadTokens != 8 || first.prefillTokens != 1 {
		t.Errorf("first step: load %d prefill %d; want 8 and 1", first.loadTokens, first.prefillTokens)
	}
	tm := c.cfg.Timing
	if want := tm.Duration(1, 0) + 8*tm.LoadPerToken; first.dur != want {
		t.Errorf("first step %v; want %v (load charged per token)", first.dur, want)
	}
	s := c.stats()
	// PrefixHits counts the GPU only: a and b hit nothing, q 8 tokens.
	if s.ExternalHitsTokens != 8 || s.PrefixHitsTokens != 8 {
		t.Errorf("stats hits GPU %d external %d; want 8 and 8", s.PrefixHitsTokens, s.ExternalHitsTokens)
	}
	if s.ExternalQueriesTokens != 17+56+9 {
		t.Errorf("external queries %d; want %d (tokens past each GPU hit)", s.ExternalQueriesTokens, 17+56+9)
	}
	// Loaded blocks are on the GPU again, announced with tokens as any
	// GPU store.
	if got := r.copies[ah[2]] + r.copies[ah[3]]; got < 2 {
		t.Errorf("loaded blocks on GPU: %d copies; want both", got)
	}
	checkConsistent(t, c, r)
}

// TestOffloadLRU: the tier evicts its least recently used hash, natively
// with a CPU BlockRemoved; a load refreshes a hash; a hash already held is
// not stored again.
func TestOffloadLRU(t *testing.T) {
	h := func(i byte) digest { var d digest; d[len(d)-1] = i; return d }
	tr := newTier(Offload{Backend: OffloadNative, Blocks: 2})
	var evs []kvevent.Event
	evs = tr.put(h(1), evs)
	evs = tr.put(h(2), evs)
	evs = tr.put(h(1), evs) // held: refresh only
	if len(evs) != 2 {
		t.Fatalf("%d events after storing 1, 2, 1; want 2", len(evs))
	}
	evs = tr.put(h(3), nil) // 2 is least recent
	if len(evs) != 2 || evs[0].Kind != kvevent.BlockRemoved || evs[0].BlockHashes[0] != h(2).wire() || *evs[0].Medium != "CPU" {
		t.Fatalf("storing 3: %+v; want CPU removal of 2 then store of 3", evs)
	}
	if !tr.has(h(1)) { // refresh 1: 3 is now least recent
		t.Fatal("1 lost")
	}
	evs = tr.put(h(4), nil)
	if evs[0].BlockHashes[0] != h(3).wire() {
		t.Errorf("storing 4 removed %d; want 3 (1 was loaded since)", evs[0].BlockHashes[0])
	}
	if tr.len() != 2 || tr.has(h(2)) || tr.has(h(3)) {
		t.Errorf("tier holds %d, 2:%v 3:%v; want 1 and 4", tr.len(), tr.has(h(2)), tr.has(h(3)))
	}
}

// TestOffloadChurn: under random churn every CPU removal names a hash the
// tier stored and still held; LMCache mode sends the same stores and no
// removal at all.
func TestOffloadChurn(t *testing.T) {
	run := func(backend string) (stored, removed []uint64) {
		c, r := newTestCore(t, offloadConfig(backend, 6)), newRecorder()
		var log []kvevent.Event
		for i := range 60 {
			c.add(newSeq(toks(100*(i%9), 9+i%13), 2, 0))
			stepTier(t, c, r, &log)
		}
		drainTier(t, c, r, &log)
		checkConsistent(t, c, r)
		if c.pool.tier.len() > 6 {
			t.Errorf("%s: tier holds %d > 6", backend, c.pool.tier.len())
		}
		// Replay the native stream in order: a store names a hash the
		// tier lacks, a removal one it holds, and what it holds stays
		// within its capacity. (LMCache re-stores what it dropped unsaid.)
		held := map[uint64]bool{}
		for _, e := range log {
			if backend != OffloadNative || e.Medium == nil || *e.Medium != "CPU" {
				continue
			}
			h := e.BlockHashes[0]
			if held[h] == (e.Kind == kvevent.BlockStored) {
				t.Fatalf("%s: %v of %d with held=%v", backend, e.Kind, h, held[h])
			}
			held[h] = e.Kind == kvevent.BlockStored
			if !held[h] {
				delete(held, h)
			}
			if len(held) > 6 {
				t.Fatalf("native: events say the tier holds %d > 6", len(held))
			}
		}
		return cpuEvents(t, log)
	}
	ns, nr := run(OffloadNative)
	if len(nr) == 0 {
		t.Fatal("native: no CPU removal under churn; the test provokes none")
	}
	ls, lr := run(OffloadLMCache)
	if len(lr) != 0 {
		t.Errorf("lmcache: %d CPU removals; want none", len(lr))
	}
	if !slices.Equal(ls, ns) {
		t.Errorf("lmcache stored %d hashes, native %d; want the same stores", len(ls), len(ns))
	}
}

// TestOffloadEncodes: the hash-only CPU events survive the wire.
func TestOffloadEncodes(t *testing.T) {
	tr := newTier(Offload{Backend: OffloadNative, Blocks: 1})
	var d1, d2 digest
	d1[31], d2[31] = 1, 2
	evs := tr.put(d2, tr.put(d1, nil))
	for _, enc := range []kvevent.Encoding{kvevent.ArrayEncoding, kvevent.MapEncoding} {
		p, err := kvevent.Encode(kvevent.Batch{TS: 1, Events: evs}, enc)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kvevent.Decode(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.Events) != 3 {
			t.Fatalf("encoding %d: %d events; want 3", enc, len(b.Events))
		}
		for i, e := range b.Events {
			w := evs[i]
			if e.Kind != w.Kind || !slices.Equal(e.BlockHashes, w.BlockHashes) || e.Medium == nil || *e.Medium != "CPU" ||
				e.Parent != nil || len(e.TokenIDs) != 0 || e.BlockSize != 0 {
				t.Errorf("encoding %d event %d: %+v; want %+v", enc, i, e, w)
			}
		}
	}
}

func TestOffloadConfig(t *testing.T) {
	for _, o := range []Offload{{Backend: "disk", Blocks: 4}, {Backend: OffloadNative}, {Backend: OffloadLMCache, Blocks: -1}} {
		c := smallConfig()
		c.Offload = o
		if err := c.validate(); err == nil {
			t.Errorf("offload %+v accepted", o)
		}
	}
	c := smallConfig()
	c.Timing.LoadPerToken = -1
	if err := c.validate(); err == nil {
		t.Error("negative load time accepted")
	}
	if got := LoadPerToken(KVBytesPerToken); got < 2*time.Microsecond || got > 3*time.Microsecond {
		t.Errorf("default load per token %v; want ~2.6µs (128 KiB at 50 GB/s)", got)
	}
}
