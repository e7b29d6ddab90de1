package bloom

import (
	"errors"
	"math/big"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/blockkey"
)

// uniformKeys returns n distinct-looking uniform 64-bit keys, as blockkey
// produces, from a fixed seed (SplitMix64), so every test is deterministic.
func uniformKeys(seed uint64, n int) []blockkey.Key {
	ks := make([]blockkey.Key, n)
	for i := range ks {
		seed += 0x9e3779b97f4a7c15
		ks[i] = blockkey.Key(mix(seed))
	}
	return ks
}

// sequentialKeys returns start, start+1, ...: the opposite of uniform, to show
// the scheme does not depend on blockkey's hash quality.
func sequentialKeys(start uint64, n int) []blockkey.Key {
	ks := make([]blockkey.Key, n)
	for i := range ks {
		ks[i] = blockkey.Key(start + uint64(i))
	}
	return ks
}

func TestBuildHeader(t *testing.T) {
	keys := uniformKeys(1, 3)
	tests := []struct {
		name string
		in   Header
		want Header
	}{
		{
			name: "fills scheme and count",
			in:   Header{Node: "pod-a", Epoch: 4, Version: 9, Count: 99, Params: Params{M: 1024, K: 7}},
			want: Header{KeyScheme: blockkey.Version, HashScheme: HashScheme, Node: "pod-a", Epoch: 4, Version: 9, Count: 3, Params: Params{M: 1024, K: 7}},
		},
		{
			name: "keeps a given key scheme, overrides hash scheme",
			in:   Header{KeyScheme: 7, HashScheme: 200, Params: Params{M: 64, K: 1}},
			want: Header{KeyScheme: 7, HashScheme: HashScheme, Count: 3, Params: Params{M: 64, K: 1}},
		},
		{
			name: "zero params become the smallest valid",
			in:   Header{},
			want: Header{KeyScheme: blockkey.Version, HashScheme: HashScheme, Count: 3, Params: Params{M: 64, K: 1}},
		},
		{
			name: "M rounds up to a word, K clamps",
			in:   Header{Params: Params{M: 100, K: 40}},
			want: Header{KeyScheme: blockkey.Version, HashScheme: HashScheme, Count: 3, Params: Params{M: 128, K: MaxK}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Build(tt.in, keys)
			if diff := cmp.Diff(tt.want, d.Header()); diff != "" {
				t.Errorf("Build(%+v).Header() mismatch (-want +got):\n%s", tt.in, diff)
			}
			if d.Len() != len(keys) {
				t.Errorf("Len() = %d; want %d", d.Len(), len(keys))
			}
			for _, k := range keys {
				if !d.Test(k) {
					t.Errorf("Test(%#x) = false after Build; want true", k)
				}
			}
		})
	}
}

func TestNoFalseNegatives(t *testing.T) {
	for _, keys := range [][]blockkey.Key{uniformKeys(2, 20_000), sequentialKeys(0, 20_000)} {
		d := Build(Header{Params: ParamsFor(10_000, 0.01)}, keys) // twice the design load
		for _, k := range keys {
			if !d.Test(k) {
				t.Fatalf("Test(%#x) = false; want true for an inserted key", k)
			}
		}
	}
}

func TestPrefixLen(t *testing.T) {
	in := uniformKeys(3, 8)
	out := uniformKeys(4, 8)
	d := Build(Header{Params: ParamsFor(1000, 0.001)}, in)
	for _, k := range out {
		if d.Test(k) {
			t.Fatalf("fixture key %#x is a false positive; pick another seed", k)
		}
	}
	tests := []struct {
		name  string
		chain []blockkey.Key
		want  int
	}{
		{"empty chain", nil, 0},
		{"all present", in, 8},
		{"first missing", []blockkey.Key{out[0], in[0], in[1]}, 0},
		{"miss in the middle stops the walk", []blockkey.Key{in[0], in[1], out[0], in[2], in[3]}, 2},
		{"last missing", []blockkey.Key{in[5], in[6], in[7], out[1]}, 3},
		{"order does not matter, presence does", []blockkey.Key{in[7], in[0], in[3]}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := d.PrefixLen(tt.chain); got != tt.want {
				t.Errorf("PrefixLen(%v) = %d; want %d", tt.chain, got, tt.want)
			}
		})
	}
}

// TestFalsePositiveRate fills each filter to its design load and probes one
// million keys never inserted. The keys are fixed, so the count is exact and
// the test cannot flake; the bound is 1.5x the target (and above 0.5x, so an
// oversized filter would fail too).
func TestFalsePositiveRate(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		target   float64
		keys     func(n int) []blockkey.Key
	}{
		{"10k at 1%", 10_000, 0.01, func(n int) []blockkey.Key { return uniformKeys(10, n) }},
		{"100k at 1%", 100_000, 0.01, func(n int) []blockkey.Key { return uniformKeys(11, n) }},
		{"25k at 0.1%", 25_000, 0.001, func(n int) []blockkey.Key { return uniformKeys(12, n) }},
		{"1k at 5%", 1_000, 0.05, func(n int) []blockkey.Key { return uniformKeys(13, n) }},
		{"10k sequential keys at 1%", 10_000, 0.01, func(n int) []blockkey.Key { return sequentialKeys(1<<40, n) }},
	}
	const probes = 1_000_000
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Build(Header{Params: ParamsFor(tt.capacity, tt.target)}, tt.keys(tt.capacity))
			fp := 0
			for _, k := range uniformKeys(99, probes) {
				if d.Test(k) {
					fp++
				}
			}
			rate := float64(fp) / probes
			t.Logf("%s: M=%d K=%d fill=%.3f measured FP %.4f%%", tt.name, d.Header().M, d.Header().K, d.FillRatio(), 100*rate)
			if rate > 1.5*tt.target || rate < 0.5*tt.target {
				t.Errorf("false-positive rate = %.4f; want within [0.5, 1.5] x %.4f", rate, tt.target)
			}
		})
	}
}

func TestFillRatio(t *testing.T) {
	p := ParamsFor(10_000, 0.01)
	tests := []struct {
		name     string
		keys     int
		min, max float64
	}{
		{"empty", 0, 0, 0},
		// one key sets exactly K distinct bits when M is large
		{"one key", 1, 7.0 / 95_872, 7.0 / 95_872},
		// at design load an optimal filter is half full: 1 - e^(-kn/m) ≈ 0.5
		{"design load", 10_000, 0.48, 0.52},
		{"overloaded", 30_000, 0.85, 0.92},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Build(Header{Params: p}, uniformKeys(20, tt.keys)).FillRatio()
			if got < tt.min || got > tt.max {
				t.Errorf("FillRatio() = %.5f; want in [%.5f, %.5f]", got, tt.min, tt.max)
			}
		})
	}
}

// TestHashSchemeReference checks the incremental location arithmetic against
// the scheme's definition, (h1 + i·h2) mod M in exact integers, computed with
// math/big. Any change here breaks every peer running the old code.
func TestHashSchemeReference(t *testing.T) {
	for _, p := range []Params{{M: 64, K: 7}, {M: 640, K: 3}, {M: 95_872, K: 7}, {M: MaxBits, K: MaxK}, {M: 3 * 64, K: 32}} {
		for _, k := range append(uniformKeys(30, 50), 0, 1, 1<<63, ^blockkey.Key(0)) {
			d := &Digest{h: Header{Params: p}}
			loc, step := d.start(k)
			h1 := new(big.Int).SetUint64(mix(uint64(k)))
			h2 := new(big.Int).SetUint64(mix(mix(uint64(k))) | 1)
			m := new(big.Int).SetUint64(p.M)
			for i := range p.K {
				want := new(big.Int).Mul(h2, big.NewInt(int64(i)))
				want.Add(want, h1).Mod(want, m)
				if want.Uint64() != loc {
					t.Fatalf("M=%d key %#x probe %d: location %d; want %d", p.M, k, i, loc, want.Uint64())
				}
				loc += step
				if loc >= p.M {
					loc -= p.M
				}
			}
		}
	}
}

// TestHashSchemeGolden pins the bits of a tiny digest. If it fails, the wire
// meaning of HashScheme 1 changed: bump HashScheme instead.
func TestHashSchemeGolden(t *testing.T) {
	d := Build(Header{Params: Params{M: 128, K: 3}}, []blockkey.Key{0x0123456789abcdef, 42})
	var b strings.Builder
	for i := range uint(128) {
		if d.bits.Test(i) {
			b.WriteString("1")
		} else {
			b.WriteString("0")
		}
	}
	const want = "00000000000000000000000000000000001000000000100000000000000000000000000100000010000000000000000000000000000010000000000000000100"
	if got := b.String(); got != want {
		t.Errorf("bits = %s; want %s", got, want)
	}
}

func TestEmptyDigest(t *testing.T) {
	for name, d := range map[string]*Digest{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			if d.Test(1) || d.PrefixLen([]blockkey.Key{1, 2}) != 0 || d.Len() != 0 || d.FillRatio() != 0 || d.Size() != 0 {
				t.Errorf("empty digest matched or reported contents")
			}
			if diff := cmp.Diff(Header{}, d.Header()); diff != "" {
				t.Errorf("Header() mismatch (-want +got):\n%s", diff)
			}
			if b, err := d.MarshalBinary(); !errors.Is(err, ErrInvalid) {
				t.Errorf("MarshalBinary() = %x, %v; want ErrInvalid", b, err)
			}
			if got, err := d.Apply(Delta{From: 0, To: 1, Keys: []blockkey.Key{1}}); !errors.Is(err, ErrGap) {
				t.Errorf("Apply() = %v, %v; want ErrGap", got, err)
			}
		})
	}
}
