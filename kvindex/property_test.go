package kvindex

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// cacheModel is a small vLLM-like prefix cache: prefix-closed chains,
// duplicate physical copies, tail-first eviction to a capacity, clears and
// restarts. It emits the batches vLLM would and knows the exact state the
// index must reach, with keys from blockkey.Chain over whole prompts.
type cacheModel struct {
	r        *rand.Rand
	model    string
	bs       int
	capacity int
	families [][]uint32
	blocks   map[uint64]*modelBlock
	copies   int
	pending  []kvevent.Event
}

type modelBlock struct {
	parent   uint64 // 0: chain root
	key      blockkey.Key
	pos      int
	copies   int
	children int
}

// vllmHash stands in for vLLM's seeded hash: unrelated to our keys.
func vllmHash(parent uint64, lora string, block []uint32) uint64 {
	seed := parent
	if parent == 0 {
		seed = uint64(blockkey.Root("vllm-seed", lora, ""))
	}
	return uint64(blockkey.Next(blockkey.Key(seed^0x5eed5eed), block)) | 1
}

func (m *cacheModel) request() {
	lora := ""
	if m.r.IntN(4) == 0 {
		lora = "A"
	}
	fam := m.families[m.r.IntN(len(m.families))]
	toks := append([]uint32(nil), fam[:m.r.IntN(len(fam))]...)
	for range m.r.IntN(3 * m.bs) {
		toks = append(toks, uint32(m.r.IntN(50000)))
	}
	n := len(toks) / m.bs
	if n == 0 {
		return
	}
	keys := blockkey.Chain(blockkey.Root(m.model, lora, ""), toks, m.bs)
	hs := make([]uint64, n)
	var parent uint64
	cached := -1 // leading blocks already cached
	for i := range n {
		hs[i] = vllmHash(parent, lora, toks[i*m.bs:(i+1)*m.bs])
		parent = hs[i]
		if _, ok := m.blocks[hs[i]]; !ok && cached < 0 {
			cached = i
		}
	}
	if cached < 0 {
		cached = n
	}
	first := cached
	if cached == n || m.r.IntN(8) == 0 {
		// A concurrent request computed some cached blocks too: their
		// copies are stored again, with the new tail.
		first = m.r.IntN(min(cached+1, n))
	}
	ev := kvevent.Event{Kind: kvevent.BlockStored, BlockHashes: hs[first:], TokenIDs: toks[first*m.bs : n*m.bs], BlockSize: m.bs}
	if lora != "" {
		ev.LoRAName = &lora
	}
	if first > 0 {
		ev.Parent = &hs[first-1]
	}
	if m.r.IntN(10) == 0 {
		ev.Medium = ptr("CPU") // an offload tier: indexed apart, the GPU view below must not move
		m.pending = append(m.pending, ev)
		return
	}
	for i := first; i < n; i++ {
		b, ok := m.blocks[hs[i]]
		if !ok {
			b = &modelBlock{key: keys[i], pos: i}
			if i > 0 {
				b.parent = hs[i-1]
				m.blocks[hs[i-1]].children++
			}
			m.blocks[hs[i]] = b
		}
		b.copies++
		m.copies++
	}
	m.pending = append(m.pending, ev)
}

// evict frees copies tail first until the cache fits its capacity.
func (m *cacheModel) evict() {
	var rm []uint64
	for m.copies > m.capacity {
		var cands []uint64
		for h, b := range m.blocks {
			if b.children == 0 || b.copies > 1 {
				cands = append(cands, h)
			}
		}
		slices.Sort(cands) // map order must not leak into the run
		h := cands[m.r.IntN(len(cands))]
		b := m.blocks[h]
		b.copies--
		m.copies--
		if b.copies == 0 {
			delete(m.blocks, h)
			if b.parent != 0 {
				m.blocks[b.parent].children--
			}
		}
		rm = append(rm, h)
	}
	if len(rm) > 0 {
		m.pending = append(m.pending, kvevent.Event{Kind: kvevent.BlockRemoved, BlockHashes: rm})
	}
}

func (m *cacheModel) clear() {
	clear(m.blocks)
	m.copies = 0
}

func (m *cacheModel) resident() []Resident {
	rs := make([]Resident, 0, len(m.blocks))
	for _, h := range slices.Sorted(maps.Keys(m.blocks)) {
		b := m.blocks[h]
		rs = append(rs, Resident{Hash: h, Key: b.key, Pos: b.pos, Refs: b.copies})
	}
	return rs
}

func (m *cacheModel) routingKeys(s blockkey.Scheme) []blockkey.Key {
	set := map[blockkey.Key]bool{}
	for _, b := range m.blocks {
		if s.Routed(b.pos) {
			set[b.key] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

func TestPropertyMatchesCacheModel(t *testing.T) {
	seeds, steps := uint64(3), 700
	if testing.Short() {
		seeds, steps = 1, 300
	}
	for seed := range seeds {
		r := rand.New(rand.NewPCG(seed, 99))
		m := &cacheModel{r: r, model: "m", bs: 4, capacity: 40 + r.IntN(40), blocks: map[uint64]*modelBlock{}}
		for range 5 {
			fam := make([]uint32, 20*m.bs)
			for i := range fam {
				fam[i] = uint32(r.IntN(50000))
			}
			m.families = append(m.families, fam)
		}
		scheme := blockkey.Scheme{BlockSize: m.bs, Stride: 1 + int(seed%3)}
		ix := New(Config{Model: m.model, Scheme: scheme, CapacityBlocks: m.capacity})
		shadow := map[blockkey.Key]bool{} // the routing set as a digest would track it from deltas
		var seq uint64
		for step := range steps {
			for range 1 + r.IntN(3) {
				m.request()
				m.evict()
			}
			switch r.IntN(150) {
			case 0:
				m.clear()
				m.pending = append(m.pending, kvevent.Event{Kind: kvevent.AllBlocksCleared})
			case 1: // restart: no event; the subscriber reports it
				m.clear()
				m.pending = nil
				seq = 0
				applyDelta(shadow, ix.Restart())
				m.request()
			}
			b := kvevent.Batch{Topic: "kv", Seq: seq, Events: m.pending}
			m.pending = nil
			seq++
			prevVersion := ix.Version()
			ch := ix.Apply(b)
			if ch.OverCapacity || ch.UnknownRemoved != 0 || ch.Orphaned != 0 {
				t.Fatalf("seed %d step %d: unexpected %+v", seed, step, ch)
			}
			applyDelta(shadow, ch)
			if diff := cmp.Diff(m.resident(), ix.Resident()); diff != "" {
				t.Fatalf("seed %d step %d: Resident() mismatch (-model +index):\n%s", seed, step, diff)
			}
			want := m.routingKeys(scheme)
			if diff := cmp.Diff(want, ix.Keys(), cmp.Comparer(func(a, b []blockkey.Key) bool { return len(a) == 0 && len(b) == 0 || slices.Equal(a, b) })); diff != "" {
				t.Fatalf("seed %d step %d: Keys() mismatch (-model +index):\n%s", seed, step, diff)
			}
			if got := slices.Sorted(maps.Keys(shadow)); !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: deltas rebuild %d keys; index has %d", seed, step, len(got), len(want))
			}
			if changed := len(ch.Added)+len(ch.Removed) > 0; changed && ix.Version() == prevVersion {
				t.Fatalf("seed %d step %d: routing set changed but Version stayed %d", seed, step, prevVersion)
			}
		}
		// The run must have exercised every rule it claims to check.
		st := ix.Stats()
		if st.Duplicates == 0 || st.Removed == 0 || st.TierStored[CPU] == 0 || st.Clears+st.Restarts == 0 || st.Batches <= uint64(steps)*8/10 {
			t.Errorf("seed %d: run too tame: %+v", seed, st)
		}
	}
}

func applyDelta(shadow map[blockkey.Key]bool, ch Change) {
	if ch.Cleared || ch.Restarted {
		clear(shadow)
	}
	for _, k := range ch.Added {
		if shadow[k] {
			panic("key added twice")
		}
		shadow[k] = true
	}
	for _, k := range ch.Removed {
		if !shadow[k] {
			panic("absent key removed")
		}
		delete(shadow, k)
	}
}
