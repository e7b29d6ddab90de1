package kvindex

import (
	"maps"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// FuzzApply drives the index with arbitrary event streams (the decoder
// passes on whatever vLLM, or a broken peer of it, sends). Properties: no
// panic; the routing set is exactly the routed keys of resident hashes;
// held orphans stay within the limit.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 1, 2, 0, 2, 1, 1})
	f.Add([]byte{0, 5, 9, 3, 0, 1, 2, 0, 3, 9, 1, 5, 3, 0, 0, 0, 4, 2})
	f.Add([]byte{4, 3, 0, 2, 7, 7, 1, 7, 0, 1, 2, 3, 4, 5, 6, 7})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		s := blockkey.Scheme{BlockSize: 2, Stride: 1 + next()%3}
		ix := New(Config{Model: "m", Scheme: s, OrphanLimit: 1 + next()%8, CapacityBlocks: next() % 5})
		for len(data) > 0 {
			b := kvevent.Batch{Seq: uint64(next() % 8)}
			for n := next() % 4; n > 0; n-- {
				var ev kvevent.Event
				switch next() % 4 {
				case 0:
					ev.Kind = kvevent.BlockStored
					for range next() % 5 {
						ev.BlockHashes = append(ev.BlockHashes, uint64(next()%16))
					}
					if p := next() % 17; p < 16 {
						h := uint64(p)
						ev.Parent = &h
					}
					ev.BlockSize = next() % 4
					for range next() % 12 {
						ev.TokenIDs = append(ev.TokenIDs, uint32(next()%3))
					}
					if next()%5 == 0 {
						ev.Medium = ptr("CPU")
					}
				case 1:
					ev.Kind = kvevent.BlockRemoved
					for range next() % 5 {
						ev.BlockHashes = append(ev.BlockHashes, uint64(next()%16))
					}
				case 2:
					ev.Kind = kvevent.AllBlocksCleared
				}
				b.Events = append(b.Events, ev)
			}
			if next()%32 == 0 {
				ix.Restart()
			}
			ix.Apply(b)
			if next()%16 == 0 {
				ix.ExpireOrphans()
			}
			want := map[blockkey.Key]bool{}
			for _, r := range ix.Resident() {
				if r.Refs < 1 {
					t.Fatalf("resident %+v with no copies", r)
				}
				if s.Routed(r.Pos) {
					want[r.Key] = true
				}
			}
			if got, w := ix.Keys(), slices.Sorted(maps.Keys(want)); !slices.Equal(got, w) {
				t.Fatalf("Keys() = %v; want routed keys of resident hashes %v", got, w)
			}
			if st := ix.Stats(); st.Orphans > ix.cfg.OrphanLimit || st.Orphans < 0 {
				t.Fatalf("Orphans = %d; limit %d", st.Orphans, ix.cfg.OrphanLimit)
			}
		}
	})
}
