package kvevent

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func ptr[T any](v T) *T { return &v }

// mp marshals test input with an independent msgpack encoder. Its default
// (non-compact) integers give fixed widths: int → int64, uint8 → 0xcc, ...
func mp(t testing.TB, v any) []byte {
	t.Helper()
	p, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatalf("msgpack.Marshal(%v): %v", v, err)
	}
	return p
}

// raw is hand-written msgpack, spaces allowed, embedded into mp input.
func raw(s string) msgpack.RawMessage {
	p, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		panic("bad hex in test table: " + s) // a typo in the table, not input
	}
	return p
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	p, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// baseCapture is the real vLLM BlockStored in testdata/kv_event_base.json.
type baseCapture struct {
	BlockHashes []uint64 `json:"block_hashes"`
	Parent      *uint64  `json:"parent_block_hash"`
	TokenIDs    []uint32 `json:"token_ids"`
	BlockSize   int      `json:"block_size"`
	Medium      string   `json:"medium"`
	LoRAName    *string  `json:"lora_name"`
}

func loadBase(t testing.TB) baseCapture {
	t.Helper()
	var c baseCapture
	if err := json.Unmarshal(readFile(t, "testdata/kv_event_base.json"), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// fixtureBatch is what both testdata/*.msgpack vectors hold (README of
// kvevent/testdata); mapForm adds the fields only v0.26 sends.
func fixtureBatch(t testing.TB, mapForm bool) Batch {
	c := loadBase(t)
	stored := Event{
		Kind: BlockStored, Tag: "BlockStored",
		BlockHashes: c.BlockHashes, Parent: c.Parent, TokenIDs: c.TokenIDs,
		BlockSize: c.BlockSize, Medium: ptr(c.Medium), LoRAName: c.LoRAName,
	}
	removed := Event{
		Kind: BlockRemoved, Tag: "BlockRemoved",
		BlockHashes: []uint64{1902323794085395034}, Medium: ptr("GPU"),
	}
	if mapForm {
		stored.ExtraKeys = make([][]any, len(c.BlockHashes))
		stored.GroupIdx = ptr[int64](0)
		stored.KVCacheSpecKind = ptr("full_attention")
		removed.GroupIdx = ptr[int64](0)
	}
	return Batch{
		TS:     1764000000.5,
		DPRank: ptr[int64](0),
		Events: []Event{stored, removed, {Kind: AllBlocksCleared, Tag: "AllBlocksCleared"}},
	}
}

// sampleBatches cover every field, nil pointers, empty slices and every
// kind; the round-trip and fuzz-seed tables share them.
func sampleBatches() map[string]Batch {
	return map[string]Batch{
		"empty": {TS: 1},
		"all nil pointers": {TS: 2.25, Events: []Event{
			{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{1}},
			{Kind: BlockRemoved, Tag: "BlockRemoved"},
		}},
		"every field": {TS: 1764000000.5, DPRank: ptr[int64](3), Events: []Event{{
			Kind: BlockStored, Tag: "BlockStored",
			BlockHashes: []uint64{0, 127, 128, 1 << 16, 1 << 32, 1<<64 - 1},
			Parent:      ptr[uint64](1<<63 + 5),
			TokenIDs:    []uint32{0, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1},
			BlockSize:   16, LoRAID: ptr[int64](-7), Medium: ptr("cpu"), LoRAName: ptr("Alice"),
			ExtraKeys: [][]any{
				{"Alice", "salt"}, nil,
				{[]any{"mm-hash", int64(3)}, []byte{1, 2}, true, float64(0.5), uint64(1 << 63), int64(-1),
					map[string]any{"k": nil}},
			},
			GroupIdx: ptr[int64](1), KVCacheSpecKind: ptr("sliding_window"),
			KVCacheSpecSlidingWindow: ptr[int64](4096), Locality: ptr("local"),
		}}},
		"lora names and tail only": {TS: -3, DPRank: ptr[int64](-1), Events: []Event{
			{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{9}, BlockSize: 64,
				LoRAName: ptr("a-very-long-adapter-name-over-32-bytes-long"), Locality: ptr("")},
			{Kind: BlockStored, Tag: "BlockStored", BlockHashes: []uint64{10}, BlockSize: 16,
				Medium: ptr("GPU"), GroupIdx: ptr[int64](0)},
		}},
		"removed and cleared": {TS: 7, Events: []Event{
			{Kind: BlockRemoved, Tag: "BlockRemoved", BlockHashes: []uint64{1, 2, 3},
				Medium: ptr("GPU"), Locality: ptr("x")},
			{Kind: AllBlocksCleared, Tag: "AllBlocksCleared"},
			{Kind: Unknown, Tag: "BlockMoved"},
		}},
	}
}
