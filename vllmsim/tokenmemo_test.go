package vllmsim

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

// A remembering tokenizer gives what a plain one does, for texts it has
// seen, texts it has not, and short ones it never keeps; and a chat whose
// messages were seen renders to the same ids.
func TestMemoSameTokens(t *testing.T) {
	plain, mem := NewTokenizer(), NewTokenizerMemo(1<<20)
	long := strings.Repeat("The quick brown fox jumps over 42 lazy dogs. ", 60)
	texts := []string{long, long + "<|im_end|>tail", "short", long, strings.ToUpper(long), long + "<|im_end|>tail"}
	for i, s := range texts {
		want := plain.Encode(s, i%2 == 0)
		if got := mem.Encode(s, i%2 == 0); !slices.Equal(got, want) {
			t.Fatalf("text %d: remembered encoding differs from the plain one", i)
		}
	}
	if mem.memo.lru.Len() != 3 {
		t.Errorf("remembered %d texts; want the 3 distinct long ones", mem.memo.lru.Len())
	}
	msgs := []Message{{Role: "system", Content: long}, {Role: "user", Content: "hi"}}
	for range 2 {
		want, _ := plain.Chat(msgs, ChatOptions{AddGenerationPrompt: true})
		got, err := mem.Chat(msgs, ChatOptions{AddGenerationPrompt: true})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("Chat through the memo = %v, %v; want the plain ids", len(got), err)
		}
	}
	// A caller appending to what Encode returned must not reach the memo.
	a := mem.Encode(long, false)
	_ = append(a[:1], 999)
	if b := mem.Encode(long, false); !slices.Equal(b, plain.Encode(long, false)) {
		t.Fatal("writing to an encoding changed the remembered one")
	}
}

// The memo stays within its bytes, dropping the least recently used.
func TestMemoBound(t *testing.T) {
	const max = 64 << 10
	mem := NewTokenizerMemo(max)
	text := func(i int) string { return fmt.Sprintf("%d %s", i, strings.Repeat("lorem ipsum dolor ", 200)) }
	for i := range 100 {
		mem.Encode(text(i), false)
		mem.Encode(text(0), false) // keep 0 recent
		if mem.memo.bytes > max {
			t.Fatalf("after %d texts the memo holds %d bytes; bound %d", i+1, mem.memo.bytes, max)
		}
	}
	if !mem.memo.lru.Contains(text(0)) || mem.memo.lru.Contains(text(1)) {
		t.Error("eviction is not least recently used first")
	}
	sum := 0
	for _, k := range mem.memo.lru.Keys() {
		v, _ := mem.memo.lru.Peek(k)
		sum += memoCost(k.(string), v.([]uint32))
	}
	if sum != mem.memo.bytes {
		t.Errorf("memo counts %d bytes; its entries hold %d", mem.memo.bytes, sum)
	}
	huge := NewTokenizerMemo(2 * memoMinText)
	huge.Encode(strings.Repeat("x", 4*memoMinText), false)
	if huge.memo.lru.Len() != 0 {
		t.Error("a text larger than the whole bound was kept")
	}
}

// Run with -race: one tokenizer serves concurrent requests.
func TestMemoConcurrent(t *testing.T) {
	plain, mem := NewTokenizer(), NewTokenizerMemo(16<<10)
	var texts []string
	for i := range 8 {
		texts = append(texts, fmt.Sprintf("%d %s", i, strings.Repeat("sit amet consectetur ", 100)))
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				s := texts[(g+i)%len(texts)]
				if !slices.Equal(mem.Encode(s, false), plain.Encode(s, false)) {
					t.Error("concurrent encoding differs")
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkEncodeRemembered(b *testing.B) {
	tok := NewTokenizerMemo(64 << 20)
	text := string(mustRead(b, "testdata/kv_event_base.json"))
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		tok.Encode(text, false)
	}
}
