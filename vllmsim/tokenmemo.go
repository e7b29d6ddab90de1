package vllmsim

import (
	"sync"

	"github.com/hashicorp/golang-lru/simplelru"
)

// memoMinText is the shortest text worth remembering: below it, encoding
// costs about what the lookup does.
const memoMinText = 1024

// memo remembers the tokens of long texts, least recently used out first.
// The simulator's tokenizer does real work (~10 ns a byte) on the machine
// that also runs the routers under test, and chat traffic repeats its long
// texts (a system prompt, a document, earlier turns) in every request: at
// 32k tokens a chat cost the simulator ~6 ms of CPU, ~40% of it encoding.
// What a real vLLM takes to tokenize is charged apart (TokenizeCost), so
// remembering changes no simulated time, only the simulator's own CPU.
// Encode is pure, so a remembered encoding is the encoding.
type memo struct {
	mu         sync.Mutex
	lru        *simplelru.LRU // text -> []uint32, never modified
	bytes, max int
}

func newMemo(maxBytes int) *memo {
	m := &memo{max: maxBytes}
	// The size bound is the byte budget's job; the count only has to be
	// larger than any number of entries that fit in it.
	m.lru, _ = simplelru.NewLRU(maxBytes/memoMinText+1, func(k, v any) {
		m.bytes -= memoCost(k.(string), v.([]uint32))
	})
	return m
}

func memoCost(text string, ids []uint32) int { return len(text) + 4*len(ids) }

func (m *memo) get(text string) ([]uint32, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.lru.Get(text)
	if !ok {
		return nil, false
	}
	return v.([]uint32), true
}

func (m *memo) put(text string, ids []uint32) {
	c := memoCost(text, ids)
	if c > m.max {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lru.Contains(text) {
		return
	}
	m.lru.Add(text, ids)
	m.bytes += c
	for m.bytes > m.max {
		m.lru.RemoveOldest()
	}
}
