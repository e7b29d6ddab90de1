package kvevent

import (
	"fmt"
	"iter"
)

// kinds is the one description of vLLM's event classes (docs/reference/vllm-interface.md
// §2.2–§2.3; KVCacheEvent in vllm/distributed/kv_events.py) that the
// decoder, the encoder and Event.Fields all read. A class's fields are in
// msgspec declaration order, which is also the positional order of the
// array form [tag, fields[0], fields[1], ...]; the map form names them
// instead. The first always fields have no default, so msgspec writes
// them even when they are None; vLLM appends every later field with a
// default, so a new one goes at the end.
var kinds = [...]kindSpec{
	Unknown: {tag: "Unknown"},
	BlockStored: {tag: "BlockStored", always: 7, fields: []fieldSpec{
		{"block_hashes", func(e *Event) any { return &e.BlockHashes }},
		{"parent_block_hash", func(e *Event) any { return &e.Parent }},
		{"token_ids", func(e *Event) any { return &e.TokenIDs }},
		{"block_size", func(e *Event) any { return &e.BlockSize }},
		{"lora_id", func(e *Event) any { return &e.LoRAID }},
		{"medium", func(e *Event) any { return &e.Medium }},
		{"lora_name", func(e *Event) any { return &e.LoRAName }},
		{"extra_keys", func(e *Event) any { return &e.ExtraKeys }},
		{"group_idx", func(e *Event) any { return &e.GroupIdx }},
		{"kv_cache_spec_kind", func(e *Event) any { return &e.KVCacheSpecKind }},
		{"kv_cache_spec_sliding_window", func(e *Event) any { return &e.KVCacheSpecSlidingWindow }},
		{"locality", func(e *Event) any { return &e.Locality }},
	}},
	BlockRemoved: {tag: "BlockRemoved", always: 2, fields: []fieldSpec{
		{"block_hashes", func(e *Event) any { return &e.BlockHashes }},
		{"medium", func(e *Event) any { return &e.Medium }},
		{"group_idx", func(e *Event) any { return &e.GroupIdx }},
		{"locality", func(e *Event) any { return &e.Locality }},
	}},
	AllBlocksCleared: {tag: "AllBlocksCleared"},
}

// kindSpec describes one event class on the wire.
type kindSpec struct {
	tag    string
	always int // leading fields without a default
	fields []fieldSpec
}

// fieldSpec is one event field: its wire name and where it lives in the
// Event. The Go type of that field picks its wire form, in the switches
// below (one case per type, all in this file):
//
//	[]uint64  block hashes: ints or byte strings folded to 64 bits; never None
//	*uint64   one block hash, or None (0 reads as None too)
//	[]uint32  token ids; never None
//	int       a non-negative int; None reads as 0
//	*int64    an int or None
//	*string   a string or None
//	[][]any   per-block lists of generic values, or None
//
// The switches work on the pointer that at returns rather than on
// per-field closures so that the decoder and encoder stay on the stack.
type fieldSpec struct {
	name string
	at   func(*Event) any
}

// decodeField reads f's value into e.
func (d *decoder) decodeField(e *Event, f *fieldSpec) (err error) {
	d.field = f.name
	switch p := f.at(e).(type) {
	case *[]uint64:
		*p, err = d.hashes()
	case **uint64:
		*p, err = d.parent()
	case *[]uint32:
		*p, err = d.tokens()
	case *int:
		*p, err = d.blockSize()
	case **int64:
		*p, err = d.optInt()
	case **string:
		*p, err = d.optStr()
	case *[][]any:
		*p, err = d.extraKeys()
	default:
		err = noCodec(f, p)
	}
	return err
}

// field writes f's value from ev.
func (e *encoder) field(ev *Event, f *fieldSpec) error {
	switch p := f.at(ev).(type) {
	case *[]uint64:
		e.arrayHeader(len(*p))
		for _, h := range *p {
			e.uint(h)
		}
	case **uint64:
		e.optUint(*p)
	case *[]uint32:
		e.arrayHeader(len(*p))
		for _, t := range *p {
			e.uint(uint64(t))
		}
	case *int:
		if *p < 0 {
			return fmt.Errorf("%w: %s %d", ErrEncode, f.name, *p)
		}
		e.int(int64(*p))
	case **int64:
		e.optInt(*p)
	case **string:
		e.optStr(*p)
	case *[][]any:
		return e.extraKeys(*p)
	default:
		return noCodec(f, p)
	}
	return nil
}

// none reports whether f holds Python's None in ev, the default that
// omit_defaults drops.
func (f *fieldSpec) none(ev *Event) bool {
	switch p := f.at(ev).(type) {
	case **uint64:
		return *p == nil
	case **int64:
		return *p == nil
	case **string:
		return *p == nil
	case *[][]any:
		return *p == nil
	}
	return false
}

// show returns f's value in ev as Fields yields it.
func (f *fieldSpec) show(ev *Event) any {
	switch p := f.at(ev).(type) {
	case *[]uint64:
		return orEmpty(*p)
	case **uint64:
		return deref(*p)
	case *[]uint32:
		return orEmpty(*p)
	case *int:
		return *p
	case **int64:
		return deref(*p)
	case **string:
		return deref(*p)
	case *[][]any:
		return *p
	}
	return nil
}

// noCodec reports a table row whose Event field has a type without a case
// above; TestTableRoundTrip fails on it.
func noCodec(f *fieldSpec, p any) error {
	return fmt.Errorf("%w: field %s of type %T has no wire form", ErrType, f.name, p)
}

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
