package kvevent

import (
	"fmt"
	"iter"
)

// kinds is the one description of vLLM's event classes that the decoder,
// the encoder and Event.Fields all read (vllm-interface.md §2.2–§2.3). A
// class's fields are in msgspec declaration order, which is also the
// positional order of the array form [tag, fields[0], fields[1], ...];
// the map form names them instead. The first always fields have no
// default, so msgspec writes them even when they are None; vLLM appends
// every later field with a default, so a new one goes at the end.
var kinds = [...]kindSpec{
	Unknown: {tag: "Unknown"},
	BlockStored: {tag: "BlockStored", always: 7, fields: []fieldSpec{
		field("block_hashes", hashCodec, func(e *Event) *[]uint64 { return &e.BlockHashes }),
		field("parent_block_hash", parentCodec, func(e *Event) **uint64 { return &e.Parent }),
		field("token_ids", tokenCodec, func(e *Event) *[]uint32 { return &e.TokenIDs }),
		field("block_size", blockSizeCodec, func(e *Event) *int { return &e.BlockSize }),
		field("lora_id", optIntCodec, func(e *Event) **int64 { return &e.LoRAID }),
		field("medium", optStrCodec, func(e *Event) **string { return &e.Medium }),
		field("lora_name", optStrCodec, func(e *Event) **string { return &e.LoRAName }),
		field("extra_keys", extraKeysCodec, func(e *Event) *[][]any { return &e.ExtraKeys }),
		field("group_idx", optIntCodec, func(e *Event) **int64 { return &e.GroupIdx }),
		field("kv_cache_spec_kind", optStrCodec, func(e *Event) **string { return &e.KVCacheSpecKind }),
		field("kv_cache_spec_sliding_window", optIntCodec, func(e *Event) **int64 { return &e.KVCacheSpecSlidingWindow }),
		field("locality", optStrCodec, func(e *Event) **string { return &e.Locality }),
	}},
	BlockRemoved: {tag: "BlockRemoved", always: 2, fields: []fieldSpec{
		field("block_hashes", hashCodec, func(e *Event) *[]uint64 { return &e.BlockHashes }),
		field("medium", optStrCodec, func(e *Event) **string { return &e.Medium }),
		field("group_idx", optIntCodec, func(e *Event) **int64 { return &e.GroupIdx }),
		field("locality", optStrCodec, func(e *Event) **string { return &e.Locality }),
	}},
	AllBlocksCleared: {tag: "AllBlocksCleared"},
}

// kindSpec describes one event class on the wire.
type kindSpec struct {
	tag    string
	always int // leading fields without a default
	fields []fieldSpec
}

// fieldSpec is one event field: its wire name and how it moves between the
// wire and its Event field.
type fieldSpec struct {
	name   string
	decode func(*decoder, *Event) error
	encode func(*encoder, *Event) error
	// none reports Python's None, the default that omit_defaults drops.
	none func(*Event) bool
	show func(*Event) any
}

// codec is how one Go field type travels on the wire. A nil none means the
// type has no None; a nil show means the value is shown as it is.
type codec[T any] struct {
	decode func(*decoder) (T, error)
	encode func(*encoder, T) error
	none   func(T) bool
	show   func(T) any
}

// field binds a codec to the Event field that at points to, so a table
// row names the field once.
func field[T any](name string, c codec[T], at func(*Event) *T) fieldSpec {
	f := fieldSpec{
		name: name,
		decode: func(d *decoder, e *Event) error {
			v, err := c.decode(d)
			*at(e) = v
			return err
		},
		encode: func(w *encoder, e *Event) error { return c.encode(w, *at(e)) },
		none:   func(*Event) bool { return false },
		show:   func(e *Event) any { return *at(e) },
	}
	if c.none != nil {
		f.none = func(e *Event) bool { return c.none(*at(e)) }
	}
	if c.show != nil {
		f.show = func(e *Event) any { return c.show(*at(e)) }
	}
	return f
}

var (
	hashCodec = codec[[]uint64]{
		decode: (*decoder).hashes,
		encode: func(w *encoder, hs []uint64) error {
			w.arrayHeader(len(hs))
			for _, h := range hs {
				w.uint(h)
			}
			return nil
		},
		show: func(hs []uint64) any { return orEmpty(hs) },
	}
	parentCodec = codec[*uint64]{
		decode: (*decoder).parent,
		encode: func(w *encoder, h *uint64) error { w.optUint(h); return nil },
		none:   isNone[uint64],
		show:   deref[uint64],
	}
	tokenCodec = codec[[]uint32]{
		decode: (*decoder).tokens,
		encode: func(w *encoder, ts []uint32) error {
			w.arrayHeader(len(ts))
			for _, t := range ts {
				w.uint(uint64(t))
			}
			return nil
		},
		show: func(ts []uint32) any { return orEmpty(ts) },
	}
	blockSizeCodec = codec[int]{
		decode: (*decoder).blockSize,
		encode: func(w *encoder, n int) error {
			if n < 0 {
				return fmt.Errorf("%w: block size %d", ErrEncode, n)
			}
			w.int(int64(n))
			return nil
		},
	}
	optIntCodec = codec[*int64]{
		decode: (*decoder).optInt,
		encode: func(w *encoder, v *int64) error { w.optInt(v); return nil },
		none:   isNone[int64],
		show:   deref[int64],
	}
	optStrCodec = codec[*string]{
		decode: (*decoder).optStr,
		encode: func(w *encoder, s *string) error { w.optStr(s); return nil },
		none:   isNone[string],
		show:   deref[string],
	}
	extraKeysCodec = codec[[][]any]{
		decode: (*decoder).extraKeys,
		encode: (*encoder).extraKeys,
		none:   func(xs [][]any) bool { return xs == nil },
	}
)

func isNone[T any](p *T) bool { return p == nil }

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// orEmpty shows a list the wire never sends as None as [], not nil.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// spec returns k's description, or nil for a Kind out of range.
func (k Kind) spec() *kindSpec {
	if int(k) >= len(kinds) {
		return nil
	}
	return &kinds[k]
}

// Fields yields e's wire fields for its Kind in vLLM's declaration order:
// the wire name and the value, with a nil pointer as nil and a set one as
// its value (uint64, int64, string), and the lists that vLLM never sends
// as None ([]uint64, []uint32) as non-nil slices. Unknown and
// AllBlocksCleared events have no fields. A tap that prints every pair
// shows all that Decode read, including fields added later.
func (e *Event) Fields() iter.Seq2[string, any] {
	return func(yield func(string, any) bool) {
		s := e.Kind.spec()
		if s == nil {
			return
		}
		for i := range s.fields {
			if !yield(s.fields[i].name, s.fields[i].show(e)) {
				return
			}
		}
	}
}
