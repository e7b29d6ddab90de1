package route

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

func TestRecent(t *testing.T) {
	type rec struct {
		peer string
		keys []blockkey.Key
		at   time.Duration // after t0
	}
	chain := keysN(1, 10)
	tests := []struct {
		name    string
		cfg     RecentConfig
		records []rec
		peer    string
		keys    []blockkey.Key
		at      time.Duration
		want    int
	}{
		{"empty", RecentConfig{}, nil, "a", chain, 0, 0},
		{"whole chain", RecentConfig{}, []rec{{"a", chain, 0}}, "a", chain, time.Second, 10},
		{"longer request", RecentConfig{}, []rec{{"a", chain[:4], 0}}, "a", chain, time.Second, 4},
		{"other peer", RecentConfig{}, []rec{{"a", chain, 0}}, "b", chain, time.Second, 0},
		{"diverging chain", RecentConfig{}, []rec{{"a", chain, 0}}, "a", append(keysN(1, 3), keysN(90, 5)...), time.Second, 3},
		{"empty request", RecentConfig{}, []rec{{"a", chain, 0}}, "a", nil, time.Second, 0},
		{"expired at the TTL", RecentConfig{TTL: time.Second}, []rec{{"a", chain, 0}}, "a", chain, time.Second, 0},
		{"just before the TTL", RecentConfig{TTL: time.Second}, []rec{{"a", chain, 0}}, "a", chain, time.Second - 1, 10},
		{"refresh extends the prefix only", RecentConfig{TTL: time.Second},
			[]rec{{"a", chain, 0}, {"a", chain[:3], 500 * time.Millisecond}}, "a", chain, 1200 * time.Millisecond, 3},
		{"max entries evicts the tail first", RecentConfig{MaxEntries: 6},
			[]rec{{"a", chain[:4], 0}, {"a", chain, time.Millisecond}}, "a", chain, time.Second, 6},
		{"max entries evicts the oldest request", RecentConfig{MaxEntries: 5},
			[]rec{{"a", chain[:5], 0}, {"b", chain[:5], time.Millisecond}}, "a", chain, time.Second, 0},
		{"request longer than max entries keeps its prefix", RecentConfig{MaxEntries: 3},
			[]rec{{"a", chain, 0}}, "a", chain, time.Second, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewRecent(tt.cfg)
			for _, rc := range tt.records {
				r.Record(rc.peer, rc.keys, t0.Add(rc.at))
			}
			if got := r.PrefixLen(tt.peer, tt.keys, t0.Add(tt.at)); got != tt.want {
				t.Errorf("PrefixLen(%s, %v) = %d; want %d", tt.peer, tt.keys, got, tt.want)
			}
			// Expire must not change what PrefixLen reports.
			r.Expire(t0.Add(tt.at))
			if got := r.PrefixLen(tt.peer, tt.keys, t0.Add(tt.at)); got != tt.want {
				t.Errorf("after Expire: PrefixLen = %d; want %d", got, tt.want)
			}
		})
	}
}

// TestRecentBounded records far more than MaxEntries and checks memory
// stays bounded and expiry empties the Recent.
func TestRecentBounded(t *testing.T) {
	r := NewRecent(RecentConfig{TTL: time.Second, MaxEntries: 1000})
	for i := range 10000 {
		r.Record("p", keysN(i*100, 64), t0.Add(time.Duration(i)*time.Microsecond))
		if r.Len() > 1000 || len(r.queue) > 2*1000+1024+64 {
			t.Fatalf("after %d records: %d live, queue %d; want ≤ 1000", i, r.Len(), len(r.queue))
		}
	}
	last := keysN(9999*100, 64)
	if got := r.PrefixLen("p", last, t0.Add(10*time.Millisecond)); got != 64 {
		t.Errorf("newest record: PrefixLen = %d; want 64", got)
	}
	r.Expire(t0.Add(time.Hour))
	if r.Len() != 0 || r.head != 0 || len(r.queue) != 0 {
		t.Errorf("after Expire: %d live, head %d, queue %d; want empty", r.Len(), r.head, len(r.queue))
	}
}

// TestRecentMatchesLinearScan checks the binary search against a linear
// walk, over many interleaved records, refreshes and evictions.
func TestRecentMatchesLinearScan(t *testing.T) {
	r := NewRecent(RecentConfig{TTL: 50 * time.Millisecond, MaxEntries: 3000})
	convs, long := 20, 0
	for step := range 3000 {
		now := t0.Add(time.Duration(step) * time.Millisecond)
		c := (step * 7) % convs
		n := 1 + (step*13)%600
		chain := keysN(c*1000, n)
		peer := string(rune('a' + c%3))
		got, want := r.PrefixLen(peer, chain, now), linear(r, peer, chain, now)
		if got != want {
			t.Fatalf("step %d: PrefixLen = %d; linear scan %d", step, got, want)
		}
		if got > checkpointDense {
			long++
		}
		r.Record(peer, chain, now)
	}
	if long < 100 {
		t.Errorf("only %d lookups matched past the dense checkpoints; the test does not exercise them", long)
	}
}

// linear walks keys' checkpoints from the front: the prefix through the
// last live one before the first that is not.
func linear(r *Recent, peer string, keys []blockkey.Key, now time.Time) int {
	p := r.peers[peer]
	n := 0
	for i := range keys {
		if floorCheckpoint(i) != i {
			continue
		}
		if p == nil {
			return n
		}
		if exp, ok := p.live[keys[i]]; !ok || exp <= now.UnixNano() {
			return n
		}
		n = i + 1
	}
	return n
}

// TestRecentPrecision checks what the sparse checkpoints cost: a prefix
// shared with a recorded chain is matched exactly up to checkpointDense
// keys and to within 1/16 of its length beyond, never over it.
func TestRecentPrecision(t *testing.T) {
	r := NewRecent(RecentConfig{})
	chain := keysN(1, 512)
	r.Record("a", chain, t0)
	if r.Len() > 100 {
		t.Errorf("a 512-key chain keeps %d entries; want at most 100", r.Len())
	}
	for m := 1; m <= len(chain); m++ {
		q := append(slices.Clone(chain[:m]), keysN(10_000, 20)...)
		got := r.PrefixLen("a", q, t0.Add(time.Second))
		lo := m - m/16
		if m <= checkpointDense {
			lo = m
		}
		if got > m || got < lo {
			t.Fatalf("sharing %d keys: PrefixLen = %d; want %d..%d", m, got, lo, m)
		}
	}
}

func TestRecentNil(t *testing.T) {
	var r *Recent
	r.Record("a", keysN(1, 3), t0)
	r.Expire(t0)
	if r.PrefixLen("a", keysN(1, 3), t0) != 0 || r.Len() != 0 {
		t.Error("nil Recent holds something")
	}
}

func TestRecentMatch(t *testing.T) {
	r := NewRecent(RecentConfig{})
	r.Record("a", keysN(1, 6), t0)
	tests := []struct {
		name string
		p    PeerView
		want int
	}{
		{"recent only", PeerView{ID: "a", KeyScheme: blockkey.Version}, 6},
		{"digest longer", PeerView{ID: "a", KeyScheme: blockkey.Version, Digest: holds(keysN(1, 9))}, 9},
		{"recent longer", PeerView{ID: "a", KeyScheme: blockkey.Version, Digest: holds(keysN(1, 2))}, 6},
		{"other scheme", PeerView{ID: "a", KeyScheme: 7, Digest: holds(keysN(1, 9))}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Match(tt.p, keysN(1, 10), t0); got != tt.want {
				t.Errorf("Match = %d; want %d", got, tt.want)
			}
		})
	}
}

// TestRecentIgnoresEntriesBeforeSince checks that a forward recorded before
// the peer's cache began (its engine came back) never matches.
func TestRecentIgnoresEntriesBeforeSince(t *testing.T) {
	r := NewRecent(RecentConfig{TTL: 5 * time.Second, MaxEntries: 100})
	keys := []blockkey.Key{1, 2, 3}
	r.Record("p", keys, t0)
	p := PeerView{ID: "p", KeyScheme: blockkey.Version}
	if got := r.Match(p, keys, t0.Add(time.Second)); got != 3 {
		t.Fatalf("Match before any restart = %d; want 3", got)
	}
	p.Since = t0.Add(500 * time.Millisecond)
	if got := r.Match(p, keys, t0.Add(time.Second)); got != 0 {
		t.Errorf("Match of entries from before Since = %d; want 0", got)
	}
	r.Record("p", keys[:2], t0.Add(600*time.Millisecond))
	if got := r.Match(p, keys, t0.Add(time.Second)); got != 2 {
		t.Errorf("Match of entries after Since = %d; want 2", got)
	}
}

// TestRecentKnown checks that the filter a choice asks of every peer
// answers as knows does: for names of every length, a Recent that knows
// none, a few, or more than its tags can list, and a nil one.
func TestRecentKnown(t *testing.T) {
	name := func(i int) string {
		return strings.Repeat("p", i%13) + strconv.Itoa(i)
	}
	for _, n := range []int{-1, 0, 1, 5, maxKnown, maxKnown + 1, 200} {
		var r *Recent
		if n >= 0 {
			r = NewRecent(RecentConfig{})
		}
		for i := range n {
			r.Record(name(3*i), keysN(i, 2), t0)
		}
		k := r.known()
		for i := range 3*max(n, 0) + 100 {
			id := name(i)
			if got, want := k.has(id), r.knows(id); got != want {
				t.Fatalf("%d known: has(%q) = %t; knows %t", n, id, got, want)
			}
		}
		if k.has("") || (n > 0 && !k.has(name(0))) {
			t.Fatalf("%d known: has(\"\") %t, has(%q) %t", n, k.has(""), name(0), k.has(name(0)))
		}
	}
}

// TestCeilCheckpoint: ceilCheckpoint(i) is the first index at or after i
// that floorCheckpoint keeps, which a Shortlist asks a Recent about.
func TestCeilCheckpoint(t *testing.T) {
	for i := range 5000 {
		want := i
		for floorCheckpoint(want) != want {
			want++
		}
		if got := ceilCheckpoint(i); got != want {
			t.Fatalf("ceilCheckpoint(%d) = %d; want %d", i, got, want)
		}
	}
}
