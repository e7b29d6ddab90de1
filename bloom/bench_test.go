package bloom

import (
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
)

// design100k is a digest at its design load: 100k keys at 1%, the upper end
// of one pod's KV capacity (docs/reference/libraries.md §2.2).
func design100k() (*Digest, []blockkey.Key) {
	keys := uniformKeys(50, 100_000)
	return Build(Header{Node: "pod-a", Epoch: 1, Version: 1, Params: ParamsFor(100_000, 0.01)}, keys), keys
}

// benchParams are the params a 100k-key, 1% digest gets in each scheme:
// scheme 1 the classic sizing ParamsFor gave while it was the default.
var benchParams = map[uint8]Params{hashDouble: {M: 958_528, K: 7}, hashBlocked: ParamsFor(100_000, 0.01)}

// BenchmarkTest tests keys against one 100k-key digest, which stays in cache.
func BenchmarkTest(b *testing.B) {
	keys, absent := uniformKeys(50, 100_000), uniformKeys(51, 4096)
	for _, s := range schemes {
		d := Build(Header{HashScheme: s, Params: benchParams[s]}, keys)
		b.Run(fmt.Sprintf("scheme=%d/present", s), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if !d.Test(keys[i%len(keys)]) {
					b.Fatal("false negative")
				}
			}
		})
		b.Run(fmt.Sprintf("scheme=%d/absent", s), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				d.Test(absent[i%len(absent)])
			}
		})
	}
}

// BenchmarkTest64 spreads tests over 64 different 100k-key digests (7.7 MB
// in all), as a choice over 64 peers does, so most tests miss the cache.
// Present keys walk the digests in turn; absent keys too, and stop at the
// first clear bit.
func BenchmarkTest64(b *testing.B) {
	const peers, sample = 64, 1024
	for _, s := range schemes {
		ds := make([]*Digest, peers)
		present := make([]blockkey.Key, peers*sample) // present[i] is in ds[i%peers]
		for i := range ds {
			keys := uniformKeys(uint64(1000+i), 100_000)
			ds[i] = Build(Header{HashScheme: s, Params: benchParams[s]}, keys)
			for j, k := range keys[:sample] {
				present[j*peers+i] = k
			}
		}
		absent := uniformKeys(51, peers*sample)
		b.Run(fmt.Sprintf("scheme=%d/present", s), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if !ds[i%peers].Test(present[i%len(present)]) {
					b.Fatal("false negative")
				}
			}
		})
		b.Run(fmt.Sprintf("scheme=%d/absent", s), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				ds[i%peers].Test(absent[i%len(absent)])
			}
		})
	}
}

func BenchmarkBuild100k(b *testing.B) {
	keys := uniformKeys(52, 100_000)
	p := ParamsFor(100_000, 0.01)
	b.ReportAllocs()
	for b.Loop() {
		Build(Header{Params: p}, keys)
	}
	b.ReportMetric(float64(Build(Header{Node: "pod-a", Params: p}, keys).Size()), "wire-bytes")
}

// BenchmarkPrefixLen32k walks a 32k-token prompt (2048 keys at block 16), all
// present, against a 100k-key digest: the worst case per peer.
func BenchmarkPrefixLen32k(b *testing.B) {
	d, keys := design100k()
	chain := keys[:2048]
	b.ReportAllocs()
	for b.Loop() {
		if n := d.PrefixLen(chain); n != len(chain) {
			b.Fatalf("PrefixLen = %d; want %d", n, len(chain))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(chain)), "ns/key")
}

func BenchmarkMarshal(b *testing.B) {
	d, _ := design100k()
	b.ReportAllocs()
	b.SetBytes(int64(d.Size()))
	for b.Loop() {
		if _, err := d.MarshalBinary(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUnmarshal(b *testing.B) {
	d, _ := design100k()
	buf, err := d.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, err := Unmarshal(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyDelta applies a 64-key delta to a 100k-key digest, copy on
// write included.
func BenchmarkApplyDelta(b *testing.B) {
	d, _ := design100k()
	x := Delta{Node: "pod-a", Epoch: 1, From: 1, To: 2, Keys: uniformKeys(53, 64)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Apply(x); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDeltaCodec(b *testing.B) {
	x := Delta{Node: "pod-a", Epoch: 1, From: 1, To: 2, Keys: uniformKeys(54, 64)}
	buf, err := MarshalDelta(x)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			MarshalDelta(x)
		}
		b.ReportMetric(float64(len(buf)), "wire-bytes")
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			UnmarshalDelta(buf)
		}
	})
}

// BenchmarkApplyWithRemovals is what a peer pays per delta of one pod
// between its rebuilds: a 20k-key digest carrying 2,500 removals (about
// RebuildRemoved's default) takes a delta of 20 additions and 20 removals.
func BenchmarkApplyWithRemovals(b *testing.B) {
	ks := uniformKeys(1, 22500)
	d := Build(Header{Node: "p", Epoch: 1, Params: ParamsFor(20000, 0.01)}, ks)
	d = withRemovals(d, ks[20000:])
	h := d.Header()
	x := Delta{Node: "p", Epoch: 1, From: h.Version, To: h.Version + 1, Keys: uniformKeys(2, 20), Removed: ks[:20]}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.Apply(x); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrefixLens matches a 32k-token prompt (512 keys, one per 64
// tokens) against every peer's digest at once (Transposed) and one digest
// at a time, as route did: 25k-key digests at 1%, each holding a shared
// 4-key system prompt and 5k other keys; one holds three quarters of the
// prompt.
func BenchmarkPrefixLens(b *testing.B) {
	prompt := uniformKeys(60, 512)
	p := ParamsFor(25_000, 0.01)
	for _, n := range []int{8, 64, 1000} {
		ds := make([]*Digest, n)
		tr := NewTransposed()
		for i := range ds {
			held := append([]blockkey.Key{}, prompt[:4]...)
			if i == n/2 {
				held = prompt[:384]
			}
			held = append(held, uniformKeys(uint64(100+i), 5000)...)
			ds[i] = Build(Header{Node: fmt.Sprint(i), Params: p}, held)
			tr.Put(-1, ds[i])
		}
		out, stamps := make([]int, n), make([]uint64, n)
		b.Run(fmt.Sprintf("peers=%d/transposed", n), func(b *testing.B) {
			for b.Loop() {
				tr.PrefixLens(prompt, out, stamps)
			}
			if out[n/2] != 384 || out[0] != 4 {
				b.Fatalf("PrefixLens = %d, %d; want 384, 4", out[n/2], out[0])
			}
		})
		b.Run(fmt.Sprintf("peers=%d/each", n), func(b *testing.B) {
			for b.Loop() {
				for i, d := range ds {
					out[i] = d.PrefixLen(prompt)
				}
			}
		})
	}
}

// BenchmarkTransposedPut is what the peer table pays per applied delta to
// keep its transposed copy: a member's next version (20 keys added) put
// over its last, among 8 or 1000 members of 25k-key digests.
func BenchmarkTransposedPut(b *testing.B) {
	for _, n := range []int{8, 1000} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) { benchTransposedPut(b, n) })
	}
}

func benchTransposedPut(b *testing.B, members int) {
	p := ParamsFor(25_000, 0.01)
	tr := NewTransposed()
	var d *Digest
	var slot int
	for i := range members {
		d = Build(Header{Node: "n", Params: p}, uniformKeys(uint64(200+i), 5000))
		slot, _ = tr.Put(-1, d)
	}
	next := make([]*Digest, 64)
	for i := range next {
		h := d.Header()
		nd, err := d.Apply(Delta{Node: h.Node, Epoch: h.Epoch, From: h.Version, To: h.Version + 1, Keys: uniformKeys(uint64(900+i), 20)})
		if err != nil {
			b.Fatal(err)
		}
		d, next[i] = nd, nd
	}
	for i := 0; b.Loop(); i++ {
		tr.Put(slot, next[i%len(next)])
	}
}
