package gossip

import (
	"errors"
	"fmt"
	"time"
)

// Message kinds: the first byte of every user message the mesh sends. Each
// is listed once more in kinds, which is what decodes and counts it.
const (
	kindDigest   byte = 0xD1 // full digest (digest.go)
	kindDelta    byte = 0xD2 // delta (digest.go)
	kindNeedFull byte = 0xD3 // "send me your full digest" (needfull.go)
	kindLoad     byte = 0xD4 // the sender's load and engine state (loadreport.go)
	// A learned text prefix (textprefix.go).
	kindTextPrefix byte = 0xD5
	kindResponses  byte = 0xD6 // which node holds which stored responses (responses.go)
)

// payload is one decoded message. Each kind's file holds its type, its
// encoder, its decoder and its apply.
type payload interface {
	// encode returns the whole message, kind byte first; decoding it gives
	// the payload back.
	encode() ([]byte, error)
	// apply makes a received message take effect at now. It runs on the mesh
	// loop, one message at a time, and must not block: it may take the
	// mesh's locks (in the order Mesh documents), never wait on the network.
	apply(m *Mesh, now time.Time)
}

// kindSpec is one message kind.
type kindSpec struct {
	kind byte
	name string // its key in ByKind.All; unique
	// decode parses the bytes after the kind byte. The result must not
	// alias them: memberlist reuses its buffers.
	decode func(b []byte) (payload, error)
}

// kinds lists every message the mesh accepts, and names it in Stats
// (ByKind.All); a byte not listed is a decode error.
var kinds = [...]kindSpec{
	{kindDigest, "digest", decodeDigestMsg},
	{kindDelta, "delta", decodeDeltaMsg},
	{kindNeedFull, "need_full", decodeNeedFullMsg},
	{kindLoad, "load", decodeLoadMsg},
	{kindTextPrefix, "text_prefix", decodeTextPrefixMsg},
	{kindResponses, "responses", decodeResponsesMsg},
}

// slotOf returns k's index in kinds, or -1 for a kind not listed.
func slotOf(k byte) int {
	for i := range kinds {
		if kinds[i].kind == k {
			return i
		}
	}
	return -1
}

// ErrMsg is wrapped by every decodeMsg error.
var ErrMsg = errors.New("malformed gossip message")

// message is one decoded user message.
type message struct {
	kind byte
	body payload
}

// decodeMsg parses a user message. The result does not alias b.
func decodeMsg(b []byte) (message, error) {
	if len(b) == 0 {
		return message{}, fmt.Errorf("empty: %w", ErrMsg)
	}
	i := slotOf(b[0])
	if i < 0 {
		return message{}, fmt.Errorf("kind %#x: %w", b[0], ErrMsg)
	}
	p, err := kinds[i].decode(b[1:])
	if err != nil {
		return message{}, fmt.Errorf("decode kind %#x: %w: %w", b[0], ErrMsg, err)
	}
	return message{kind: b[0], body: p}, nil
}
