package kvevent

import "testing"

// benchBatches are the two ingest shapes vLLM produces most: one prefill's
// BlockStored (64 blocks of 16 tokens) and an eviction burst.
func benchBatches() []struct {
	name   string
	b      Batch
	blocks int
} {
	stored := Event{Kind: BlockStored, Tag: "BlockStored", BlockSize: 16, Medium: ptr("GPU"),
		BlockHashes: make([]uint64, 64), TokenIDs: make([]uint32, 1024), Parent: ptr[uint64](1<<63 + 1)}
	for i := range stored.BlockHashes {
		stored.BlockHashes[i] = 0x9e3779b97f4a7c15 * uint64(i+1) // spread over 64 bits, like sha256 tails
	}
	for i := range stored.TokenIDs {
		stored.TokenIDs[i] = uint32(i * 151 % 151936) // Qwen3 vocabulary size
	}
	removed := make([]Event, 32)
	for i := range removed {
		removed[i] = Event{Kind: BlockRemoved, Tag: "BlockRemoved", Medium: ptr("GPU"),
			BlockHashes: []uint64{0xc2b2ae3d27d4eb4f * uint64(i+1)}}
	}
	return []struct {
		name   string
		b      Batch
		blocks int
	}{
		{"stored64x1024", Batch{TS: 1764000000.5, DPRank: ptr[int64](0), Events: []Event{stored}}, 64},
		{"removed32", Batch{TS: 1764000000.5, DPRank: ptr[int64](0), Events: removed}, 32},
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, bb := range benchBatches() {
		for _, enc := range []struct {
			name string
			enc  Encoding
		}{{"array", ArrayEncoding}, {"map", MapEncoding}} {
			p, err := Encode(bb.b, enc.enc)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(bb.name+"/"+enc.name, func(b *testing.B) {
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Decode(p); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(bb.blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
			})
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, bb := range benchBatches() {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Encode(bb.b, MapEncoding); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(bb.blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}
