package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute/blockkey"
)

// A text-prefix message (kindTextPrefix) carries one learned text prefix:
// a conversation's turns enter random sidecars, and the sidecar a turn
// enters should not have to tokenize what another sidecar already did.
// Wire form: kind | hash u64 LE | tokens uvarint | bytes uvarint |
// key count uvarint | keys u64 LE* [| flags byte | last u64 LE |
// tail count uvarint | tail u32 LE*]. The bracketed part (a receiver
// needs it to extend the prefix by new messages without tokenizing it) is
// sent when flags would not be zero, and a message without it is read as
// it was before the part existed. It goes by TCP (a 32k-token prefix is
// 4 KiB of keys at the default stride).

// maxTextPrefixKeys bounds a received prefix (a 1M-token prompt at one
// key per 16 tokens), so a bad message cannot make us allocate more.
const maxTextPrefixKeys = 1 << 16

// maxTextPrefixTail bounds a received chain tail: fewer tokens than a
// block, and far above any block size vLLM takes.
const maxTextPrefixTail = 1 << 12

// Text-prefix flags.
const (
	textChained  = 1 << 0 // Last and Tail are set
	textComposed = 1 << 1
)

// TextPrefix is a text prefix as the mesh carries it (textprefix.Entry
// under its textprefix.Hash).
type TextPrefix struct {
	Hash          uint64
	Tokens, Bytes int
	Keys          []blockkey.Key
	// Chained entries carry the key of their last full block and the
	// tokens after it (textprefix.Entry); Composed ones were composed.
	Chained, Composed bool
	Last              blockkey.Key
	Tail              []uint32
}

func encodeTextPrefix(p TextPrefix) ([]byte, error) {
	if len(p.Keys) > maxTextPrefixKeys || p.Tokens < 0 || p.Bytes < 0 || len(p.Tail) > maxTextPrefixTail || (!p.Chained && (p.Last != 0 || p.Tail != nil)) {
		return nil, fmt.Errorf("encode text prefix: %d keys, %d tokens, %d bytes, tail %d", len(p.Keys), p.Tokens, p.Bytes, len(p.Tail))
	}
	b := make([]byte, 0, 1+8+3*binary.MaxVarintLen64+8*len(p.Keys)+1+8+binary.MaxVarintLen64+4*len(p.Tail))
	b = append(b, kindTextPrefix)
	b = binary.LittleEndian.AppendUint64(b, p.Hash)
	b = binary.AppendUvarint(b, uint64(p.Tokens))
	b = binary.AppendUvarint(b, uint64(p.Bytes))
	b = binary.AppendUvarint(b, uint64(len(p.Keys)))
	for _, k := range p.Keys {
		b = binary.LittleEndian.AppendUint64(b, uint64(k))
	}
	var flags byte
	if p.Chained {
		flags |= textChained
	}
	if p.Composed {
		flags |= textComposed
	}
	if flags == 0 {
		return b, nil
	}
	b = append(b, flags)
	if p.Chained {
		b = binary.LittleEndian.AppendUint64(b, uint64(p.Last))
		b = binary.AppendUvarint(b, uint64(len(p.Tail)))
		for _, t := range p.Tail {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
	}
	return b, nil
}

// decodeTextPrefix parses b without its kind byte. The result does not
// alias b.
func decodeTextPrefix(b []byte) (TextPrefix, error) {
	if len(b) < 8 {
		return TextPrefix{}, errors.New("text prefix: truncated hash")
	}
	p := TextPrefix{Hash: binary.LittleEndian.Uint64(b)}
	b = b[8:]
	var f [3]uint64
	for i := range f {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<31 {
			return TextPrefix{}, fmt.Errorf("text prefix: field %d truncated or out of range", i)
		}
		f[i], b = v, b[n:]
	}
	if f[2] > maxTextPrefixKeys || uint64(len(b)) < 8*f[2] {
		return TextPrefix{}, fmt.Errorf("text prefix: %d keys in %d bytes", f[2], len(b))
	}
	p.Tokens, p.Bytes = int(f[0]), int(f[1])
	p.Keys = make([]blockkey.Key, f[2])
	for i := range p.Keys {
		p.Keys[i] = blockkey.Key(binary.LittleEndian.Uint64(b[8*i:]))
	}
	b = b[8*f[2]:]
	if len(b) == 0 {
		return p, nil
	}
	flags := b[0]
	b = b[1:]
	if flags == 0 || flags&^(textChained|textComposed) != 0 {
		return TextPrefix{}, fmt.Errorf("text prefix: flags %#x", flags)
	}
	p.Chained, p.Composed = flags&textChained != 0, flags&textComposed != 0
	if !p.Chained {
		if len(b) != 0 {
			return TextPrefix{}, fmt.Errorf("text prefix: %d bytes after the flags", len(b))
		}
		return p, nil
	}
	if len(b) < 8 {
		return TextPrefix{}, errors.New("text prefix: truncated chain key")
	}
	p.Last = blockkey.Key(binary.LittleEndian.Uint64(b))
	b = b[8:]
	n, w := binary.Uvarint(b)
	if w <= 0 || n > maxTextPrefixTail || uint64(len(b)-w) != 4*n {
		return TextPrefix{}, fmt.Errorf("text prefix: tail of %d tokens in %d bytes", n, len(b))
	}
	b = b[w:]
	if n > 0 {
		p.Tail = make([]uint32, n)
		for i := range p.Tail {
			p.Tail[i] = binary.LittleEndian.Uint32(b[4*i:])
		}
	}
	return p, nil
}

func decodeTextPrefixMsg(b []byte) (payload, error) { return decodeTextPrefix(b) }

func (p TextPrefix) encode() ([]byte, error) { return encodeTextPrefix(p) }

// apply hands the prefix to the OnTextPrefix function; it takes no lock.
func (p TextPrefix) apply(m *Mesh, _ time.Time) {
	if f := m.textPrefix.Load(); f != nil {
		(*f)(p)
	}
}

// ShareTextPrefix sends p to every member, reliably. A peer whose queue is
// full misses it: it tokenizes that prefix itself when it needs it.
func (m *Mesh) ShareTextPrefix(p TextPrefix) error {
	b, err := p.encode()
	if err != nil {
		return err
	}
	m.members.each(func(s *sender) { s.enqueue(out{b: b, reliable: true}) })
	return nil
}

// OnTextPrefix sets the function that receives the text prefixes peers
// share (call it before peers share any; f must not block).
func (m *Mesh) OnTextPrefix(f func(TextPrefix)) { m.textPrefix.Store(&f) }
