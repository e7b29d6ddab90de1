package forward

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestHop(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	h := NewHop([]byte("secret"), 30*time.Second)
	other := NewHop([]byte("other"), 30*time.Second)
	good := h.Sign("a", "b", t0)
	// A later version's header: a field appended after the time, signed.
	body := good[:strings.LastIndexByte(good, ';')] + ";x=1"
	appended := body + ";" + h.mac(body)
	tests := []struct {
		name  string
		value string
		self  string
		now   time.Time
		want  string
		err   error
	}{
		{"valid", good, "b", t0.Add(time.Second), "a", nil},
		{"skew within window", good, "b", t0.Add(-10 * time.Second), "a", nil},
		{"stale", good, "b", t0.Add(31 * time.Second), "", ErrHopStale},
		{"future", good, "b", t0.Add(-31 * time.Second), "", ErrHopStale},
		{"other node", good, "c", t0, "", ErrHopOtherNode},
		{"other key", other.Sign("a", "b", t0), "b", t0, "", ErrHopBadMAC},
		{"tampered from", "v1;x" + good[4:], "b", t0, "", ErrHopBadMAC},
		{"empty", "", "b", t0, "", ErrHopMalformed},
		{"no mac", "v1;a;b;1", "b", t0, "", ErrHopMalformed},
		{"bad time", "v1;a;b;zz;mac", "b", t0, "", ErrHopMalformed},
		{"wrong version", "v2;a;b;1;mac", "b", t0, "", ErrHopMalformed},
		{"appended field", appended, "b", t0, "a", nil},
		{"appended field unsigned", body + good[strings.LastIndexByte(good, ';'):], "b", t0, "", ErrHopBadMAC},
		{"client junk", "1", "b", t0, "", ErrHopMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := h.Verify(tt.value, tt.self, tt.now)
			if got != tt.want || !errors.Is(err, tt.err) {
				t.Errorf("Verify(%q) = %q, %v; want %q, %v", tt.value, got, err, tt.want, tt.err)
			}
		})
	}
}

func FuzzHopVerify(f *testing.F) {
	t0 := time.Unix(1_800_000_000, 0)
	h := NewHop([]byte("k"), time.Minute)
	f.Add(h.Sign("a", "b", t0))
	f.Add("v1;;;;")
	f.Add("v1;a;b;1800000000000;later;field;mac")
	f.Fuzz(func(t *testing.T, v string) {
		from, err := h.Verify(v, "b", t0)
		if err == nil && !strings.HasPrefix(v, "v1;"+from+";b;") {
			t.Fatalf("Verify(%q) accepted a header not addressed from %q to b", v, from)
		}
	})
}
