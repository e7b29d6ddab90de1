package bloom

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
)

func FuzzUnmarshal(f *testing.F) {
	for _, d := range []*Digest{
		Build(Header{Node: "pod-a", Epoch: 1, Version: 2, Params: Params{M: 64, K: 1}}, nil),
		Build(Header{Node: "pod-b", Epoch: 7, Version: 9, Params: Params{M: 256, K: 3}}, uniformKeys(1, 20)),
		Build(Header{Params: ParamsFor(64, 0.01)}, uniformKeys(2, 64)),
		Build(Header{Node: "old", HashScheme: hashDouble, Params: Params{M: 192, K: 3}}, uniformKeys(5, 9)),
		Build(Header{Node: strings.Repeat("z", MaxNodeBytes), Params: Params{M: 128, K: MaxK}}, uniformKeys(3, 2)),
		withRemovals(Build(Header{Node: "gone", Epoch: 1, Params: ParamsFor(64, 0.01)}, uniformKeys(6, 30)), uniformKeys(6, 30)[3:9]),
	} {
		b, err := d.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add([]byte("KVRD"))
	f.Add(validRaw().bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Unmarshal(b)
		if err != nil {
			if d != nil {
				t.Fatalf("Unmarshal returned a digest and error %v", err)
			}
			return
		}
		again, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary of a decoded digest: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-marshal = %x; want the input %x", again, b)
		}
		if d.Size() != len(b) {
			t.Fatalf("Size() = %d; want %d", d.Size(), len(b))
		}
		// Any decoded digest must be usable without panicking.
		d.Test(blockkey.Key(len(b)))
		d.FillRatio()
		if _, err := d.Apply(Delta{Node: d.Header().Node, Epoch: d.Header().Epoch, From: d.Header().Version, To: d.Header().Version + 1, Keys: []blockkey.Key{1}}); err != nil && d.Header().Version != ^uint64(0) {
			t.Fatalf("Apply of the next delta: %v", err)
		}
	})
}

func FuzzUnmarshalDelta(f *testing.F) {
	for _, x := range []Delta{
		{Node: "pod-a", Epoch: 1, From: 1, To: 2},
		{Node: "pod-a", Epoch: 1, From: 2, To: 3, Keys: uniformKeys(4, 5)},
		{Node: strings.Repeat("y", MaxNodeBytes), Epoch: 1, From: 0, To: ^uint64(0), Keys: []blockkey.Key{1}},
		{Node: "pod-a", Epoch: 1, From: 3, To: 4, Keys: uniformKeys(7, 2), Removed: uniformKeys(8, 3)},
		{Node: "pod-a", Epoch: 1, From: 3, To: 4, Removed: []blockkey.Key{9}},
	} {
		b, err := MarshalDelta(x)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)-1])
	}
	f.Add(validRawDelta().bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		x, err := UnmarshalDelta(b)
		if err != nil {
			return
		}
		again, err := MarshalDelta(x)
		if err != nil {
			t.Fatalf("MarshalDelta of a decoded delta: %v", err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("re-marshal = %x; want the input %x", again, b)
		}
	})
}
