package textprefix

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

func msgs(raws ...string) []Message {
	out := make([]Message, len(raws))
	for i, r := range raws {
		out[i] = Message{Raw: []byte(r)}
		if len(r) > 0 && r[0] == 'A' {
			out[i].Role = []byte("assistant")
		}
	}
	return out
}

func TestChainIdentifiesWholePrefixes(t *testing.T) {
	base := Chain([]byte("ctx"), msgs("S", "U1", "A1", "U2"))
	if len(base) != 4 {
		t.Fatalf("len %d", len(base))
	}
	if again := Chain([]byte("ctx"), msgs("S", "U1", "A1", "U2")); !slices.Equal(base, again) {
		t.Fatal("not deterministic")
	}
	// A longer conversation shares the shorter one's hashes.
	if longer := Chain([]byte("ctx"), msgs("S", "U1", "A1", "U2", "A2", "U3")); !slices.Equal(longer[:4], base) {
		t.Fatal("a conversation's turns do not share their prefix hashes")
	}
	seen := map[Hash]string{}
	for _, tc := range []struct {
		name string
		hs   []Hash
	}{
		{"base", base},
		{"other ctx", Chain([]byte("ctx2"), msgs("S", "U1", "A1", "U2"))},
		{"empty ctx", Chain(nil, msgs("S", "U1", "A1", "U2"))},
		{"first differs", Chain([]byte("ctx"), msgs("T", "U1", "A1", "U2"))},
		{"resplit bytes", Chain([]byte("ctx"), msgs("SU", "1", "A1", "U2"))},
		{"merged", Chain([]byte("ctx"), msgs("SU1", "A1U2", "", ""))},
	} {
		for k, h := range tc.hs {
			if prev, dup := seen[h]; dup { // none of these is a prefix of another
				t.Errorf("%s/%d collides with %s", tc.name, k, prev)
			}
			seen[h] = fmt.Sprint(tc.name, "/", k)
		}
	}
}

func keys(n int, salt uint64) []blockkey.Key {
	out := make([]blockkey.Key, n)
	for i := range out {
		out[i] = blockkey.Key(salt<<32 | uint64(i))
	}
	return out
}

func TestStoreEvictsLeastRecentlyUsedBySize(t *testing.T) {
	fixed := entryCost(Entry{}) // an entry's own cost, in keys
	s := NewStore(10 + 2*fixed)
	s.Put(1, Entry{Keys: keys(4, 1)})
	s.Put(2, Entry{Keys: keys(4, 2)})
	if _, ok := s.Get(1); !ok { // 1 is now the most recent
		t.Fatal("1 missing")
	}
	s.Put(3, Entry{Keys: keys(4, 3)}) // 12 keys and 3 entries > 10 and 2: evict the LRU, 2
	if s.Has(2) || !s.Has(1) || !s.Has(3) || s.Keys() != 8 || s.Len() != 2 {
		t.Fatalf("after eviction: has 1 %v 2 %v 3 %v, keys %d, len %d", s.Has(1), s.Has(2), s.Has(3), s.Keys(), s.Len())
	}
	// Has does not refresh: 1 was used before 3 was put, so 1 goes next.
	s.Has(1)
	s.Put(4, Entry{Keys: keys(3, 4)})
	if s.Has(1) || !s.Has(3) || !s.Has(4) || s.Keys() != 7 {
		t.Fatalf("Has refreshed an entry: has 1 %v, keys %d", s.Has(1), s.Keys())
	}
	// Replacing an entry accounts its keys once.
	s.Put(4, Entry{Keys: keys(5, 4)})
	if s.Keys() != 9 || s.Len() != 2 || s.cost != 9+2*fixed {
		t.Fatalf("replace: keys %d len %d cost %d", s.Keys(), s.Len(), s.cost)
	}
	// One entry above the bound is still kept: the newest.
	s.Put(5, Entry{Keys: keys(30, 5)})
	if s.Len() != 1 || !s.Has(5) || s.Keys() != 30 {
		t.Fatalf("oversized entry: len %d keys %d", s.Len(), s.Keys())
	}
	s.Delete(5)
	s.Delete(5)
	if s.Len() != 0 || s.Keys() != 0 || s.cost != 0 {
		t.Fatalf("delete: len %d keys %d cost %d", s.Len(), s.Keys(), s.cost)
	}
}

// TestStoreBoundsEntriesWithoutKeys: a prefix shorter than a routing key
// has no keys, and its entry still costs memory; the bound counts it.
func TestStoreBoundsEntriesWithoutKeys(t *testing.T) {
	s := NewStoreTTL(1000, 0, time.Now)
	for i := range 100000 {
		s.Put(Hash(i), Entry{Tokens: 30, Bytes: 100, Chained: true, Tail: make([]uint32, 14)})
	}
	if max := 1000 / entryCost(Entry{Tail: make([]uint32, 14)}); s.Len() > max || s.Len() == 0 {
		t.Fatalf("%d keyless entries held in a store of 1000 keys' memory; want 1 to %d", s.Len(), max)
	}
}

// TestStoreAgesUnusedEntries: an entry neither got nor put for the TTL is
// dropped by the next use of the store; one used meanwhile stays.
func TestStoreAgesUnusedEntries(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	s := NewStoreTTL(1<<20, time.Minute, clock)
	s.Put(1, Entry{Keys: keys(4, 1)})
	s.Put(2, Entry{Keys: keys(4, 2)})
	now = now.Add(40 * time.Second)
	if _, ok := s.Get(1); !ok {
		t.Fatal("1 missing before its TTL")
	}
	s.Put(3, Entry{Keys: keys(4, 3)})
	now = now.Add(20 * time.Second) // 2 unused for 60 s, 1 for 20 s
	if s.Has(2) || !s.Has(1) || !s.Has(3) || s.Len() != 2 || s.Keys() != 8 {
		t.Fatalf("after 2's TTL: has 1 %v 2 %v 3 %v, len %d, keys %d", s.Has(1), s.Has(2), s.Has(3), s.Len(), s.Keys())
	}
	// Has does not count as a use: 1 and 3 age from their Get and Put
	// (at 40 s), unless got again.
	now = now.Add(39 * time.Second)
	if !s.Has(1) || !s.Has(3) {
		t.Fatalf("has 1 %v 3 %v; want both, used 59 s ago", s.Has(1), s.Has(3))
	}
	s.Get(1)
	now = now.Add(time.Second)
	if s.Has(3) || !s.Has(1) {
		t.Fatalf("has 1 %v 3 %v; want only 1, used 1 s ago", s.Has(1), s.Has(3))
	}
	now = now.Add(time.Minute)
	if _, ok := s.Get(1); ok || s.Len() != 0 || s.Keys() != 0 || s.cost != 0 {
		t.Fatalf("after every TTL: len %d keys %d cost %d", s.Len(), s.Keys(), s.cost)
	}
	// A steady stream of new entries keeps the store at a TTL's worth.
	for i := range 600 {
		now = now.Add(time.Second)
		s.Put(Hash(100+i), Entry{Keys: keys(2, uint64(i))})
	}
	if s.Len() != 60 {
		t.Fatalf("a new entry a second for 10 min, TTL 1 min: %d held; want 60", s.Len())
	}
}

// TestStoreMemory fills a store to its bound with entries as the front
// makes them and checks that the heap they hold is what the bound says:
// maxKeys × 8 bytes, within the map's own overhead.
func TestStoreMemory(t *testing.T) {
	const maxKeys = 1 << 16 // 512 KiB
	for _, n := range []int{0, 4, 125} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		s := NewStoreTTL(maxKeys, 0, time.Now)
		for i := range 200000 {
			e := Entry{Keys: keys(n, uint64(i)), Tokens: 64*n + 10, Chained: true, Tail: make([]uint32, 10)}
			s.Put(Hash(i), e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		per := float64(held) / float64(s.Len())
		t.Logf("%d keys an entry: %d entries hold %d KiB (%.0f B each; bound %d KiB)", n, s.Len(), held>>10, per, maxKeys*8>>10)
		if held > maxKeys*8*5/4 || held < maxKeys*8/2 {
			t.Errorf("%d keys an entry: the store holds %d KiB; its bound is %d KiB", n, held>>10, maxKeys*8>>10)
		}
		runtime.KeepAlive(s)
	}
}

func TestCheckDropsWrongGuessesAndTrustFalls(t *testing.T) {
	s := NewStore(1 << 20)
	long := Entry{Keys: keys(10, 7), Tokens: 700}
	for _, tc := range []struct {
		name string
		used Entry
		want bool
	}{
		{"prefix", Entry{Keys: long.Keys[:6], Tokens: 400}, true},
		{"equal", long, true},
		{"no keys", Entry{Tokens: 30}, true},
		{"other chain", Entry{Keys: keys(6, 8), Tokens: 400}, false},
		{"longer keys", Entry{Keys: keys(11, 7), Tokens: 700}, false},
		{"more tokens", Entry{Keys: long.Keys[:6], Tokens: 701}, false},
	} {
		s.Put(42, tc.used)
		if got := s.Check(42, tc.used, long); got != tc.want || s.Has(42) != tc.want {
			t.Errorf("%s: Check %v (entry kept %v), want %v", tc.name, got, s.Has(42), tc.want)
		}
	}
	if c, w := s.Checks(); c != 6 || w != 3 {
		t.Fatalf("checks %d wrong %d", c, w)
	}
	if !s.Trusted() {
		t.Fatal("distrusted before enough checks")
	}
	// 3 wrong of 60 is 5%: still trusted; one more wrong is not.
	for range 54 {
		s.Check(1, long, long)
	}
	if !s.Trusted() {
		t.Fatal("3 wrong of 60 distrusted")
	}
	s.Check(1, Entry{Keys: keys(1, 9)}, long)
	if s.Trusted() {
		t.Fatal("4 wrong of 61 still trusted")
	}
	// Distrusted: Plan tokenizes, but keeps learning (and checking).
	s.Put(Hash(100), Entry{Keys: keys(2, 1), Tokens: 100, Bytes: 400})
	p := s.Plan([]Hash{100, 101}, msgs("S", "U"), false)
	if p.Use || !slices.Equal(p.Learn, []int{2}) {
		t.Fatalf("distrusted plan %+v", p)
	}
}

func TestPlan(t *testing.T) {
	conv := msgs("SSSS", "U1U1", "A1A1", "U2U2", "A2A2", "U3U3")
	hs := Chain(nil, conv)
	entry := func(k int) Entry {
		b := 0
		for _, m := range conv[:k] {
			b += len(m.Raw)
		}
		return Entry{Keys: keys(k, uint64(k)), Tokens: 2 * b, Bytes: b}
	}
	for _, tc := range []struct {
		name   string
		n      int   // messages in the request
		known  []int // prefix lengths with entries
		use    int   // K routed on, 0: tokenize
		learn  []int
		tokens int
	}{
		{"nothing known", 2, nil, 0, []int{1, 2}, 0},
		{"system prompt known", 2, []int{1}, 1, []int{2}, 16},
		{"same request again", 2, []int{1, 2}, 2, nil, 16},
		{"follow-up, previous turn known", 4, []int{1, 2}, 2, []int{4}, 32},
		{"follow-up, all but the last known", 4, []int{3}, 3, []int{4}, 32},
		{"follow-up, only the system prompt", 4, []int{1}, 0, []int{4}, 0},
		{"third turn, previous turn known", 6, []int{1, 2, 4}, 4, []int{6}, 48},
		{"third turn, an older turn only", 6, []int{1, 2}, 0, []int{6}, 0},
		{"longest wins", 6, []int{4, 5}, 5, []int{6}, 48},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(1 << 20)
			for _, k := range tc.known {
				s.Put(hs[k-1], entry(k))
			}
			p := s.Plan(hs[:tc.n], conv[:tc.n], false)
			if p.Use != (tc.use > 0) || p.K != tc.use || !slices.Equal(p.Learn, tc.learn) || p.Tokens != tc.tokens {
				t.Fatalf("plan %+v; want use %d learn %v tokens %d", p, tc.use, tc.learn, tc.tokens)
			}
			if p.Use && (p.Hash != hs[tc.use-1] || !slices.Equal(p.Entry.Keys, entry(tc.use).Keys)) {
				t.Fatalf("plan routes on the wrong entry: %+v", p)
			}
		})
	}
	// Doc question: [system, document, question]: an unknown document may
	// be cached elsewhere, so the system prompt alone is not routed on.
	doc := msgs("S", "UDOC", "UQ")
	dh := Chain(nil, doc)
	s := NewStore(100)
	s.Put(dh[0], Entry{Keys: keys(1, 1), Tokens: 10, Bytes: 1})
	if p := s.Plan(dh, doc, false); p.Use || !slices.Equal(p.Learn, []int{2, 3}) {
		t.Fatalf("doc plan %+v", p)
	}
	s.Put(dh[1], Entry{Keys: keys(5, 2), Tokens: 50, Bytes: 5})
	if p := s.Plan(dh, doc, false); !p.Use || p.K != 2 || p.Tokens != 70 || !slices.Equal(p.Learn, []int{3}) {
		t.Fatalf("doc plan with the document known %+v", p)
	}
	// An open last message: the whole conversation's entry does not apply,
	// the one before it does.
	s.Put(dh[2], Entry{Keys: keys(7, 3), Tokens: 70, Bytes: 7})
	if p := s.Plan(dh, doc, false); !p.Use || p.K != 3 {
		t.Fatalf("closed plan %+v", p)
	}
	if p := s.Plan(dh, doc, true); !p.Use || p.K != 2 {
		t.Fatalf("open plan %+v", p)
	}
	if p := s.Plan(nil, nil, false); p.Use || p.Learn != nil {
		t.Fatalf("empty plan %+v", p)
	}
	if p := s.Plan(dh[:2], doc, false); p.Use || p.Learn != nil {
		t.Fatalf("mismatched lengths %+v", p)
	}
}

func TestEstimate(t *testing.T) {
	for _, tc := range []struct {
		e          Entry
		total, out int
	}{
		{Entry{Tokens: 100, Bytes: 400}, 400, 100},
		{Entry{Tokens: 100, Bytes: 400}, 401, 101}, // rounds up
		{Entry{Tokens: 100, Bytes: 400}, 800, 200},
		{Entry{Tokens: 100, Bytes: 0}, 800, 100},
		{Entry{Tokens: 0, Bytes: 10}, 800, 0},
		{Entry{Tokens: 100, Bytes: 400}, 300, 100},
	} {
		if got := estimate(tc.e, tc.total); got != tc.out {
			t.Errorf("estimate(%+v, %d) = %d, want %d", tc.e, tc.total, got, tc.out)
		}
	}
}

func BenchmarkChain32k(b *testing.B) {
	// A 32k-token conversation is ~128 KB of messages.
	m := make([]Message, 16)
	for i := range m {
		m[i] = Message{Raw: make([]byte, 8<<10)}
	}
	b.SetBytes(128 << 10)
	for b.Loop() {
		Chain([]byte("sim-model"), m)
	}
}
