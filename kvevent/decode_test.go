package kvevent

import (
	"errors"
	"math"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"
)

func TestDecodeFixtures(t *testing.T) {
	base := loadBase(t)
	// Guard the fixture itself, so a wrong copy cannot make the test vacuous.
	if len(base.BlockHashes) != 25 || len(base.TokenIDs) != 400 || base.BlockHashes[0] != 17705339885301241772 {
		t.Fatalf("kv_event_base.json: %d hashes, %d tokens, first %d; want 25, 400, 17705339885301241772",
			len(base.BlockHashes), len(base.TokenIDs), base.BlockHashes[0])
	}
	for _, tc := range []struct {
		file    string
		mapForm bool
	}{
		{"testdata/batch_array_legacy.msgpack", false},
		{"testdata/batch_map_v026.msgpack", true},
	} {
		t.Run(tc.file, func(t *testing.T) {
			got, err := Decode(readFile(t, tc.file))
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if diff := cmp.Diff(fixtureBatch(t, tc.mapForm), got); diff != "" {
				t.Errorf("Decode(%s) mismatch (-want +got):\n%s", tc.file, diff)
			}
		})
	}
}

// storedFixed is the BlockStored that most variant inputs below describe.
func storedFixed(hashes ...uint64) Event {
	return Event{Kind: BlockStored, Tag: "BlockStored", BlockHashes: hashes,
		TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2}
}

func TestDecodeVariants(t *testing.T) {
	storedArr := []any{"BlockStored", []any{uint64(1), uint64(2)}, nil, []any{1, 2, 3, 4}, 2}
	one := func(e Event) Batch { return Batch{TS: 1.5, Events: []Event{e}} }
	oneDP := func(e Event, dp int64) Batch { b := one(e); b.DPRank = &dp; return b }
	ev := func(events ...any) []byte { return mp(t, []any{1.5, events}) }
	hashEv := func(h ...any) []byte { return ev([]any{"BlockRemoved", h}) }
	removed := func(hs ...uint64) Batch {
		return one(Event{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: hs})
	}
	seq32 := raw("c4 20 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f")
	seq16 := raw("c4 10 f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")

	tests := []struct {
		name string
		in   []byte
		want Batch
	}{
		{"array batch without dp rank", ev(storedArr), one(storedFixed(1, 2))},
		{"array batch with dp rank", mp(t, []any{1.5, []any{storedArr}, 2}), oneDP(storedFixed(1, 2), 2)},
		{"array batch extra trailing elements", mp(t, []any{1.5, []any{storedArr}, 0, "future", []any{1, 2}}),
			oneDP(storedFixed(1, 2), 0)},
		{"map batch", mp(t, map[string]any{"ts": 1.5, "events": []any{storedArr}, "data_parallel_rank": 4, "x": []any{1}}),
			oneDP(storedFixed(1, 2), 4)},
		{"map batch nil dp rank", mp(t, map[string]any{"ts": 1.5, "events": []any{storedArr}, "data_parallel_rank": nil}),
			one(storedFixed(1, 2))},
		{"ts float32", mp(t, []any{float32(1.5), []any{storedArr}}), one(storedFixed(1, 2))},
		{"ts int", mp(t, []any{uint8(7), nil}), Batch{TS: 7}},
		{"ts negative int", mp(t, []any{int16(-7), []any{}}), Batch{TS: -7}},
		{"map event", ev(map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2}, "parent_block_hash": nil,
			"token_ids": []any{1, 2, 3, 4}, "block_size": 2, "lora_id": nil, "medium": nil, "lora_name": nil}),
			one(storedFixed(1, 2))},
		{"map event type not first", ev(raw("83 a6 6d656469756d a3 475055 ac 626c6f636b5f686173686573 91 07 a4 74797065 ac 426c6f636b52656d6f766564")),
			one(Event{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{7}, Medium: ptr("GPU")})},
		{"map event unknown and foreign keys", ev(map[string]any{"type": "BlockRemoved", "block_hashes": []any{5},
			"token_ids": []any{-1}, "future": map[string]any{"a": []any{1}}}), removed(5)},
		{"every integer width as hash", hashEv(raw("05"), raw("cc ff"), raw("cd 0102"), raw("ce 01020304"),
			raw("cf 0102030405060708"), raw("d0 05"), raw("d1 0102"), raw("d2 01020304"), raw("d3 0102030405060708"),
			float64(1<<40), float32(3)),
			removed(5, 255, 0x0102, 0x01020304, 0x0102030405060708, 5, 0x0102, 0x01020304, 0x0102030405060708, 1<<40, 3)},
		{"negative hashes wrap", hashEv(int64(-1), raw("e0"), int8(-100), int32(math.MinInt32), int64(math.MinInt64), -2.0),
			removed(math.MaxUint64, math.MaxUint64-31, math.MaxUint64-99, 1<<64-1<<31, 1<<63, math.MaxUint64-1)},
		{"bin hash 32 bytes", hashEv(seq32), removed(0x18191a1b1c1d1e1f)},
		{"bin hash 16 bytes", hashEv(seq16), removed(0xf8f9fafbfcfdfeff)},
		{"str hash and short bin", hashEv("abcdefghij", raw("c4 03 010203"), raw("c4 00")),
			removed(0x636465666768696a, 0x010203, 0)},
		{"token ids every width", ev([]any{"BlockStored", []any{1}, nil,
			[]any{uint8(1), int8(2), uint16(3), int16(4), uint32(5), int32(6), uint64(7), int64(8), 9.0, float32(10),
				raw("ce ffffffff")}, int16(2)}),
			one(Event{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1},
				TokenIDs: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, math.MaxUint32}, BlockSize: 2})},
		{"block size as float", ev([]any{"BlockStored", []any{1}, nil, []any{1, 2, 3, 4}, 2.0}), one(storedFixed(1))},
		{"parent 0 is nil", ev([]any{"BlockStored", []any{1, 2}, 0, []any{1, 2, 3, 4}, 2}), one(storedFixed(1, 2))},
		{"parent zero bin is nil", ev([]any{"BlockStored", []any{1, 2}, make([]byte, 32), []any{1, 2, 3, 4}, 2}),
			one(storedFixed(1, 2))},
		{"parent int and bin", ev([]any{"BlockStored", []any{1}, int64(-2), []any{}, 0},
			[]any{"BlockStored", []any{2}, seq32, nil, nil}),
			Batch{TS: 1.5, Events: []Event{
				{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1}, Parent: ptr[uint64](math.MaxUint64 - 1)},
				{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{2}, Parent: ptr[uint64](0x18191a1b1c1d1e1f)},
			}}},
		{"unknown tag keeps tag and skips fields", ev([]any{"BlockMoved", []any{1}, "x", []any{[]any{-1}}},
			map[string]any{"type": "Future", "block_hashes": "not even a list"}),
			Batch{TS: 1.5, Events: []Event{{Kind: Unknown, Tag: "BlockMoved"}, {Kind: Unknown, Tag: "Future"}}}},
		{"missing trailing fields", ev([]any{"BlockStored", []any{1}}, []any{"BlockRemoved"}, []any{"AllBlocksCleared"}),
			Batch{TS: 1.5, Events: []Event{
				{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1}},
				{Kind: BlockRemoved, Tag: "BlockRemoved"},
				{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
			}}},
		{"extra trailing fields", ev(
			[]any{"BlockStored", []any{1, 2}, nil, []any{1, 2, 3, 4}, 2, nil, "GPU", nil, nil, 0, "full_attention", nil, "here",
				"f13", []any{1}, map[string]any{"x": 1}},
			[]any{"BlockRemoved", []any{1}, "CPU", 1, "there", "f5"},
			[]any{"AllBlocksCleared", 1, 2}),
			Batch{TS: 1.5, Events: []Event{
				{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2,
					Medium: ptr("GPU"), GroupIdx: ptr[int64](0), KVCacheSpecKind: ptr("full_attention"), Locality: ptr("here")},
				{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{1}, Medium: ptr("CPU"),
					GroupIdx: ptr[int64](1), Locality: ptr("there")},
				{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
			}}},
		{"extra keys", ev(map[string]any{"type": "BlockStored", "block_hashes": []any{1, 2, 3}, "token_ids": []any{},
			"extra_keys": []any{[]any{"Alice"}, nil, []any{}, []any{[]any{"mm", uint8(3)}, raw("c4 01 ff"), -1, uint64(1 << 63), float32(0.5),
				map[string]any{"s": true}}}}),
			one(Event{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1, 2, 3},
				ExtraKeys: [][]any{{"Alice"}, nil, nil, {[]any{"mm", int64(3)}, []byte{0xff}, int64(-1), uint64(1 << 63), 0.5,
					map[string]any{"s": true}}}})},
		{"medium kept as sent", ev([]any{"BlockRemoved", []any{1}, "gpu"}),
			one(Event{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{1}, Medium: ptr("gpu")})},
		{"bin tag and str8 medium", ev([]any{[]byte("BlockRemoved"), []any{1}, raw("d9 03 475055")}),
			one(Event{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{1}, Medium: ptr("GPU")})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			if err != nil {
				t.Fatalf("Decode(% x): %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decode(% x) mismatch (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	ev := func(events ...any) []byte { return mp(t, []any{1.5, events}) }
	deep := make([]byte, 0, 80)
	for range 40 {
		deep = append(deep, 0x91)
	}
	deep = append(deep, 0x01)

	tests := []struct {
		name  string
		in    []byte
		err   error
		event int
		field string
	}{
		{"empty", nil, ErrTruncated, -1, ""},
		{"not a batch", mp(t, 5), ErrType, -1, ""},
		{"batch array too short", mp(t, []any{1.5}), ErrShape, -1, ""},
		{"array claims 2^32-1 elements", raw("dd ffffffff cb 0000"), ErrTruncated, -1, ""},
		{"map claims 2^32-1 entries", raw("df ffffffff a2 7473 00"), ErrTruncated, -1, ""},
		{"hashes claim 2^32-1", mp(t, []any{1.5, []any{[]any{"BlockRemoved", raw("dd ffffffff")}}}), ErrTruncated, 0, "block_hashes"},
		{"string claims 2^32-1 bytes", mp(t, []any{1.5, []any{[]any{raw("db ffffffff 41")}}}), ErrTruncated, 0, "type"},
		{"truncated float", raw("92 cb 0000"), ErrTruncated, -1, "ts"},
		{"ts string", mp(t, []any{"now", []any{}}), ErrType, -1, "ts"},
		{"ts nil", mp(t, []any{nil, []any{}}), ErrType, -1, "ts"},
		{"events int", mp(t, []any{1.5, 3}), ErrType, -1, "events"},
		{"dp rank string", mp(t, []any{1.5, []any{}, "0"}), ErrType, -1, "data_parallel_rank"},
		{"map batch without events", mp(t, map[string]any{"ts": 1.5}), ErrShape, -1, ""},
		{"map batch int key", raw("81 01 02"), ErrType, -1, ""},
		{"event int", ev(7), ErrType, 0, "type"},
		{"empty event array", ev([]any{}), ErrShape, 0, "type"},
		{"tag int", ev([]any{1, 2}), ErrType, 0, "type"},
		{"map event without type", ev(map[string]any{"block_hashes": []any{1}}), ErrShape, 0, ""},
		{"map event type int", ev(map[string]any{"type": 3}), ErrType, 0, "type"},
		{"hashes not a list", ev([]any{"BlockRemoved", "abc"}), ErrType, 0, "block_hashes"},
		{"hash nil", ev([]any{"BlockRemoved", []any{nil}}), ErrType, 0, "block_hashes"},
		{"hash non-integral float", ev([]any{"BlockRemoved", []any{1.5}}), ErrType, 0, "block_hashes"},
		{"hash float too big", ev([]any{"BlockRemoved", []any{1e20}}), ErrRange, 0, "block_hashes"},
		{"hash NaN", ev([]any{"BlockRemoved", []any{math.NaN()}}), ErrType, 0, "block_hashes"},
		{"negative token id", ev([]any{"BlockStored", []any{1}, nil, []any{1, -1}, 16}), ErrRange, 0, "token_ids"},
		{"token id 2^32", ev([]any{"BlockStored", []any{1}, nil, []any{uint64(1 << 32)}, 16}), ErrRange, 0, "token_ids"},
		{"token id float", ev([]any{"BlockStored", []any{1}, nil, []any{2.5}, 16}), ErrType, 0, "token_ids"},
		{"token id string", ev([]any{"BlockStored", []any{1}, nil, []any{"a"}, 16}), ErrType, 0, "token_ids"},
		{"negative block size", ev([]any{"BlockStored", []any{1}, nil, []any{}, -16}), ErrRange, 0, "block_size"},
		{"lora id above int64", ev([]any{"BlockStored", []any{1}, nil, []any{}, 16, uint64(math.MaxUint64)}), ErrRange, 0, "lora_id"},
		{"medium int", ev([]any{"BlockRemoved", []any{1}, 1}), ErrType, 0, "medium"},
		{"group idx string", ev(map[string]any{"type": "BlockRemoved", "group_idx": "0"}), ErrType, 0, "group_idx"},
		{"extra keys entry not a list", ev(map[string]any{"type": "BlockStored", "extra_keys": []any{"Alice"}}), ErrType, 0, "extra_keys"},
		{"extra key ext type", ev(map[string]any{"type": "BlockStored", "extra_keys": []any{[]any{raw("d4 01 00")}}}), ErrType, 0, "extra_keys"},
		{"extra key bin map key", ev(map[string]any{"type": "BlockStored", "extra_keys": []any{[]any{raw("81 c4 01 61 01")}}}), ErrType, 0, "extra_keys"},
		{"error in second event", ev([]any{"AllBlocksCleared"}, []any{"BlockRemoved", []any{"x", 1.5}}), ErrType, 1, "block_hashes"},
		{"reserved code in skipped field", ev([]any{"AllBlocksCleared", raw("c1")}), ErrType, 0, ""},
		{"deep nesting in skipped field", ev([]any{"AllBlocksCleared", msgpack.RawMessage(deep)}), ErrDepth, 0, ""},
		{"trailing bytes", append(mp(t, []any{1.5, []any{}}), 0x00), ErrTrailing, -1, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.in)
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("Decode(% x) = %+v, %v; want *DecodeError", tc.in, got, err)
			}
			if !errors.Is(err, tc.err) || de.Event != tc.event || de.Field != tc.field {
				t.Errorf("Decode(% x) error = %v (event %d, field %q); want %v (event %d, field %q)",
					tc.in, err, de.Event, de.Field, tc.err, tc.event, tc.field)
			}
			if diff := cmp.Diff(Batch{}, got); diff != "" {
				t.Errorf("Decode(% x) returned a partial batch on error:\n%s", tc.in, diff)
			}
		})
	}
}

// Every strict prefix of a valid payload is incomplete, so it must fail
// cleanly rather than decode or panic.
func TestDecodeTruncatedFixtures(t *testing.T) {
	for _, f := range []string{"testdata/batch_array_legacy.msgpack", "testdata/batch_map_v026.msgpack"} {
		p := readFile(t, f)
		for n := range len(p) {
			if b, err := Decode(p[:n]); err == nil {
				t.Fatalf("Decode(%s[:%d]) = %d events, nil error; want error", f, n, len(b.Events))
			}
		}
	}
}

// A header that lies about its length must not make Decode allocate by it.
func TestDecodeBoundedAllocation(t *testing.T) {
	inputs := [][]byte{
		[]byte(raw("dd ffffffff 00000000 00")),
		[]byte(raw("92 cb 0000000000000000 dd ffffffff 00")),
		[]byte(raw("92 cb 0000000000000000 91 92 ac 426c6f636b52656d6f766564 dd ffffffff")),
		[]byte(raw("92 cb 0000000000000000 91 81 a4 74797065 db ffffffff")),
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, in := range inputs {
		if _, err := Decode(in); !errors.Is(err, ErrTruncated) {
			t.Errorf("Decode(% x) error = %v; want ErrTruncated", in, err)
		}
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
		t.Errorf("Decode of %d lying headers allocated %d bytes; want < 1 MiB", len(inputs), n)
	}
}

func TestDecodeFrames(t *testing.T) {
	payload := readFile(t, "testdata/batch_array_legacy.msgpack")
	want := fixtureBatch(t, false)
	want.Topic, want.Seq = "kv@10.0.0.1@Qwen/Qwen3-0.6B", 0x0102030405060708

	got, err := DecodeFrames([][]byte{[]byte(want.Topic), {1, 2, 3, 4, 5, 6, 7, 8}, payload})
	if err != nil {
		t.Fatalf("DecodeFrames: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DecodeFrames mismatch (-want +got):\n%s", diff)
	}

	// A longer seq frame is read by its first 8 bytes; an empty topic is fine.
	got, err = DecodeFrames([][]byte{nil, {0, 0, 0, 0, 0, 0, 0, 9, 0xff}, payload})
	if err != nil || got.Seq != 9 || got.Topic != "" {
		t.Errorf("DecodeFrames(9-byte seq) = seq %d topic %q, %v; want 9, \"\", nil", got.Seq, got.Topic, err)
	}

	for _, tc := range []struct {
		name   string
		frames [][]byte
	}{
		{"no frames", nil},
		{"two frames", [][]byte{{}, payload}},
		{"four frames", [][]byte{{}, make([]byte, 8), payload, {}}},
		{"short seq", [][]byte{{}, make([]byte, 7), payload}},
	} {
		if _, err := DecodeFrames(tc.frames); !errors.Is(err, ErrFrames) {
			t.Errorf("DecodeFrames(%s) error = %v; want ErrFrames", tc.name, err)
		}
	}

	// A bad payload still reports where it sat in the sequence.
	got, err = DecodeFrames([][]byte{[]byte("t"), {0, 0, 0, 0, 0, 0, 0, 42}, payload[:10]})
	if !errors.Is(err, ErrTruncated) || got.Seq != 42 || got.Topic != "t" || got.Events != nil {
		t.Errorf("DecodeFrames(bad payload) = %+v, %v; want seq 42, topic t, no events, ErrTruncated", got, err)
	}
}

// Fields the decoder does not know are skipped whatever their type.
func TestDecodeSkipsEveryType(t *testing.T) {
	in := mp(t, []any{1.5, []any{
		[]any{"Future", nil, true, false, raw("ca 3f800000"), raw("cb 3ff0000000000000"), raw("cc 01"), raw("cd 0102"),
			raw("ce 01020304"), raw("cf 0102030405060708"), raw("d0 ff"), raw("d1 ffff"), raw("d2 ffffffff"),
			raw("d3 ffffffffffffffff"), raw("d4 01 02"), raw("d5 01 0203"), raw("d6 01 02030405"),
			raw("d7 01 0203040506070809"), raw("d8 01 02030405060708090a0b0c0d0e0f1011"), raw("c7 02 01 0203"),
			raw("c8 0002 01 0203"), raw("c9 00000002 01 0203"), raw("c4 01 00"), raw("c5 0001 00"), raw("c6 00000001 00"),
			raw("d9 01 61"), raw("da 0001 61"), raw("db 00000001 61"), raw("dc 0001 01"), raw("dd 00000001 01"),
			raw("de 0001 01 02"), raw("df 00000001 01 02"), raw("81 a1 61 91 01"), raw("e0")},
		[]any{"AllBlocksCleared"},
	}})
	want := Batch{TS: 1.5, Events: []Event{{Kind: Unknown, Tag: "Future"}, {Kind: AllBlocksCleared, Tag: "AllBlocksCleared"}}}
	got, err := Decode(in)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Decode mismatch (-want +got):\n%s", diff)
	}
}

func TestDecodeErrorMessage(t *testing.T) {
	_, err := Decode(mp(t, []any{1.5, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}}}}))
	const want = "decode event 0 token_ids at byte 28: value out of range: token id -1"
	if err == nil || err.Error() != want {
		t.Errorf("Decode error = %v; want %q", err, want)
	}
	_, err = Decode(nil)
	if want := "decode batch at byte 0: truncated input"; err == nil || err.Error() != want {
		t.Errorf("Decode(nil) error = %v; want %q", err, want)
	}
}
