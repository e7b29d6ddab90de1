package bloom

import (
	"testing"
	"unsafe"
)

// TestBlocksAligned checks that every way of making a scheme-2 digest puts
// its blocks on 64-byte boundaries, so that a block is one cache line and a
// Test one miss. Nothing in the code aligns them: Go allocates pointer-free
// objects of a multiple of 64 bytes at multiples of 64 (size classes from 64
// bytes up are multiples of 64, and spans and large objects start on pages).
// If a runtime changes that, this test says so; results stay correct either
// way, only slower.
func TestBlocksAligned(t *testing.T) {
	for _, m := range []uint64{512, 1024, 1536, 3 * 4096, 99_328, 989_696} {
		d := Build(Header{Node: "p", Params: Params{M: m, K: 6}}, uniformKeys(40, 10))
		b, err := d.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		u, err := Unmarshal(b)
		if err != nil {
			t.Fatal(err)
		}
		a, err := d.Apply(Delta{Node: "p", From: 0, To: 1})
		if err != nil {
			t.Fatal(err)
		}
		for name, x := range map[string]*Digest{"Build": d, "Unmarshal": u, "Apply": a} {
			if addr := uintptr(unsafe.Pointer(&x.bits.Words()[0])); addr%64 != 0 {
				t.Errorf("M=%d: %s's words at %#x, not on a 64-byte boundary", m, name, addr)
			}
		}
	}
}
