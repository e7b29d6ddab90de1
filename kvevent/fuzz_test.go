package kvevent

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func addSeeds(f *testing.F) {
	f.Add(readFile(f, "testdata/batch_array_legacy.msgpack"))
	f.Add(readFile(f, "testdata/batch_map_v026.msgpack"))
	for _, b := range sampleBatches() {
		for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
			p, err := Encode(b, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Add(mp(f, map[string]any{"ts": 1.5, "events": []any{[]any{"BlockRemoved", []any{int64(-1), []byte("0123456789")}, "GPU"}}}))
}

// checkRoundTrip asserts that a decoded batch survives Encode and Decode
// in both encodings, and that encoding is stable.
func checkRoundTrip(t *testing.T, b Batch) {
	for _, enc := range []Encoding{ArrayEncoding, MapEncoding} {
		p, err := Encode(b, enc)
		if err != nil {
			t.Fatalf("Encode(enc %d) of a decoded batch: %v", enc, err)
		}
		got, err := Decode(p)
		if err != nil {
			t.Fatalf("Decode(Encode(enc %d)): %v\n% x", enc, err, p)
		}
		got.Topic, got.Seq = b.Topic, b.Seq
		if diff := cmp.Diff(b, got, cmpopts.EquateNaNs()); diff != "" {
			t.Fatalf("Decode(Encode(enc %d)) mismatch (-want +got):\n%s", enc, diff)
		}
		if q, err := Encode(got, enc); err != nil || !bytes.Equal(p, q) {
			t.Fatalf("Encode(enc %d) not stable: % x then % x (%v)", enc, p, q, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := Decode(p)
		if err != nil {
			return
		}
		checkRoundTrip(t, b)
	})
}

func FuzzDecodeFrames(f *testing.F) {
	f.Add([]byte("kv@pod@model"), []byte{0, 0, 0, 0, 0, 0, 0, 1}, readFile(f, "testdata/batch_map_v026.msgpack"))
	f.Add([]byte{}, []byte{1, 2, 3}, readFile(f, "testdata/batch_array_legacy.msgpack"))
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		b, err := DecodeFrames([][]byte{topic, seq, payload})
		if len(seq) < 8 {
			if err == nil {
				t.Fatalf("DecodeFrames with %d-byte seq: nil error", len(seq))
			}
			return
		}
		if b.Topic != string(topic) || b.Seq != uint64(seq[0])<<56|uint64(seq[1])<<48|uint64(seq[2])<<40|
			uint64(seq[3])<<32|uint64(seq[4])<<24|uint64(seq[5])<<16|uint64(seq[6])<<8|uint64(seq[7]) {
			t.Fatalf("DecodeFrames = topic %q seq %d; want %q and the first 8 seq bytes % x", b.Topic, b.Seq, topic, seq[:8])
		}
		if err != nil {
			return
		}
		frames, err := EncodeFrames(b, MapEncoding)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(frames[0], topic) || !bytes.Equal(frames[1], seq[:8]) {
			t.Fatalf("EncodeFrames header = % x, % x; want % x, % x", frames[0], frames[1], topic, seq[:8])
		}
		checkRoundTrip(t, b)
	})
}
