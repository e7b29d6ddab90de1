package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
)

func TestDeltaRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		x    Delta
	}{
		{"no keys (removals only)", Delta{Node: "pod-a", Epoch: 1, From: 4, To: 5}},
		{"some keys", Delta{Node: "pod-a", Epoch: 2, From: 0, To: 1, Keys: uniformKeys(70, 64)}},
		{"skips versions", Delta{Node: "p", Epoch: 2, From: 10, To: 20, Keys: uniformKeys(71, 3)}},
		{"longest node, extreme numbers", Delta{Node: strings.Repeat("x", MaxNodeBytes), Epoch: ^uint64(0), From: ^uint64(0) - 1, To: ^uint64(0), Keys: []blockkey.Key{0, ^blockkey.Key(0)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := MarshalDelta(tt.x)
			if err != nil {
				t.Fatalf("MarshalDelta() error = %v", err)
			}
			if want := deltaFixedBytes + len(tt.x.Node) + 8*len(tt.x.Keys); len(b) != want {
				t.Errorf("len(MarshalDelta()) = %d; want %d", len(b), want)
			}
			got, err := UnmarshalDelta(b)
			if err != nil {
				t.Fatalf("UnmarshalDelta() error = %v", err)
			}
			if diff := cmp.Diff(tt.x, got); diff != "" {
				t.Errorf("UnmarshalDelta(MarshalDelta()) mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMarshalDeltaErrors(t *testing.T) {
	tests := []struct {
		name string
		x    Delta
	}{
		{"node too long", Delta{Node: strings.Repeat("n", MaxNodeBytes+1), From: 1, To: 2}},
		{"does not advance", Delta{Node: "p", From: 2, To: 2}},
		{"goes backwards", Delta{Node: "p", From: 3, To: 2}},
		{"too many keys", Delta{Node: "p", From: 1, To: 2, Keys: make([]blockkey.Key, MaxDeltaKeys+1)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if b, err := MarshalDelta(tt.x); !errors.Is(err, ErrInvalid) {
				t.Errorf("MarshalDelta() = %d bytes, %v; want ErrInvalid", len(b), err)
			}
		})
	}
}

type rawDelta struct {
	magic           string
	format          uint8
	node            string
	epoch, from, to uint64
	n               uint32
	keys            int
	extra           int
}

func validRawDelta() rawDelta {
	return rawDelta{magic: deltaMagic, format: FormatVersion, node: "pod", epoch: 1, from: 2, to: 3, n: 2, keys: 2}
}

func (r rawDelta) bytes() []byte {
	b := []byte(r.magic)
	b = append(b, r.format, uint8(len(r.node)))
	b = append(b, r.node...)
	for _, v := range []uint64{r.epoch, r.from, r.to} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	b = binary.BigEndian.AppendUint32(b, r.n)
	for i := range r.keys {
		b = binary.BigEndian.AppendUint64(b, uint64(i)+1)
	}
	return append(b, make([]byte, r.extra)...)
}

func TestUnmarshalDeltaErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(r *rawDelta)
		want error
	}{
		{"valid", func(r *rawDelta) {}, nil},
		{"no keys", func(r *rawDelta) { r.n, r.keys = 0, 0 }, nil},
		{"digest magic", func(r *rawDelta) { r.magic = digestMagic }, ErrMalformed},
		{"format 3", func(r *rawDelta) { r.format = 3 }, ErrUnsupported},
		{"format 2 without removals", func(r *rawDelta) { r.format = 2 }, ErrMalformed},
		{"to equals from", func(r *rawDelta) { r.to = r.from }, ErrMalformed},
		{"to before from", func(r *rawDelta) { r.to = 1 }, ErrMalformed},
		{"count above MaxDeltaKeys", func(r *rawDelta) { r.n = MaxDeltaKeys + 1 }, ErrMalformed},
		{"count huge, no keys", func(r *rawDelta) { r.n = ^uint32(0) }, ErrMalformed},
		{"key missing", func(r *rawDelta) { r.keys = 1 }, ErrMalformed},
		{"key extra", func(r *rawDelta) { r.keys = 3 }, ErrMalformed},
		{"trailing byte", func(r *rawDelta) { r.extra = 1 }, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRawDelta()
			tt.edit(&r)
			b := r.bytes()
			x, err := UnmarshalDelta(b)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("UnmarshalDelta() error = %v; want nil", err)
				}
				if again, _ := MarshalDelta(x); !bytes.Equal(again, b) {
					t.Errorf("re-marshal = %x; want %x", again, b)
				}
				return
			}
			if !errors.Is(err, tt.want) {
				t.Errorf("UnmarshalDelta() = %+v, %v; want %v", x, err, tt.want)
			}
		})
	}
	b := validRawDelta().bytes()
	for n := range len(b) {
		if x, err := UnmarshalDelta(b[:n]); !errors.Is(err, ErrMalformed) {
			t.Errorf("UnmarshalDelta(first %d of %d bytes) = %+v, %v; want ErrMalformed", n, len(b), x, err)
		}
	}
}

// TestApplyChain applies a chain of deltas and checks the result equals a
// digest built from scratch, bit for bit, while each older digest is untouched,
// in every hash scheme.
func TestApplyChain(t *testing.T) {
	for _, s := range schemes {
		t.Run(fmt.Sprintf("scheme %d", s), func(t *testing.T) { testApplyChain(t, s) })
	}
}

func testApplyChain(t *testing.T, scheme uint8) {
	p := ParamsFor(1000, 0.01)
	base, add1, add2 := uniformKeys(80, 300), uniformKeys(81, 40), uniformKeys(82, 25)
	d0 := Build(Header{Node: "pod-a", HashScheme: scheme, Epoch: 3, Version: 10, Params: p}, base)
	before, _ := d0.MarshalBinary()

	d1, err := d0.Apply(Delta{Node: "pod-a", Epoch: 3, From: 10, To: 11, Keys: add1})
	if err != nil {
		t.Fatalf("Apply(10→11) error = %v", err)
	}
	d2, err := d1.Apply(Delta{Node: "pod-a", Epoch: 3, From: 11, To: 13, Keys: add2})
	if err != nil {
		t.Fatalf("Apply(11→13) error = %v", err)
	}
	d3, err := d2.Apply(Delta{Node: "pod-a", Epoch: 3, From: 13, To: 14})
	if err != nil {
		t.Fatalf("Apply(13→14, no keys) error = %v", err)
	}

	want := Build(Header{Node: "pod-a", HashScheme: scheme, Epoch: 3, Version: 14, Params: p}, slices.Concat(base, add1, add2))
	wb, _ := want.MarshalBinary()
	gb, _ := d3.MarshalBinary()
	if !bytes.Equal(gb, wb) {
		t.Errorf("chain of deltas differs from a full build:\n got %x\nwant %x", gb[:64], wb[:64])
	}
	if diff := cmp.Diff(want.Header(), d3.Header()); diff != "" {
		t.Errorf("Header() after chain mismatch (-want +got):\n%s", diff)
	}
	if after, _ := d0.MarshalBinary(); !bytes.Equal(after, before) {
		t.Errorf("Apply modified the digest it was called on")
	}
	if got := d1.Header().Version; got != 11 {
		t.Errorf("d1 version = %d; want 11", got)
	}
	if n := d1.PrefixLen(add2); n == len(add2) {
		t.Errorf("d1.PrefixLen(later keys) = %d; want a miss (d2's keys leaked into d1)", n)
	}
}

func TestApplyErrors(t *testing.T) {
	d := Build(Header{Node: "pod-a", Epoch: 3, Version: 10, Params: ParamsFor(100, 0.01)}, uniformKeys(90, 10))
	tests := []struct {
		name string
		x    Delta
		want error
	}{
		{"next", Delta{Node: "pod-a", Epoch: 3, From: 10, To: 11}, nil},
		{"missed one", Delta{Node: "pod-a", Epoch: 3, From: 11, To: 12}, ErrGap},
		{"from ahead of us", Delta{Node: "pod-a", Epoch: 3, From: 12, To: 20}, ErrGap},
		{"duplicate of the last", Delta{Node: "pod-a", Epoch: 3, From: 9, To: 10}, ErrStale},
		{"old", Delta{Node: "pod-a", Epoch: 3, From: 2, To: 3}, ErrStale},
		{"overlaps: starts before, ends after", Delta{Node: "pod-a", Epoch: 3, From: 9, To: 11}, ErrGap},
		{"other epoch", Delta{Node: "pod-a", Epoch: 4, From: 10, To: 11}, ErrGap},
		{"older epoch", Delta{Node: "pod-a", Epoch: 2, From: 10, To: 11}, ErrGap},
		{"other node", Delta{Node: "pod-b", Epoch: 3, From: 10, To: 11}, ErrGap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := d.Apply(tt.x)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Apply(%+v) error = %v; want nil", tt.x, err)
				}
				if got.Header().Version != tt.x.To {
					t.Errorf("Apply(%+v).Version = %d; want %d", tt.x, got.Header().Version, tt.x.To)
				}
				return
			}
			if !errors.Is(err, tt.want) || got != nil {
				t.Errorf("Apply(%+v) = %v, %v; want nil, %v", tt.x, got, err, tt.want)
			}
			other := ErrGap
			if tt.want == ErrGap {
				other = ErrStale
			}
			if errors.Is(err, other) {
				t.Errorf("Apply(%+v) error %v also matches %v", tt.x, err, other)
			}
		})
	}
}
