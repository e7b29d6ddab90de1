package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// Encode writes b's payload (frame 2) the way vLLM's msgspec encoder would
// for the given wire generation: the batch as [ts, events] or [ts, events,
// dp_rank] (dp_rank omitted when nil), ts as float64, integers and
// lengths in their smallest msgpack form. ArrayEncoding writes events as
// [tag, fields...] in declaration order, dropping trailing defaulted nil
// fields; MapEncoding writes {"type": tag, fields...}, dropping every nil
// field that has a default. Known kinds are written under Kind.String();
// Unknown events as the bare Tag. A Parent of 0 is written as 0, which
// decodes back to nil, as in vLLM.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	if enc != ArrayEncoding && enc != MapEncoding {
		return nil, fmt.Errorf("encode batch: %w: encoding %d", ErrEncode, enc)
	}
	e := encoder{buf: make([]byte, 0, sizeHint(b)), enc: enc}
	n := 2
	if b.DPRank != nil {
		n = 3
	}
	e.arrayHeader(n)
	e.float(b.TS)
	e.arrayHeader(len(b.Events))
	for i := range b.Events {
		if err := e.event(&b.Events[i]); err != nil {
			return nil, fmt.Errorf("encode event %d: %w", i, err)
		}
	}
	if b.DPRank != nil {
		e.int(*b.DPRank)
	}
	return e.buf, nil
}

// EncodeFrames returns the three frames of a live message for b:
// [topic, seq (8 bytes big-endian), Encode(b, enc)].
func EncodeFrames(b Batch, enc Encoding) ([][]byte, error) {
	p, err := Encode(b, enc)
	if err != nil {
		return nil, err
	}
	return [][]byte{[]byte(b.Topic), binary.BigEndian.AppendUint64(nil, b.Seq), p}, nil
}

// sizeHint over-estimates a typical payload so Encode appends without
// regrowing: 9 bytes per hash, up to 5 per token, plus fixed overhead.
func sizeHint(b Batch) int {
	n := 16
	for i := range b.Events {
		n += 192 + 9*len(b.Events[i].BlockHashes) + 5*len(b.Events[i].TokenIDs)
	}
	return n
}

type encoder struct {
	buf []byte
	enc Encoding
}

func (e *encoder) event(ev *Event) error {
	s := ev.Kind.spec()
	if s == nil {
		return fmt.Errorf("%w: kind %d", ErrEncode, ev.Kind)
	}
	tag := s.tag
	if ev.Kind == Unknown {
		tag = ev.Tag
	}
	if e.enc == ArrayEncoding {
		// omit_defaults in array form can drop only a None tail.
		n := len(s.fields)
		for n > s.always && s.fields[n-1].none(ev) {
			n--
		}
		e.arrayHeader(1 + n)
		e.str(tag)
		for i := range s.fields[:n] {
			if err := e.field(ev, &s.fields[i]); err != nil {
				return err
			}
		}
		return nil
	}
	// The header needs the count first; set remembers which fields count
	// so none runs once per field (kinds has at most 64, see
	// TestTableRoundTrip).
	var set uint64
	n := 1
	for i := range s.fields {
		if i < s.always || !s.fields[i].none(ev) {
			set |= 1 << i
			n++
		}
	}
	e.mapHeader(n)
	e.str("type")
	e.str(tag)
	for i := range s.fields {
		if set&(1<<i) != 0 {
			f := &s.fields[i]
			e.str(f.name)
			if err := e.field(ev, f); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *encoder) extraKeys(xs [][]any) error {
	if xs == nil {
		e.nil()
		return nil
	}
	e.arrayHeader(len(xs))
	for _, keys := range xs {
		if keys == nil {
			e.nil()
			continue
		}
		if err := e.value(keys, 0); err != nil {
			return fmt.Errorf("extra_keys: %w", err)
		}
	}
	return nil
}

// value writes the Go forms that Decode produces for generic values, plus
// the other fixed-size integer types for callers' convenience.
func (e *encoder) value(v any, depth int) error {
	if depth > maxDepth {
		return ErrDepth
	}
	switch x := v.(type) {
	case nil:
		e.nil()
	case bool:
		if x {
			e.buf = append(e.buf, 0xc3)
		} else {
			e.buf = append(e.buf, 0xc2)
		}
	case int:
		e.int(int64(x))
	case int8:
		e.int(int64(x))
	case int16:
		e.int(int64(x))
	case int32:
		e.int(int64(x))
	case int64:
		e.int(x)
	case uint:
		e.uint(uint64(x))
	case uint8:
		e.uint(uint64(x))
	case uint16:
		e.uint(uint64(x))
	case uint32:
		e.uint(uint64(x))
	case uint64:
		e.uint(x)
	case float32:
		e.float(float64(x))
	case float64:
		e.float(x)
	case string:
		e.str(x)
	case []byte:
		e.bin(x)
	case []any:
		e.arrayHeader(len(x))
		for _, y := range x {
			if err := e.value(y, depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		e.mapHeader(len(x))
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys) // deterministic bytes for equal maps
		for _, k := range keys {
			e.str(k)
			if err := e.value(x[k], depth+1); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%w: value of type %T", ErrEncode, v)
	}
	return nil
}

func (e *encoder) nil() { e.buf = append(e.buf, 0xc0) }

func (e *encoder) float(f float64) {
	e.buf = append(e.buf, 0xcb)
	e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(f))
}

// uint writes v in msgspec's smallest unsigned form.
func (e *encoder) uint(v uint64) {
	switch {
	case v <= 0x7f:
		e.buf = append(e.buf, byte(v))
	case v <= math.MaxUint8:
		e.buf = append(e.buf, 0xcc, byte(v))
	case v <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xcd), uint16(v))
	case v <= math.MaxUint32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xce), uint32(v))
	default:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, 0xcf), v)
	}
}

// int writes v as msgspec does a Python int: non-negative values in the
// unsigned forms, negative ones in the smallest signed form.
func (e *encoder) int(v int64) {
	switch {
	case v >= 0:
		e.uint(uint64(v))
	case v >= -32:
		e.buf = append(e.buf, byte(int8(v)))
	case v >= math.MinInt8:
		e.buf = append(e.buf, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xd1), uint16(int16(v)))
	case v >= math.MinInt32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xd2), uint32(int32(v)))
	default:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, 0xd3), uint64(v))
	}
}

func (e *encoder) optUint(v *uint64) {
	if v == nil {
		e.nil()
		return
	}
	e.uint(*v)
}

func (e *encoder) optInt(v *int64) {
	if v == nil {
		e.nil()
		return
	}
	e.int(*v)
}

func (e *encoder) optStr(s *string) {
	if s == nil {
		e.nil()
		return
	}
	e.str(*s)
}

func (e *encoder) str(s string) {
	n := len(s)
	switch {
	case n < 32:
		e.buf = append(e.buf, 0xa0|byte(n))
	case n <= math.MaxUint8:
		e.buf = append(e.buf, 0xd9, byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xda), uint16(n))
	default:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xdb), uint32(n))
	}
	e.buf = append(e.buf, s...)
}

func (e *encoder) bin(p []byte) {
	n := len(p)
	switch {
	case n <= math.MaxUint8:
		e.buf = append(e.buf, 0xc4, byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xc5), uint16(n))
	default:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xc6), uint32(n))
	}
	e.buf = append(e.buf, p...)
}

func (e *encoder) arrayHeader(n int) {
	switch {
	case n < 16:
		e.buf = append(e.buf, 0x90|byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xdc), uint16(n))
	default:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xdd), uint32(n))
	}
}

func (e *encoder) mapHeader(n int) {
	switch {
	case n < 16:
		e.buf = append(e.buf, 0x80|byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xde), uint16(n))
	default:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xdf), uint32(n))
	}
}
