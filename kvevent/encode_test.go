package kvevent

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The fixture vectors follow msgspec's compact rules, so re-encoding what
// they decode to must reproduce them byte for byte.
func TestEncodeFixtureBytes(t *testing.T) {
	for _, tc := range []struct {
		file string
		enc  Encoding
	}{
		{"testdata/batch_array_legacy.msgpack", ArrayEncoding},
		{"testdata/batch_map_v026.msgpack", MapEncoding},
	} {
		want := readFile(t, tc.file)
		b, err := Decode(want)
		if err != nil {
			t.Fatalf("Decode(%s): %v", tc.file, err)
		}
		got, err := Encode(b, tc.enc)
		if err != nil {
			t.Fatalf("Encode(%s): %v", tc.file, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("Encode(Decode(%s)) =\n% x\nwant\n% x", tc.file, got, want)
		}
	}
}

func TestEncodeBytes(t *testing.T) {
	const ts = "cb 3ff8000000000000" // 1.5
	gpu := ptr("GPU")
	tests := []struct {
		name string
		b    Batch
		enc  Encoding
		want string
	}{
		{"array removed, no dp rank", Batch{TS: 1.5, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{5}}}},
			ArrayEncoding, "92" + ts + "91 93 ac 426c6f636b52656d6f766564 91 05 c0"},
		{"map removed keeps medium, drops nil group", Batch{TS: 1.5, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: gpu}}},
			MapEncoding, "92" + ts + "91 83 a4 74797065 ac 426c6f636b52656d6f766564 ac 626c6f636b5f686173686573 91 05 a6 6d656469756d a3 475055"},
		{"array stored, nil tail dropped", Batch{TS: 1.5, DPRank: ptr[int64](1), Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1 << 63},
			TokenIDs: []uint32{1, 300}, BlockSize: 2}}},
			ArrayEncoding, "93" + ts + "91 98 ab 426c6f636b53746f726564 91 cf 8000000000000000 c0 92 01 cd 012c 02 c0 c0 c0 01"},
		{"array stored, nil holes before group idx", Batch{TS: 1.5, Events: []Event{{Kind: BlockStored, GroupIdx: ptr[int64](0)}}},
			ArrayEncoding, "92" + ts + "91 9a ab 426c6f636b53746f726564 90 c0 90 00 c0 c0 c0 c0 00"},
		{"map stored, lora fields always present", Batch{TS: 1.5, Events: []Event{{Kind: BlockStored, Locality: ptr("x")}}},
			MapEncoding, "92" + ts + "91 89 a4 74797065 ab 426c6f636b53746f726564 ac 626c6f636b5f686173686573 90" +
				" b1 706172656e745f626c6f636b5f68617368 c0 a9 746f6b656e5f696473 90 aa 626c6f636b5f73697a65 00" +
				" a7 6c6f72615f6964 c0 a6 6d656469756d c0 a9 6c6f72615f6e616d65 c0 a8 6c6f63616c697479 a1 78"},
		{"cleared and unknown", Batch{TS: 1.5, Events: []Event{{Kind: AllBlocksCleared}, {Kind: Unknown, Tag: "X"}}},
			MapEncoding, "92" + ts + "92 81 a4 74797065 b0 416c6c426c6f636b73436c6561726564 81 a4 74797065 a1 58"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(tc.b, tc.enc)
			if err != nil {
				t.Fatalf("Encode: %v", err)
			}
			if want := []byte(raw(tc.want)); !bytes.Equal(got, want) {
				t.Errorf("Encode =\n% x\nwant\n% x", got, want)
			}
		})
	}
}

// msgspec writes every int in its smallest form: unsigned forms for
// non-negative values, signed forms only for negative ones.
func TestEncodeIntForms(t *testing.T) {
	tests := []struct {
		v    int64
		u    uint64
		want string
	}{
		{u: 0, want: "00"}, {u: 127, want: "7f"}, {u: 128, want: "cc 80"}, {u: 255, want: "cc ff"},
		{u: 256, want: "cd 0100"}, {u: 65535, want: "cd ffff"}, {u: 65536, want: "ce 00010000"},
		{u: math.MaxUint32, want: "ce ffffffff"}, {u: 1 << 32, want: "cf 0000000100000000"},
		{u: math.MaxUint64, want: "cf ffffffffffffffff"},
		{v: -1, want: "ff"}, {v: -32, want: "e0"}, {v: -33, want: "d0 df"}, {v: -128, want: "d0 80"},
		{v: -129, want: "d1 ff7f"}, {v: -32768, want: "d1 8000"}, {v: -32769, want: "d2 ffff7fff"},
		{v: math.MinInt32, want: "d2 80000000"}, {v: math.MinInt32 - 1, want: "d3 ffffffff7fffffff"},
		{v: math.MinInt64, want: "d3 8000000000000000"}, {v: 200, want: "cc c8"},
	}
	for _, tc := range tests {
		var e encoder
		if tc.v != 0 {
			e.int(tc.v)
		} else {
			e.uint(tc.u)
		}
		if want := []byte(raw(tc.want)); !bytes.Equal(e.buf, want) {
			t.Errorf("encode int %d / uint %d = % x; want % x", tc.v, tc.u, e.buf, want)
		}
	}
}

func TestEncodeErrors(t *testing.T) {
	tests := []struct {
		name string
		b    Batch
		enc  Encoding
	}{
		{"unknown encoding", Batch{}, Encoding(2)},
		{"kind out of range", Batch{Events: []Event{{Kind: Kind(9)}}}, ArrayEncoding},
		{"negative block size", Batch{Events: []Event{{Kind: BlockStored, BlockSize: -1}}}, MapEncoding},
		{"unsupported extra key", Batch{Events: []Event{{Kind: BlockStored, ExtraKeys: [][]any{{struct{}{}}}}}}, ArrayEncoding},
	}
	for _, tc := range tests {
		if p, err := Encode(tc.b, tc.enc); !errors.Is(err, ErrEncode) {
			t.Errorf("Encode(%s) = % x, %v; want ErrEncode", tc.name, p, err)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for name, b := range sampleBatches() {
		for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("%s: Encode(enc %d): %v", name, enc, err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("%s: Decode(Encode(enc %d)): %v", name, enc, err)
			}
			if diff := cmp.Diff(b, got); diff != "" {
				t.Errorf("%s: Decode(Encode(enc %d)) mismatch (-want +got):\n%s", name, enc, diff)
			}
		}
	}
}

func TestEncodeFramesRoundTrip(t *testing.T) {
	b := sampleBatches()["every field"]
	b.Topic, b.Seq = "kv@pod@model", 1<<40+3
	frames, err := EncodeFrames(b, MapEncoding)
	if err != nil {
		t.Fatalf("EncodeFrames: %v", err)
	}
	if want := []byte{0, 0, 1, 0, 0, 0, 0, 3}; !bytes.Equal(frames[1], want) {
		t.Errorf("EncodeFrames seq frame = % x; want % x", frames[1], want)
	}
	got, err := DecodeFrames(frames)
	if err != nil {
		t.Fatalf("DecodeFrames: %v", err)
	}
	if diff := cmp.Diff(b, got); diff != "" {
		t.Errorf("DecodeFrames(EncodeFrames) mismatch (-want +got):\n%s", diff)
	}
}

// Lengths cross msgpack's header boundaries (fix/8/16/32-bit forms).
func TestLengthForms(t *testing.T) {
	for _, n := range []int{0, 15, 16, 31, 32, 255, 256, 65535, 65536} {
		s := string(bytes.Repeat([]byte{'a'}, n))
		hashes := make([]uint64, n+1)
		extra := map[string]any{}
		for i := range n % 40 {
			extra[string(rune('A'+i))] = int64(i)
		}
		b := Batch{TS: 1, Events: []Event{{Kind: BlockStored, Tag: "BlockStored", BlockHashes: hashes,
			LoRAName: &s, ExtraKeys: [][]any{{bytes.Repeat([]byte{1}, n+1), extra}}}}}
		for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("Encode(len %d): %v", n, err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("Decode(Encode(len %d)): %v", n, err)
			}
			// cmp.Diff is slow on 64k elements; use it only to explain.
			if !reflect.DeepEqual(b, got) {
				t.Errorf("len %d enc %d: round trip mismatch (-want +got):\n%s", n, enc, cmp.Diff(b, got))
			}
		}
	}
}

// Headers take msgspec's smallest form for each length.
func TestEncodeHeaderForms(t *testing.T) {
	tests := []struct {
		n                 int
		arr, mp, str, bin string
	}{
		{0, "90", "80", "a0", "c4 00"},
		{15, "9f", "8f", "af", "c4 0f"},
		{16, "dc 0010", "de 0010", "b0", "c4 10"},
		{31, "dc 001f", "de 001f", "bf", "c4 1f"},
		{32, "dc 0020", "de 0020", "d9 20", "c4 20"},
		{255, "dc 00ff", "de 00ff", "d9 ff", "c4 ff"},
		{256, "dc 0100", "de 0100", "da 0100", "c5 0100"},
		{65535, "dc ffff", "de ffff", "da ffff", "c5 ffff"},
		{65536, "dd 00010000", "df 00010000", "db 00010000", "c6 00010000"},
	}
	for _, tc := range tests {
		for _, c := range []struct {
			form  string
			write func(e *encoder)
			want  string
		}{
			{"array", func(e *encoder) { e.arrayHeader(tc.n) }, tc.arr},
			{"map", func(e *encoder) { e.mapHeader(tc.n) }, tc.mp},
			{"str", func(e *encoder) { e.str(string(make([]byte, tc.n))) }, tc.str},
			{"bin", func(e *encoder) { e.bin(make([]byte, tc.n)) }, tc.bin},
		} {
			var e encoder
			c.write(&e)
			want := []byte(raw(c.want))
			if !bytes.HasPrefix(e.buf, want) {
				t.Errorf("%s header for length %d = % x; want % x", c.form, tc.n, e.buf[:min(len(e.buf), len(want))], want)
			}
		}
	}
}
