package vllmsim

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

type fixture struct {
	TokenIDs    []uint32 `json:"token_ids"`
	BlockHashes []uint64 `json:"block_hashes"`
	BlockSize   int      `json:"block_size"`
	LoRAName    *string  `json:"lora_name"`
	HashSeed    string   `json:"hash_seed"`
}

func loadFixture(t testing.TB, name string) fixture {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var f fixture
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return f
}

func wires(ds []digest) []uint64 {
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.wire()
	}
	return out
}

func TestNoneHashSeed42(t *testing.T) {
	h, err := newHasher(HashSHA256CBOR, "42", true)
	if err != nil {
		t.Fatal(err)
	}
	const want = "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780"
	if got := hex.EncodeToString(h.none[:]); got != want {
		t.Errorf("NONE_HASH(42) = %s; want %s", got, want)
	}
}

// TestHashVectors checks the chain against real vLLM captures (seed 42,
// sha256_cbor, block 16), with and without LoRA "Alice".
func TestHashVectors(t *testing.T) {
	for _, name := range []string{"kv_event_base.json", "kv_event_lora.json"} {
		t.Run(name, func(t *testing.T) {
			f := loadFixture(t, name)
			h, err := newHasher(HashSHA256CBOR, f.HashSeed, true)
			if err != nil {
				t.Fatal(err)
			}
			lora := ""
			if f.LoRAName != nil {
				lora = *f.LoRAName
			}
			got := wires(h.chain(nil, f.TokenIDs, f.BlockSize, blockKeys{lora: lora}))
			if len(got) != 25 || len(f.BlockHashes) != 25 {
				t.Fatalf("got %d hashes, fixture %d; want 25", len(got), len(f.BlockHashes))
			}
			for i := range got {
				if got[i] != f.BlockHashes[i] {
					t.Errorf("block %d = %d; want %d", i, got[i], f.BlockHashes[i])
				}
			}
		})
	}
}

// TestEncodeBlockMatchesLibrary compares the hand encoder with
// fxamacker/cbor in canonical mode over the shapes the engine produces.
func TestEncodeBlockMatchesLibrary(t *testing.T) {
	em, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	var parent digest
	for i := range parent {
		parent[i] = byte(i * 7)
	}
	tokens := []uint32{0, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1}
	big := make([]uint32, 300) // array length above one byte
	for i := range big {
		big[i] = uint32(i * 1000)
	}
	cases := []struct {
		name   string
		tokens []uint32
		extra  []string
	}{
		{"nil extra", tokens, nil},
		{"lora", tokens, []string{"Alice"}},
		{"lora and salt", tokens, []string{"Alice", "salt-with-a-long-text-over-23-bytes"}},
		{"long block", big, nil},
		{"empty", []uint32{}, []string{""}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var extra any
			if c.extra != nil {
				extra = c.extra
			}
			want, err := em.Marshal([]any{parent[:], c.tokens, extra})
			if err != nil {
				t.Fatal(err)
			}
			got := encodeBlock(nil, parent, c.tokens, c.extra)
			if hex.EncodeToString(got) != hex.EncodeToString(want) {
				t.Errorf("encodeBlock = %x; want %x", got, want)
			}
		})
	}
	if got, want := appendText(nil, "42"), []byte{0x62, '4', '2'}; string(got) != string(want) {
		t.Errorf("appendText(42) = %x; want %x", got, want)
	}
}

// TestExtraKeys: vLLM's order is LoRA, then the images overlapping the
// block (placement [offset, offset+length) against [start, start+bs)),
// then the salt on block 0; nil when there are none.
func TestExtraKeys(t *testing.T) {
	// Blocks of 4: img a covers tokens 2..5 (blocks 0 and 1), b covers
	// 8..11 (block 2 exactly), c covers 12 (block 3, its first token).
	mm := []MMPlacement{{ID: "a", Offset: 2, Length: 4}, {ID: "b", Offset: 8, Length: 4}, {ID: "c", Offset: 12, Length: 1}}
	adj := []MMPlacement{{ID: "x", Offset: 1, Length: 2}, {ID: "y", Offset: 3, Length: 2}}
	cases := []struct {
		k     blockKeys
		block int
		want  []string
	}{
		{blockKeys{}, 0, nil},
		{blockKeys{lora: "A"}, 0, []string{"A"}},
		{blockKeys{lora: "A"}, 3, []string{"A"}},
		{blockKeys{salt: "s"}, 0, []string{"s"}},
		{blockKeys{salt: "s"}, 1, nil},
		{blockKeys{lora: "A", salt: "s"}, 0, []string{"A", "s"}},
		{blockKeys{lora: "A", salt: "s"}, 2, []string{"A"}},
		{blockKeys{mm: mm}, 0, []string{"a"}},
		{blockKeys{mm: mm}, 1, []string{"a"}},
		{blockKeys{mm: mm}, 2, []string{"b"}},
		{blockKeys{mm: mm}, 3, []string{"c"}},
		{blockKeys{mm: mm}, 4, nil},
		{blockKeys{lora: "A", salt: "s", mm: mm}, 0, []string{"A", "a", "s"}},
		{blockKeys{lora: "A", salt: "s", mm: mm}, 1, []string{"A", "a"}},
		// Two images in one block, in offset order; the first also
		// reaches into the block before.
		{blockKeys{mm: adj}, 0, []string{"x", "y"}},
		{blockKeys{mm: adj}, 1, []string{"y"}},
		{blockKeys{mm: adj}, 2, nil},
	}
	for _, c := range cases {
		got := extraKeys(c.k, c.block, 4)
		if !slices.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("extraKeys(%+v, %d) = %q; want %q", c.k, c.block, got, c.want)
		}
	}
}

// TestImageChangesHashFromItsBlock: an image's ID enters the hash of the
// blocks it overlaps, so a different image changes those blocks' hashes
// and, through the chain, every later one, and nothing before.
func TestImageChangesHashFromItsBlock(t *testing.T) {
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(100 + i)
	}
	for _, algo := range []string{HashSHA256CBOR, HashFast} {
		h, _ := newHasher(algo, "42", true)
		at := func(id string) []uint64 {
			return wires(h.chain(nil, toks, 16, blockKeys{mm: []MMPlacement{{ID: id, Offset: 20, Length: 8}}}))
		}
		a, b, plain := at("A"), at("B"), wires(h.chain(nil, toks, 16, blockKeys{}))
		if a[0] != b[0] || a[0] != plain[0] {
			t.Errorf("%s: block 0 (before the image) differs: %x %x %x", algo, a[0], b[0], plain[0])
		}
		for i := 1; i < len(a); i++ {
			if a[i] == b[i] || a[i] == plain[i] {
				t.Errorf("%s: block %d hash does not depend on the image", algo, i)
			}
		}
		if again := at("A"); !slices.Equal(again, a) {
			t.Errorf("%s: same image, different chain", algo)
		}
	}
}

// TestSaltChangesWholeChain: the salt enters block 0 only, but through the
// chain every hash differs; the same salt reproduces the chain.
func TestSaltAndSeed(t *testing.T) {
	f := loadFixture(t, "kv_event_base.json")
	for _, algo := range []string{HashSHA256CBOR, HashFast} {
		h, _ := newHasher(algo, "42", true)
		base := wires(h.chain(nil, f.TokenIDs, 16, blockKeys{}))
		salted := wires(h.chain(nil, f.TokenIDs, 16, blockKeys{salt: "s1"}))
		again := wires(h.chain(nil, f.TokenIDs, 16, blockKeys{salt: "s1"}))
		for i := range base {
			if base[i] == salted[i] {
				t.Errorf("%s: block %d unchanged by salt", algo, i)
			}
			if salted[i] != again[i] {
				t.Errorf("%s: block %d not deterministic", algo, i)
			}
		}
		r1, _ := newHasher(algo, "", false)
		r2, _ := newHasher(algo, "", false)
		if r1.none == r2.none {
			t.Errorf("%s: two random seeds are equal", algo)
		}
		// Incremental chaining equals one-shot chaining.
		part := h.chain(nil, f.TokenIDs[:100], 16, blockKeys{})
		full := h.chain(part, f.TokenIDs, 16, blockKeys{})
		if got := wires(full); got[24] != base[24] || len(got) != 25 {
			t.Errorf("%s: incremental chain differs", algo)
		}
	}
	if _, err := newHasher("md5", "", true); err == nil {
		t.Error("newHasher(md5) succeeded; want error")
	}
}

func BenchmarkHashBlock(b *testing.B) {
	f := loadFixture(b, "kv_event_base.json")
	for _, algo := range []string{HashSHA256CBOR, HashFast} {
		b.Run(algo, func(b *testing.B) {
			h, _ := newHasher(algo, "42", true)
			b.ReportAllocs()
			for b.Loop() {
				h.chain(nil, f.TokenIDs, 16, blockKeys{})
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*25), "ns/block")
		})
	}
}
