package forward

import (
	"testing"
	"time"
)

func TestFlights(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	f := flights{}
	f.add("a", at(1))
	f.add("a", at(2))
	f.add("a", at(2))
	f.add("", at(3))
	for _, c := range []struct {
		peer  string
		since time.Time
		want  int
	}{
		{"a", time.Time{}, 3}, {"a", at(1), 2}, {"a", at(2), 0}, {"", at(0), 1}, {"b", time.Time{}, 0},
	} {
		if got := f.since(c.peer, c.since); got != c.want {
			t.Errorf("since(%q, %v) = %d; want %d", c.peer, c.since, got, c.want)
		}
	}
	f.done("a", at(2))
	f.done("a", at(9)) // never added: nothing changes
	if got := f.since("a", time.Time{}); got != 2 {
		t.Errorf("after one done: %d in flight; want 2", got)
	}
	f.done("a", at(1))
	f.done("a", at(2))
	f.done("", at(3))
	if len(f) != 0 {
		t.Errorf("flights not empty after every done: %v", f)
	}
}
