package textprefix

import (
	"fmt"
	"slices"
	"testing"

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

func TestStoreEvictsLeastRecentlyUsedByKeys(t *testing.T) {
	s := NewStore(10)
	s.Put(1, Entry{Keys: keys(4, 1)})
	s.Put(2, Entry{Keys: keys(4, 2)})
	if _, ok := s.Get(1); !ok { // 1 is now the most recent
		t.Fatal("1 missing")
	}
	s.Put(3, Entry{Keys: keys(4, 3)}) // 12 keys > 10: evict the LRU, 2
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
	if s.Keys() != 9 || s.Len() != 2 {
		t.Fatalf("replace: keys %d len %d", s.Keys(), s.Len())
	}
	// One entry above the bound is still kept: the newest.
	s.Put(5, Entry{Keys: keys(30, 5)})
	if s.Len() != 1 || !s.Has(5) || s.Keys() != 30 {
		t.Fatalf("oversized entry: len %d keys %d", s.Len(), s.Keys())
	}
	s.Delete(5)
	s.Delete(5)
	if s.Len() != 0 || s.Keys() != 0 {
		t.Fatalf("delete: len %d keys %d", s.Len(), s.Keys())
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
