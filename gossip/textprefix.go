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
// key count uvarint | keys u64 LE*. It goes by TCP (a 32k-token prefix is
// 4 KiB of keys at the default stride).

// maxTextPrefixKeys bounds a received prefix (a 1M-token prompt at one
// key per 16 tokens), so a bad message cannot make us allocate more.
const maxTextPrefixKeys = 1 << 16

// TextPrefix is a text prefix as the mesh carries it (textprefix.Entry
// under its textprefix.Hash).
type TextPrefix struct {
	Hash          uint64
	Tokens, Bytes int
	Keys          []blockkey.Key
}

func encodeTextPrefix(p TextPrefix) ([]byte, error) {
	if len(p.Keys) > maxTextPrefixKeys || p.Tokens < 0 || p.Bytes < 0 {
		return nil, fmt.Errorf("encode text prefix: %d keys, %d tokens, %d bytes", len(p.Keys), p.Tokens, p.Bytes)
	}
	b := make([]byte, 0, 1+8+3*binary.MaxVarintLen64+8*len(p.Keys))
	b = append(b, kindTextPrefix)
	b = binary.LittleEndian.AppendUint64(b, p.Hash)
	b = binary.AppendUvarint(b, uint64(p.Tokens))
	b = binary.AppendUvarint(b, uint64(p.Bytes))
	b = binary.AppendUvarint(b, uint64(len(p.Keys)))
	for _, k := range p.Keys {
		b = binary.LittleEndian.AppendUint64(b, uint64(k))
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
	if f[2] > maxTextPrefixKeys || uint64(len(b)) != 8*f[2] {
		return TextPrefix{}, fmt.Errorf("text prefix: %d keys in %d bytes", f[2], len(b))
	}
	p.Tokens, p.Bytes = int(f[0]), int(f[1])
	p.Keys = make([]blockkey.Key, f[2])
	for i := range p.Keys {
		p.Keys[i] = blockkey.Key(binary.LittleEndian.Uint64(b[8*i:]))
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
