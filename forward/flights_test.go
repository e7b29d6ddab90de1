package forward

import (
	"net/http"
	"testing"
	"time"
)

func TestFlights(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	f := flights{}
	f.add("a", at(1), 100, 0, -1)
	f.add("a", at(2), 20, 0, -1)
	f.add("a", at(2), 20, 0, -1)
	f.add("", at(3), 7, 0, -1)
	f.add("", at(4), -5, 0, -1) // a prediction above the prompt: nothing queued
	check := func(when, peer string, since time.Time, wantN, wantQueued, wantPrefill int) {
		t.Helper()
		if n, q, p := f.since(peer, since, at(5)); n != wantN || q != wantQueued || p != wantPrefill {
			t.Errorf("%s: since(%q, %v) = %d, %d, %d; want %d, %d, %d", when, peer, since, n, q, p, wantN, wantQueued, wantPrefill)
		}
	}
	check("sent", "a", time.Time{}, 3, 3, 140)
	check("sent", "a", at(1), 2, 2, 40)
	check("sent", "a", at(2), 0, 0, 0)
	check("sent", "", at(0), 2, 2, 7)
	check("sent", "b", time.Time{}, 0, 0, 0)

	f.answered("a", at(1)) // its prefill is done; it still runs
	f.answered("a", at(9)) // never added: nothing changes
	check("one answered", "a", time.Time{}, 3, 2, 40)
	f.done("a", at(2))
	f.done("a", at(9))
	check("one done", "a", time.Time{}, 2, 1, 20)
	f.done("a", at(1))
	f.done("a", at(2))
	f.done("", at(3))
	f.done("", at(4))
	if len(f) != 0 {
		t.Errorf("flights not empty after every done: %v", f)
	}

	// A non-streamed answer's prefill counts until its time is up.
	f.add("", at(10), 300, 2*time.Second, -1)
	f.add("", at(11), 5, 0, -1)
	if n, q, p := f.since("", time.Time{}, at(11)); n != 2 || q != 2 || p != 305 {
		t.Errorf("within its time: %d, %d, %d; want 2, 2, 305", n, q, p)
	}
	if got := f.next("", at(11)); !got.Equal(at(12)) {
		t.Errorf("next = %v; want %v", got, at(12))
	}
	if n, q, p := f.since("", time.Time{}, at(12)); n != 2 || q != 1 || p != 5 {
		t.Errorf("its time up: %d, %d, %d; want 2, 1, 5 (it still runs)", n, q, p)
	}
	if got := f.next("", at(12)); !got.IsZero() {
		t.Errorf("next after every time is up = %v; want zero", got)
	}
}

func TestHopPrefill(t *testing.T) {
	for _, c := range []struct {
		v      string
		tokens int
		for_   time.Duration
	}{
		{"", 0, 0}, {"1048", 1048, 0}, {"24; for=63", 24, 63 * time.Millisecond}, {"24;for=63", 24, 63 * time.Millisecond},
		{"-3", 0, 0}, {"x", 0, 0}, {"99999999999", maxPrefill, 0}, {"5; for=-1", 5, 0}, {"5; for=abc", 5, 0}, {"5; bogus", 5, 0},
	} {
		r, _ := http.NewRequest("POST", "/", nil)
		r.Header.Set(PrefillHeader, c.v)
		n, d := hopPrefill(r)
		if n != c.tokens || d != c.for_ || r.Header.Get(PrefillHeader) != "" {
			t.Errorf("%q: %d, %v; want %d, %v and the header gone", c.v, n, d, c.tokens, c.for_)
		}
	}
	tg := target{Prefill: 24, PrefillFor: 63 * time.Millisecond}
	r, _ := http.NewRequest("POST", "/", nil)
	r.Header.Set(PrefillHeader, prefillValue(tg))
	if n, d := hopPrefill(r); n != 24 || d != 63*time.Millisecond {
		t.Errorf("round trip of %+v: %d, %v", tg, n, d)
	}
}
