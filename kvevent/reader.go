package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
)

// maxDepth bounds nesting in skipped and generic values, so hostile input
// cannot exhaust the stack. vLLM's deepest value (an extra key tuple inside
// extra_keys inside an event inside the batch) is 5 levels.
const maxDepth = 32

// reader is a bounds-checked cursor over one msgpack value stream. It never
// copies: strings and byte strings come back as sub-slices of b, and every
// length header is checked against the bytes that remain before anyone
// allocates for it.
type reader struct {
	b   []byte
	off int
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, ErrTruncated
	}
	return r.b[r.off], nil
}

// take returns the next n bytes; n comes from a length header, so it is
// compared as uint64 before any int conversion.
func (r *reader) take(n uint64) ([]byte, error) {
	if n > uint64(r.left()) {
		return nil, ErrTruncated
	}
	p := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return p, nil
}

func (r *reader) uintN(size int) (uint64, error) {
	p, err := r.take(uint64(size))
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	}
	return binary.BigEndian.Uint64(p), nil
}

// nil consumes a msgpack nil if one is next.
func (r *reader) nil() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

func isArray(c byte) bool { return c&0xf0 == 0x90 || c == 0xdc || c == 0xdd }
func isMap(c byte) bool   { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// arrayLen reads an array header. Every element takes at least one byte,
// so a count above the bytes left is a lie and is refused before the
// caller sizes a slice by it.
func (r *reader) arrayLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x90:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xdc:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdd:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("%w: 0x%02x, want array", ErrType, c)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(r.left()) {
		return 0, ErrTruncated
	}
	return int(n), nil
}

// mapLen reads a map header; each entry takes at least two bytes.
func (r *reader) mapLen() (int, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case c&0xf0 == 0x80:
		r.off++
		n = uint64(c & 0x0f)
	case c == 0xde:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdf:
		r.off++
		n, err = r.uintN(4)
	default:
		return 0, fmt.Errorf("%w: 0x%02x, want map", ErrType, c)
	}
	if err != nil {
		return 0, err
	}
	if 2*n > uint64(r.left()) {
		return 0, ErrTruncated
	}
	return int(n), nil
}

// raw reads a str or bin value as a sub-slice of the input. bin marks
// which one it was.
func (r *reader) raw() (p []byte, bin bool, err error) {
	c, err := r.peek()
	if err != nil {
		return nil, false, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		r.off++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		r.off++
		n, err = r.uintN(1)
	case c == 0xda || c == 0xc5:
		r.off++
		n, err = r.uintN(2)
	case c == 0xdb || c == 0xc6:
		r.off++
		n, err = r.uintN(4)
	default:
		return nil, false, fmt.Errorf("%w: 0x%02x, want string", ErrType, c)
	}
	if err != nil {
		return nil, false, err
	}
	p, err = r.take(n)
	return p, c >= 0xc4 && c <= 0xc6, err
}

// integer reads any msgpack integer, or a float holding an integral
// value, as two's-complement bits plus its sign.
func (r *reader) integer() (v uint64, neg bool, err error) {
	c, err := r.peek()
	if err != nil {
		return 0, false, err
	}
	if c <= 0x7f {
		r.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		r.off++
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		r.off++
		v, err = r.uintN(1 << (c - 0xcc))
		return v, false, err
	case 0xd0, 0xd1, 0xd2, 0xd3:
		r.off++
		size := 1 << (c - 0xd0)
		v, err = r.uintN(size)
		if err != nil {
			return 0, false, err
		}
		// Sign-extend from the wire width.
		shift := 64 - 8*size
		x := int64(v<<shift) >> shift
		return uint64(x), x < 0, nil
	case 0xca, 0xcb:
		start := r.off
		f, err := r.float()
		if err != nil {
			return 0, false, err
		}
		v, neg, err = floatInt(f)
		if err != nil {
			r.off = start // report the value, not what follows it
		}
		return v, neg, err
	}
	return 0, false, fmt.Errorf("%w: 0x%02x, want integer", ErrType, c)
}

// floatInt accepts f where an integer is expected only if it is integral
// and fits int64 or uint64.
func floatInt(f float64) (uint64, bool, error) {
	if f != math.Trunc(f) { // also rejects NaN and ±Inf
		return 0, false, fmt.Errorf("%w: non-integral float %v", ErrType, f)
	}
	if f < 0 {
		if f < math.MinInt64 {
			return 0, false, fmt.Errorf("%w: %v", ErrRange, f)
		}
		return uint64(int64(f)), true, nil
	}
	if f >= 1<<64 {
		return 0, false, fmt.Errorf("%w: %v", ErrRange, f)
	}
	return uint64(f), false, nil
}

// float reads a float32, float64 or any integer as a float64.
func (r *reader) float() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		v, err := r.uintN(4)
		return float64(math.Float32frombits(uint32(v))), err
	case 0xcb:
		r.off++
		v, err := r.uintN(8)
		return math.Float64frombits(v), err
	}
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if neg {
		return float64(int64(v)), nil
	}
	return float64(v), nil
}

// int64 reads an integer that must fit int64.
func (r *reader) int64() (int64, error) {
	start := r.off
	v, neg, err := r.integer()
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		r.off = start
		return 0, fmt.Errorf("%w: %d", ErrRange, v)
	}
	return int64(v), nil
}

// hash reads a block hash: an integer as its 64 bits (a negative Python
// hash() becomes its two's complement), or a byte string folded to its
// last 8 bytes big-endian.
func (r *reader) hash() (uint64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	if c <= 0x7f {
		r.off++
		return uint64(c), nil
	}
	if c == 0xcf && r.left() >= 9 { // the common case: a hash ≥ 2^63
		v := binary.BigEndian.Uint64(r.b[r.off+1:])
		r.off += 9
		return v, nil
	}
	if c&0xe0 == 0xa0 || (c >= 0xc4 && c <= 0xc6) || (c >= 0xd9 && c <= 0xdb) {
		p, _, err := r.raw()
		return fold(p), err
	}
	v, _, err := r.integer()
	return v, err
}

// fold names a byte-string hash by its last 8 bytes read big-endian, the
// same number vLLM sends when it sends ints (docs/reference/vllm-interface.md §2.5).
// Shorter strings are read as if left-padded with zeros.
func fold(p []byte) uint64 {
	if len(p) >= 8 {
		return binary.BigEndian.Uint64(p[len(p)-8:])
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v
}

// skip steps over one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return ErrDepth
	}
	c, err := r.peek()
	if err != nil {
		return err
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		r.off++
		return nil
	case isArray(c):
		n, err := r.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := r.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := r.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xe0 == 0xa0 || (c >= 0xc4 && c <= 0xc6) || (c >= 0xd9 && c <= 0xdb):
		_, _, err := r.raw()
		return err
	}
	r.off++
	var n uint64
	switch c {
	case 0xcc, 0xd0, 0xd4:
		n = 1
	case 0xcd, 0xd1, 0xd5:
		n = 2
	case 0xca, 0xce, 0xd2, 0xd6:
		n = 4
	case 0xcb, 0xcf, 0xd3, 0xd7:
		n = 8
	case 0xd8:
		n = 16
	case 0xc7, 0xc8, 0xc9: // ext: length, then a type byte, then data
		n, err = r.uintN(1 << (c - 0xc7))
		if err != nil {
			return err
		}
		n++
	default: // 0xc1 is never used
		return fmt.Errorf("%w: reserved code 0x%02x", ErrType, c)
	}
	if c >= 0xd4 && c <= 0xd8 {
		n++ // fixext type byte
	}
	_, err = r.take(n)
	return err
}
