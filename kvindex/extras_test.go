package kvindex

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/blockkey"
	"github.com/kvroute/kvroute/kvevent"
)

// The index keys a block with vLLM's extra keys as the request side keys
// it (blockkey.RequestMM): the salt on block 0, an image's identifier on
// the blocks it overlaps, the LoRA name dropped (it is in the root), and
// the (identifier, offset) form read like the bare one.
func TestExtrasKeyLikeRequests(t *testing.T) {
	s := blockkey.Scheme{BlockSize: 4, Stride: 1}
	tok := blockToks(10, 6, 4)
	mm := []blockkey.MM{{ID: "img-A", Offset: 6, Length: 5}} // blocks 1 and 2
	for _, tc := range []struct {
		name   string
		lora   string
		extras [][]any
		salt   string
		mm     []blockkey.MM
	}{
		{name: "salt", extras: [][]any{{"s1"}, nil, nil, nil, nil, nil}, salt: "s1"},
		{name: "image bare", extras: [][]any{nil, {"img-A"}, {"img-A"}, nil, nil, nil}, mm: mm},
		{name: "image pair", extras: [][]any{nil, {[]any{"img-A", int64(2)}}, {[]any{"img-A", int64(0)}}, nil, nil, nil}, mm: mm},
		{name: "lora, image and salt", lora: "ad",
			extras: [][]any{{"ad", "s1"}, {"ad", "img-A"}, {"ad", "img-A"}, {"ad"}, {"ad"}, {"ad"}}, salt: "s1", mm: mm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix := New(Config{Model: "m", Scheme: s, CapacityBlocks: 100})
			ev := kvevent.Event{Kind: kvevent.BlockStored, BlockHashes: []uint64{1, 2, 3, 4, 5, 6}, TokenIDs: tok, BlockSize: 4, ExtraKeys: tc.extras}
			if tc.lora != "" {
				ev.LoRAName = ptr(tc.lora)
			}
			ix.Apply(kvevent.Batch{Events: []kvevent.Event{ev}})
			model := "m"
			if tc.lora != "" {
				model = tc.lora
			}
			// A prompt of these 24 tokens plus one: every block reusable.
			prompt := append(slices.Clone(tok), 99)
			want := s.RequestMM(blockkey.ModelRoot("m", model), prompt, tc.mm, tc.salt)
			if got := ix.PrefixLen(want); got != len(want) {
				t.Fatalf("request keys match %d of %d blocks", got, len(want))
			}
			plain := s.Request(blockkey.ModelRoot("m", model), prompt)
			if got := ix.PrefixLen(plain); got == len(plain) {
				t.Fatal("the plain chain matches blocks stored with extras")
			}
		})
	}
}

// A different image shares only the blocks before it.
func TestOtherImageMatchesOnlyBefore(t *testing.T) {
	s := blockkey.Scheme{BlockSize: 4, Stride: 1}
	tok := blockToks(10, 6, 4)
	ix := New(Config{Model: "m", Scheme: s, CapacityBlocks: 100})
	ix.Apply(kvevent.Batch{Events: []kvevent.Event{{Kind: kvevent.BlockStored, BlockHashes: []uint64{1, 2, 3, 4, 5, 6},
		TokenIDs: tok, BlockSize: 4, ExtraKeys: [][]any{nil, nil, {"img-A"}, {"img-A"}, nil, nil}}}})
	prompt := append(slices.Clone(tok), 99)
	other := s.RequestMM(blockkey.ModelRoot("m", "m"), prompt, []blockkey.MM{{ID: "img-B", Offset: 8, Length: 8}}, "")
	if got := ix.PrefixLen(other); got != 2 {
		t.Fatalf("another image matched %d blocks, want the 2 before it", got)
	}
}
