package bloom

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/blockkey"
)

// Wire format of a digest, all integers big-endian:
//
//	"KVRD" | format u8 | key scheme u8 | hash scheme u8 | node len u8 | node |
//	epoch u64 | version u64 | count u64 | M u64 | K u32 | M/64 words u64
//	[| gone count u32 | gone keys u64, ascending]
//
// The gone section (the keys removed since the digest was built, gone.go)
// is there in format 2 (FormatRemovals) only, written only for a digest
// that has removals. The size is fixed by M, the node name and the count
// of removals (Size), so a receiver checks the length before it allocates
// anything.
const (
	digestMagic = "KVRD"
	// FormatVersion is the wire format version written by MarshalBinary and
	// MarshalDelta; decoders refuse others (ErrUnsupported) and any byte
	// past the bits. v0.1.0 writes and reads 1 alone, so a digest's frame
	// cannot grow while v0.1.0 peers may be in the mesh: a longer frame or a
	// format 2 is refused whole. A new format therefore takes a new
	// number, and its sender writes it only to peers whose gossip wire
	// version says they read it, format 1 to the others
	// (docs/compat.md). The hash scheme byte is versioned the same way
	// (HashScheme).
	FormatVersion uint8 = 1
	// FormatRemovals is the format of a digest or delta that carries
	// removals (gone.go): written only to peers of wire version 2 and up.
	FormatRemovals uint8 = 2
	// MaxNodeBytes bounds the node name (a Kubernetes pod name is at most 253).
	MaxNodeBytes = 255

	digestFixedBytes = len(digestMagic) + 4 + 3*8 + 8 + 4
)

var (
	// ErrMalformed is wrapped by every decode error caused by the input bytes.
	ErrMalformed = errors.New("malformed")
	// ErrUnsupported is wrapped when the input is well formed but uses a format
	// version or hash scheme this build cannot read.
	ErrUnsupported = errors.New("unsupported")
	// ErrInvalid is wrapped when a value cannot be encoded (a node name over
	// MaxNodeBytes, too many delta keys, a delta that does not advance).
	ErrInvalid = errors.New("invalid")
)

// Size returns the length of d's binary form in bytes.
func (d *Digest) Size() int {
	if d.empty() {
		return 0
	}
	n := d.sizeV1()
	if len(d.gone) > 0 {
		n += 4 + 8*len(d.gone)
	}
	return n
}

func (d *Digest) sizeV1() int { return digestFixedBytes + len(d.h.Node) + int(d.h.M/8) }

// MarshalBinary returns d's wire form: format 1 when it has no removals,
// else format 2. It fails only when the node name is longer than
// MaxNodeBytes or d is nil or zero.
func (d *Digest) MarshalBinary() ([]byte, error) {
	removals := !d.empty() && len(d.gone) > 0
	b, err := d.marshal(removals)
	if err != nil || !removals {
		return b, err
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(d.gone)))
	return appendKeys(b, d.gone), nil
}

// MarshalV1 returns d's bits in format 1, without its removals: what a peer
// of wire version 1 reads (the removed keys look present to it until the
// owner rebuilds, as they did before removals were carried).
func (d *Digest) MarshalV1() ([]byte, error) { return d.marshal(false) }

func (d *Digest) marshal(removals bool) ([]byte, error) {
	if d.empty() {
		return nil, fmt.Errorf("marshal digest: empty digest: %w", ErrInvalid)
	}
	if len(d.h.Node) > MaxNodeBytes {
		return nil, fmt.Errorf("marshal digest: node name of %d bytes: %w", len(d.h.Node), ErrInvalid)
	}
	format, size := FormatVersion, d.sizeV1()
	if removals {
		format, size = FormatRemovals, d.Size()
	}
	b := make([]byte, 0, size)
	b = append(b, digestMagic...)
	b = append(b, format, d.h.KeyScheme, d.h.HashScheme, uint8(len(d.h.Node)))
	b = append(b, d.h.Node...)
	b = binary.BigEndian.AppendUint64(b, d.h.Epoch)
	b = binary.BigEndian.AppendUint64(b, d.h.Version)
	b = binary.BigEndian.AppendUint64(b, d.h.Count)
	b = binary.BigEndian.AppendUint64(b, d.h.M)
	b = binary.BigEndian.AppendUint32(b, d.h.K)
	off := len(b)
	b = b[:d.sizeV1()]
	for _, w := range d.bits.Words() {
		binary.BigEndian.PutUint64(b[off:off+8], w)
		off += 8
	}
	return b, nil
}

// Unmarshal decodes a digest written by MarshalBinary. It checks the magic,
// format version (1, or 2 with removals) and hash scheme (1 or 2), that M is
// a positive multiple of 64 (512 for scheme 2) up to MaxBits, that K is in
// 1..MaxK, that the input holds exactly M/64 words and, in format 2, at
// most MaxGone removals, ascending, each with its bits set: no more, no
// less. The result does not alias b.
func Unmarshal(b []byte) (*Digest, error) {
	r := reader{b: b}
	if string(r.bytes(len(digestMagic))) != digestMagic {
		return nil, fmt.Errorf("unmarshal digest: bad magic: %w", ErrMalformed)
	}
	format, keyScheme, hashScheme, nodeLen := r.u8(), r.u8(), r.u8(), r.u8()
	if r.short {
		return nil, fmt.Errorf("unmarshal digest: truncated header: %w", ErrMalformed)
	}
	if format != FormatVersion && format != FormatRemovals {
		return nil, fmt.Errorf("unmarshal digest: format version %d: %w", format, ErrUnsupported)
	}
	if !knownScheme(hashScheme) {
		return nil, fmt.Errorf("unmarshal digest: hash scheme %d: %w", hashScheme, ErrUnsupported)
	}
	h := Header{KeyScheme: keyScheme, HashScheme: hashScheme}
	h.Node = string(r.bytes(int(nodeLen)))
	h.Epoch, h.Version, h.Count = r.u64(), r.u64(), r.u64()
	h.M, h.K = r.u64(), r.u32()
	if r.short {
		return nil, fmt.Errorf("unmarshal digest: truncated header: %w", ErrMalformed)
	}
	if !h.Params.valid(hashScheme) {
		return nil, fmt.Errorf("unmarshal digest: M=%d K=%d out of range for hash scheme %d: %w", h.M, h.K, hashScheme, ErrMalformed)
	}
	if rest := uint64(len(r.b)); rest < h.M/8 || (format == FormatVersion && rest != h.M/8) {
		return nil, fmt.Errorf("unmarshal digest: %d bytes of bits for M=%d: %w", rest, h.M, ErrMalformed)
	}
	words := make([]uint64, h.M/64)
	for i := range words {
		words[i] = r.u64()
	}
	d := newDigest(h, words)
	if format == FormatRemovals {
		if err := d.readGone(&r); err != nil {
			return nil, fmt.Errorf("unmarshal digest: %w", err)
		}
	}
	return d, nil
}

// readGone reads format 2's removals into d, which is not shared yet.
func (d *Digest) readGone(r *reader) error {
	n := r.u32()
	switch {
	case r.short:
		return fmt.Errorf("truncated removals: %w", ErrMalformed)
	case n == 0 || n > MaxGone:
		return fmt.Errorf("%d removals: %w", n, ErrMalformed)
	case len(r.b) != 8*int(n):
		return fmt.Errorf("%d bytes for %d removals: %w", len(r.b), n, ErrMalformed)
	}
	gone := make([]blockkey.Key, n)
	for i := range gone {
		gone[i] = blockkey.Key(r.u64())
		switch {
		case i > 0 && gone[i] <= gone[i-1]:
			return fmt.Errorf("removals not ascending at %d: %w", i, ErrMalformed)
		case !d.testBits(gone[i]):
			return fmt.Errorf("removal %d not in the bits: %w", i, ErrMalformed)
		}
	}
	d.gone = gone
	d.scan()
	return nil
}

// reader consumes big-endian fields; after a short read it returns zeros and
// sets short, so a decoder checks once per group of fields.
type reader struct {
	b     []byte
	short bool
}

func (r *reader) bytes(n int) []byte {
	if n > len(r.b) {
		r.short, r.b = true, nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.bytes(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if v := r.bytes(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.bytes(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}
