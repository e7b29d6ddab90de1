package forward

import (
	"math"
	"testing"
	"time"
)

func TestPrefillShare(t *testing.T) {
	var s prefillShare
	t0 := time.Unix(1000, 0)
	s.set(t0, false)
	if got := s.at(t0.Add(time.Minute)); got != 0 {
		t.Fatalf("never busy: share %v; want 0", got)
	}
	s.set(t0, true)
	w := 5 * time.Second // route.ShareWindow
	busy := 1 - math.Exp(-1)
	if got := s.at(t0.Add(w)); math.Abs(got-busy) > 1e-9 {
		t.Fatalf("busy a window: %v; want %v", got, busy)
	}
	s.set(t0.Add(w), false)
	if got := s.at(t0.Add(2 * w)); math.Abs(got-busy*math.Exp(-1)) > 1e-9 {
		t.Fatalf("then idle a window: %v; want %v", got, busy*math.Exp(-1))
	}
	// A change of nothing (busy again while busy) keeps the curve.
	s.set(t0.Add(2*w), true)
	a := s.at(t0.Add(3 * w))
	s.set(t0.Add(2*w+w/2), true)
	if b := s.at(t0.Add(3 * w)); math.Abs(a-b) > 1e-9 {
		t.Fatalf("a repeated busy moved the share: %v then %v", a, b)
	}
}
