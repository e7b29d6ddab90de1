package kvindex

import (
	"slices"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

func ptr[T any](v T) *T { return &v }

// blockToks returns n blocks of bs tokens, block i filled with base+i.
func blockToks(base uint32, n, bs int) []uint32 {
	t := make([]uint32, 0, n*bs)
	for i := range n {
		for range bs {
			t = append(t, base+uint32(i))
		}
	}
	return t
}

func stored(parent *uint64, toks []uint32, hashes ...uint64) kvevent.Event {
	return kvevent.Event{Kind: kvevent.BlockStored, BlockHashes: hashes, Parent: parent, TokenIDs: toks, BlockSize: 4}
}

func removed(hashes ...uint64) kvevent.Event {
	return kvevent.Event{Kind: kvevent.BlockRemoved, BlockHashes: hashes}
}

// perBlock is vLLM's block size with a routing key on every block.
var perBlock = blockkey.Scheme{BlockSize: 16, Stride: 1}

func TestApply(t *testing.T) {
	root := blockkey.Root("m", "", "")
	abc := blockToks(100, 3, 4)
	k := blockkey.Chain(root, abc, 4)
	tests := []struct {
		name    string
		cfg     Config
		batches [][]kvevent.Event
		want    Change // of the last batch
		keys    []blockkey.Key
		refs    map[uint64]int
	}{
		{
			name:    "store keys every block",
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3)}},
			want:    Change{Added: []blockkey.Key{k[0], k[1], k[2]}},
			keys:    k, refs: map[uint64]int{1: 1, 2: 1, 3: 1},
		},
		{
			name:    "duplicate copy increments refs",
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3)}, {stored(ptr[uint64](1), abc[4:8], 2)}},
			want:    Change{},
			keys:    k, refs: map[uint64]int{1: 1, 2: 2, 3: 1},
		},
		{
			name:    "removal of one copy keeps the key",
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3), stored(ptr[uint64](1), abc[4:8], 2)}, {removed(2)}},
			want:    Change{},
			keys:    k, refs: map[uint64]int{1: 1, 2: 1, 3: 1},
		},
		{
			name:    "last copy removed drops the key",
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3)}, {removed(3, 2)}},
			want:    Change{Removed: []blockkey.Key{k[2], k[1]}},
			keys:    k[:1], refs: map[uint64]int{1: 1},
		},
		{
			name:    "unknown removal counted",
			batches: [][]kvevent.Event{{stored(nil, abc[:4], 1)}, {removed(7, 8)}},
			want:    Change{UnknownRemoved: 2},
			keys:    k[:1], refs: map[uint64]int{1: 1},
		},
		{
			name: "a lower tier is not the GPU; hash-only stores of unknown hashes are unresolved",
			batches: [][]kvevent.Event{{
				{Kind: kvevent.BlockStored, BlockHashes: []uint64{1}, TokenIDs: abc[:4], BlockSize: 4, Medium: ptr("CPU")},
				{Kind: kvevent.BlockStored, BlockHashes: []uint64{2, 3}, BlockSize: 4},
			}},
			want: Change{Unresolved: 2}, // block 1 on the CPU at pos 0: no lower-tier entry (TierStride 4)
			refs: map[uint64]int{},
		},
		{
			name:    "uncovered hashes ignored",
			batches: [][]kvevent.Event{{stored(nil, abc[:7], 1, 2, 3)}},
			want:    Change{Added: k[:1], Ignored: 2},
			keys:    k[:1], refs: map[uint64]int{1: 1},
		},
		{
			name: "zero block size falls back to the scheme",
			cfg:  Config{Scheme: blockkey.Scheme{BlockSize: 4}},
			batches: [][]kvevent.Event{{
				{Kind: kvevent.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: abc[:8]},
			}},
			want: Change{Added: k[:2]},
			keys: k[:2], refs: map[uint64]int{1: 1, 2: 1},
		},
		{
			name:    "unseen parent held aside",
			batches: [][]kvevent.Event{{stored(ptr[uint64](9), abc[4:12], 2, 3)}},
			want:    Change{Orphaned: 2},
			refs:    map[uint64]int{},
		},
		{
			name:    "negative orphan limit holds none",
			cfg:     Config{OrphanLimit: -1},
			batches: [][]kvevent.Event{{stored(ptr[uint64](9), abc[4:12], 2, 3)}},
			want:    Change{Expired: 2},
			refs:    map[uint64]int{},
		},
		{
			name:    "cleared",
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3)}, {{Kind: kvevent.AllBlocksCleared}}},
			want:    Change{Cleared: true},
			refs:    map[uint64]int{},
		},
		{
			name:    "over capacity",
			cfg:     Config{CapacityBlocks: 1},
			batches: [][]kvevent.Event{{stored(nil, abc, 1, 2, 3)}},
			want:    Change{Added: k, OverCapacity: true},
			keys:    k, refs: map[uint64]int{1: 1, 2: 1, 3: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.Model = "m"
			if cfg.Scheme == (blockkey.Scheme{}) {
				cfg.Scheme = perBlock // these cases expect a key per block
			}
			ix := New(cfg)
			var ch Change
			for i, evs := range tt.batches {
				ch = ix.Apply(kvevent.Batch{Seq: uint64(i), Events: evs})
			}
			if diff := cmp.Diff(tt.want, ch); diff != "" {
				t.Errorf("last Change mismatch (-want +got):\n%s", diff)
			}
			wantKeys := append([]blockkey.Key{}, tt.keys...)
			slices.Sort(wantKeys)
			if diff := cmp.Diff(wantKeys, ix.Keys()); diff != "" {
				t.Errorf("Keys() mismatch (-want +got):\n%s", diff)
			}
			got := map[uint64]int{}
			for _, r := range ix.Resident() {
				got[r.Hash] = r.Refs
			}
			if diff := cmp.Diff(tt.refs, got); diff != "" {
				t.Errorf("refs mismatch (-want +got):\n%s", diff)
			}
			if ch.OverCapacity != ix.Uncertain() {
				t.Errorf("Uncertain() = %v; want %v", ix.Uncertain(), ch.OverCapacity)
			}
		})
	}
}

func TestAccessors(t *testing.T) {
	s := blockkey.Scheme{BlockSize: 4, Stride: 1}
	root := blockkey.Root("m", "", "")
	toks := blockToks(7, 6, 4)
	ix := New(Config{Model: "m", Scheme: s})
	ix.Apply(kvevent.Batch{Events: []kvevent.Event{stored(nil, toks[:12], 1, 2, 3)}})
	req := s.Request(root, append(toks, 99)) // 6 reusable blocks, 3 cached
	tests := []struct {
		name string
		got  int
		want int
	}{
		{"PrefixLen", ix.PrefixLen(req), 3},
		{"PrefixLen empty", ix.PrefixLen(nil), 0},
		{"PrefixLen miss first", ix.PrefixLen(req[3:]), 0},
		{"Len", ix.Len(), 3},
		{"Blocks", ix.Blocks(), 3},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %d; want %d", tt.name, tt.got, tt.want)
		}
	}
	if !ix.Contains(req[2]) || ix.Contains(req[3]) {
		t.Errorf("Contains(req[2], req[3]) = %v, %v; want true, false", ix.Contains(req[2]), ix.Contains(req[3]))
	}
	ix.SetUncertain(true)
	if !ix.Uncertain() || !ix.Stats().Uncertain {
		t.Error("SetUncertain(true) not reflected")
	}
}

func TestConfigDefaults(t *testing.T) {
	d := DefaultConfig()
	if d.Scheme != blockkey.DefaultScheme() || d.OrphanLimit != 4096 || d.CapacityBlocks != 0 {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	if got := (Config{}).normalized(); got.Scheme != d.Scheme || got.OrphanLimit != d.OrphanLimit {
		t.Errorf("Config{}.normalized() = %+v; want the defaults", got)
	}
	if got := New(Config{Epoch: 42}).Epoch(); got != 42 {
		t.Errorf("Epoch() = %d; want Config.Epoch 42", got)
	}
}

// The real capture's 25 blocks key exactly as blockkey.Chain keys its
// 400 tokens (with and without LoRA "Alice").
func TestFixtureKeys(t *testing.T) {
	for _, f := range []string{"kv_event_base.json", "kv_event_lora.json"} {
		t.Run(f, func(t *testing.T) {
			fx, ev := loadFixture(t, f)
			if len(fx.BlockHashes) != 25 || len(fx.TokenIDs) != 400 {
				t.Fatalf("fixture has %d hashes, %d tokens; want 25, 400", len(fx.BlockHashes), len(fx.TokenIDs))
			}
			ix := New(Config{Model: fx.ModelName, Scheme: perBlock})
			ch := ix.Apply(kvevent.Batch{Events: []kvevent.Event{ev}})
			lora := ""
			if fx.LoRAName != nil {
				lora = *fx.LoRAName
			}
			want := blockkey.Chain(blockkey.Root(fx.ModelName, lora, ""), fx.TokenIDs, 16)
			if diff := cmp.Diff(want, ch.Added); diff != "" {
				t.Errorf("Added mismatch (-Chain +got):\n%s", diff)
			}
			for _, r := range ix.Resident() {
				if want[r.Pos] != r.Key {
					t.Errorf("hash %d at pos %d: key %#x; want %#x", r.Hash, r.Pos, uint64(r.Key), uint64(want[r.Pos]))
				}
			}
		})
	}
}

// Readers run while batches apply; -race checks the locking.
func TestConcurrentReaders(t *testing.T) {
	ix := New(Config{Model: "m", Scheme: blockkey.Scheme{BlockSize: 4}})
	toks := blockToks(1, 64, 4)
	keys := blockkey.Chain(blockkey.Root("m", "", ""), toks, 4)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					_ = ix.PrefixLen(keys)
					_ = ix.Stats()
				}
			}
		}()
	}
	for i := range 200 {
		hs := make([]uint64, 64)
		for j := range hs {
			hs[j] = uint64(j + 1)
		}
		ix.Apply(kvevent.Batch{Seq: uint64(2 * i), Events: []kvevent.Event{stored(nil, toks, hs...)}})
		ix.Apply(kvevent.Batch{Seq: uint64(2*i + 1), Events: []kvevent.Event{removed(hs...)}})
	}
	close(stop)
	wg.Wait()
	if ix.Blocks() != 0 {
		t.Errorf("Blocks() = %d; want 0", ix.Blocks())
	}
}

func BenchmarkApply(b *testing.B) {
	const blocks, bs = 64, 16
	ix := New(Config{Model: "m", Scheme: blockkey.Scheme{BlockSize: bs, Stride: 1}})
	toks := blockToks(1000, blocks, bs)
	hs := make([]uint64, blocks)
	rm := make([]uint64, blocks)
	seq := uint64(0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := range hs {
			hs[j] = uint64(i)<<8 | uint64(j) + 1
			rm[blocks-1-j] = hs[j] // tail first, as vLLM evicts
		}
		toks[0] = uint32(i) // a new prompt each time: new keys
		ix.Apply(kvevent.Batch{Seq: seq, Events: []kvevent.Event{{Kind: kvevent.BlockStored, BlockHashes: hs, TokenIDs: toks, BlockSize: bs}}})
		ix.Apply(kvevent.Batch{Seq: seq + 1, Events: []kvevent.Event{{Kind: kvevent.BlockRemoved, BlockHashes: rm}}})
		seq += 2
	}
	b.ReportMetric(float64(b.N*blocks)/b.Elapsed().Seconds(), "blocks/s")
}

// TestRestartEmptiesIntoNewEpoch: after Restart the index is empty in a
// new epoch and the new engine's first batch, seq 0, live or replayed,
// applies (the index has no sequence state to drop it by).
func TestRestartEmptiesIntoNewEpoch(t *testing.T) {
	ix := New(Config{Model: "m"})
	stored := func(seq uint64, hash uint64) kvevent.Batch {
		toks := make([]uint32, 16)
		for i := range toks {
			toks[i] = uint32(hash)*100 + uint32(i)
		}
		return kvevent.Batch{Topic: "t", Seq: seq, Events: []kvevent.Event{{Kind: kvevent.BlockStored,
			BlockHashes: []uint64{hash}, TokenIDs: toks, BlockSize: 16}}}
	}
	for seq := range uint64(5) {
		ix.Apply(stored(seq, 100+seq))
	}
	epoch := ix.Epoch()
	ch := ix.Restart()
	if !ch.Restarted || ix.Epoch() == epoch || ix.Blocks() != 0 || ix.Len() != 0 {
		t.Fatalf("Restart() = %+v, epoch %d→%d, blocks %d; want restarted, new epoch, empty", ch, epoch, ix.Epoch(), ix.Blocks())
	}
	if ch := ix.Apply(stored(0, 7)); ch.Restarted || ix.Blocks() != 1 {
		t.Errorf("seq 0 after Restart: %+v, blocks %d; want applied", ch, ix.Blocks())
	}
}
