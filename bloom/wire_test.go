package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
)

func TestMarshalRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		keys []blockkey.Key
	}{
		{"empty filter", Header{Node: "pod-a", Params: Params{M: 64, K: 1}}, nil},
		{"no node name", Header{Epoch: 1, Version: 2, Params: ParamsFor(100, 0.01)}, uniformKeys(60, 100)},
		{"longest node name", Header{Node: strings.Repeat("n", MaxNodeBytes), Params: ParamsFor(100, 0.01)}, uniformKeys(61, 10)},
		{"extreme versions", Header{Node: "p", Epoch: ^uint64(0), Version: ^uint64(0) - 1, Params: ParamsFor(1000, 0.001)}, uniformKeys(62, 1000)},
		{"max K", Header{Node: "p", KeyScheme: 255, Params: Params{M: 4096, K: MaxK}}, uniformKeys(63, 20)},
		{"scheme 1", Header{Node: "old", HashScheme: hashDouble, Params: Params{M: 640, K: 7}}, uniformKeys(64, 50)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Build(tt.h, tt.keys)
			b, err := d.MarshalBinary()
			if err != nil {
				t.Fatalf("MarshalBinary() error = %v", err)
			}
			if len(b) != d.Size() {
				t.Errorf("len(MarshalBinary()) = %d; want Size() = %d", len(b), d.Size())
			}
			got, err := Unmarshal(b)
			if err != nil {
				t.Fatalf("Unmarshal() error = %v", err)
			}
			if diff := cmp.Diff(d.Header(), got.Header()); diff != "" {
				t.Errorf("Unmarshal(MarshalBinary()).Header() mismatch (-want +got):\n%s", diff)
			}
			if !slices.Equal(d.bits.Words(), got.bits.Words()) {
				t.Errorf("Unmarshal(MarshalBinary()) bits differ")
			}
			for _, k := range tt.keys {
				if !got.Test(k) {
					t.Errorf("Test(%#x) = false after round trip; want true", k)
				}
			}
			again, err := got.MarshalBinary()
			if err != nil || !bytes.Equal(again, b) {
				t.Errorf("re-marshal = %x, %v; want the original bytes", again, err)
			}
			// The result must not alias the input.
			clear(b)
			for _, k := range tt.keys {
				if !got.Test(k) {
					t.Fatalf("Test(%#x) = false after clearing the input; digest aliases its input", k)
				}
			}
		})
	}
}

func TestMarshalBinaryLayout(t *testing.T) {
	d := Build(Header{Node: "ab", Epoch: 3, Version: 4, Params: Params{M: 512, K: 2}}, []blockkey.Key{7})
	b, err := d.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("KVRD")
	want = append(want, FormatVersion, blockkey.Version, HashScheme, 2, 'a', 'b')
	want = binary.BigEndian.AppendUint64(want, 3)   // epoch
	want = binary.BigEndian.AppendUint64(want, 4)   // version
	want = binary.BigEndian.AppendUint64(want, 1)   // count
	want = binary.BigEndian.AppendUint64(want, 512) // M
	want = binary.BigEndian.AppendUint32(want, 2)   // K
	for _, w := range d.bits.Words() {
		want = binary.BigEndian.AppendUint64(want, w)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("MarshalBinary() = %x; want %x", b, want)
	}
}

func TestMarshalBinaryLongNode(t *testing.T) {
	d := Build(Header{Node: strings.Repeat("n", MaxNodeBytes+1)}, nil)
	if b, err := d.MarshalBinary(); !errors.Is(err, ErrInvalid) {
		t.Errorf("MarshalBinary() = %d bytes, %v; want ErrInvalid", len(b), err)
	}
}

// rawDigest is a digest encoding with every field settable, for bad-input cases.
type rawDigest struct {
	magic                         string
	format, keyScheme, hashScheme uint8
	node                          string
	nodeLen                       int // -1: len(node)
	epoch, version, count, m      uint64
	k                             uint32
	words                         int // number of 8-byte words appended
	extra                         int // trailing bytes
}

func validRaw() rawDigest {
	return rawDigest{magic: digestMagic, format: FormatVersion, keyScheme: 1, hashScheme: HashScheme,
		node: "pod", nodeLen: -1, epoch: 1, version: 2, count: 3, m: 512, k: 3, words: 8}
}

func (r rawDigest) bytes() []byte {
	b := []byte(r.magic)
	nl := r.nodeLen
	if nl < 0 {
		nl = len(r.node)
	}
	b = append(b, r.format, r.keyScheme, r.hashScheme, uint8(nl))
	b = append(b, r.node...)
	for _, v := range []uint64{r.epoch, r.version, r.count, r.m} {
		b = binary.BigEndian.AppendUint64(b, v)
	}
	b = binary.BigEndian.AppendUint32(b, r.k)
	for i := range r.words {
		b = binary.BigEndian.AppendUint64(b, uint64(i)*0x0101010101010101)
	}
	return append(b, make([]byte, r.extra)...)
}

func TestUnmarshalErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(r *rawDigest)
		want error // nil: must succeed
	}{
		{"valid", func(r *rawDigest) {}, nil},
		{"wrong magic", func(r *rawDigest) { r.magic = "KVRX" }, ErrMalformed},
		{"format 3", func(r *rawDigest) { r.format = 3 }, ErrUnsupported},
		{"format 2 without removals", func(r *rawDigest) { r.format = 2 }, ErrMalformed},
		{"format 0", func(r *rawDigest) { r.format = 0 }, ErrUnsupported},
		{"hash scheme 0", func(r *rawDigest) { r.hashScheme = 0 }, ErrUnsupported},
		{"hash scheme 3", func(r *rawDigest) { r.hashScheme = 3 }, ErrUnsupported},
		{"hash scheme 1, M a word multiple", func(r *rawDigest) { r.hashScheme, r.m, r.words = 1, 128, 2 }, nil},
		{"hash scheme 1, M not a word multiple", func(r *rawDigest) { r.hashScheme, r.m, r.words = 1, 100, 2 }, ErrMalformed},
		{"M a word but not a block multiple", func(r *rawDigest) { r.m, r.words = 576, 9 }, ErrMalformed},
		{"node longer than announced", func(r *rawDigest) { r.nodeLen = 1 }, ErrMalformed},
		{"M zero", func(r *rawDigest) { r.m, r.words = 0, 0 }, ErrMalformed},
		{"M not a word multiple", func(r *rawDigest) { r.m = 100 }, ErrMalformed},
		{"M above MaxBits", func(r *rawDigest) { r.m = MaxBits * 2 }, ErrMalformed},
		{"M huge without the words", func(r *rawDigest) { r.m = 1 << 62 }, ErrMalformed},
		{"M at MaxBits without the words", func(r *rawDigest) { r.m = MaxBits }, ErrMalformed},
		{"K zero", func(r *rawDigest) { r.k = 0 }, ErrMalformed},
		{"K above MaxK", func(r *rawDigest) { r.k = MaxK + 1 }, ErrMalformed},
		{"K max", func(r *rawDigest) { r.k = MaxK }, nil},
		{"one word missing", func(r *rawDigest) { r.words = 7 }, ErrMalformed},
		{"one word extra", func(r *rawDigest) { r.words = 9 }, ErrMalformed},
		{"trailing byte", func(r *rawDigest) { r.extra = 1 }, ErrMalformed},
		{"empty node", func(r *rawDigest) { r.node = "" }, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := validRaw()
			tt.edit(&r)
			b := r.bytes()
			d, err := Unmarshal(b)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Unmarshal() error = %v; want nil", err)
				}
				again, _ := d.MarshalBinary()
				if !bytes.Equal(again, b) {
					t.Errorf("re-marshal = %x; want %x", again, b)
				}
				return
			}
			if !errors.Is(err, tt.want) || d != nil {
				t.Errorf("Unmarshal() = %v, %v; want nil, %v", d, err, tt.want)
			}
		})
	}
}

// TestUnmarshalTruncated cuts a valid encoding at every length.
func TestUnmarshalTruncated(t *testing.T) {
	b := validRaw().bytes()
	for n := range len(b) {
		if d, err := Unmarshal(b[:n]); !errors.Is(err, ErrMalformed) {
			t.Errorf("Unmarshal(first %d of %d bytes) = %v, %v; want ErrMalformed", n, len(b), d, err)
		}
	}
}
