package vllmclient

import (
	"testing"

	"github.com/kvroute/kvroute/kvevent"
)

// BenchmarkSequencerLive is the per-batch cost of in-order sequencing.
func BenchmarkSequencerLive(b *testing.B) {
	sq := newSequencer(0, "", false, 100)
	m := msg{topic: "kv", batch: testBatch("kv", 0)}
	b.ReportAllocs()
	for i := range b.N {
		m.seq = uint64(i)
		if s := sq.live(m); len(s.items) != 1 {
			b.Fatalf("step %+v", s)
		}
	}
}

// BenchmarkParseLive is frame parsing plus kvevent decoding of a 16-block
// BlockStored batch, what the socket loop does per message.
func BenchmarkParseLive(b *testing.B) {
	batch := testBatch("kv", 7)
	e := &batch.Events[0]
	e.BlockHashes, e.TokenIDs, e.BlockSize = make([]uint64, 16), make([]uint32, 256), 16
	for i := range e.BlockHashes {
		e.BlockHashes[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	f := frames(b, batch, kvevent.MapEncoding)
	b.SetBytes(int64(len(f[2])))
	b.ReportAllocs()
	for range b.N {
		if m, err := parseLive(f); err != nil || m.err != nil {
			b.Fatal(err, m.err)
		}
	}
}
