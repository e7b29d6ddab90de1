package blockkey

import (
	"slices"
	"testing"
)

func seqMM(n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(i*7 + 3)
	}
	return t
}

func TestExtendNoExtrasIsParent(t *testing.T) {
	r := Root("m", "", "")
	if Extend(r, nil) != r || Salted(r, "") != r {
		t.Fatal("no extras must leave the key as it is")
	}
	if Extend(r, []string{"a"}) == r || Extend(r, []string{"a"}) == Extend(r, []string{"b"}) {
		t.Fatal("extras must change the key")
	}
	// Lengths are framed: ("ab","c") is not ("a","bc").
	if Extend(r, []string{"ab", "c"}) == Extend(r, []string{"a", "bc"}) {
		t.Fatal("extras alias across boundaries")
	}
}

func TestRequestMMWithoutItemsIsRequest(t *testing.T) {
	s := DefaultScheme()
	r := Root("m", "", "")
	tok := seqMM(1000)
	if !slices.Equal(s.RequestMM(r, tok, nil, ""), s.Request(r, tok)) {
		t.Fatal("RequestMM without items or salt differs from Request")
	}
	if !slices.Equal(s.RequestMM(r, tok, nil, "salt"), s.Request(Salted(r, "salt"), tok)) {
		t.Fatal("a salt is a salted root")
	}
	// An item that does not touch block 0 leaves the salted root as it is.
	mm := []MM{{ID: "img", Offset: 600, Length: 64}}
	a, b := s.RequestMM(r, tok, mm, "salt"), s.Request(Salted(r, "salt"), tok)
	if !slices.Equal(a[:600/64], b[:600/64]) {
		t.Fatal("keys before the image must not depend on it")
	}
}

func TestRequestMMDifferentImagesShareOnlyBlocksBefore(t *testing.T) {
	s := Scheme{BlockSize: 16, Stride: 1}
	r := Root("m", "", "")
	tok := seqMM(400)
	// The image's placeholders are tokens 100..163: blocks 6..10 overlap it.
	a := s.RequestMM(r, tok, []MM{{ID: "A", Offset: 100, Length: 64}}, "")
	b := s.RequestMM(r, tok, []MM{{ID: "B", Offset: 100, Length: 64}}, "")
	plain := s.Request(r, tok)
	for i := range a {
		same := a[i] == b[i]
		if want := i < 6; same != want {
			t.Fatalf("block %d: same=%v, want %v", i, same, want)
		}
		if i < 6 && a[i] != plain[i] {
			t.Fatalf("block %d before the image differs from the plain chain", i)
		}
	}
	if !slices.Equal(a, s.RequestMM(r, tok, []MM{{ID: "A", Offset: 100, Length: 64}}, "")) {
		t.Fatal("the same image must key the same")
	}
}

func TestBlockExtrasOrder(t *testing.T) {
	mm := []MM{{ID: "a", Offset: 0, Length: 20}, {ID: "b", Offset: 20, Length: 4}, {ID: "c", Offset: 40, Length: 0}}
	if got := BlockExtras(0, 16, mm, "s"); !slices.Equal(got, []string{"a", "s"}) {
		t.Fatalf("block 0: %q", got)
	}
	if got := BlockExtras(1, 16, mm, "s"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("block 1: %q", got)
	}
	if got := BlockExtras(2, 16, mm, "s"); got != nil {
		t.Fatalf("block 2: %q (an empty item overlaps nothing)", got)
	}
}
