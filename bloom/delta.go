package bloom

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/kvroute/kvroute/blockkey"
)

var (
	// ErrGap is wrapped by Apply when a delta does not follow the digest: it
	// starts at another version, or belongs to another node or epoch. The
	// receiver needs a full digest.
	ErrGap = errors.New("delta does not follow digest")
	// ErrStale is wrapped by Apply when the digest already reflects the
	// delta's target version; the delta is a duplicate or arrived late.
	ErrStale = errors.New("delta is stale")
)

// Delta is the change from one digest version to the next within an epoch:
// the keys added and the keys removed (gone.go). After it, every key in
// Keys is held and none in Removed is; a key in both counts as added.
type Delta struct {
	Node     string
	Epoch    uint64
	From, To uint64 // versions: applies to a digest at From, yields To
	Keys     []blockkey.Key
	Removed  []blockkey.Key
}

// AddsOnly returns x without its removals: what a peer of wire version 1,
// which reads no removals, is sent (its view drops evicted keys only at
// the owner's next full digest, as v0.1.0's did).
func (x Delta) AddsOnly() Delta {
	x.Removed = nil
	return x
}

// Wire format of a delta, all integers big-endian:
//
//	"KVRX" | format u8 | node len u8 | node | epoch u64 | from u64 | to u64 |
//	key count u32 | keys u64 [| removed count u32 | removed u64]
//
// The removed section is there in format 2 (FormatRemovals) only, which is
// written only for a delta with removals: a delta of additions alone has
// v0.1.0's bytes.
const (
	deltaMagic = "KVRX"
	// MaxDeltaKeys bounds the keys in one delta (8 MiB of keys); a larger
	// change is better sent as a full digest.
	MaxDeltaKeys    = 1 << 20
	deltaFixedBytes = len(deltaMagic) + 2 + 3*8 + 4
)

// MarshalDelta returns x's wire form. It fails when the node name is longer
// than MaxNodeBytes, x has more than MaxDeltaKeys keys, or x.To <= x.From.
func MarshalDelta(x Delta) ([]byte, error) {
	if err := x.check(); err != nil {
		return nil, fmt.Errorf("marshal delta: %w", err)
	}
	format := FormatVersion
	if len(x.Removed) > 0 {
		format = FormatRemovals
	}
	b := make([]byte, 0, deltaFixedBytes+len(x.Node)+8*len(x.Keys)+4+8*len(x.Removed))
	b = append(b, deltaMagic...)
	b = append(b, format, uint8(len(x.Node)))
	b = append(b, x.Node...)
	b = binary.BigEndian.AppendUint64(b, x.Epoch)
	b = binary.BigEndian.AppendUint64(b, x.From)
	b = binary.BigEndian.AppendUint64(b, x.To)
	b = binary.BigEndian.AppendUint32(b, uint32(len(x.Keys)))
	b = appendKeys(b, x.Keys)
	if format == FormatRemovals {
		b = binary.BigEndian.AppendUint32(b, uint32(len(x.Removed)))
		b = appendKeys(b, x.Removed)
	}
	return b, nil
}

func appendKeys(b []byte, ks []blockkey.Key) []byte {
	for _, k := range ks {
		b = binary.BigEndian.AppendUint64(b, uint64(k))
	}
	return b
}

func (x Delta) check() error {
	switch {
	case len(x.Node) > MaxNodeBytes:
		return fmt.Errorf("node name of %d bytes: %w", len(x.Node), ErrInvalid)
	case len(x.Keys) > MaxDeltaKeys:
		return fmt.Errorf("%d keys: %w", len(x.Keys), ErrInvalid)
	case len(x.Removed) > MaxDeltaKeys:
		return fmt.Errorf("%d removed keys: %w", len(x.Removed), ErrInvalid)
	case x.To <= x.From:
		return fmt.Errorf("version %d to %d does not advance: %w", x.From, x.To, ErrInvalid)
	}
	return nil
}

// UnmarshalDelta decodes a delta written by MarshalDelta, with the same
// checks: magic, format version (1, or 2 with removals), at most
// MaxDeltaKeys keys in each list, To > From, and exactly the announced
// number of keys with no trailing bytes.
func UnmarshalDelta(b []byte) (Delta, error) {
	r := reader{b: b}
	if string(r.bytes(len(deltaMagic))) != deltaMagic {
		return Delta{}, fmt.Errorf("unmarshal delta: bad magic: %w", ErrMalformed)
	}
	format, nodeLen := r.u8(), r.u8()
	if r.short {
		return Delta{}, fmt.Errorf("unmarshal delta: truncated header: %w", ErrMalformed)
	}
	if format != FormatVersion && format != FormatRemovals {
		return Delta{}, fmt.Errorf("unmarshal delta: format version %d: %w", format, ErrUnsupported)
	}
	var x Delta
	x.Node = string(r.bytes(int(nodeLen)))
	x.Epoch, x.From, x.To = r.u64(), r.u64(), r.u64()
	n := r.u32()
	if r.short {
		return Delta{}, fmt.Errorf("unmarshal delta: truncated header: %w", ErrMalformed)
	}
	if x.To <= x.From {
		return Delta{}, fmt.Errorf("unmarshal delta: version %d to %d: %w", x.From, x.To, ErrMalformed)
	}
	var err error
	if x.Keys, err = readKeys(&r, n, format == FormatVersion); err != nil {
		return Delta{}, fmt.Errorf("unmarshal delta: %w", err)
	}
	if format == FormatRemovals {
		n = r.u32()
		if r.short {
			return Delta{}, fmt.Errorf("unmarshal delta: truncated removals: %w", ErrMalformed)
		}
		if x.Removed, err = readKeys(&r, n, true); err != nil {
			return Delta{}, fmt.Errorf("unmarshal delta: removed %w", err)
		}
		if len(x.Removed) == 0 {
			return Delta{}, fmt.Errorf("unmarshal delta: format %d without removals: %w", format, ErrMalformed)
		}
	}
	return x, nil
}

// readKeys reads n keys, nil for none; last says they end the input.
func readKeys(r *reader, n uint32, last bool) ([]blockkey.Key, error) {
	if n > MaxDeltaKeys {
		return nil, fmt.Errorf("%d keys: %w", n, ErrMalformed)
	}
	if rest := len(r.b); rest < 8*int(n) || (last && rest != 8*int(n)) {
		return nil, fmt.Errorf("%d bytes for %d keys: %w", rest, n, ErrMalformed)
	}
	if n == 0 {
		return nil, nil
	}
	ks := make([]blockkey.Key, n)
	for i := range ks {
		ks[i] = blockkey.Key(r.u64())
	}
	return ks, nil
}

// Apply returns a new digest with x's keys added and its removals taken
// out (gone.go), Version x.To and Count increased by len(x.Keys); d is
// unchanged. It fails with ErrGap when x is for
// another node or epoch or x.From != d's version, and with ErrStale when
// x.To <= d's version (checked before the From test, so a late delta is
// dropped rather than mistaken for a gap). Apply copies the M/64 words and
// sets K bits per key: O(M/64 + K·len(x.Keys)), about 120 KB copied for a
// 100k-key digest at 1%.
func (d *Digest) Apply(x Delta) (*Digest, error) {
	switch {
	case d.empty():
		return nil, fmt.Errorf("apply delta to an empty digest: %w", ErrGap)
	case x.Node != d.h.Node:
		return nil, fmt.Errorf("apply delta from node %q to digest of %q: %w", x.Node, d.h.Node, ErrGap)
	case x.Epoch != d.h.Epoch:
		return nil, fmt.Errorf("apply delta of epoch %d to epoch %d: %w", x.Epoch, d.h.Epoch, ErrGap)
	case x.To <= d.h.Version:
		return nil, fmt.Errorf("apply delta to version %d on version %d: %w", x.To, d.h.Version, ErrStale)
	case x.From != d.h.Version:
		return nil, fmt.Errorf("apply delta from version %d on version %d: %w", x.From, d.h.Version, ErrGap)
	}
	h := d.h
	h.Version = x.To
	h.Count += uint64(len(x.Keys))
	n := newDigest(h, slices.Clone(d.bits.Words()))
	for _, k := range x.Keys {
		n.add(k)
	}
	n.gone = nextGone(d.gone, x.Removed, x.Keys, n.testBits)
	if len(n.gone) > MaxGone {
		return nil, fmt.Errorf("apply delta: %d removals since the digest was built: %w", len(n.gone), ErrGap)
	}
	n.scan()
	return n, nil
}
