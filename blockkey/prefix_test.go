package blockkey

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Keying a prompt in steps must route exactly as keying it at once, for
// every split point (block boundaries, one token either side, empty steps).
func TestContinueEqualsRequest(t *testing.T) {
	root := Root("m", "", "")
	toks := seq(1000, 150)
	for _, s := range []Scheme{{BlockSize: 16, Stride: 4}, {BlockSize: 16, Stride: 1}, {BlockSize: 5, Stride: 3}} {
		for n := 0; n <= len(toks); n++ {
			whole := s.Prefix(root, toks[:n])
			if want := s.Request(root, toks[:n]); !slices.Equal(whole.Keys, want) {
				t.Fatalf("%+v n=%d: Prefix keys %v; Request %v", s, n, whole.Keys, want)
			}
			for a := 0; a <= n; a++ {
				for _, b := range []int{a, (a + n) / 2, n} {
					p := s.Continue(s.Continue(s.Prefix(root, toks[:a]), toks[a:b]), toks[b:n])
					if diff := cmp.Diff(whole, p); diff != "" {
						t.Fatalf("%+v n=%d split %d,%d (-once +steps):\n%s", s, n, a, b, diff)
					}
				}
			}
		}
	}
}

func TestPrefixState(t *testing.T) {
	s := Scheme{BlockSize: 16, Stride: 4}
	root := Root("m", "", "")
	toks := seq(7, 70)
	p := s.Prefix(root, toks)
	chain := Chain(root, toks, 16)
	if p.Tokens != 70 || p.Last != chain[3] || !slices.Equal(p.Tail, toks[64:]) {
		t.Errorf("Prefix(70 tokens) = %d tokens, last %#x, tail %v; want 70, %#x, %v", p.Tokens, p.Last, p.Tail, chain[3], toks[64:])
	}
	if e := s.Prefix(root, nil); e.Last != root || e.Tail != nil || len(e.Keys) != 0 {
		t.Errorf("Prefix(nothing) = %+v; want the root and no tail", e)
	}
	// The result does not alias its inputs.
	q := s.Continue(p, toks[:5])
	q.Tail[0]++
	if p.Tail[0] != toks[64] || toks[64] != 71 {
		t.Error("Continue's tail aliases its input")
	}
}

func BenchmarkContinue(b *testing.B) {
	s := DefaultScheme()
	root := Root("m", "", "")
	p := s.Prefix(root, seq(0, 32000))
	more := seq(5, 200)
	b.ReportAllocs()
	for b.Loop() {
		s.Continue(p, more)
	}
}
