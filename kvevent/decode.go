package kvevent

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// kindOf maps a wire tag to its Kind and returns the tag as a string,
// without allocating for the known ones.
func kindOf(tag []byte) (Kind, string) {
	for k := Unknown + 1; int(k) < len(kinds); k++ {
		if s := kinds[k].tag; string(tag) == s {
			return k, s
		}
	}
	return Unknown, string(tag)
}

// Decode decodes one msgpack payload (frame 2 of a live message) into a
// Batch with Topic and Seq unset. It accepts every wire variant described
// in the package doc. On failure it returns a zero Batch and a
// *DecodeError: one bad event fails the whole batch, because applying the
// rest out of context could corrupt a chain.
func Decode(payload []byte) (Batch, error) {
	d := decoder{r: reader{b: payload}, event: -1}
	b, err := d.batch()
	if err != nil {
		return Batch{}, &DecodeError{Offset: d.r.off, Event: d.event, Field: d.field, Err: err}
	}
	return b, nil
}

// DecodeFrames decodes a live ZMQ message [topic, seq, payload], where seq
// is at least 8 bytes whose first 8 are a big-endian uint64. When only the
// payload is bad it returns the Batch with Topic and Seq set alongside the
// error, so the caller can still track the sequence (a bad batch is a lost
// batch, not a restart).
func DecodeFrames(frames [][]byte) (Batch, error) {
	if len(frames) != 3 {
		return Batch{}, fmt.Errorf("decode frames: %w: %d frames, want 3", ErrFrames, len(frames))
	}
	if len(frames[1]) < 8 {
		return Batch{}, fmt.Errorf("decode frames: %w: seq frame of %d bytes, want 8", ErrFrames, len(frames[1]))
	}
	topic, seq := string(frames[0]), binary.BigEndian.Uint64(frames[1])
	b, err := Decode(frames[2])
	b.Topic, b.Seq = topic, seq
	return b, err
}

// decoder carries the position for error reports.
type decoder struct {
	r     reader
	event int
	field string
}

func (d *decoder) batch() (Batch, error) {
	var b Batch
	c, err := d.r.peek()
	if err != nil {
		return b, err
	}
	switch {
	case isArray(c):
		n, err := d.r.arrayLen()
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, fmt.Errorf("%w: batch array of %d elements, want [ts, events, ...]", ErrShape, n)
		}
		for i := range n {
			if err := d.batchField(&b, i); err != nil {
				return b, err
			}
		}
	case isMap(c):
		n, err := d.r.mapLen()
		if err != nil {
			return b, err
		}
		var seen [3]bool
		for range n {
			d.field = ""
			key, _, err := d.r.raw()
			if err != nil {
				return b, err
			}
			i := slices.Index(batchFields[:], string(key))
			if i < 0 {
				if err := d.r.skip(1); err != nil {
					return b, err
				}
				continue
			}
			seen[i] = true
			if err := d.batchField(&b, i); err != nil {
				return b, err
			}
		}
		if !seen[0] || !seen[1] {
			d.field = ""
			return b, fmt.Errorf("%w: batch map without ts or events", ErrShape)
		}
	default:
		return b, fmt.Errorf("%w: 0x%02x, want batch array or map", ErrType, c)
	}
	d.field = ""
	if d.r.left() != 0 {
		return b, ErrTrailing
	}
	return b, nil
}

var batchFields = [...]string{"ts", "events", "data_parallel_rank"}

// batchField decodes the batch field at position i of batchFields; later
// positions are skipped.
func (d *decoder) batchField(b *Batch, i int) error {
	if i >= len(batchFields) {
		d.field = ""
		return d.r.skip(1)
	}
	d.field = batchFields[i]
	var err error
	switch i {
	case 0:
		b.TS, err = d.r.float()
	case 1:
		b.Events, err = d.events()
	case 2:
		b.DPRank, err = d.optInt()
	}
	return err
}

func (d *decoder) events() ([]Event, error) {
	if d.r.nil() {
		return nil, nil
	}
	n, err := d.r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	// An Event is ~200 bytes while its smallest encoding is 2, so grow as
	// events arrive rather than trusting n for the whole allocation.
	evs := make([]Event, 0, min(n, 64))
	for i := range n {
		d.event = i
		// Decoded in place: the table's accessors would make a local
		// Event escape to the heap.
		evs = append(evs, Event{})
		if err := d.decodeEvent(&evs[i]); err != nil {
			return nil, err
		}
	}
	d.event, d.field = -1, ""
	return evs, nil
}

func (d *decoder) decodeEvent(e *Event) error {
	d.field = "type"
	c, err := d.r.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := d.r.arrayLen()
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%w: empty event array", ErrShape)
		}
		if err := d.tag(e); err != nil {
			return err
		}
		fields := kinds[e.Kind].fields
		for j := 1; j < n; j++ {
			if j-1 >= len(fields) {
				d.field = ""
				if err := d.r.skip(1); err != nil {
					return err
				}
				continue
			}
			if err := d.decodeField(e, &fields[j-1]); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := d.r.mapLen()
		if err != nil {
			return err
		}
		return d.mapEvent(e, n)
	}
	return fmt.Errorf("%w: 0x%02x, want event array or map", ErrType, c)
}

// mapEvent decodes the n entries of a map event. Fields are looked up by
// name; the "type" key comes first from msgspec, but any order is
// accepted at the cost of a pre-scan.
func (d *decoder) mapEvent(e *Event, n int) error {
	start := d.r.off
	found := false
	for range n {
		key, _, err := d.r.raw()
		if err != nil {
			return err
		}
		if string(key) == "type" {
			if err := d.tag(e); err != nil {
				return err
			}
			found = true
			break
		}
		if err := d.r.skip(1); err != nil {
			return err
		}
	}
	if !found {
		d.field = ""
		return fmt.Errorf("%w: event map without type", ErrShape)
	}
	d.r.off = start
	fields := kinds[e.Kind].fields
	for range n {
		d.field = ""
		key, _, err := d.r.raw()
		if err != nil {
			return err
		}
		i := fieldIndex(fields, key)
		if i < 0 {
			// "type" (already read), unknown keys and fields of other kinds.
			if err := d.r.skip(1); err != nil {
				return err
			}
			continue
		}
		if err := d.decodeField(e, &fields[i]); err != nil {
			return err
		}
	}
	return nil
}

func fieldIndex(fields []fieldSpec, name []byte) int {
	for i := range fields {
		if string(name) == fields[i].name {
			return i
		}
	}
	return -1
}

func (d *decoder) tag(e *Event) error {
	d.field = "type"
	p, _, err := d.r.raw()
	if err != nil {
		return err
	}
	e.Kind, e.Tag = kindOf(p)
	return nil
}

// parent decodes parent_block_hash; nil and 0 both mean the chain starts
// at token 0.
func (d *decoder) parent() (*uint64, error) {
	if d.r.nil() {
		return nil, nil
	}
	h, err := d.r.hash()
	if err != nil || h == 0 {
		return nil, err
	}
	return &h, nil
}

// blockSize decodes block_size, which must fit an int; nil gives 0.
func (d *decoder) blockSize() (int, error) {
	if d.r.nil() {
		return 0, nil
	}
	start := d.r.off
	v, err := d.r.int64()
	if err != nil {
		return 0, err
	}
	if v < 0 || v > math.MaxInt {
		d.r.off = start
		return 0, fmt.Errorf("%w: block size %d", ErrRange, v)
	}
	return int(v), nil
}

// hashes decodes a hash array; an empty or nil array gives nil.
func (d *decoder) hashes() ([]uint64, error) {
	if d.r.nil() {
		return nil, nil
	}
	n, err := d.r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	hs := make([]uint64, n)
	for i := range hs {
		if hs[i], err = d.r.hash(); err != nil {
			return nil, err
		}
	}
	return hs, nil
}

// tokens decodes token ids, which must fit uint32; an empty or nil array
// gives nil.
func (d *decoder) tokens() ([]uint32, error) {
	if d.r.nil() {
		return nil, nil
	}
	n, err := d.r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	ts := make([]uint32, n)
	r := &d.r
	for i := range ts {
		// Inline the forms msgspec writes for token ids < 2^32.
		if r.off < len(r.b) {
			switch c := r.b[r.off]; {
			case c <= 0x7f:
				ts[i] = uint32(c)
				r.off++
				continue
			case c == 0xcd && r.left() >= 3:
				ts[i] = uint32(binary.BigEndian.Uint16(r.b[r.off+1:]))
				r.off += 3
				continue
			case c == 0xce && r.left() >= 5:
				ts[i] = binary.BigEndian.Uint32(r.b[r.off+1:])
				r.off += 5
				continue
			}
		}
		start := r.off
		v, neg, err := r.integer()
		if err != nil {
			return nil, err
		}
		if neg || v > math.MaxUint32 {
			r.off = start
			if neg {
				return nil, fmt.Errorf("%w: token id %d", ErrRange, int64(v))
			}
			return nil, fmt.Errorf("%w: token id %d", ErrRange, v)
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}

func (d *decoder) optInt() (*int64, error) {
	if d.r.nil() {
		return nil, nil
	}
	v, err := d.r.int64()
	if err != nil {
		return nil, err
	}
	return &v, nil
}

func (d *decoder) optStr() (*string, error) {
	if d.r.nil() {
		return nil, nil
	}
	p, _, err := d.r.raw()
	if err != nil {
		return nil, err
	}
	s := intern(p)
	return &s, nil
}

// intern returns the common string values without copying their bytes.
func intern(p []byte) string {
	for _, s := range [...]string{"GPU", "CPU", "full_attention"} {
		if string(p) == s {
			return s
		}
	}
	return string(p)
}

// extraKeys decodes extra_keys: per block, nil or an array of keys. An
// empty array (outer or per block) gives nil, like an absent one.
func (d *decoder) extraKeys() ([][]any, error) {
	if d.r.nil() {
		return nil, nil
	}
	n, err := d.r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	out := make([][]any, n)
	for i := range out {
		if d.r.nil() {
			continue
		}
		m, err := d.r.arrayLen()
		if err != nil {
			return nil, err
		}
		if m == 0 {
			continue
		}
		keys := make([]any, m)
		for j := range keys {
			if keys[j], err = d.r.value(3); err != nil {
				return nil, err
			}
		}
		out[i] = keys
	}
	return out, nil
}

// value decodes any msgpack value into the normalised Go forms documented
// on Event.ExtraKeys. Extension types are refused: msgspec does not write
// them for anything vLLM puts in an event.
func (r *reader) value(depth int) (any, error) {
	if depth > maxDepth {
		return nil, ErrDepth
	}
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	switch {
	case c == 0xc0:
		r.off++
		return nil, nil
	case c == 0xc2 || c == 0xc3:
		r.off++
		return c == 0xc3, nil
	case c == 0xca || c == 0xcb:
		return r.float()
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		v, neg, err := r.integer()
		if err != nil {
			return nil, err
		}
		if !neg && v > math.MaxInt64 {
			return v, nil
		}
		return int64(v), nil
	case c&0xe0 == 0xa0 || (c >= 0xc4 && c <= 0xc6) || (c >= 0xd9 && c <= 0xdb):
		p, bin, err := r.raw()
		if err != nil {
			return nil, err
		}
		if bin {
			return slices.Clone(p), nil
		}
		return string(p), nil
	case isArray(c):
		n, err := r.arrayLen()
		if err != nil {
			return nil, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], err = r.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return a, nil
	case isMap(c):
		n, err := r.mapLen()
		if err != nil {
			return nil, err
		}
		m := make(map[string]any, n)
		for range n {
			k, bin, err := r.raw()
			if err != nil {
				return nil, err
			}
			if bin {
				return nil, fmt.Errorf("%w: bin map key, want string", ErrType)
			}
			if m[string(k)], err = r.value(depth + 1); err != nil {
				return nil, err
			}
		}
		return m, nil
	}
	return nil, fmt.Errorf("%w: 0x%02x in extra key", ErrType, c)
}
