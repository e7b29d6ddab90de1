package blockkey

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func seq(start, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(start + i)
	}
	return s
}

// The published XXH64 vectors (xxHash's own test suite, also used by
// cespare/xxhash): the scheme is XXH64, so these pin it to the standard.
func TestXXH64Vectors(t *testing.T) {
	tests := []struct {
		in   string
		seed uint64
		want uint64
	}{
		{"", 0, 0xef46db3751d8e999},
		{"", 1, 0xd5afba1336a3be4b},
		{"a", 0, 0xd24ec4f1a98c6e5b},
		{"asdf", 0, 0x415872f599cea71e},
		{"0123456789abcdef", 0, 0x5c5b90c34e376d0b},
		{"0123456789abcdef0123456789abcdef", 0, 0x642a94958e71e6c5},
		{"Call me Ishmael. Some years ago--never mind how long precisely-", 0, 0x02a2e85470d6fd96},
	}
	for _, tt := range tests {
		if got := xxh64([]byte(tt.in), tt.seed); got != tt.want {
			t.Errorf("xxh64(%q, %d) = %#x; want %#x", tt.in, tt.seed, got, tt.want)
		}
	}
}

// The token fast path must be XXH64 of the little-endian bytes, for every
// length (each tail branch) and seed.
func TestTokensEqualBytes(t *testing.T) {
	for n := 0; n <= 41; n++ {
		toks := seq(0x01020304*n+7, n)
		toks = append(toks[:0:0], toks...)
		for i := range toks {
			toks[i] ^= uint32(i) * 0x9e3779b9
		}
		b := make([]byte, 0, 4*n)
		for _, x := range toks {
			b = binary.LittleEndian.AppendUint32(b, x)
		}
		for _, seed := range []uint64{0, 1, 0xdeadbeefcafef00d} {
			if got, want := xxh64Tokens(toks, seed), xxh64(b, seed); got != want {
				t.Errorf("xxh64Tokens(len %d, seed %#x) = %#x; want %#x", n, seed, got, want)
			}
		}
	}
}

// Pinned keys: changing any of these changes what every peer computes, so
// it requires a new Version.
func TestPinnedKeys(t *testing.T) {
	const model = "Qwen/Qwen3-0.6B"
	r := Root(model, "", "")
	tests := []struct {
		name string
		got  Key
		want Key
	}{
		{"root", r, 0x9602202b14437e9f},
		{"root lora", Root(model, "Alice", ""), 0x99b4383faa2fd4f5},
		{"root salt", Root(model, "", "salt"), 0x581f60d002a2eaa4},
		{"root empty", Root("", "", ""), 0xc406699099691cfa},
		{"next 0..15", Next(r, seq(0, 16)), 0xe279f9b9b4345ed2},
		{"next empty", Next(0, nil), 0xef46db3751d8e999},
		{"next short", Next(r, seq(100000, 3)), 0x7ab9aa0eb00013e},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %#x; want %#x", tt.name, uint64(tt.got), uint64(tt.want))
		}
	}
	want := []Key{0xe279f9b9b4345ed2, 0xca47c81032b6104e, 0x226d2b14c7e39c09}
	if diff := cmp.Diff(want, Chain(r, seq(0, 48), 16)); diff != "" {
		t.Errorf("Chain mismatch (-want +got):\n%s", diff)
	}
}

func TestRootSeparatesFields(t *testing.T) {
	roots := map[Key]string{}
	for _, c := range [][3]string{
		{"m", "", ""}, {"", "m", ""}, {"", "", "m"},
		{"ab", "c", ""}, {"a", "bc", ""}, {"abc", "", ""},
		{"m", "Alice", ""}, {"m", "", "Alice"}, {"m", "Alice", "s"},
	} {
		k := Root(c[0], c[1], c[2])
		if prev, ok := roots[k]; ok {
			t.Errorf("Root%q = Root%s = %#x", c, prev, uint64(k))
		}
		roots[k] = "(" + c[0] + "," + c[1] + "," + c[2] + ")"
	}
}

func TestChain(t *testing.T) {
	r := Root("m", "", "")
	toks := seq(1, 100)
	tests := []struct {
		name   string
		tokens []uint32
		bs     int
		want   int
	}{
		{"empty", nil, 16, 0},
		{"partial only", toks[:15], 16, 0},
		{"exact one", toks[:16], 16, 1},
		{"one plus partial", toks[:17], 16, 1},
		{"exact multiple", toks[:64], 16, 4},
		{"partial tail", toks[:100], 16, 6},
		{"block size 1", toks[:5], 1, 5},
		{"block size 0", toks, 0, 0},
		{"negative block size", toks, -4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Chain(r, tt.tokens, tt.bs)
			if len(got) != tt.want {
				t.Fatalf("len(Chain(%d tokens, bs %d)) = %d; want %d", len(tt.tokens), tt.bs, len(got), tt.want)
			}
			k := r
			for i, g := range got {
				k = Next(k, tt.tokens[i*tt.bs:(i+1)*tt.bs])
				if g != k {
					t.Errorf("Chain[%d] = %#x; want Next chain %#x", i, uint64(g), uint64(k))
				}
			}
		})
	}
}

// A prefix's keys are the prefix of the longer prompt's keys, and one
// changed token changes its block's key and every key after it.
func TestChainPrefixAndDivergence(t *testing.T) {
	r := Root("m", "", "")
	a := seq(1, 64)
	b := append([]uint32(nil), a...)
	b[37]++ // block 2
	ka, kb := Chain(r, a, 16), Chain(r, b, 16)
	if diff := cmp.Diff(ka[:2], Chain(r, a[:40], 16)); diff != "" {
		t.Errorf("prefix keys differ (-want +got):\n%s", diff)
	}
	for i := range ka {
		if same := ka[i] == kb[i]; same != (i < 2) {
			t.Errorf("block %d: keys equal = %v; want %v", i, same, i < 2)
		}
	}
}

// LoRA and salt seeds must change every key of the chain, not just the first.
func TestSeedsChangeEveryKey(t *testing.T) {
	toks := seq(5, 160)
	base := Chain(Root("m", "", ""), toks, 16)
	for _, r := range []struct{ name, lora, salt string }{
		{"lora", "Alice", ""}, {"salt", "", "s1"}, {"both", "Alice", "s1"}, {"other salt", "", "s2"},
	} {
		got := Chain(Root("m", r.lora, r.salt), toks, 16)
		for i := range base {
			if got[i] == base[i] {
				t.Errorf("%s: key %d equals the unseeded key", r.name, i)
			}
		}
	}
	if Chain(Root("m2", "", ""), toks, 16)[9] == base[9] {
		t.Error("model name does not change key 9")
	}
}

func TestNoAllocs(t *testing.T) {
	toks := seq(0, 1000)
	r := Root("m", "", "")
	if n := testing.AllocsPerRun(100, func() { _ = Next(r, toks[:16]) }); n != 0 {
		t.Errorf("Next allocs = %v; want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Root("Qwen/Qwen3-0.6B", "Alice", "salt") }); n != 0 {
		t.Errorf("Root allocs = %v; want 0", n)
	}
	s := Scheme{BlockSize: 16, Stride: 4}
	if n := testing.AllocsPerRun(100, func() { _ = s.Request(r, toks) }); n != 1 {
		t.Errorf("Request allocs = %v; want 1 (the result)", n)
	}
}

func BenchmarkNext(b *testing.B) {
	toks := seq(0, 16)
	var k Key
	for b.Loop() {
		k = Next(k, toks)
	}
}

func TestModelRoot(t *testing.T) {
	for _, tt := range []struct {
		name        string
		base, model string
		want        Key
	}{
		{"no model named", "m", "", Root("m", "", "")},
		{"the base model", "m", "m", Root("m", "", "")},
		{"an adapter", "m", "alice", Root("m", "alice", "")},
	} {
		if got := ModelRoot(tt.base, tt.model); got != tt.want {
			t.Errorf("%s: ModelRoot(%q, %q) = %x; want %x", tt.name, tt.base, tt.model, got, tt.want)
		}
	}
	if ModelRoot("m", "alice") == ModelRoot("m", "bob") || ModelRoot("m", "alice") == ModelRoot("m", "") {
		t.Errorf("adapters share a root with each other or the base")
	}
}
