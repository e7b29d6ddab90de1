package gossip

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/bloom"
)

// Message kinds: the first byte of every user message the mesh sends. The
// rest is bloom's own encoding, or for a need-full request two names.
const (
	kindDigest   byte = 0xD1 // full digest: bloom.(*Digest).MarshalBinary
	kindDelta    byte = 0xD2 // delta: bloom.MarshalDelta
	kindNeedFull byte = 0xD3 // "send me your full digest": requester, origin
	kinds             = 3
)

// kindIndex maps a kind to its slot in Stats' per-kind counters.
func kindIndex(k byte) int { return int(k - kindDigest) }

// ErrMsg is wrapped by every decodeMsg error.
var ErrMsg = errors.New("malformed gossip message")

// message is one decoded user message. Exactly one of digest, delta or
// needFull is set, as kind says.
type message struct {
	kind     byte
	digest   *bloom.Digest
	delta    bloom.Delta
	needFull needFull
}

// needFull asks Origin to send its full digest to Requester.
type needFull struct{ Requester, Origin string }

func encodeDigest(d *bloom.Digest) ([]byte, error) {
	b, err := d.MarshalBinary()
	if err != nil {
		return nil, err
	}
	return append([]byte{kindDigest}, b...), nil
}

func encodeDelta(x bloom.Delta) ([]byte, error) {
	b, err := bloom.MarshalDelta(x)
	if err != nil {
		return nil, err
	}
	return append([]byte{kindDelta}, b...), nil
}

func encodeNeedFull(n needFull) ([]byte, error) {
	if len(n.Requester) > 255 || len(n.Origin) > 255 {
		return nil, fmt.Errorf("encode need-full: name over 255 bytes")
	}
	b := make([]byte, 0, 3+len(n.Requester)+len(n.Origin))
	b = append(b, kindNeedFull, byte(len(n.Requester)))
	b = append(b, n.Requester...)
	b = append(b, byte(len(n.Origin)))
	b = append(b, n.Origin...)
	return b, nil
}

// decodeMsg parses a user message. The result does not alias b.
func decodeMsg(b []byte) (message, error) {
	if len(b) == 0 {
		return message{}, fmt.Errorf("empty: %w", ErrMsg)
	}
	m := message{kind: b[0]}
	var err error
	switch m.kind {
	case kindDigest:
		m.digest, err = bloom.Unmarshal(b[1:])
	case kindDelta:
		m.delta, err = bloom.UnmarshalDelta(b[1:])
	case kindNeedFull:
		m.needFull, err = decodeNeedFull(b[1:])
	default:
		return message{}, fmt.Errorf("kind %#x: %w", m.kind, ErrMsg)
	}
	if err != nil {
		return message{}, fmt.Errorf("decode kind %#x: %w: %w", m.kind, ErrMsg, err)
	}
	return m, nil
}

func decodeNeedFull(b []byte) (needFull, error) {
	var names [2]string
	for i := range names {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return needFull{}, fmt.Errorf("truncated need-full")
		}
		names[i] = string(b[1 : 1+int(b[0])])
		b = b[1+int(b[0]):]
	}
	if len(b) != 0 || names[0] == "" || names[1] == "" {
		return needFull{}, fmt.Errorf("need-full with %d trailing bytes or an empty name", len(b))
	}
	return needFull{Requester: names[0], Origin: names[1]}, nil
}
