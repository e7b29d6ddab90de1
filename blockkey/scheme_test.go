package blockkey

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRouted(t *testing.T) {
	tests := []struct {
		s    Scheme
		pos  int
		want bool
	}{
		{Scheme{16, 1}, 0, true},
		{Scheme{16, 1}, 7, true},
		{Scheme{16, 0}, 0, true}, // Stride below 1 reads as 1
		{Scheme{16, 4}, 0, false},
		{Scheme{16, 4}, 2, false},
		{Scheme{16, 4}, 3, true},
		{Scheme{16, 4}, 4, false},
		{Scheme{16, 4}, 7, true},
		{Scheme{16, 4}, -1, false},
	}
	for _, tt := range tests {
		if got := tt.s.Routed(tt.pos); got != tt.want {
			t.Errorf("%+v.Routed(%d) = %v; want %v", tt.s, tt.pos, got, tt.want)
		}
	}
}

func TestTokensPerKey(t *testing.T) {
	for _, tt := range []struct {
		s    Scheme
		want int
	}{{DefaultScheme(), 64}, {Scheme{16, 1}, 16}, {Scheme{64, 0}, 64}} {
		if got := tt.s.TokensPerKey(); got != tt.want {
			t.Errorf("%+v.TokensPerKey() = %d; want %d", tt.s, got, tt.want)
		}
	}
}

func TestRequest(t *testing.T) {
	r := Root("m", "", "")
	toks := seq(1, 300)
	chain := Chain(r, toks, 16) // 18 full blocks
	pick := func(pos ...int) []Key {
		var ks []Key
		for _, p := range pos {
			ks = append(ks, chain[p])
		}
		return ks
	}
	tests := []struct {
		name string
		s    Scheme
		n    int
		want []Key
	}{
		{"empty", Scheme{16, 1}, 0, nil},
		{"one token", Scheme{16, 1}, 1, nil},
		{"exactly one block is not reusable", Scheme{16, 1}, 16, nil},
		{"one block plus one token", Scheme{16, 1}, 17, pick(0)},
		{"exact multiple drops the last block", Scheme{16, 1}, 64, pick(0, 1, 2)},
		{"partial tail", Scheme{16, 1}, 70, pick(0, 1, 2, 3)},
		{"stride 4 short", Scheme{16, 4}, 64, nil},
		{"stride 4 one key", Scheme{16, 4}, 65, pick(3)},
		{"stride 4 two keys", Scheme{16, 4}, 140, pick(3, 7)},
		{"stride 3", Scheme{16, 3}, 300, pick(2, 5, 8, 11, 14, 17)},
		{"zero block size", Scheme{0, 1}, 300, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.s.Request(r, toks[:tt.n])
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("%+v.Request(%d tokens) mismatch (-want +got):\n%s", tt.s, tt.n, diff)
			}
		})
	}
}

// Request and Routed agree: the Request keys are exactly the Routed
// positions of the chain, up to vLLM's reusable limit.
func TestRequestMatchesRouted(t *testing.T) {
	r := Root("m", "lora", "")
	toks := seq(9, 1000)
	for _, s := range []Scheme{{16, 1}, {16, 2}, {16, 4}, {64, 1}, {7, 5}} {
		for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 65, 128, 129, 999, 1000} {
			var want []Key
			for pos, k := range Chain(r, toks[:n], s.BlockSize) {
				if s.Routed(pos) && pos < (n-1)/s.BlockSize {
					want = append(want, k)
				}
			}
			if diff := cmp.Diff(want, s.Request(r, toks[:n])); diff != "" {
				t.Errorf("%+v.Request(%d) mismatch (-want +got):\n%s", s, n, diff)
			}
		}
	}
}

func ExampleScheme_Request() {
	s := Scheme{BlockSize: 16, Stride: 4} // one routing key per 64 tokens
	root := Root("Qwen/Qwen3-0.6B", "", "")
	prompt := make([]uint32, 200)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	keys := s.Request(root, prompt)
	// (200-1)/16 = 12 reusable blocks; positions 3, 7 and 11 carry keys.
	fmt.Println(len(keys), s.TokensPerKey())
	fmt.Println(keys[0] == Chain(root, prompt, 16)[3])
	// Output:
	// 3 64
	// true
}

func ExampleChain() {
	root := Root("Qwen/Qwen3-0.6B", "", "")
	tokens := make([]uint32, 40) // two full blocks of 16 and a partial one
	keys := Chain(root, tokens, 16)
	fmt.Println(len(keys), keys[1] == Next(keys[0], tokens[16:32]))
	// Output: 2 true
}

func BenchmarkRequest32k(b *testing.B) {
	toks := seq(0, 32768)
	r := Root("Qwen/Qwen3-0.6B", "", "")
	for _, s := range []Scheme{{16, 1}, {16, 4}} {
		b.Run(fmt.Sprintf("bs%d-stride%d", s.BlockSize, s.Stride), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(4 * len(toks)))
			for b.Loop() {
				_ = s.Request(r, toks)
			}
		})
	}
}
