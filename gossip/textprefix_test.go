package gossip

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

func TestTextPrefixRoundTrip(t *testing.T) {
	for _, p := range []TextPrefix{
		{Hash: 1},
		{Hash: 1<<64 - 1, Tokens: 32768, Bytes: 131072, Keys: []blockkey.Key{1, 2, 1<<64 - 1}},
		{Hash: 2, Tokens: 70, Keys: []blockkey.Key{9}, Chained: true, Last: 8, Tail: []uint32{1, 2, 3, 4, 5, 6}},
		{Hash: 3, Tokens: 64, Keys: []blockkey.Key{9}, Chained: true, Composed: true, Last: 8},
		{Hash: 4, Tokens: 5, Composed: true},
	} {
		b, err := encodeTextPrefix(p)
		if err != nil || b[0] != kindTextPrefix {
			t.Fatalf("encode %+v: %v", p, err)
		}
		got, err := decodeTextPrefix(b[1:])
		if err != nil || got.Hash != p.Hash || got.Tokens != p.Tokens || got.Bytes != p.Bytes || !slices.Equal(got.Keys, p.Keys) ||
			got.Chained != p.Chained || got.Composed != p.Composed || got.Last != p.Last || !slices.Equal(got.Tail, p.Tail) {
			t.Fatalf("round trip %+v: %+v, %v", p, got, err)
		}
	}
	if _, err := encodeTextPrefix(TextPrefix{Tokens: -1}); err == nil {
		t.Error("negative tokens encoded")
	}
	if _, err := encodeTextPrefix(TextPrefix{Last: 1}); err == nil {
		t.Error("a chain key without Chained encoded")
	}
	good, _ := encodeTextPrefix(TextPrefix{Hash: 7, Tokens: 3, Bytes: 9, Keys: []blockkey.Key{5, 6}})
	chained, _ := encodeTextPrefix(TextPrefix{Hash: 7, Tokens: 3, Keys: []blockkey.Key{5}, Chained: true, Last: 1, Tail: []uint32{1, 2, 3}})
	for name, b := range map[string][]byte{
		"empty":       {},
		"short hash":  good[1:5],
		"no fields":   good[1:9],
		"short keys":  good[1 : len(good)-1],
		"zero flags":  append(slices.Clone(good[1:]), 0),
		"bad flags":   append(slices.Clone(good[1:]), 4),
		"after flags": append(slices.Clone(good[1:]), textComposed, 0),
		"no chain":    append(slices.Clone(good[1:]), textChained, 1, 2),
		"short tail":  chained[1 : len(chained)-1],
		"long tail":   append(slices.Clone(chained[1:]), 0),
		"huge count":  append(slices.Clone(good[1:10]), 1, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := decodeTextPrefix(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

func FuzzTextPrefix(f *testing.F) {
	good, _ := encodeTextPrefix(TextPrefix{Hash: 7, Tokens: 3, Bytes: 9, Keys: []blockkey.Key{5, 6}})
	chained, _ := encodeTextPrefix(TextPrefix{Hash: 7, Tokens: 3, Keys: []blockkey.Key{5}, Chained: true, Composed: true, Last: 1, Tail: []uint32{1, 2, 3}})
	f.Add(good[1:])
	f.Add(chained[1:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeTextPrefix(b)
		if err != nil {
			return
		}
		again, err := encodeTextPrefix(p)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", p, err)
		}
		if p2, err := decodeTextPrefix(again[1:]); err != nil || p2.Hash != p.Hash || !slices.Equal(p2.Keys, p.Keys) ||
			p2.Chained != p.Chained || p2.Composed != p.Composed || p2.Last != p.Last || !slices.Equal(p2.Tail, p.Tail) {
			t.Fatalf("re-decode %+v: %+v %v", p, p2, err)
		}
	})
}

func TestMeshSharesTextPrefixes(t *testing.T) {
	ms := cluster(t, 3, nil)
	var mu sync.Mutex
	got := map[int][]TextPrefix{}
	for i, m := range ms {
		m.OnTextPrefix(func(p TextPrefix) {
			mu.Lock()
			got[i] = append(got[i], p)
			mu.Unlock()
		})
	}
	keys := make([]blockkey.Key, 2048) // 32k tokens at one key per block: far over a packet
	for i := range keys {
		keys[i] = blockkey.Key(i + 1)
	}
	if err := ms[0].ShareTextPrefix(TextPrefix{Hash: 99, Tokens: 32768, Bytes: 1 << 17, Keys: keys}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "n1 and n2 receive the prefix", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got[1]) == 1 && len(got[2]) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if p := got[2][0]; p.Hash != 99 || p.Tokens != 32768 || !slices.Equal(p.Keys, keys) || len(got[0]) != 0 {
		t.Fatalf("n2 got %d keys hash %d; sender got %d", len(p.Keys), p.Hash, len(got[0]))
	}
	before := ms[1].Stats().DecodeErrors
	ms[1].handle([]byte{kindTextPrefix, 1})
	if ms[1].Stats().DecodeErrors != before+1 {
		t.Error("a bad text prefix was not counted")
	}
}
