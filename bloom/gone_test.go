package bloom

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
)

// withRemovals returns d after one delta that removes ks.
func withRemovals(d *Digest, ks []blockkey.Key) *Digest {
	h := d.Header()
	n, err := d.Apply(Delta{Node: h.Node, Epoch: h.Epoch, From: h.Version, To: h.Version + 1, Removed: ks})
	if err != nil {
		panic(err)
	}
	return n
}

func TestDeltaRemoves(t *testing.T) {
	ks := uniformKeys(11, 100)
	d := Build(Header{Node: "p", Epoch: 1, Version: 1, Params: ParamsFor(1000, 0.01)}, ks)
	d2 := withRemovals(d, ks[10:20])
	for i, k := range ks {
		if got, want := d2.Test(k), i < 10 || i >= 20; got != want {
			t.Fatalf("Test(ks[%d]) after removing ks[10:20] = %v; want %v", i, got, want)
		}
		if !d.Test(k) {
			t.Fatalf("Apply changed the original digest: ks[%d] gone", i)
		}
	}
	if got := d2.PrefixLen(ks); got != 10 {
		t.Fatalf("PrefixLen = %d; want 10 (the chain breaks at the first removal)", got)
	}
	if d2.Removed() != 10 {
		t.Fatalf("Removed() = %d; want 10", d2.Removed())
	}
	// Re-adding takes a key out of the removals.
	h := d2.Header()
	d3, err := d2.Apply(Delta{Node: "p", Epoch: 1, From: h.Version, To: h.Version + 1, Keys: ks[12:14]})
	if err != nil {
		t.Fatal(err)
	}
	if !d3.Test(ks[12]) || !d3.Test(ks[13]) || d3.Test(ks[14]) || d3.Removed() != 8 {
		t.Fatalf("after re-adding ks[12:14]: Test 12,13,14 = %v %v %v, Removed %d; want true true false 8",
			d3.Test(ks[12]), d3.Test(ks[13]), d3.Test(ks[14]), d3.Removed())
	}
	// A key in both lists of one delta counts as added.
	d4, err := d3.Apply(Delta{Node: "p", Epoch: 1, From: h.Version + 1, To: h.Version + 2, Keys: ks[15:16], Removed: ks[15:17]})
	if err != nil {
		t.Fatal(err)
	}
	if !d4.Test(ks[15]) || d4.Test(ks[16]) {
		t.Fatalf("a key added and removed in one delta: Test = %v; want true (and ks[16] false)", d4.Test(ks[15]))
	}
}

// A removal of a key the bits do not hold costs nothing: it is not kept.
func TestRemovalOfAbsentKeyNotKept(t *testing.T) {
	d := Build(Header{Node: "p", Epoch: 1, Params: ParamsFor(1000, 0.01)}, uniformKeys(1, 10))
	var absent []blockkey.Key
	for _, k := range uniformKeys(99, 50) {
		if !d.Test(k) {
			absent = append(absent, k)
		}
	}
	if got := withRemovals(d, absent).Removed(); got != 0 {
		t.Fatalf("Removed() = %d after removing %d absent keys; want 0", got, len(absent))
	}
}

// Against an exact set under random churn, a chain of deltas never loses a
// held key and never shows a removed one.
func TestDeltaChurnMatchesExactSet(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	pool := uniformKeys(21, 4000)
	held := map[blockkey.Key]bool{}
	d := Build(Header{Node: "p", Epoch: 1, Params: ParamsFor(2000, 0.01)}, nil)
	for step := range 300 {
		var add, rem []blockkey.Key
		seen := map[blockkey.Key]bool{}
		for range 20 {
			k := pool[r.IntN(len(pool))]
			if seen[k] {
				continue
			}
			seen[k] = true
			if held[k] {
				rem = append(rem, k)
				delete(held, k)
			} else {
				add = append(add, k)
				held[k] = true
			}
		}
		h := d.Header()
		// The delta travels on the wire, as it does between peers.
		b, err := MarshalDelta(Delta{Node: "p", Epoch: 1, From: h.Version, To: h.Version + 1, Keys: add, Removed: rem})
		if err != nil {
			t.Fatal(err)
		}
		x, err := UnmarshalDelta(b)
		if err != nil {
			t.Fatal(err)
		}
		if d, err = d.Apply(x); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if step%50 == 49 { // and so does the copy
			b, err := d.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if d, err = Unmarshal(b); err != nil {
				t.Fatalf("step %d: unmarshal a digest with %d removals: %v", step, d.Removed(), err)
			}
		}
	}
	everAdded := 0
	for _, k := range pool {
		if held[k] && !d.Test(k) {
			t.Fatalf("held key %x tests absent", k)
		}
		if !held[k] {
			everAdded++
		}
	}
	if d.Removed() == 0 {
		t.Fatal("no removals kept after churn: the test did not exercise them")
	}
	for _, k := range d.gone {
		if held[k] {
			t.Fatalf("held key %x among the removals", k)
		}
	}
}

func TestDigestWireWithRemovals(t *testing.T) {
	ks := uniformKeys(3, 200)
	base := Build(Header{Node: "p", Epoch: 2, Version: 5, Params: ParamsFor(500, 0.01)}, ks)
	v1, err := base.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if v1[len(digestMagic)] != FormatVersion {
		t.Fatalf("a digest without removals has format %d; want %d (v0.1.0's bytes)", v1[len(digestMagic)], FormatVersion)
	}
	d := withRemovals(base, ks[:7])
	b, err := d.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if b[len(digestMagic)] != FormatRemovals || len(b) != d.Size() || len(b) != len(v1)+4+8*7 {
		t.Fatalf("format %d, %d bytes, Size %d; want format %d and %d bytes", b[len(digestMagic)], len(b), d.Size(), FormatRemovals, len(v1)+4+56)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range ks {
		if got.Test(k) != (i >= 7) {
			t.Fatalf("decoded Test(ks[%d]) = %v", i, got.Test(k))
		}
	}
	old, err := d.MarshalV1()
	if err != nil {
		t.Fatal(err)
	}
	// For a peer of wire 1: the bits alone, with the header of the newer version.
	wantOld, _ := Build(Header{Node: "p", Epoch: 2, Version: 6, Params: ParamsFor(500, 0.01)}, ks).MarshalBinary()
	if !bytes.Equal(old, wantOld) {
		t.Fatal("MarshalV1 is not the format-1 digest of the same bits")
	}
	// Removals out of order, or not in the bits, are malformed.
	bad := slices.Clone(b)
	i, j := len(bad)-16, len(bad)-8
	a := slices.Clone(bad[i:j])
	copy(bad[i:j], bad[j:])
	copy(bad[j:], a)
	if _, err := Unmarshal(bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("removals out of order: err = %v; want malformed", err)
	}
}

func TestDeltaWireFormats(t *testing.T) {
	x := Delta{Node: "p", Epoch: 1, From: 1, To: 2, Keys: uniformKeys(1, 3), Removed: uniformKeys(2, 2)}
	b, err := MarshalDelta(x)
	if err != nil {
		t.Fatal(err)
	}
	got, err := UnmarshalDelta(b)
	if err != nil || !slices.Equal(got.Keys, x.Keys) || !slices.Equal(got.Removed, x.Removed) || b[len(deltaMagic)] != FormatRemovals {
		t.Fatalf("round trip = %+v, %v (format %d)", got, err, b[len(deltaMagic)])
	}
	old, err := MarshalDelta(x.AddsOnly())
	if err != nil {
		t.Fatal(err)
	}
	if old[len(deltaMagic)] != FormatVersion || len(old) != deltaFixedBytes+1+8*3 {
		t.Fatalf("AddsOnly: format %d, %d bytes; want format 1 of v0.1.0's size", old[len(deltaMagic)], len(old))
	}
}
